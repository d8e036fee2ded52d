//! The durable inbox: the `InboxStore` trait and its backends (memory, embedded SQLite, AMQP). Only this module knows a storage engine.

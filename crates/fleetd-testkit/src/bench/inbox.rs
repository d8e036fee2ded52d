//! Inbox benchmark: raw fdatasync baseline vs the embedded and AMQP stores.

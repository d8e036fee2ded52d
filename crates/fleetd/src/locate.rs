//! Caller locator: from a connection (TCP peer or unix-socket peer) to the OS process and the pane it runs in. Only this module reads `/proc` for identity.

//! The fleetd daemon: configuration, the clock, multiplexer adapters, the inbox store, the caller
//! locator, HTTP and the CLI. Domain decisions live in `fleetd-core`; this crate performs I/O.

pub mod clock;
pub mod locate;
pub mod mux;
pub mod store;

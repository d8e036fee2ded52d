//! The fleetd daemon: configuration, the clock, multiplexer adapters, the inbox store, the caller
//! locator, HTTP and the CLI. Domain decisions live in `fleetd-core`; this crate performs I/O.

#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod backends;
pub mod cli;
pub mod client;
pub mod clock;
pub mod config;
pub mod conn;
pub mod demo;
pub mod engine;
pub mod events;
pub mod gateway;
pub mod health;
pub mod http;
pub mod human;
pub mod identity;
pub mod inbox;
pub mod locate;
pub mod mcp;
pub mod members;
pub mod model_gateway;
pub mod mux;
pub mod ops;
pub mod reload;
pub mod sandbox;
pub mod secrets;
pub mod serve;
pub mod shim;
pub mod shim_relay;
pub mod state_dir;
pub mod store;
mod sync;
#[cfg(test)]
mod test_support;
pub mod worktree;

//! fleetd's one integration-test binary: the built `fleetd` binary, the stores against real disks and
//! the real RabbitMQ, the multiplexer backends against real tmux and fake-herdr.

mod bridge;
mod cli;
mod config;
mod crash;
mod locate;
mod mux_herdr;
mod mux_tmux;
mod push;
mod serve;
mod service;
mod store;
mod tidy;

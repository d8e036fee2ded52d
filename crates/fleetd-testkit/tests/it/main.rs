//! fleetd's one integration-test binary: the built `fleetd` binary (daemon, CLI, installer,
//! service readiness), the stores against real disks and the real RabbitMQ, the multiplexer
//! backends against real tmux and fake-herdr.

mod amqp;
mod bridge;
mod cli;
mod client;
mod config;
mod conn_limits;
mod crash;
mod dashboard;
mod delegation;
mod delivery_herdr;
mod demo;
mod events;
mod faults;
mod gateway;
mod gateway_cluster;
mod herdr_versions;
mod install;
mod locate;
mod members;
mod metrics;
mod mux_herdr;
mod mux_kit;
mod mux_tmux;
mod mux_tmux_control;
mod paging;
mod push;
mod push_herdr;
mod real_claude;
mod real_claude_tasks;
mod real_codex;
mod real_herdr;
mod recovery;
mod reload;
mod scenarios;
mod security;
mod security_herdr;
mod security_leads;
mod security_tasks;
mod serve;
mod service;
mod spawn_herdr;
mod store;
mod tidy;
mod worktrees;

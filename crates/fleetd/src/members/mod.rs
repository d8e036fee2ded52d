//! The member service: starting members from profiles. `spawn` runs `fleet_spawn`'s saga on a
//! task of its own, so no request that goes away can leave it half-done; `env` builds a member's
//! environment and says which profile secrets resolve. It knows no multiplexer backend (a
//! `Launch` says what to run, `mux` decides how) and no MCP, and holds no member state (the
//! engine does).

mod env;
mod kinds;
mod spawn;
#[cfg(test)]
mod tests;

pub(crate) use env::{log_secret_names, missing_secret};
pub use spawn::{READY_TIMEOUT, SpawnRequest, Spawned, Spawner};

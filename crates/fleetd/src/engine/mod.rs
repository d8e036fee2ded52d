//! The engine: the one task that owns the fleet's live state — members, tickets, task queues,
//! questions, waiters, lead bindings — and runs the core's policies (`Injector`, `PushLoop`,
//! `TicketBook`) against the multiplexer and the store. MCP and HTTP handlers talk to it only
//! through [`EngineHandle`], which sends a closed [`Command`] with a oneshot reply; nothing else
//! holds the state. Architecture invariant: the engine never blocks on I/O — every multiplexer or
//! store call runs in a spawned task that reports back as an [`Event`].

mod busy;
mod command;
mod effects;
mod gateway_handle;
mod handle;
mod lead_tabs;
mod registry;
mod run;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_durable;
#[cfg(test)]
mod tests_gateway;
#[cfg(test)]
mod tests_steps;
mod verify;
mod views;
mod wake;

use std::sync::Arc;

use crate::clock::SharedClock;
use crate::mux::MuxRouter;
use crate::store::InboxStore;

pub use gateway_handle::{PeerSpawn, RemoteSpawned, SpawnAnswer, SpawnRemote};
pub use run::spawn;
pub use state::{
    Delegator, GatewayOutcome, MemberModel, Passes, PeerRefusal, Standing, UsageTotals, UsageView,
};
pub use wake::WakeView;

pub(crate) use command::Command;
pub use handle::{EngineGone, EngineHandle, WeakEngineHandle};
pub use views::{
    AnswerRoute, Delivered, LeadRef, MemberUser, MemberView, NewMember, QuestionView, Readiness,
    Settled, TicketAnswer, TicketView, WorktreeView,
};

/// Capacity of the engine's inbox. Commands are small and handled in microseconds; 1024 absorbs
/// a burst from every member of a large fleet replying at once without making callers wait.
const ENGINE_QUEUE: usize = 1024;

/// The durable side of the engine (SPEC §15).
#[derive(Debug, Clone)]
pub struct Durable {
    /// The fleet state's store.
    pub store: Arc<dyn crate::store::StateStore>,
    /// The legacy member registry (`<state dir>/members.json`): imported once when
    /// the store holds no members, then removed.
    pub legacy_members_file: Option<std::path::PathBuf>,
}

/// What the engine needs to run.
#[derive(Debug, Clone)]
pub struct EngineParts {
    /// Where the fleet state is kept across restarts; `None` keeps it in memory only.
    pub durable: Option<Durable>,
    /// The running configuration: read at start; applied reloads reach the engine through it
    /// (members whose backend vanished get an `unmapped` incident).
    pub config: crate::config::Live,
    /// The clock.
    pub clock: SharedClock,
    /// The inbox store.
    pub store: Arc<dyn InboxStore>,
    /// The multiplexers.
    pub mux: MuxRouter,
    /// Takes secret values out of the texts the engine stores for leads (fallback tails,
    /// incidents).
    pub redactor: crate::secrets::Redactor,
    /// This engine as one gateway of a multi-host fleet; `None`: one host.
    pub gateway: Option<GatewayParts>,
}

/// What the engine needs to be a gateway.
#[derive(Debug, Clone)]
pub struct GatewayParts {
    /// Its name.
    pub me: fleetd_core::gateway::GatewayName,
    /// What each other gateway may ask of it.
    pub peers: std::collections::BTreeMap<String, Vec<crate::config::PeerRight>>,
    /// Where outbox records go, in order, once committed: the forwarder.
    pub forward: tokio::sync::mpsc::UnboundedSender<(u64, Box<fleetd_core::gateway::Envelope>)>,
    /// `gateway.outboxMax`: records in the outbox at which new requests to other gateways are
    /// refused. The channel to the forwarder carries each record once, so it holds no more
    /// than the outbox does.
    pub outbox_max: usize,
    /// `gateway.peerBacklogMax`: messages waiting for one other gateway at which new requests
    /// to it are refused (`gateway_busy`).
    pub peer_backlog_max: usize,
}

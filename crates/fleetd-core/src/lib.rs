//! fleetd's pure core: identifiers, the message model and the domain decisions (registry, tickets,
//! push-loop policy, model usage and budgets). Architecture invariant: this crate does no I/O and has no async runtime — it
//! takes `now` and randomness as arguments and returns decisions as data.

pub mod access;
pub mod dialog;
pub mod gateway;
pub mod ids;
pub mod injector;
pub mod message;
pub mod pane;
pub mod push;
pub mod refusal;
pub mod sanitize;
mod text_impls;
pub mod ticket;
pub mod usage;

pub use ids::{IdError, MsgId, Target, Ticket};
pub use message::{Message, MessageError, MessageKind, MessageLimits};
pub use pane::{
    AgentStatus, DaemonName, MuxDaemon, PaneId, PaneIdError, PaneRef, QualifiedPaneId, TabId,
    TerminalId, WorkspaceId,
};
pub use sanitize::{Injection, clean_line, plan_injection};
pub use ticket::{TicketBook, TicketEvent, TicketLookup, TicketRecord, TicketRefusal, TicketState};

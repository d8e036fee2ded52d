//! The engine's side of wakes (MCP tasks, see `mcp::wake`): the handle's calls and their
//! dispatch. The state they act on is `state::wakes`.

use fleetd_core::access::Refusal;
use fleetd_core::refusal::Code;
use fleetd_core::{Message, Target, Ticket, TicketState};
use jiff::Timestamp;
use tokio::sync::oneshot;

use super::run::Deferred;
use super::state::{Io, State};
use super::{Command, EngineGone, EngineHandle, QuestionView};

/// A wake as its owner's `tasks/get` sees it: its ticket as it is now.
#[derive(Debug, Clone)]
pub struct WakeView {
    /// The ticket it watches.
    pub ticket: Ticket,
    /// The ticket's member (`None` once the ticket expired).
    pub target: Option<Target>,
    /// The ticket's state (`None` once it expired).
    pub state: Option<TicketState>,
    /// The ticket's reply, when the engine still holds it (else it is read from the inbox).
    pub reply: Option<Message>,
    /// An open question of the ticket's member.
    pub question: Option<QuestionView>,
    /// When it was armed.
    pub created_at: Timestamp,
    /// Its owner cancelled it.
    pub cancelled: bool,
}

/// What the handle asks of the engine about wakes.
#[derive(Debug)]
pub(crate) enum WakeCommand {
    Arm {
        ticket: Ticket,
        owner: String,
        reply: oneshot::Sender<Result<String, Refusal>>,
    },
    View {
        id: String,
        owner: String,
        reply: oneshot::Sender<Option<WakeView>>,
    },
    Read {
        id: String,
        owner: String,
    },
    Cancel {
        id: String,
        owner: String,
        reply: oneshot::Sender<bool>,
    },
}

impl EngineHandle {
    /// Arms a wake on `ticket` for `owner` (a caller's holder id); answers its id once it is
    /// durable.
    pub async fn arm_wake(
        &self,
        ticket: Ticket,
        owner: String,
    ) -> Result<Result<String, Refusal>, EngineGone> {
        self.ask(|reply| {
            Command::Wake(WakeCommand::Arm {
                ticket,
                owner,
                reply,
            })
        })
        .await
    }

    /// Wake `id` as `owner` sees it (`None` for another's or an unknown one).
    pub async fn wake(&self, id: String, owner: String) -> Result<Option<WakeView>, EngineGone> {
        self.ask(|reply| Command::Wake(WakeCommand::View { id, owner, reply }))
            .await
    }

    /// `owner` was told wake `id`'s outcome.
    pub async fn wake_read(&self, id: String, owner: String) -> Result<(), EngineGone> {
        self.send(Command::Wake(WakeCommand::Read { id, owner }))
            .await
    }

    /// `owner` cancelled wake `id`; false when it has no such wake.
    pub async fn cancel_wake(&self, id: String, owner: String) -> Result<bool, EngineGone> {
        self.ask(|reply| Command::Wake(WakeCommand::Cancel { id, owner, reply }))
            .await
    }
}

/// Handles one wake command.
pub(super) fn dispatch(
    state: &mut State,
    command: WakeCommand,
    now: Timestamp,
    io: &mut Vec<Io>,
    replies: &mut Vec<Deferred>,
) {
    match command {
        WakeCommand::Arm {
            ticket,
            owner,
            reply,
        } => {
            let armed = state.arm_wake(ticket, owner, now);
            // The task is answered once it is durable: the client polls it within ~60 ms, and a
            // restart must not forget a task its client holds.
            replies.push(Box::new(move |stored| {
                let answer = match stored {
                    Ok(()) => armed,
                    Err(e) => Err(Refusal::new(Code::StoreUnavailable,
                        format!("fleetd failed to {e}, so it keeps no task for this ticket: poll it with fleet_poll"),
                    )),
                };
                let _ = reply.send(answer);
            }));
        }
        WakeCommand::View { id, owner, reply } => {
            let _ = reply.send(state.wake_view(&id, &owner, now));
        }
        WakeCommand::Read { id, owner } => state.wake_read(&id, &owner, now),
        WakeCommand::Cancel { id, owner, reply } => {
            let _ = reply.send(state.cancel_wake(&id, &owner, now, io));
        }
    }
}

//! Wakes: a ticket watched for its caller through an MCP task (SEP-2663), so a client that
//! polls `tasks/get` (Claude Code ≥ 2.1.3xx) starts a turn by itself when the ticket has news —
//! nothing typed into its pane. A wake is a view of its ticket: it keeps who may read it and
//! whether it was read or cancelled, never a state of its own; what `tasks/get` answers is
//! derived from the ticket (and its member's open question) when it is asked.
//!
//! While a wake is live (neither read nor cancelled) the news it carries is not nudged about:
//! its reply is handed (as to a waiting `fleet_send`), its question held back from the push
//! loop. Once read, the reply is the reader's like a waiter's (its next call acknowledges it).
//! Cancelled, or not read within [`WAKE_GRACE`] of the news (a client that lost its
//! connection), the news goes back to the nudge. Wakes are durable: a restart keeps them.

use fleetd_core::access::Refusal;
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use fleetd_core::{Target, Ticket};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::super::WakeView;
use super::{Io, State};
use crate::store::{StateOp, StateRecord};
use fleetd_core::TicketLookup;

/// The durable record kind.
pub(super) const WAKE: &str = "wake";

/// How long news held for a wake waits for its client's poll before the nudge takes over: well
/// over the five failed polls after which Claude Code stops re-dialling a server
/// (`mcp::TASK_POLL`), so only a client that lost its connection meets it.
pub(in crate::engine) const WAKE_GRACE: SignedDuration = SignedDuration::from_secs(60);

/// One wake.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Wake {
    ticket: Ticket,
    /// Who may read it: the caller's holder id (a lead's pane, `operator`, `member:NAME`).
    owner: String,
    created_at: Timestamp,
    #[serde(default)]
    cancelled: bool,
    /// Its outcome reached the owner (a `tasks/get` answered `completed`).
    #[serde(default)]
    read: bool,
    /// When news was held for it (not kept: after a restart the nudge decides again).
    #[serde(skip)]
    held_at: Option<Timestamp>,
    /// The question held back from the push loop for it.
    #[serde(skip)]
    question: Option<(Target, String)>,
}

impl Wake {
    fn live(&self) -> bool {
        !self.cancelled && !self.read
    }
}

impl State {
    /// Arms a wake on `ticket` for `owner`; its id is a random 128-bit capability.
    pub(in crate::engine) fn arm_wake(
        &mut self,
        ticket: Ticket,
        owner: String,
        now: Timestamp,
    ) -> Result<String, Refusal> {
        let TicketLookup::Live(record) = self.tickets.book.get_at(ticket, now) else {
            return Err(Refusal::new(
                Code::UnknownTicket,
                format!("ticket {ticket} is unknown or expired: nothing to wait for"),
            ));
        };
        let settled = record.state.is_terminal();
        let target = record.target.clone();
        let id = new_wake_id()?;
        let mut wake = Wake {
            ticket,
            owner,
            created_at: now,
            cancelled: false,
            read: false,
            held_at: None,
            question: None,
        };
        // A reply already in the inbox and not handed: this wake carries it from now on.
        if settled
            && !self.handed.contains_key(&ticket)
            && let Some(reply) = self.tickets.replies.get(&ticket)
        {
            let msg_id = reply.msg_id;
            self.hand(ticket, target, msg_id, now);
            wake.held_at = Some(now);
        }
        self.dirty.wakes.insert(id.clone());
        self.wakes.insert(id.clone(), wake);
        self.emit_wake(ticket, "armed", now);
        Ok(id)
    }

    /// Tells the event stream what became of `ticket`'s wake.
    fn emit_wake(&mut self, ticket: Ticket, state: &str, now: Timestamp) {
        if let TicketLookup::Live(r) = self.tickets.book.get_at(ticket, now) {
            let target = r.target.to_string();
            self.emit(crate::events::FleetEvent::TicketWake {
                ticket: ticket.to_string(),
                target,
                state: state.to_owned(),
            });
        }
    }

    /// The wake `id` as `owner` sees it: `None` for another's or an unknown one alike.
    pub(in crate::engine) fn wake_view(
        &self,
        id: &str,
        owner: &str,
        now: Timestamp,
    ) -> Option<WakeView> {
        let wake = self.wakes.get(id).filter(|w| w.owner == owner)?;
        let (target, state) = match self.tickets.book.get_at(wake.ticket, now) {
            TicketLookup::Live(r) => (Some(r.target.clone()), Some(r.state)),
            _ => (None, None),
        };
        let question = target
            .as_ref()
            .and_then(|t| self.questions(Some(t)).into_iter().next());
        Some(WakeView {
            ticket: wake.ticket,
            target,
            state,
            reply: self.tickets.replies.get(&wake.ticket).cloned(),
            question,
            created_at: wake.created_at,
            cancelled: wake.cancelled,
        })
    }

    /// The owner read wake `id`'s outcome: a reply it held is the owner's now (its next call
    /// acknowledges it); a question it held is the owner's to answer.
    pub(in crate::engine) fn wake_read(&mut self, id: &str, owner: &str, now: Timestamp) {
        let Some(wake) = self
            .wakes
            .get_mut(id)
            .filter(|w| w.owner == owner && w.live())
        else {
            return;
        };
        wake.read = true;
        wake.question = None;
        let ticket = wake.ticket;
        self.dirty.wakes.insert(id.to_owned());
        self.handed_to(ticket, owner.to_owned());
        self.emit_wake(ticket, "read", now);
    }

    /// The owner cancelled wake `id`: what it held goes back to the nudge. False when `owner`
    /// has no such wake.
    pub(in crate::engine) fn cancel_wake(
        &mut self,
        id: &str,
        owner: &str,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> bool {
        let Some(wake) = self.wakes.get_mut(id).filter(|w| w.owner == owner) else {
            return false;
        };
        let was_live = wake.live();
        wake.cancelled = true;
        let ticket = wake.ticket;
        self.dirty.wakes.insert(id.to_owned());
        if was_live {
            self.release_wake(id, now, io);
            self.emit_wake(ticket, "cancelled", now);
        }
        true
    }

    /// A reply for `ticket` was stored and no waiter took it: a live wake on it holds it.
    pub(super) fn wake_holds_reply(&mut self, ticket: Ticket, now: Timestamp) -> bool {
        let Some(wake) = self
            .wakes
            .values_mut()
            .find(|w| w.ticket == ticket && w.live())
        else {
            return false;
        };
        wake.held_at.get_or_insert(now);
        true
    }

    /// `target` asked question `id`: a live wake on one of its open tickets holds it back from
    /// the push loop (the wake reports it).
    pub(super) fn wake_holds_question(
        &mut self,
        target: &Target,
        id: &str,
        now: Timestamp,
    ) -> bool {
        let tickets = &self.tickets.book;
        let Some(wake) = self.wakes.values_mut().find(|w| {
            w.live()
                && w.question.is_none()
                && matches!(tickets.get_at(w.ticket, now),
                    TicketLookup::Live(r) if r.target == *target && !r.state.is_terminal())
        }) else {
            return false;
        };
        wake.question = Some((target.clone(), id.to_owned()));
        wake.held_at.get_or_insert(now);
        true
    }

    /// Wakes whose news waited [`WAKE_GRACE`] unread: the nudge takes over.
    pub(super) fn wakes_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let due: Vec<String> = self
            .wakes
            .iter()
            .filter(|(_, w)| {
                w.live()
                    && w.held_at
                        .and_then(|at| at.checked_add(WAKE_GRACE).ok())
                        .is_some_and(|due| now >= due)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let Some(ticket) = self.wakes.get(&id).map(|w| w.ticket) else {
                continue;
            };
            tracing::info!(%ticket, "a wake was not read in time; the nudge takes over");
            self.release_wake(&id, now, io);
            self.emit_wake(ticket, "lapsed", now);
        }
    }

    /// Gives what wake `id` held back to the nudge; it holds nothing after.
    fn release_wake(&mut self, id: &str, now: Timestamp, io: &mut Vec<Io>) {
        let Some(wake) = self.wakes.get_mut(id) else {
            return;
        };
        let ticket = wake.ticket;
        let question = wake.question.take();
        wake.held_at = None;
        if self
            .handed
            .get(&ticket)
            .is_some_and(|h| h.holder().is_none())
        {
            self.unhand(ticket, now, io);
        }
        if let Some((target, question_id)) = question
            && self.questions.contains_key(&question_id)
        {
            self.feed_push(
                PushInput::QuestionOpened {
                    target,
                    question_id,
                },
                now,
                io,
            );
        }
    }

    /// Forgets the wakes of pruned `ticket`.
    pub(super) fn forget_wakes(&mut self, ticket: Ticket) {
        let gone: Vec<String> = self
            .wakes
            .iter()
            .filter(|(_, w)| w.ticket == ticket)
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.wakes.remove(&id);
            self.dirty.wakes.insert(id);
        }
    }

    /// The durable op for wake `id`.
    pub(super) fn wake_op(&self, id: String) -> Option<StateOp> {
        match self.wakes.get(&id) {
            Some(wake) => match serde_json::to_string(wake) {
                Ok(value) => Some(StateOp::Put(StateRecord {
                    kind: WAKE.to_owned(),
                    key: id,
                    value,
                })),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a wake");
                    None
                }
            },
            None => Some(StateOp::Delete {
                kind: WAKE.to_owned(),
                key: id,
            }),
        }
    }

    /// Restores a wake kept before the restart.
    pub(super) fn restore_wake(&mut self, id: String, value: &str) {
        match serde_json::from_str::<Wake>(value) {
            Ok(wake) => {
                self.wakes.insert(id, wake);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a kept wake does not decode; its client will hear \"not found\"")
            }
        }
    }
}

/// A fresh wake id: 128 random bits, hex.
fn new_wake_id() -> Result<String, Refusal> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| {
        Refusal::new(Code::NoRandomness,
            format!("the system gave no random bytes for a task id ({e}): retry, or call with wait=false"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

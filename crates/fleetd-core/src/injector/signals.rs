//! What the injector is told ([`InjectorInput`], with a member's [`Activity`] and how a typing
//! went, [`TypeOutcome`]) and what it asks its driver to do ([`InjectorEffect`]).

use jiff::Timestamp;

use crate::ids::{Target, Ticket};
use crate::ticket::TicketEvent;

/// What the multiplexer says a member is doing, reduced to what delivery needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Idle or done: a prompt is waiting for input.
    AtRest,
    /// Working (or blocked on a prompt of its own): not ready for a task.
    Busy,
    /// No reading yet.
    Unknown,
}

/// How typing a task (or the Enter retry) went, as the driver learned it from the multiplexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeOutcome {
    /// The multiplexer took it. Whether the member's turn started is for verification to see.
    Accepted,
    /// The multiplexer took it and saw the member reach working: proof the turn started, as
    /// good as a busy reading for this ticket.
    Started,
    /// The call failed after the text may have reached the pane (it timed out or broke once the
    /// request was out). Treated as typed and verified from the member's status; never typed
    /// again.
    Uncertain,
    /// Nothing was typed: the multiplexer refused, or the call failed before anything could be
    /// written.
    Failed,
}

/// Inputs to the injector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectorInput {
    /// A member joined (spawned, or adopted at start-up).
    MemberAdded {
        /// The member.
        target: Target,
    },
    /// Queue a task for a member, behind any already queued.
    Enqueue {
        /// The member.
        target: Target,
        /// The task's ticket.
        ticket: Ticket,
    },
    /// The member's agent status changed.
    Activity {
        /// The member.
        target: Target,
        /// Its new activity.
        activity: Activity,
    },
    /// A process in the member's pane opened an MCP session with fleetd (this incarnation).
    PresenceSeen {
        /// The member.
        target: Target,
    },
    /// The driver finished typing a task (or pressing Enter again).
    Typed {
        /// The member.
        target: Target,
        /// The ticket typed.
        ticket: Ticket,
        /// How it went.
        outcome: TypeOutcome,
    },
    /// The member answered a ticket with `fleet_reply`.
    Replied {
        /// The member.
        target: Target,
        /// The ticket answered.
        ticket: Ticket,
    },
    /// Whether the member has delegated work outstanding: tickets it sent that are still open,
    /// or its own members' replies or questions it has not read. While it has, a turn of its
    /// that ends without a reply is not over — it waits on its members, and owes its reply in a
    /// later turn (the one its nudge starts): no fallback is recorded, and nothing else is
    /// typed meanwhile. Once it has none, a turn still unanswered at rest is recorded.
    Delegating {
        /// The member.
        target: Target,
        /// Delegated work is outstanding.
        outstanding: bool,
    },
    /// Something else was just typed into the member's pane — a nudge, when the member is a
    /// delegating one and so also a lead — and nothing may be typed after it until the member
    /// is seen busy (the turn it started) or `until` passes; `None` lifts the hold (it was not
    /// typed after all).
    Hold {
        /// The member.
        target: Target,
        /// Until when at most.
        until: Option<Timestamp>,
    },
    /// The turn a fallback was about to be recorded for was not the task's: its text still sits
    /// unsent in the member's input box (a status blip — Codex's spinner at the end of its
    /// start-up — read as its turn). Nothing is recorded; Enter is pressed once more and the
    /// delivery is verified again, then `stalled` if no turn starts.
    NotSubmitted {
        /// The member.
        target: Target,
        /// The ticket whose text waits.
        ticket: Ticket,
    },
    /// The turn a fallback was about to be recorded for has not ended: the member reads busy
    /// again (an agent's title can read at rest a moment before the dialog it draws). Nothing
    /// is recorded; the turn is the current one again, `answered` when its reply came meanwhile.
    TurnGoesOn {
        /// The member.
        target: Target,
        /// The ticket whose turn goes on.
        ticket: Ticket,
        /// Whether the ticket was answered while the fallback was being looked at.
        answered: bool,
    },
    /// The driver recorded the fallback message for a turn that ended without a reply.
    FallbackRecorded {
        /// The member.
        target: Target,
    },
    /// Time passed; deadlines are checked.
    Tick,
    /// The member is gone; its queue is dropped (the caller fails the tickets).
    MemberRemoved {
        /// The member.
        target: Target,
    },
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InjectorEffect {
    /// Type the ticket's task into the member's pane and submit it; report with `Typed`.
    Type {
        /// The member.
        target: Target,
        /// The ticket whose task to type.
        ticket: Ticket,
    },
    /// Press Enter again in the member's pane (the first submit was not seen); report with `Typed`.
    Resubmit {
        /// The member.
        target: Target,
        /// The ticket being delivered.
        ticket: Ticket,
    },
    /// Apply an event to a ticket.
    Ticket {
        /// The ticket.
        ticket: Ticket,
        /// The event.
        event: TicketEvent,
    },
    /// The member's turn for `ticket` ended with no reply: capture the pane's tail, publish it
    /// as a fallback message, apply `TurnEndedWithoutReply`, then report `FallbackRecorded`.
    RecordFallback {
        /// The member.
        target: Target,
        /// The ticket.
        ticket: Ticket,
    },
}

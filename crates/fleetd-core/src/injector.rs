//! The injector's policy (SPEC §3 delivery rules): one FIFO of tasks per member, a task typed only
//! when the member is ready (at rest and its MCP presence seen), delivery verified by the member
//! leaving rest within a grace period (one retry of the submit, then `stalled`), and the
//! turn-done fallback when a turn ends without a reply. Pure: inputs and `now` in, effects out;
//! the driver performs them and reports results back as inputs.
//!
//! A task's text is typed at most once (SPEC §13.7). Only a typing that affirmatively wrote
//! nothing ([`TypeOutcome::Failed`]) is tried again; one that may have reached the pane
//! ([`TypeOutcome::Uncertain`]) is verified like a typed one, and the one retry after that is
//! an Enter press, never the text. That one Enter retry per delivery is decided here and only
//! here: a multiplexer presses nothing of its own accord, and a typing it saw start the turn
//! ([`TypeOutcome::Started`]) needs none.

use std::collections::{BTreeMap, VecDeque};

use jiff::{SignedDuration, Timestamp};

use crate::ids::{Target, Ticket};
use crate::ticket::TicketEvent;

mod signals;

pub use signals::{Activity, InjectorEffect, InjectorInput, TypeOutcome};

/// How many times typing a task may fail (nothing typed) before the ticket is `stalled`.
const MAX_TYPE_FAILURES: u8 = 3;
/// Wait between attempts after a typing that wrote nothing.
const TYPE_RETRY: SignedDuration = SignedDuration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// The driver is typing; no answer yet.
    Typing { resubmit: bool },
    /// Typed; the member must leave rest before `deadline`.
    Verifying {
        deadline: Timestamp,
        resubmitted: bool,
    },
}

#[derive(Debug, Clone)]
struct InFlight {
    ticket: Ticket,
    phase: Phase,
}

impl InFlight {
    /// `ticket` handed to the driver to type (`resubmit`: only its Enter again), no answer yet.
    fn typing(ticket: Ticket, resubmit: bool) -> Self {
        Self {
            ticket,
            phase: Phase::Typing { resubmit },
        }
    }
}

#[derive(Debug, Clone)]
struct Lane {
    queue: VecDeque<Ticket>,
    activity: Activity,
    presence: bool,
    in_flight: Option<InFlight>,
    /// The ticket whose turn is running, and whether it was answered.
    current: Option<(Ticket, bool)>,
    /// A fallback is being recorded: nothing is typed until it is (its tail must not include
    /// the next task).
    recording: bool,
    /// The member has delegated work outstanding ([`InjectorInput::Delegating`]).
    delegating: bool,
    /// Nothing is typed before this ([`InjectorInput::Hold`]).
    held_until: Option<Timestamp>,
    /// Typing failures of the head task, and when to try again.
    type_failures: u8,
    retry_at: Option<Timestamp>,
}

impl Lane {
    fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            activity: Activity::Unknown,
            presence: false,
            in_flight: None,
            current: None,
            recording: false,
            delegating: false,
            held_until: None,
            type_failures: 0,
            retry_at: None,
        }
    }

    fn ready_at(&self, now: Timestamp) -> bool {
        self.activity == Activity::AtRest
            && self.presence
            && self.in_flight.is_none()
            && self.current.is_none()
            && !self.recording
            && self.retry_at.is_none_or(|t| now >= t)
            && self.held_until.is_none_or(|t| now >= t)
    }
}

/// Per-member task queues and delivery verification.
#[derive(Debug, Clone)]
pub struct Injector {
    lanes: BTreeMap<Target, Lane>,
    grace: SignedDuration,
}

impl Injector {
    /// An injector whose members must leave rest within `grace` of a submit.
    pub fn new(grace: SignedDuration) -> Self {
        Self {
            lanes: BTreeMap::new(),
            grace,
        }
    }

    /// Members must leave rest within `grace` of a submit from now on (a reload changed it); a
    /// delivery already being verified keeps its deadline.
    pub fn set_grace(&mut self, grace: SignedDuration) {
        self.grace = grace;
    }

    /// Tasks waiting (not yet typed) for `target`.
    pub fn queued(&self, target: &Target) -> usize {
        self.lanes.get(target).map_or(0, |l| l.queue.len())
    }

    /// The ticket whose turn is running on `target`, if any.
    pub fn current(&self, target: &Target) -> Option<Ticket> {
        let lane = self.lanes.get(target)?;
        lane.current
            .map(|(t, _)| t)
            .or_else(|| lane.in_flight.as_ref().map(|f| f.ticket))
    }

    /// The ticket being typed into `target` (handed to the driver, no answer yet), if any.
    pub fn typing(&self, target: &Target) -> Option<Ticket> {
        self.lanes
            .get(target)?
            .in_flight
            .as_ref()
            .filter(|f| matches!(f.phase, Phase::Typing { .. }))
            .map(|f| f.ticket)
    }

    /// Whether a task is being delivered to `target`, or would be typed at `now`: its pane is
    /// not free for anything else to be typed into.
    pub fn would_type(&self, target: &Target, now: Timestamp) -> bool {
        self.lanes
            .get(target)
            .is_some_and(|l| l.in_flight.is_some() || (!l.queue.is_empty() && l.ready_at(now)))
    }

    /// Whether fleetd has seen an MCP session from `target`'s pane since it joined.
    pub fn presence(&self, target: &Target) -> bool {
        self.lanes.get(target).is_some_and(|l| l.presence)
    }

    /// After a restart: `ticket` was typed into `target`'s pane before, and whether its turn ran
    /// or still runs is not known. It becomes the lane's current turn (unanswered), so a reply
    /// settles it and the member's next rest records the turn-done fallback: it is never typed
    /// again. The member must have been added.
    pub fn restore_current(&mut self, target: &Target, ticket: Ticket) {
        if let Some(lane) = self.lanes.get_mut(target) {
            lane.queue.retain(|t| *t != ticket);
            lane.current = Some((ticket, false));
        }
    }

    /// After a restart: `ticket` was handed to the multiplexer before, and whether it reached
    /// `target`'s pane is not known until the driver has looked. The lane types nothing until
    /// the driver says, with `InjectorInput::Typed`: [`TypeOutcome::Uncertain`] when it may
    /// have arrived (verified like any uncertain typing), [`TypeOutcome::Failed`] when it did
    /// not (typed again, first in its lane). A busy reading meanwhile is its turn. The member
    /// must have been added.
    pub fn restore_typing(&mut self, target: &Target, ticket: Ticket) {
        if let Some(lane) = self.lanes.get_mut(target) {
            lane.queue.retain(|t| *t != ticket);
            lane.in_flight = Some(InFlight::typing(ticket, false));
        }
    }

    /// The earliest deadline the driver must wake for, if any.
    pub fn next_wake(&self) -> Option<Timestamp> {
        self.lanes
            .values()
            .flat_map(|l| {
                let verify = match &l.in_flight {
                    Some(InFlight {
                        phase: Phase::Verifying { deadline, .. },
                        ..
                    }) => Some(*deadline),
                    _ => None,
                };
                verify
                    .into_iter()
                    .chain(l.retry_at)
                    .chain(l.held_until.filter(|_| !l.queue.is_empty()))
            })
            .min()
    }

    /// Handles one input at `now`.
    pub fn handle_at(&mut self, input: InjectorInput, now: Timestamp) -> Vec<InjectorEffect> {
        let mut out = Vec::new();
        match input {
            InjectorInput::MemberAdded { target } => {
                self.lanes.entry(target).or_insert_with(Lane::new);
            }
            InjectorInput::MemberRemoved { target } => {
                self.lanes.remove(&target);
            }
            InjectorInput::Enqueue { target, ticket } => {
                self.lanes
                    .entry(target.clone())
                    .or_insert_with(Lane::new)
                    .queue
                    .push_back(ticket);
                self.pump(&target, now, &mut out);
            }
            InjectorInput::PresenceSeen { target } => {
                if let Some(lane) = self.lanes.get_mut(&target) {
                    lane.presence = true;
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Activity { target, activity } => {
                self.activity(&target, activity, &mut out);
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Typed {
                target,
                ticket,
                outcome,
            } => {
                self.typed(&target, ticket, outcome, now, &mut out);
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Replied { target, ticket } => {
                if let Some(lane) = self.lanes.get_mut(&target) {
                    if let Some((current, answered)) = &mut lane.current
                        && *current == ticket
                    {
                        *answered = true;
                    }
                    // A reply to the task being verified proves it arrived, even when the turn
                    // was too short for a status reading to see it working.
                    if lane.in_flight.as_ref().is_some_and(|f| f.ticket == ticket) {
                        lane.in_flight = None;
                        if lane.activity != Activity::AtRest {
                            lane.current = Some((ticket, true));
                        }
                    }
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Delegating {
                target,
                outstanding,
            } => {
                if let Some(lane) = self.lanes.get_mut(&target) {
                    lane.delegating = outstanding;
                }
                if !outstanding
                    && self
                        .lanes
                        .get(&target)
                        .is_some_and(|l| l.activity == Activity::AtRest)
                {
                    // At rest already (it read its members' mail and stopped): the turn ends now.
                    self.turn_over(&target, &mut out);
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Hold { target, until } => {
                if let Some(lane) = self.lanes.get_mut(&target) {
                    lane.held_until = until;
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::NotSubmitted { target, ticket } => {
                if let Some(lane) = self.lanes.get_mut(&target)
                    && lane.recording
                    && lane.in_flight.is_none()
                {
                    lane.recording = false;
                    lane.in_flight = Some(InFlight::typing(ticket, true));
                    out.push(InjectorEffect::Resubmit {
                        target: target.clone(),
                        ticket,
                    });
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::TurnGoesOn {
                target,
                ticket,
                answered,
            } => {
                if let Some(lane) = self.lanes.get_mut(&target)
                    && lane.recording
                    && lane.current.is_none()
                {
                    lane.recording = false;
                    lane.current = Some((ticket, answered));
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::FallbackRecorded { target } => {
                if let Some(lane) = self.lanes.get_mut(&target) {
                    lane.recording = false;
                }
                self.pump(&target, now, &mut out);
            }
            InjectorInput::Tick => {
                let targets: Vec<Target> = self.lanes.keys().cloned().collect();
                for target in targets {
                    self.deadlines(&target, now, &mut out);
                    self.pump(&target, now, &mut out);
                }
            }
        }
        out
    }

    fn activity(&mut self, target: &Target, activity: Activity, out: &mut Vec<InjectorEffect>) {
        let Some(lane) = self.lanes.get_mut(target) else {
            return;
        };
        lane.activity = activity;
        match activity {
            Activity::Busy => {
                // Whatever was typed before has started its turn.
                lane.held_until = None;
                // Leaving rest after a submit is the proof the task arrived (typing only
                // starts at rest, so any busy reading while a task is in flight is that turn).
                if let Some(flight) = lane.in_flight.take() {
                    lane.current = Some((flight.ticket, false));
                    out.push(InjectorEffect::Ticket {
                        ticket: flight.ticket,
                        event: TicketEvent::TurnStarted,
                    });
                }
            }
            Activity::AtRest => self.turn_over(target, out),
            Activity::Unknown => {}
        }
    }

    /// The member is at rest: its turn is over unless it waits on delegated work; one that
    /// ended unanswered has its fallback recorded.
    fn turn_over(&mut self, target: &Target, out: &mut Vec<InjectorEffect>) {
        let Some(lane) = self.lanes.get_mut(target) else {
            return;
        };
        if lane.delegating && matches!(lane.current, Some((_, false))) {
            return;
        }
        if let Some((ticket, answered)) = lane.current.take()
            && !answered
        {
            lane.recording = true;
            out.push(InjectorEffect::RecordFallback {
                target: target.clone(),
                ticket,
            });
        }
    }

    fn typed(
        &mut self,
        target: &Target,
        ticket: Ticket,
        outcome: TypeOutcome,
        now: Timestamp,
        out: &mut Vec<InjectorEffect>,
    ) {
        let Some(lane) = self.lanes.get_mut(target) else {
            return;
        };
        let Some(flight) = lane.in_flight.as_mut().filter(|f| f.ticket == ticket) else {
            return; // The turn already started (status arrived first), or the member left.
        };
        let Phase::Typing { resubmit } = flight.phase else {
            return;
        };
        let verify = Phase::Verifying {
            deadline: now.checked_add(self.grace).unwrap_or(now),
            resubmitted: resubmit,
        };
        // A typing that went in (or that the multiplexer saw start the turn) delivered the task;
        // an Enter retry's delivery was said with its text.
        if !resubmit && matches!(outcome, TypeOutcome::Accepted | TypeOutcome::Started) {
            out.push(InjectorEffect::Ticket {
                ticket,
                event: TicketEvent::Delivered,
            });
        }
        match outcome {
            TypeOutcome::Accepted => {
                flight.phase = verify;
                lane.type_failures = 0;
            }
            TypeOutcome::Started => {
                // The multiplexer saw the turn start: what a busy reading would have proved.
                lane.in_flight = None;
                lane.current = Some((ticket, false));
                lane.type_failures = 0;
                out.push(InjectorEffect::Ticket {
                    ticket,
                    event: TicketEvent::TurnStarted,
                });
            }
            TypeOutcome::Uncertain => {
                // It may be in the pane: typing it again could run the task twice. The member's
                // status decides, as after any submit; the ticket claims no delivery it cannot
                // vouch for (a turn seen starting moves it straight on).
                flight.phase = verify;
                lane.type_failures = 0;
            }
            TypeOutcome::Failed if resubmit => {
                // Only the Enter retry failed; the text was typed before it. Never type it again:
                // the member has one more grace to start, then the ticket is stalled.
                flight.phase = verify;
            }
            TypeOutcome::Failed => {
                lane.in_flight = None;
                lane.type_failures += 1;
                if lane.type_failures >= MAX_TYPE_FAILURES {
                    lane.type_failures = 0;
                    lane.queue.retain(|t| *t != ticket);
                    out.push(InjectorEffect::Ticket {
                        ticket,
                        event: TicketEvent::Stalled,
                    });
                } else {
                    // Nothing was typed: keep its place at the head and try again shortly.
                    if !lane.queue.contains(&ticket) {
                        lane.queue.push_front(ticket);
                    }
                    lane.retry_at = now.checked_add(TYPE_RETRY).ok();
                }
            }
        }
    }

    fn deadlines(&mut self, target: &Target, now: Timestamp, out: &mut Vec<InjectorEffect>) {
        let Some(lane) = self.lanes.get_mut(target) else {
            return;
        };
        if lane.retry_at.is_some_and(|t| now >= t) {
            lane.retry_at = None;
        }
        let Some(flight) = lane.in_flight.as_mut() else {
            return;
        };
        let Phase::Verifying {
            deadline,
            resubmitted,
        } = flight.phase
        else {
            return;
        };
        if now < deadline {
            return;
        }
        let ticket = flight.ticket;
        if resubmitted {
            lane.in_flight = None;
            out.push(InjectorEffect::Ticket {
                ticket,
                event: TicketEvent::Stalled,
            });
        } else {
            flight.phase = Phase::Typing { resubmit: true };
            out.push(InjectorEffect::Resubmit {
                target: target.clone(),
                ticket,
            });
        }
    }

    fn pump(&mut self, target: &Target, now: Timestamp, out: &mut Vec<InjectorEffect>) {
        let Some(lane) = self.lanes.get_mut(target) else {
            return;
        };
        if !lane.ready_at(now) {
            return;
        }
        if let Some(ticket) = lane.queue.pop_front() {
            lane.retry_at = None;
            lane.in_flight = Some(InFlight::typing(ticket, false));
            out.push(InjectorEffect::Type {
                target: target.clone(),
                ticket,
            });
        }
    }
}

#[cfg(test)]
mod tests;

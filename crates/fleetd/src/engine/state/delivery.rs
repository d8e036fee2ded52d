//! Delivery: tickets, task texts, waiters and the injector's effects — from `fleet_send` to a
//! settled ticket.

use crate::events::FleetEvent;
use fleetd_core::access::Refusal;
use fleetd_core::injector::{InjectorEffect, InjectorInput, TypeOutcome};
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use fleetd_core::{Message, MessageKind, Target, Ticket, TicketEvent, TicketLookup, TicketState};
use jiff::Timestamp;
use tokio::sync::oneshot;

use super::super::{Delivered, LeadRef, Settled, TicketAnswer, TicketView};
use super::{Io, State, view};

/// A task on its way to `target`'s queue (a `fleet_send`, or a question's late answer): what
/// `State::submit`, `State::enqueue` and `State::submit_remote` take.
pub(in crate::engine) struct TaskOrder<'a> {
    /// The lead whose member `target` becomes for it, if a lead sent it (or adopted it).
    pub(in crate::engine) lead: Option<&'a LeadRef>,
    /// The delegating member that sent it, if a member did.
    pub(in crate::engine) by: Option<Target>,
    /// Whose queue it goes to (`name@gateway`: a member on another host).
    pub(in crate::engine) target: Target,
    /// The task's text.
    pub(in crate::engine) task: String,
}

impl TaskOrder<'_> {
    /// Who sent it, as its ticket names the sender: the delegating member, else the lead.
    pub(super) fn sender(&self) -> Option<String> {
        self.by
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| self.lead.map(|l| State::lead_id(l).0))
    }
}

impl State {
    /// The text typed into a member's pane for `ticket`: its task as the injection plan shapes
    /// it (a long task is referred to, not typed whole).
    pub(super) fn injection_text(&self, ticket: Ticket) -> String {
        let task = self
            .tickets
            .tasks
            .get(&ticket)
            .map(String::as_str)
            .unwrap_or_default();
        fleetd_core::plan_injection(task, ticket, self.max_inject)
            .text()
            .to_owned()
    }

    /// Queues `order`'s task (a `fleet_send`), unless `limits.maxQueuedTasks` tasks already
    /// wait to be typed into its target's pane.
    pub(in crate::engine) fn submit(
        &mut self,
        order: TaskOrder<'_>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<Ticket, Refusal> {
        if order.target.gateway().is_some() {
            return self.submit_remote(order, now, io);
        }
        let target = &order.target;
        let queued = self.injector.queued(target);
        let max = self.limits.max_queued_tasks;
        if self.members.contains_key(target) && u64::try_from(queued).unwrap_or(u64::MAX) >= max {
            return Err(Refusal::new(
                Code::QueueFull,
                format!(
                    "{target} already has {queued} tasks waiting to be typed, the most allowed (limits.maxQueuedTasks = {max}): wait for it to work through them (fleet_status shows its tickets), or raise limits.maxQueuedTasks in the config"
                ),
            ));
        }
        // A delegating member becomes the lead of the member it hands work to.
        let adopted = match &order.by {
            Some(by) if self.members.contains_key(target) => Some(self.send_lead(by, target)?),
            _ => None,
        };
        if let Some(lead) = &adopted {
            self.adopt_as_lead(lead, now, io);
        }
        let lead = adopted.as_ref().or(order.lead);
        self.enqueue(TaskOrder { lead, ..order }, now, io)
    }

    /// Queues `order`'s task whatever its target's queue holds: `submit` past the cap check,
    /// and the path of a question's late answer.
    pub(super) fn enqueue(
        &mut self,
        order: TaskOrder<'_>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<Ticket, Refusal> {
        let sender = order.sender();
        let TaskOrder {
            lead, target, task, ..
        } = order;
        let Some(member) = self.members.get_mut(&target) else {
            return Err(Refusal::new(
                Code::UnknownTarget,
                format!(
                    "no member named {target}: call fleet_list to see members, or fleet_spawn to start one"
                ),
            ));
        };
        if let Some(lead) = lead {
            let id = Self::lead_id(lead);
            member.lead = Some(id.clone());
            self.dirty.members.insert(target.clone());
            self.feed_push(
                PushInput::Bound {
                    target: target.clone(),
                    lead: id,
                },
                now,
                io,
            );
        }
        let ticket = Ticket::from_uuid(self.ids.new_id());
        self.open_ticket(
            super::tickets::Opening {
                ticket,
                target: target.clone(),
                task,
                sender,
                owner: None,
            },
            now,
        );
        self.inject(InjectorInput::Enqueue { target, ticket }, now, io);
        Ok(ticket)
    }

    pub(in crate::engine) fn wait(
        &mut self,
        ticket: Ticket,
        reply: oneshot::Sender<Settled>,
        now: Timestamp,
    ) {
        match self.tickets.book.get_at(ticket, now) {
            TicketLookup::Live(r) if r.state.is_terminal() => {
                let _ = reply.send(Settled {
                    state: r.state,
                    reply: self.tickets.replies.get(&ticket).cloned(),
                });
            }
            TicketLookup::Live(_) => self.tickets.waiters.entry(ticket).or_default().push(reply),
            // Unknown or expired: the sender is dropped; the waiter reads that as "no answer".
            _ => {}
        }
    }

    pub(in crate::engine) fn ticket(&self, ticket: Ticket, now: Timestamp) -> TicketAnswer {
        match self.tickets.book.get_at(ticket, now) {
            TicketLookup::Live(r) => TicketAnswer::Live(view(r, self.tickets.sent_by.get(&ticket))),
            TicketLookup::Expired => TicketAnswer::Expired,
            TicketLookup::Unknown => TicketAnswer::Unknown,
        }
    }

    pub(in crate::engine) fn task_text(
        &self,
        ticket: Ticket,
        now: Timestamp,
    ) -> Option<(Target, String)> {
        let TicketLookup::Live(r) = self.tickets.book.get_at(ticket, now) else {
            return None;
        };
        Some((r.target.clone(), self.tickets.tasks.get(&ticket)?.clone()))
    }

    pub(in crate::engine) fn current_ticket(&self, target: &Target) -> Option<Ticket> {
        self.injector.current(target)
    }

    /// A durable reply (or fallback): settle its ticket, hand it to a waiter if one is alive.
    pub(in crate::engine) fn reply_stored(
        &mut self,
        message: Message,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Delivered {
        let target = message.target.clone();
        // For a ticket another gateway owns, the reply goes there (and not to this host's
        // inbox, where its local copy is removed once it is on its way).
        let forwarded = self.reply_to_owner(&message, io);
        if matches!(message.kind, MessageKind::Reply | MessageKind::Fallback) {
            self.emit(FleetEvent::ReplyStored {
                target: target.to_string(),
                msg_id: message.msg_id.to_string(),
                ticket: message.ticket.map(|t| t.to_string()),
                bytes: message.text.len(),
            });
        }
        let mut delivered = Delivered::Inbox;
        if let Some(ticket) = message.ticket {
            let event = match message.kind {
                MessageKind::Fallback => TicketEvent::TurnEndedWithoutReply,
                _ => TicketEvent::Replied,
            };
            if message.kind == MessageKind::Reply {
                self.inject(
                    InjectorInput::Replied {
                        target: target.clone(),
                        ticket,
                    },
                    now,
                    io,
                );
            }
            let msg_id = message.msg_id;
            self.tickets.replies.insert(ticket, message);
            if self.apply(ticket, event, now) {
                if self.settle(ticket, now) {
                    delivered = Delivered::Waiter;
                    // Until the waiter's caller is known to have it, it is not mail to nudge about.
                    self.hand(ticket, target.clone(), msg_id, now);
                } else if self.wake_holds_reply(ticket, now) {
                    // Its caller's MCP task reports it: no nudge while the task is live.
                    self.hand(ticket, target.clone(), msg_id, now);
                }
            }
        }
        if !forwarded {
            self.depth_pending.insert(target.clone());
            io.push(Io::Depth { target });
        }
        delivered
    }

    /// Sets the `fleetd_tickets{state}` gauges from the book.
    pub(super) fn ticket_gauges(&self) {
        let counts = self.tickets.book.count_by_state();
        for state in fleetd_core::TicketState::ALL {
            #[expect(
                clippy::cast_precision_loss,
                reason = "a gauge: ticket counts are far below 2^52"
            )]
            let n = counts.get(&state).copied().unwrap_or(0) as f64;
            metrics::gauge!("fleetd_tickets", "state" => state.as_str()).set(n);
        }
    }

    /// Applies a ticket event; true when it changed the ticket.
    pub(super) fn apply(&mut self, ticket: Ticket, event: TicketEvent, now: Timestamp) -> bool {
        // A task leaving the queue for its member is its delivery, timed once: typed, or its
        // turn seen starting before the typing was confirmed (the member's title can change
        // first on a loaded machine; the `delivered` that follows no longer applies).
        let queued_since = match self.tickets.book.get_at(ticket, now) {
            TicketLookup::Live(r) if r.state == TicketState::Queued => Some(r.created_at),
            _ => None,
        };
        let report = event.clone();
        let applied = self.apply_event(ticket, event, now);
        if let Some(state) = applied {
            let waited = queued_since
                .filter(|_| matches!(state, TicketState::Delivered | TicketState::Working))
                .map(|created| now.duration_since(created));
            if let Some(waited) = waited {
                metrics::histogram!("fleetd_delivery_seconds")
                    .record(waited.as_secs_f64().max(0.0));
            }
            self.dirty.tickets.insert(ticket);
            self.emit_ticket_state(ticket, now, waited);
            self.report_to_owner(ticket, &report);
        }
        self.ticket_gauges();
        applied.is_some()
    }

    /// Emits `ticket`'s current state.
    pub(super) fn emit_ticket(&mut self, ticket: Ticket, now: Timestamp) {
        self.emit_ticket_state(ticket, now, None);
    }

    /// Emits `ticket`'s current state, with how long it waited to be delivered when it just was
    /// (the dashboard's delivery chart).
    fn emit_ticket_state(
        &mut self,
        ticket: Ticket,
        now: Timestamp,
        waited: Option<jiff::SignedDuration>,
    ) {
        if let TicketLookup::Live(r) = self.tickets.book.get_at(ticket, now) {
            let event = FleetEvent::TicketState {
                ticket: ticket.to_string(),
                target: r.target.to_string(),
                state: r.state.as_str().to_owned(),
                waited_ms: waited.map(super::push::millis),
            };
            self.emit(event);
        }
    }

    /// Applies `event` to `ticket` in the book: its state now, `None` when it did not apply.
    pub(super) fn apply_event(
        &mut self,
        ticket: Ticket,
        event: TicketEvent,
        now: Timestamp,
    ) -> Option<TicketState> {
        match self.tickets.book.apply_at(ticket, event, now) {
            Ok(state) => Some(state),
            Err(refusal) => {
                tracing::debug!(%refusal, "ticket event ignored");
                None
            }
        }
    }

    /// Hands a settled ticket to its waiters; true when at least one was still listening.
    pub(super) fn settle(&mut self, ticket: Ticket, now: Timestamp) -> bool {
        let TicketLookup::Live(record) = self.tickets.book.get_at(ticket, now) else {
            return false;
        };
        if !record.state.is_terminal() {
            return false;
        }
        let settled = Settled {
            state: record.state,
            reply: self.tickets.replies.get(&ticket).cloned(),
        };
        let mut taken = false;
        for waiter in self.tickets.waiters.remove(&ticket).unwrap_or_default() {
            taken |= waiter.send(settled.clone()).is_ok();
        }
        taken
    }

    pub(in crate::engine) fn recent(&self, target: &Target) -> Vec<TicketView> {
        self.tickets
            .book
            .recent_for(target, 10)
            .into_iter()
            .map(|r| view(r, self.tickets.sent_by.get(&r.ticket)))
            .collect()
    }

    pub(in crate::engine) fn typed(
        &mut self,
        target: &Target,
        ticket: Ticket,
        outcome: TypeOutcome,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let effects = self.injector.handle_at(
            InjectorInput::Typed {
                target: target.clone(),
                ticket,
                outcome,
            },
            now,
        );
        // A typing that wrote nothing gave the task back to its queue (a failed Enter retry
        // keeps it in flight): it is untyped again, and a restart may type it.
        if outcome == TypeOutcome::Failed
            && self.injector.current(target) != Some(ticket)
            && self.tickets.typed.remove(&ticket)
        {
            self.dirty.tickets.insert(ticket);
        }
        self.injector_effects(effects, now, io);
    }

    /// A turn ended without a reply and its pane tail could not be stored: the ticket still
    /// ends, with no fallback message to show.
    pub(in crate::engine) fn turn_ended_unrecorded(&mut self, ticket: Ticket, now: Timestamp) {
        tracing::warn!(%ticket, "the turn ended without a reply and its fallback could not be stored");
        if self.apply(ticket, TicketEvent::TurnEndedWithoutReply, now) {
            self.settle(ticket, now);
        }
    }

    pub(in crate::engine) fn fallback_recorded(
        &mut self,
        target: Target,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        self.inject(InjectorInput::FallbackRecorded { target }, now, io);
    }

    /// The turn a fallback was to be recorded for was not over: with `unsent` it was not the
    /// task's (its text still waits in the member's input: Enter once more, verified again),
    /// else the member reads busy again and the turn goes on.
    pub(in crate::engine) fn turn_not_over(
        &mut self,
        target: Target,
        ticket: Ticket,
        unsent: bool,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let input = if unsent {
            tracing::info!(%target, %ticket, "the task still waits unsent in the member's input: pressing Enter once more");
            InjectorInput::NotSubmitted { target, ticket }
        } else {
            tracing::debug!(%target, %ticket, "the member reads busy again: its turn goes on");
            let answered = self.tickets.replies.contains_key(&ticket);
            InjectorInput::TurnGoesOn {
                target,
                ticket,
                answered,
            }
        };
        self.inject(input, now, io);
    }

    /// Feeds the injector one input and carries out what it answers.
    pub(super) fn inject(&mut self, input: InjectorInput, now: Timestamp, io: &mut Vec<Io>) {
        let effects = self.injector.handle_at(input, now);
        self.injector_effects(effects, now, io);
    }

    fn injector_effects(&mut self, effects: Vec<InjectorEffect>, now: Timestamp, io: &mut Vec<Io>) {
        for effect in effects {
            match effect {
                InjectorEffect::Type { target, ticket } => {
                    let Some(pane) = self.members.get(&target).map(|m| m.pane.clone()) else {
                        continue;
                    };
                    let text = self.injection_text(ticket);
                    // Durable before it is typed: after a restart it is never typed again.
                    if self.tickets.typed.insert(ticket) {
                        self.dirty.tickets.insert(ticket);
                    }
                    io.push(Io::Type {
                        target,
                        ticket,
                        pane,
                        text,
                    });
                }
                InjectorEffect::Resubmit { target, ticket } => {
                    if let Some(pane) = self.members.get(&target).map(|m| m.pane.clone()) {
                        io.push(Io::Enter {
                            target,
                            ticket,
                            pane,
                        });
                    }
                }
                InjectorEffect::RecordFallback { target, ticket } => {
                    match self.members.get(&target).map(|m| m.pane.clone()) {
                        Some(pane) => io.push(Io::Fallback {
                            target,
                            ticket,
                            pane,
                            text: self.injection_text(ticket),
                        }),
                        None => {
                            self.inject(InjectorInput::FallbackRecorded { target }, now, io);
                        }
                    }
                }
                InjectorEffect::Ticket { ticket, event } => {
                    let stalled = event == TicketEvent::Stalled;
                    if self.apply(ticket, event, now) {
                        let settled_waiter = self.settle(ticket, now);
                        if stalled
                            && !settled_waiter
                            && let TicketLookup::Live(r) = self.tickets.book.get_at(ticket, now)
                        {
                            io.push(Io::Notice {
                                target: r.target.clone(),
                                ticket: Some(ticket),
                                kind: MessageKind::Incident,
                                text: format!("[fleet] ticket {ticket} to {} stalled: the member did not start working after the task was typed and Enter pressed again", r.target),
                            });
                        }
                    }
                }
            }
        }
    }
}

//! What another gateway's message does here (SPEC §12): each kind checked against the rights
//! this gateway gave its sender (`gateway.peers`), then taken in — a task queued on a member here,
//! a ticket's news for a lead here, a reply stored, a question opened, an answer routed, a stop
//! carried out — or refused with the reason `gateway_refusals` counts.

use fleetd_core::gateway::{Envelope, GatewayName, Kind};
use fleetd_core::injector::InjectorInput;
use fleetd_core::push::PushInput;
use fleetd_core::{Target, TicketEvent};
use jiff::Timestamp;

use super::gateway::{
    AnswerBody, GatewayOutcome, QuestionBody, ReplyBody, StopBody, TaskBody, TicketBody, done_key,
};
use super::gateway_refusals::{PeerRefusal, reason};
use super::{Io, State};
use crate::config::PeerRight;
use crate::events::FleetEvent;

/// Refused: `gateway.peers.<src>.allow` lacks `right`, so `src` may not do `what`.
fn not_allowed(src: &GatewayName, what: &str, right: &str) -> GatewayOutcome {
    GatewayOutcome::refused(
        reason::NOT_ALLOWED,
        format!("gateway {src} may not {what} (gateway.peers.{src}.allow has no `{right}`)"),
    )
}

impl State {
    /// Takes in `envelope` from another gateway by its kind, once its sender has the right for it.
    pub(super) fn take_in(
        &mut self,
        envelope: Envelope,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> GatewayOutcome {
        let src = envelope.src.clone();
        let allowed = |right: PeerRight, s: &Self| {
            s.gateway
                .as_ref()
                .and_then(|g| g.peers.get(src.as_str()))
                .is_some_and(|rights| rights.contains(&right))
        };
        match envelope.kind {
            Kind::Task => {
                if !allowed(PeerRight::Send, self) {
                    return not_allowed(&src, "send tasks here", "send");
                }
                let Ok(body) = serde_json::from_value::<TaskBody>(envelope.body) else {
                    return GatewayOutcome::malformed("a task without its ticket, member or text");
                };
                if self.tickets.book.record(body.ticket).is_some()
                    || self.tickets.book.pruned_at(body.ticket).is_some()
                {
                    return GatewayOutcome::Taken; // a copy of one already taken
                }
                let member = Target::local(body.member.as_str())
                    .ok()
                    .filter(|t| self.members.contains_key(t));
                // No such member, or its queue is full (`limits.maxQueuedTasks` holds for every
                // sender, so another gateway cannot lock this host's own lead out): the ticket
                // ends at once, saying why, and nothing is queued.
                let unqueued = match &member {
                    None => Some(format!(
                        "no member {} on gateway {}",
                        body.member,
                        self.me_name()
                    )),
                    Some(m) => {
                        let queued = self.injector.queued(m);
                        let max = self.limits.max_queued_tasks;
                        (u64::try_from(queued).unwrap_or(u64::MAX) >= max).then(|| {
                            format!(
                                "queue_full: {} on gateway {} already has {queued} tasks waiting to be typed, the most allowed there (limits.maxQueuedTasks = {max}); send it again once it has worked through them",
                                body.member,
                                self.me_name()
                            )
                        })
                    }
                };
                let Some(member) = member.filter(|_| unqueued.is_none()) else {
                    let why = unqueued.unwrap_or_default();
                    tracing::info!(member = %body.member, from = %src, "a task from another gateway ended unqueued");
                    let reply = TicketBody {
                        ticket: body.ticket,
                        event: TicketEvent::Cancelled(why),
                    };
                    self.send_out(&src, Kind::Ticket, reply);
                    return GatewayOutcome::Taken;
                };
                self.open_ticket(
                    super::tickets::Opening {
                        ticket: body.ticket,
                        target: member.clone(),
                        task: body.task,
                        sender: Some(body.by),
                        owner: Some(src),
                    },
                    now,
                );
                self.inject(
                    InjectorInput::Enqueue {
                        target: member,
                        ticket: body.ticket,
                    },
                    now,
                    io,
                );
                GatewayOutcome::Taken
            }
            Kind::Ticket => {
                let Ok(body) = serde_json::from_value::<TicketBody>(envelope.body) else {
                    return GatewayOutcome::malformed("a ticket event without its ticket or event");
                };
                if !self.sent_there(body.ticket, &src) {
                    return GatewayOutcome::refused(
                        reason::NEVER_SENT,
                        format!("ticket {} was never sent to gateway {src}", body.ticket),
                    );
                }
                self.apply(body.ticket, body.event, now);
                self.settle(body.ticket, now);
                GatewayOutcome::Taken
            }
            Kind::Reply => {
                let Ok(body) = serde_json::from_value::<ReplyBody>(envelope.body) else {
                    return GatewayOutcome::malformed("a reply without its message");
                };
                let Some(ticket) = body.message.ticket else {
                    return GatewayOutcome::malformed("a reply for no ticket");
                };
                if !self.sent_there(ticket, &src)
                    || body.message.target.gateway() != Some(src.as_str())
                {
                    return GatewayOutcome::refused(
                        reason::NEVER_SENT,
                        format!(
                            "a reply for ticket {ticket}, which was never sent to gateway {src}"
                        ),
                    );
                }
                GatewayOutcome::PublishReply(Box::new(body.message))
            }
            Kind::Stop => {
                if !allowed(PeerRight::Stop, self) {
                    return not_allowed(&src, "stop members here", "stop");
                }
                let Ok(body) = serde_json::from_value::<StopBody>(envelope.body) else {
                    return GatewayOutcome::malformed("a stop without its member");
                };
                if let Ok(member) = Target::local(body.member.as_str()) {
                    let cause = format!("{} (by gateway {src})", body.cause);
                    if let Some(pane) = self.release(&member, &cause, now, io) {
                        io.push(Io::Close { pane });
                    }
                }
                GatewayOutcome::Taken
            }
            Kind::Question => self.question_in(&src, envelope.body, now, io),
            Kind::Answer => {
                let Ok(body) = serde_json::from_value::<AnswerBody>(envelope.body) else {
                    return GatewayOutcome::malformed("an answer without its question id or text");
                };
                let asked_there = self
                    .questions
                    .get(&body.question_id)
                    .is_some_and(|q| q.target.gateway().is_none() && q.peer.as_ref() == Some(&src));
                if !asked_there && !allowed(PeerRight::Answer, self) {
                    // Answered already (a copy), or never asked there: either way nothing to do
                    // unless it is one this gateway knows, which it would have found.
                    if self.questions.contains_key(&body.question_id) {
                        return GatewayOutcome::refused(
                            reason::NOT_ALLOWED,
                            format!(
                                "question {} was not asked of gateway {src} (gateway.peers.{src}.allow has no `answer`)",
                                body.question_id
                            ),
                        );
                    }
                    return GatewayOutcome::Taken;
                }
                if !self.questions.contains_key(&body.question_id) {
                    return GatewayOutcome::Taken; // answered already: a copy
                }
                match self.answer(&body.question_id, body.answer, now, io) {
                    Ok(_) => GatewayOutcome::Taken,
                    Err(refusal) => {
                        GatewayOutcome::refused(reason::UNDELIVERABLE, &refusal.message)
                    }
                }
            }
            Kind::Spawn => {
                if !allowed(PeerRight::Spawn, self) {
                    // Answered with the reason, so the asking call does not wait in vain; a
                    // refusal all the same, so counted and an incident here too.
                    let why = format!(
                        "gateway {src} may not spawn members on gateway {} (gateway.peers.{src}.allow has no `spawn` there)",
                        self.me_name()
                    );
                    let outcome = self.spawn_refused(&src, envelope.body, &why);
                    if outcome == GatewayOutcome::Taken {
                        let refused = PeerRefusal {
                            from: Some(src.to_string()),
                            reason: reason::NOT_ALLOWED,
                            why,
                            parked: false,
                        };
                        self.gateway_refused(refused, now, io);
                    }
                    return outcome;
                }
                self.spawn_in(&src, envelope.body, now)
            }
            Kind::Spawned => self.spawned_in(&src, envelope.body, now, io),
        }
    }

    /// A question of a member on gateway `src` about a task this gateway's lead sent it: kept
    /// here under the member's `name@src` until a lead answers it, and nudged about like a
    /// local member's.
    pub(super) fn question_in(
        &mut self,
        src: &GatewayName,
        body: serde_json::Value,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> GatewayOutcome {
        let Ok(body) = serde_json::from_value::<QuestionBody>(body) else {
            return GatewayOutcome::malformed("a question without its id, member, ticket or text");
        };
        let Ok(target) = Target::local(body.member.as_str()).map(|t| t.at(src.as_str())) else {
            // Not quoted: the name is whatever the body held.
            return GatewayOutcome::malformed("a question whose member is not a member name");
        };
        if !self.sent_there(body.ticket, src)
            || self.tickets.book.record(body.ticket).map(|r| &r.target) != Some(&target)
        {
            return GatewayOutcome::refused(
                reason::NEVER_SENT,
                format!(
                    "a question about ticket {}, which was never sent to {target}",
                    body.ticket
                ),
            );
        }
        if self.questions.contains_key(&body.question_id)
            || self
                .answered
                .contains_key(&done_key("question", &body.question_id, src))
        {
            return GatewayOutcome::Taken; // a copy of one already taken (or answered)
        }
        self.emit(FleetEvent::QuestionOpened {
            question_id: body.question_id.clone(),
            target: target.to_string(),
        });
        self.dirty.questions.insert(body.question_id.clone());
        self.questions.insert(
            body.question_id.clone(),
            super::Question {
                target: target.clone(),
                text: body.question,
                waiter: None,
                peer: Some(src.clone()),
            },
        );
        self.feed_push(
            PushInput::QuestionOpened {
                target,
                question_id: body.question_id,
            },
            now,
            io,
        );
        GatewayOutcome::Taken
    }
}

//! Several hosts, one fleet (SPEC §12), as the engine keeps it. A member on another host is the
//! target `name@gateway`; a lead's ticket for it lives here, on the lead's gateway, and moves as
//! the member's gateway reports; its replies come back into this host's inbox under that name
//! and are nudged by this host's own push loop. A task from another gateway for a member here
//! gets a ticket with the same id, remembered as owned by that gateway: its events and its
//! replies go back there, never to this host's leads.
//!
//! Every message to another gateway is an outbox record committed in the same batch as the
//! state change that caused it, handed to the forwarder after the commit, and deleted once the
//! broker confirmed it (re-sent after a restart until then: receivers take each once — a ticket
//! by its id, a reply by its msgId, an event only forward). What another gateway sends is
//! checked against what this one sent there and what `gateway.peers` allows.

use fleetd_core::gateway::{Envelope, GatewayName, Kind, PROTOCOL};
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use fleetd_core::{Message, Target, Ticket, TicketEvent};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::gateway_refusals::PeerRefusal;
use super::{Io, State, TaskOrder};
use crate::config::PeerRight;

/// This gateway, as the engine needs it.
#[derive(Debug, Clone)]
pub(in crate::engine) struct GatewayState {
    /// This gateway's name.
    pub(in crate::engine) me: GatewayName,
    /// What each other gateway may ask of this one.
    pub(in crate::engine) peers: std::collections::BTreeMap<String, Vec<PeerRight>>,
    /// Records in the outbox at which new requests to other gateways are refused.
    pub(in crate::engine) outbox_max: usize,
    /// Messages waiting for one other gateway at which new requests to it are refused.
    pub(in crate::engine) peer_backlog_max: usize,
}

/// What became of a delivery from another gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayOutcome {
    /// Done (durable once the batch commits), or a duplicate: ack it.
    Taken,
    /// Never to be taken: dead-letter it. Counted under `reason` and raised as an incident
    /// already (`refusals`).
    Refused {
        /// The reason label (`never_sent`, `not_allowed`, `malformed`, ...).
        reason: &'static str,
        /// Why, in words: never the body.
        why: String,
    },
    /// A reply for one of this gateway's tickets: publish it into the inbox, then hand it to
    /// the engine as a stored reply, then ack.
    PublishReply(Box<Message>),
    /// A spawn request, recorded (durable once the batch commits): ack it and run it with the
    /// spawn service, then tell the engine what it came to ([`EngineHandle::peer_spawned`]).
    ///
    /// [`EngineHandle::peer_spawned`]: crate::engine::EngineHandle::peer_spawned
    Spawn(Box<crate::engine::PeerSpawn>),
}

impl GatewayOutcome {
    /// Refused under `reason` (one of `gateway_refusals::reason`), saying `why`.
    pub(super) fn refused(reason: &'static str, why: impl Into<String>) -> Self {
        Self::Refused {
            reason,
            why: why.into(),
        }
    }

    /// Refused as malformed: the body is not what its kind carries; `lacking` says so in words
    /// ("a task without its ticket, member or text").
    pub(super) fn malformed(lacking: &'static str) -> Self {
        Self::refused(super::gateway_refusals::reason::MALFORMED, lacking)
    }
}

/// A task's body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TaskBody {
    pub(super) ticket: Ticket,
    pub(super) member: String,
    pub(super) task: String,
    /// Who sent it, as the sending gateway names it (`L@a`): for `fleet_status` only.
    pub(super) by: String,
}

/// A ticket event's body.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct TicketBody {
    pub(super) ticket: Ticket,
    pub(super) event: TicketEvent,
}

/// A reply's body.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct ReplyBody {
    pub(super) message: Message,
}

/// A question's body: a member's question about a task the receiver's lead sent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct QuestionBody {
    pub(super) question_id: String,
    pub(super) member: String,
    pub(super) ticket: Ticket,
    pub(super) question: String,
}

/// An answer's body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AnswerBody {
    pub(super) question_id: String,
    pub(super) answer: String,
}

/// A stop's body.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StopBody {
    pub(super) member: String,
    pub(super) cause: String,
}

impl State {
    /// Makes this engine one gateway (`None`: a fleet on one host).
    pub(in crate::engine) fn set_gateway(&mut self, gateway: Option<GatewayState>) {
        self.gateway = gateway;
    }

    /// Queues `body` for gateway `dst`: an outbox record in this input's batch, forwarded after
    /// the commit. A body that does not encode (a bug) is logged and not sent, rather than sent
    /// as `null` for the peer to refuse.
    pub(super) fn send_out(&mut self, dst: &GatewayName, kind: Kind, body: impl serde::Serialize) {
        let Some(gw) = &self.gateway else {
            return;
        };
        let body = match serde_json::to_value(body) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(kind = kind.as_str(), %dst, error = %e, "cannot encode a message for another gateway; it is not sent");
                return;
            }
        };
        let envelope = Envelope {
            v: PROTOCOL,
            kind,
            src: gw.me.clone(),
            dst: dst.clone(),
            msg_id: self.ids.new_id().to_string(),
            body,
        };
        self.outbox_seq += 1;
        let seq = self.outbox_seq;
        self.outbox.insert(seq, envelope);
        self.dirty.outbox.insert(seq);
        self.to_forward.push(seq);
    }

    /// The outbox records to hand the forwarder now (after this input's commit).
    pub(in crate::engine) fn take_forwards(&mut self) -> Vec<Io> {
        std::mem::take(&mut self.to_forward)
            .into_iter()
            .filter_map(|seq| {
                self.outbox.get(&seq).map(|envelope| Io::Forward {
                    seq,
                    envelope: Box::new(envelope.clone()),
                })
            })
            .collect()
    }

    /// The broker has outbox record `seq`: it goes.
    pub(in crate::engine) fn forwarded(&mut self, seq: u64) {
        if self.outbox.remove(&seq).is_some() {
            self.dirty.outbox.insert(seq);
        }
    }

    /// The broker has no such gateway for outbox record `seq`: what it carried fails here.
    pub(in crate::engine) fn unroutable(&mut self, seq: u64, now: Timestamp, io: &mut Vec<Io>) {
        let Some(envelope) = self.outbox.remove(&seq) else {
            return;
        };
        self.dirty.outbox.insert(seq);
        tracing::warn!(dst = %envelope.dst, kind = envelope.kind.as_str(), "the broker has no such gateway; the message is dropped");
        match envelope.kind {
            Kind::Task => {
                if let Ok(body) = serde_json::from_value::<TaskBody>(envelope.body) {
                    let cause = format!("no gateway {} on the broker", envelope.dst);
                    self.apply(body.ticket, TicketEvent::Cancelled(cause), now);
                    self.settle(body.ticket, now);
                }
            }
            Kind::Spawn => self.spawn_unroutable(envelope.body, io),
            _ => {}
        }
    }

    /// `order`'s task for a member on another host (`alice@b`): a ticket here, the task to `b`.
    pub(super) fn submit_remote(
        &mut self,
        order: TaskOrder<'_>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<Ticket, fleetd_core::access::Refusal> {
        let sender = order.sender().unwrap_or_else(|| "operator".to_owned());
        let TaskOrder {
            lead, target, task, ..
        } = order;
        let Some(gw) = &self.gateway else {
            return Err(fleetd_core::access::Refusal::new(
                Code::NoGateway,
                format!(
                    "{target} is a member on another host, and this fleetd is no gateway: configure `gateway:` (docs/MULTIHOST.md)"
                ),
            ));
        };
        let me = gw.me.clone();
        let Some(dst) = target.gateway().and_then(|g| GatewayName::new(g).ok()) else {
            return Err(fleetd_core::access::Refusal::new(
                Code::InvalidTarget,
                format!("{target} names no gateway"),
            ));
        };
        self.outbox_room(&dst)?;
        let ticket = Ticket::from_uuid(self.ids.new_id());
        self.open_ticket(
            super::tickets::Opening {
                ticket,
                target: target.clone(),
                task: task.clone(),
                sender: Some(sender.clone()),
                owner: None,
            },
            now,
        );
        if let Some(lead) = lead {
            self.feed_push(
                PushInput::Bound {
                    target: target.clone(),
                    lead: Self::lead_id(lead),
                },
                now,
                io,
            );
        }
        let body = TaskBody {
            ticket,
            member: target.member_name().to_owned(),
            task,
            by: format!("{sender}@{me}"),
        };
        self.send_out(&dst, Kind::Task, body);
        Ok(ticket)
    }

    /// Room for a new request to gateway `dst` (a task, a spawn): none at `gateway.outboxMax`
    /// records in the outbox, so a long broker outage does not grow memory and the state file
    /// without end; none while `gateway.peerBacklogMax` messages wait for `dst` (in its queue
    /// on the broker and in this outbox), so a gateway that falls behind slows its senders
    /// rather than holding their tasks for minutes. Answers owed to other gateways, and stops,
    /// always go in.
    pub(super) fn outbox_room(
        &self,
        dst: &GatewayName,
    ) -> Result<(), fleetd_core::access::Refusal> {
        let (max, peer_max) = self.gateway.as_ref().map_or((usize::MAX, usize::MAX), |g| {
            (g.outbox_max, g.peer_backlog_max)
        });
        if self.outbox.len() >= max {
            return Err(fleetd_core::access::Refusal::new(
                Code::GatewayBacklog,
                format!(
                    "{} messages wait in this gateway's outbox for the broker (gateway.outboxMax = {max}): new tasks and spawns for other gateways are refused until it takes some; replies and answers still go. /healthz says why the broker is not taking them",
                    self.outbox.len()
                ),
            ));
        }
        let backlog = self.outbox.backlog(dst);
        if backlog.total() < u64::try_from(peer_max).unwrap_or(u64::MAX) {
            return Ok(());
        }
        Err(fleetd_core::access::Refusal::new(
            Code::GatewayBusy,
            format!(
                "gateway {dst} is behind: {} messages wait for it ({} in its queue on the broker, {} in this gateway's outbox; gateway.peerBacklogMax = {peer_max}); new tasks and spawns for it are refused until it takes some. Try again in a few seconds",
                backlog.total(),
                backlog.queued,
                backlog.outboxed,
            ),
        ))
    }

    /// Gateway `dst`'s queue on the broker held `depth` messages when the forwarder last read
    /// it (soft state: nothing to commit).
    pub(in crate::engine) fn peer_queued(&mut self, dst: GatewayName, depth: u64) {
        self.outbox.set_queued(dst, depth);
    }

    /// A stop of a member on another host: sent there; its tickets end as it reports.
    pub(in crate::engine) fn stop_remote(&mut self, target: &Target, cause: &str) -> bool {
        let Some(dst) = target.gateway().and_then(|g| GatewayName::new(g).ok()) else {
            return false;
        };
        if self.gateway.is_none() {
            return false;
        }
        let body = json!({ "member": target.member_name(), "cause": cause });
        self.send_out(&dst, Kind::Stop, body);
        true
    }

    /// A member here asks a question while its current task is another gateway's: the question
    /// goes there (its lead answers it) and that gateway is returned; `None` for a local one.
    pub(super) fn ask_remote(
        &mut self,
        target: &Target,
        id: &str,
        text: &str,
    ) -> Option<GatewayName> {
        let ticket = self.injector.current(target)?;
        let owner = self.tickets.remote_owner.get(&ticket).cloned()?;
        let body = QuestionBody {
            question_id: id.to_owned(),
            member: target.member_name().to_owned(),
            ticket,
            question: text.to_owned(),
        };
        self.send_out(&owner, Kind::Question, body);
        Some(owner)
    }

    /// A lead here answered the question of a member on gateway `peer`: the answer goes there.
    pub(super) fn answer_remote(&mut self, peer: &GatewayName, id: &str, answer: String) {
        let body = AnswerBody {
            question_id: id.to_owned(),
            answer,
        };
        self.send_out(peer, Kind::Answer, body);
    }

    /// A ticket here owned by another gateway changed: tell it (replies travel as replies).
    pub(super) fn report_to_owner(&mut self, ticket: Ticket, event: &TicketEvent) {
        if matches!(
            event,
            TicketEvent::Replied | TicketEvent::TurnEndedWithoutReply
        ) {
            return;
        }
        if let Some(owner) = self.tickets.remote_owner.get(&ticket).cloned() {
            let body = TicketBody {
                ticket,
                event: event.clone(),
            };
            self.send_out(&owner, Kind::Ticket, body);
        }
    }

    /// A reply (or fallback) of a member here for a ticket another gateway owns: sent there;
    /// the local copy goes once that is committed. `true` when it was one.
    pub(super) fn reply_to_owner(&mut self, message: &Message, io: &mut Vec<Io>) -> bool {
        let Some(ticket) = message.ticket else {
            return false;
        };
        let (Some(owner), Some(gw)) = (
            self.tickets.remote_owner.get(&ticket).cloned(),
            &self.gateway,
        ) else {
            return false;
        };
        let mut forwarded = message.clone();
        forwarded.target = message.target.at(gw.me.as_str());
        let body = ReplyBody { message: forwarded };
        self.send_out(&owner, Kind::Reply, body);
        io.push(Io::AckLocal {
            target: message.target.clone(),
            msg_id: message.msg_id,
        });
        true
    }

    /// A delivery from gateway `envelope.src`, checked against what this gateway sent there and
    /// what `gateway.peers` lets that gateway ask. A refusal is counted and raised as an
    /// incident to this gateway's lead here, where it is decided.
    pub(in crate::engine) fn gateway_in(
        &mut self,
        envelope: Envelope,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> GatewayOutcome {
        let src = envelope.src.to_string();
        let outcome = self.take_in(envelope, now, io);
        if let GatewayOutcome::Refused { reason, why } = &outcome {
            let refused = PeerRefusal {
                from: Some(src),
                reason,
                why: why.clone(),
                parked: true,
            };
            self.gateway_refused(refused, now, io);
        }
        outcome
    }

    /// Remembers (durably) that what `key` names is done with here.
    pub(super) fn done_with(&mut self, key: String, now: Timestamp) {
        self.dirty.answered.insert(key.clone());
        self.answered.insert(key, now);
    }

    /// Forgets what was done with longer than [`super::ANSWERED_TTL`] ago.
    pub(super) fn forget_answered(&mut self, now: Timestamp) {
        let dirty = &mut self.dirty.answered;
        self.answered.retain(|id, at| {
            let keep = at
                .checked_add(super::ANSWERED_TTL)
                .is_ok_and(|until| until > now);
            if !keep {
                dirty.insert(id.clone());
            }
            keep
        });
    }

    /// Whether `ticket` is this gateway's, for a member on gateway `gw`.
    pub(super) fn sent_there(&self, ticket: Ticket, gw: &GatewayName) -> bool {
        match self.tickets.book.record(ticket) {
            Some(r) => {
                r.target.gateway() == Some(gw.as_str())
                    && !self.tickets.remote_owner.contains_key(&ticket)
            }
            None => false,
        }
    }

    pub(super) fn me_name(&self) -> String {
        self.gateway
            .as_ref()
            .map(|g| g.me.to_string())
            .unwrap_or_default()
    }
}

/// The key of something gateway `peer` sent that is done with here (`State::answered`): its
/// kind (`question`, `spawned`), its id and the peer, so one peer's ids never stand for
/// another's.
pub(super) fn done_key(kind: &str, id: &str, peer: &GatewayName) -> String {
    format!("{kind} {id} from {peer}")
}

/// The outbox record's key: its sequence number, zero-padded so keys sort in order.
pub(super) fn outbox_key(seq: u64) -> String {
    format!("{seq:020}")
}

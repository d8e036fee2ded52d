//! The fleet's event stream (SPEC §14): typed events the engine publishes as it decides — a
//! member spawned, its status, a ticket's state, a reply stored, a question opened or answered,
//! a nudge sent, deferred or given up, an incident, a reload — the same decisions the metrics
//! count, never re-read from state. Never a message body or a task text: ids, names, sizes.
//!
//! Each event gets an id `<boot>-<seq>`: `boot` tells this run of the daemon from the previous
//! one, `seq` counts from 1. The last [`RING`] events are kept in memory, so a client that
//! reconnects with `Last-Event-ID` gets what it missed; when what it missed is no longer held
//! (the ring moved past it, or the daemon restarted in between), it is told so by a `stream.gap`
//! event and re-reads the state it shows. Publishing never blocks on a client: each subscriber
//! has a bounded queue, and one that falls behind is disconnected (it resumes from the ring).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::broadcast;

/// How many events the ring holds for reconnecting clients.
pub const RING: usize = 10_000;
/// How many events one subscriber may lag behind before it is disconnected.
const SUBSCRIBER_QUEUE: usize = 4096;
/// How far back the latency record goes (the dashboard's charts: the last hour).
pub const LATENCY_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);
/// Most samples the latency record keeps per series (the newest), however busy the hour.
const LATENCY_SAMPLES: usize = 20_000;

/// One fleet event. Serialised with its kind in `type` (`member.spawned`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub enum FleetEvent {
    /// A member joined the fleet (spawned, or re-adopted after a restart).
    #[serde(rename = "member.spawned")]
    MemberSpawned {
        /// Its name.
        target: String,
        /// Its profile.
        profile: String,
        /// Its profile's model backend, when it names one.
        backend: Option<String>,
        /// Its pane (daemon-qualified).
        pane: String,
        /// The lead it works for, when it is not the primary.
        lead: Option<String>,
        /// Its own git branch, when it works in a worktree of its own.
        branch: Option<String>,
    },
    /// A member's agent status changed (`idle`, `working`, `blocked`, `done`, `unknown`).
    #[serde(rename = "member.status")]
    MemberStatus {
        /// The member.
        target: String,
        /// The new status.
        status: String,
    },
    /// A member waits on a dialog on its screen (SPEC §20).
    #[serde(rename = "member.blocked", rename_all = "camelCase")]
    MemberBlocked {
        /// The member.
        target: String,
        /// The dialog's question (the screen's last line when fleetd recognises no dialog).
        question: String,
        /// The dialog as the member's screen shows it: cleaned, secrets redacted.
        lines: Vec<String>,
        /// The choices fleetd can type, `{key, label}` (empty: none it recognises).
        choices: Vec<serde_json::Value>,
        /// The dialog's fingerprint: an approval naming it is typed only into this dialog.
        dialog: String,
        /// When the member began waiting.
        since: String,
    },
    /// A member's dialog went (answered here or in its pane).
    #[serde(rename = "member.unblocked", rename_all = "camelCase")]
    MemberUnblocked {
        /// The member.
        target: String,
        /// How long it waited, in ms.
        waited_ms: u64,
    },
    /// A choice was typed into a member's dialog (`fleetd approve`, the dashboard, a lead).
    #[serde(rename = "member.approved", rename_all = "camelCase")]
    MemberApproved {
        /// The member.
        target: String,
        /// The choice's number.
        choice: String,
        /// Its words.
        label: String,
        /// Who: `operator`, or `lead:<pane>`.
        by: String,
        /// `answered` (the dialog went) or `typed` (still on screen a moment after).
        outcome: String,
    },
    /// A member left the fleet.
    #[serde(rename = "member.released")]
    MemberReleased {
        /// The member.
        target: String,
        /// Why (`stopped`, `gone`, `idle`, `shutdown`, ...).
        cause: String,
    },
    /// A ticket changed state.
    #[serde(rename = "ticket.state")]
    TicketState {
        /// The ticket.
        ticket: String,
        /// The member it was sent to.
        target: String,
        /// Its new state (`queued`, `delivered`, `replied`, `failed`, ...).
        state: String,
        /// On `delivered`: how long the task waited from its send to being typed, in ms.
        #[serde(skip_serializing_if = "Option::is_none")]
        waited_ms: Option<u64>,
    },
    /// A member's reply was stored in its inbox.
    #[serde(rename = "reply.stored")]
    ReplyStored {
        /// The member.
        target: String,
        /// The message id.
        msg_id: String,
        /// The ticket it answers, when it answers one.
        ticket: Option<String>,
        /// The body's size in bytes (never the body).
        bytes: usize,
    },
    /// How many replies wait in a member's inbox, when it changed.
    #[serde(rename = "inbox.depth")]
    InboxDepth {
        /// The member.
        target: String,
        /// Replies waiting (not yet acknowledged).
        depth: u64,
    },
    /// A ticket's wake (an MCP task its caller's client polls, SEP-2663): `armed` (the news is
    /// not nudged about while it is), `read` (the client was told), `cancelled`, `lapsed` (not
    /// read in time: the nudge takes over).
    #[serde(rename = "ticket.wake")]
    TicketWake {
        /// The ticket.
        ticket: String,
        /// Its member.
        target: String,
        /// What happened to the wake.
        state: String,
    },
    /// A member asked its lead a question.
    #[serde(rename = "question.opened")]
    QuestionOpened {
        /// The question's id (what `fleet_answer` takes).
        question_id: String,
        /// The member that asked.
        target: String,
    },
    /// A question was answered (or closed with its member).
    #[serde(rename = "question.closed")]
    QuestionClosed {
        /// The question's id.
        question_id: String,
        /// The member that asked.
        target: String,
        /// `answered`, or `released` when its member left first.
        how: String,
    },
    /// A nudge decision for a lead: `nudged`, `deferred_busy`, `exhausted` (given up),
    /// `no_lead`, `binding_forgotten`, `inject_failed`, `inject_uncertain`.
    #[serde(rename = "nudge")]
    Nudge {
        /// The lead, when the decision concerns one.
        lead: Option<String>,
        /// The outcome.
        outcome: String,
        /// On `nudged`, the first nudge about mail: how long after that mail landed, in ms.
        #[serde(skip_serializing_if = "Option::is_none")]
        after_ms: Option<u64>,
    },
    /// An incident fleetd reported to the members' leads (a backend down, a member unmapped).
    #[serde(rename = "incident")]
    Incident {
        /// What it is about: `backend` (a backend down or up again), `unmapped` (a member's
        /// backend left the configuration), `budget` (a member's or tree's model budget
        /// reached), `budget_warning` (its warning fraction), `gateway` (another host).
        kind: String,
        /// The members it concerns.
        targets: Vec<String>,
        /// fleetd's own sentence (never a member's text).
        text: String,
    },
    /// The configuration was reloaded.
    #[serde(rename = "config.reloaded")]
    ConfigReloaded,
    /// A model response through fleetd's gateway ended and was counted (never its body).
    #[serde(rename = "usage", rename_all = "camelCase")]
    Usage {
        /// The member that made the request.
        target: String,
        /// Its profile.
        profile: String,
        /// The delegation tree it belongs to (its top member).
        tree: String,
        /// This response's tokens by kind.
        tokens: fleetd_core::usage::Tokens,
        /// What they cost, in micro-dollars (millionths of a US dollar).
        cost_micros: u64,
        /// The member's tokens so far, every kind.
        total_tokens: u64,
        /// The member's cost so far, in micro-dollars.
        total_cost_micros: u64,
    },
}

/// A published event, serialised once for every subscriber.
#[derive(Debug, Clone)]
pub struct Published {
    /// Its id (`<boot>-<seq>`).
    pub id: String,
    /// Its kind (the SSE `event:` field).
    pub kind: &'static str,
    /// The JSON object: `id`, `at` and the event's fields.
    pub json: String,
    seq: u64,
}

/// Where a subscription starts.
#[derive(Debug)]
pub struct Subscription {
    /// Events published after the client's `Last-Event-ID`, oldest first.
    pub missed: Vec<Arc<Published>>,
    /// Set when some of what the client missed is no longer held: why.
    pub gap: Option<String>,
    /// Everything published from now on.
    pub live: broadcast::Receiver<Arc<Published>>,
}

#[derive(Debug)]
struct Ring {
    next: u64,
    events: VecDeque<Arc<Published>>,
}

/// The last hour's latencies the events carried, for a page that opens now: the ring holds
/// the last [`RING`] events, which a busy fleet goes through in minutes.
#[derive(Debug, Default)]
struct Latencies {
    /// `(at, ms)`: a task's wait from its send to being typed.
    delivery: VecDeque<(Timestamp, u64)>,
    /// `(at, ms)`: mail landed → its lead's first nudge.
    nudge: VecDeque<(Timestamp, u64)>,
}

impl Latencies {
    fn record(series: &mut VecDeque<(Timestamp, u64)>, at: Timestamp, ms: u64) {
        if series.len() >= LATENCY_SAMPLES {
            series.pop_front();
        }
        series.push_back((at, ms));
    }

    fn prune(&mut self, now: Timestamp) {
        let Ok(since) = now.checked_sub(LATENCY_WINDOW) else {
            return;
        };
        for series in [&mut self.delivery, &mut self.nudge] {
            while series.front().is_some_and(|(at, _)| *at < since) {
                series.pop_front();
            }
        }
    }
}

/// The last hour's latency samples (`GET /events/latency`): each `[at in ms since the epoch,
/// latency in ms]`, oldest first, as of `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LatencyRecord {
    /// When the record was read (events stamped later are not in it).
    pub at: String,
    /// A task's wait from its send to being typed.
    pub delivery: Vec<(i64, u64)>,
    /// Mail landed → its lead's first nudge about it.
    pub nudge: Vec<(i64, u64)>,
}

/// The event hub: the ring and the live fan-out. Cheap to share.
#[derive(Debug)]
pub struct EventHub {
    boot: String,
    ring: Mutex<Ring>,
    live: broadcast::Sender<Arc<Published>>,
    capacity: usize,
    latencies: Mutex<Latencies>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new(RING)
    }
}

impl EventHub {
    /// A hub keeping the last `capacity` events.
    #[expect(
        clippy::disallowed_methods,
        reason = "the boot id only tells runs apart; no decision reads it as a time"
    )]
    pub fn new(capacity: usize) -> Self {
        let (live, _) = broadcast::channel(SUBSCRIBER_QUEUE);
        Self {
            // Milliseconds since the epoch at start: distinct across restarts of one daemon.
            boot: format!("{:x}", Timestamp::now().as_millisecond()),
            ring: Mutex::new(Ring {
                next: 1,
                events: VecDeque::with_capacity(capacity.min(1024)),
            }),
            live,
            capacity: capacity.max(1),
            latencies: Mutex::default(),
        }
    }

    fn latencies(&self) -> std::sync::MutexGuard<'_, Latencies> {
        crate::sync::lock(&self.latencies)
    }

    /// The last hour's latency samples, as of `now`.
    pub fn latency(&self, now: Timestamp) -> LatencyRecord {
        let mut latencies = self.latencies();
        latencies.prune(now);
        let pairs = |series: &VecDeque<(Timestamp, u64)>| {
            series
                .iter()
                .map(|(at, ms)| (at.as_millisecond(), *ms))
                .collect()
        };
        LatencyRecord {
            at: now.to_string(),
            delivery: pairs(&latencies.delivery),
            nudge: pairs(&latencies.nudge),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        crate::sync::lock(&self.ring)
    }

    /// Publishes `event` (stamped `at`) to the ring and every subscriber.
    pub fn publish(&self, event: &FleetEvent, at: Timestamp) {
        let mut value = match serde_json::to_value(event) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "a fleet event could not be serialised; dropped");
                return;
            }
        };
        let kind = kind_of(event);
        match event {
            FleetEvent::TicketState {
                waited_ms: Some(ms),
                ..
            } => {
                let mut latencies = self.latencies();
                Latencies::record(&mut latencies.delivery, at, *ms);
                latencies.prune(at);
            }
            FleetEvent::Nudge {
                after_ms: Some(ms), ..
            } => {
                let mut latencies = self.latencies();
                Latencies::record(&mut latencies.nudge, at, *ms);
                latencies.prune(at);
            }
            _ => {}
        }
        let mut ring = self.ring();
        let seq = ring.next;
        ring.next += 1;
        let id = format!("{}-{seq}", self.boot);
        if let serde_json::Value::Object(map) = &mut value {
            map.insert("id".into(), id.clone().into());
            map.insert("at".into(), at.to_string().into());
        }
        let published = Arc::new(Published {
            id,
            kind,
            json: value.to_string(),
            seq,
        });
        if ring.events.len() >= self.capacity {
            ring.events.pop_front();
        }
        ring.events.push_back(Arc::clone(&published));
        // Sent under the ring's lock, so a subscriber's missed list and its live stream meet
        // without a hole or a repeat. No subscriber is not an error.
        let _ = self.live.send(published);
    }

    /// Subscribes from the oldest event the ring holds: a new client that wants the recent past
    /// too (the dashboard's charts and log), not only what comes next.
    pub fn subscribe_all(&self) -> Subscription {
        let ring = self.ring();
        Subscription {
            missed: ring.events.iter().cloned().collect(),
            gap: None,
            live: self.live.subscribe(),
        }
    }

    /// Subscribes from `last_event_id` (a client's `Last-Event-ID`, `None` for a new client,
    /// who gets only what comes next).
    pub fn subscribe(&self, last_event_id: Option<&str>) -> Subscription {
        let ring = self.ring();
        let live = self.live.subscribe();
        let Some(last) = last_event_id.map(str::trim).filter(|s| !s.is_empty()) else {
            return Subscription {
                missed: Vec::new(),
                gap: None,
                live,
            };
        };
        let seq = last
            .rsplit_once('-')
            .filter(|(boot, _)| *boot == self.boot)
            .and_then(|(_, seq)| seq.parse::<u64>().ok());
        let Some(seq) = seq.filter(|s| *s < ring.next) else {
            return Subscription {
                missed: ring.events.iter().cloned().collect(),
                gap: Some(format!(
                    "event {last} is not from this run of fleetd (it restarted, or the id is not one it sent): re-read the fleet's state"
                )),
                live,
            };
        };
        let oldest = ring.events.front().map_or(ring.next, |e| e.seq);
        let gap = (seq + 1 < oldest).then(|| {
            format!(
                "{} events after {last} are no longer held (the ring keeps the last {}): re-read the fleet's state",
                oldest - seq - 1,
                self.capacity
            )
        });
        Subscription {
            missed: ring
                .events
                .iter()
                .filter(|e| e.seq > seq)
                .cloned()
                .collect(),
            gap,
            live,
        }
    }
}

fn kind_of(event: &FleetEvent) -> &'static str {
    match event {
        FleetEvent::MemberSpawned { .. } => "member.spawned",
        FleetEvent::MemberStatus { .. } => "member.status",
        FleetEvent::MemberReleased { .. } => "member.released",
        FleetEvent::MemberBlocked { .. } => "member.blocked",
        FleetEvent::MemberUnblocked { .. } => "member.unblocked",
        FleetEvent::MemberApproved { .. } => "member.approved",
        FleetEvent::TicketState { .. } => "ticket.state",
        FleetEvent::ReplyStored { .. } => "reply.stored",
        FleetEvent::TicketWake { .. } => "ticket.wake",
        FleetEvent::InboxDepth { .. } => "inbox.depth",
        FleetEvent::QuestionOpened { .. } => "question.opened",
        FleetEvent::QuestionClosed { .. } => "question.closed",
        FleetEvent::Nudge { .. } => "nudge",
        FleetEvent::Incident { .. } => "incident",
        FleetEvent::ConfigReloaded => "config.reloaded",
        FleetEvent::Usage { .. } => "usage",
    }
}

#[cfg(test)]
mod tests;

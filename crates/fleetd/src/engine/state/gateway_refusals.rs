//! Refusals of what other gateways send, as incidents to this gateway's lead: a poison
//! message goes to the dead-letter queue with a log line and an incident to the lead. Each
//! refusal is counted (`fleetd_gateway_refused_total{reason}`) and raises a notice in the inbox
//! of this gateway's own target `gateway@<me>`, which no delegation binds, so the push loop
//! nudges the primary lead about it. Bounded: the first refusal of a sender for a reason is a
//! notice at once, and the ones after it within [`REFUSAL_WINDOW`] are folded into one notice
//! at the window's end that says how many there were; a sender that keeps on gets one notice a
//! window. A notice names the sender, the reason and where the message went, never its body.
//! Knows nothing of the broker: the link and the gateway service report what they refused.

use std::collections::BTreeMap;

use fleetd_core::Target;
use jiff::{SignedDuration, Timestamp};

use super::{Io, State};

/// How long the refusals of one sender for one reason after the first are folded into one
/// notice: a forged or broken peer can publish thousands a second, and each would otherwise be
/// a message in the lead's inbox.
pub(in crate::engine) const REFUSAL_WINDOW: SignedDuration = SignedDuration::from_secs(60);

/// Most (sender, reason) windows open at once. Senders are broker users (the broker vouched for
/// them), so this is plenty; beyond it the refusals of the senders not yet seen share a window.
const MAX_WINDOWS: usize = 64;

/// The sender of refusals beyond [`MAX_WINDOWS`].
const SEVERAL: &str = "several senders";
/// The sender of a message no `user_id` vouched for.
const NOBODY: &str = "a sender no user_id vouched for";

/// The reason label of a refusal: what `fleetd_gateway_refused_total` counts it under.
pub(in crate::engine) mod reason {
    /// The body is not what its kind carries (an envelope, or the fields of its kind).
    pub(in crate::engine) const MALFORMED: &str = "malformed";
    /// A reply, ticket event, question or spawn result about something this gateway never
    /// sent to that gateway.
    pub(in crate::engine) const NEVER_SENT: &str = "never_sent";
    /// A request (task, stop, spawn, answer) `gateway.peers` does not let that gateway make.
    pub(in crate::engine) const NOT_ALLOWED: &str = "not_allowed";
    /// An answer for a question whose member cannot take it now.
    pub(in crate::engine) const UNDELIVERABLE: &str = "undeliverable";
}

/// One refused message, as the engine hears of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRefusal {
    /// The gateway the broker vouched for as its sender (its `user_id`); `None`: none did.
    pub from: Option<String>,
    /// The reason label (`impersonation`, `never_sent`, ...).
    pub reason: &'static str,
    /// Why, in words (never the body).
    pub why: String,
    /// Whether it went to the dead-letter queue (a refused spawn request is answered instead).
    pub parked: bool,
}

/// The open windows, by sender and reason.
#[derive(Debug, Default)]
pub(in crate::engine) struct Refusals {
    windows: BTreeMap<(String, &'static str), Window>,
}

#[derive(Debug)]
struct Window {
    /// When it closes.
    until: Timestamp,
    /// Refusals since the last notice.
    folded: u64,
    /// The latest of them.
    last: Option<PeerRefusal>,
}

impl State {
    /// Another gateway's message was refused: counted, and an incident for this gateway's lead
    /// unless one about the same sender and reason went out within [`REFUSAL_WINDOW`].
    pub(in crate::engine) fn gateway_refused(
        &mut self,
        refused: PeerRefusal,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        metrics::counter!("fleetd_gateway_refused_total", "reason" => refused.reason).increment(1);
        let windows = &mut self.refusals.windows;
        let mut key = (
            refused.from.clone().unwrap_or_else(|| NOBODY.to_owned()),
            refused.reason,
        );
        if windows.len() >= MAX_WINDOWS && !windows.contains_key(&key) {
            key.0 = SEVERAL.to_owned();
        }
        if let Some(window) = windows.get_mut(&key) {
            window.folded += 1;
            window.last = Some(refused);
            return;
        }
        windows.insert(
            key,
            Window {
                until: now.checked_add(REFUSAL_WINDOW).unwrap_or(now),
                folded: 0,
                last: None,
            },
        );
        let text = format!(
            "[fleet] incident: gateway {me} refused a message from {from} ({}: {}){}. Refusals like it in the next {}s are counted in one notice.",
            refused.reason,
            refused.why,
            self.where_refused(&refused),
            REFUSAL_WINDOW.as_secs(),
            me = self.me_name(),
            from = sender(refused.from.as_deref()),
        );
        self.gateway_incident(&text, io);
    }

    /// Windows that closed: a notice of what they folded, and a new window after one (a sender
    /// that keeps on is told about once a window); a quiet one is forgotten.
    pub(super) fn refusals_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let due: Vec<(String, &'static str)> = self
            .refusals
            .windows
            .iter()
            .filter(|(_, w)| w.until <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            let Some(window) = self.refusals.windows.remove(&key) else {
                continue;
            };
            let Some(last) = window.last else {
                continue;
            };
            let text = format!(
                "[fleet] incident: gateway {me} refused {n} more {messages} from {from} ({reason}) in the last {secs}s; the last: {why}{place}.",
                me = self.me_name(),
                n = window.folded,
                messages = if window.folded == 1 {
                    "message"
                } else {
                    "messages"
                },
                from = sender(Some(key.0.as_str())),
                reason = key.1,
                secs = REFUSAL_WINDOW.as_secs(),
                why = last.why,
                place = self.where_refused(&last),
            );
            self.gateway_incident(&text, io);
            self.refusals.windows.insert(
                key,
                Window {
                    until: now.checked_add(REFUSAL_WINDOW).unwrap_or(now),
                    folded: 0,
                    last: None,
                },
            );
        }
    }

    /// When the next window closes.
    pub(super) fn refusals_wake(&self) -> Option<Timestamp> {
        self.refusals.windows.values().map(|w| w.until).min()
    }

    /// The target whose inbox holds this gateway's own incidents: `gateway@<me>`, a name no
    /// member here can have (a local name has no `@`) and no other gateway's member has.
    pub(in crate::engine) fn gateway_inbox(&self) -> Option<Target> {
        let gw = self.gateway.as_ref()?;
        Target::new(format!("gateway@{}", gw.me)).ok()
    }

    /// `text` as an incident in this gateway's own inbox (nudged to the primary lead) and on
    /// `/events`.
    fn gateway_incident(&mut self, text: &str, io: &mut Vec<Io>) {
        let Some(target) = self.gateway_inbox() else {
            return;
        };
        self.incident_to("gateway", vec![target], text, io);
    }

    /// Where a refused message went, as a clause of a notice.
    fn where_refused(&self, refused: &PeerRefusal) -> String {
        if refused.parked {
            let dead = self
                .gateway
                .as_ref()
                .map(|g| g.me.dead_queue())
                .unwrap_or_default();
            format!("; it is parked in the dead-letter queue {dead}")
        } else {
            "; it was answered with the reason".to_owned()
        }
    }
}

/// A sender as a notice names it.
fn sender(from: Option<&str>) -> String {
    match from {
        None | Some(NOBODY) => NOBODY.to_owned(),
        Some(SEVERAL) => SEVERAL.to_owned(),
        Some(gw) => format!("gateway {gw}"),
    }
}

//! The push loop's policy (SPEC §5, §6): which lead is told about which mail, when a nudge may be
//! typed into a lead's pane, and when to stop. Owns delegation bindings, the primary, per-lead
//! batches, the reminder budget and exponential backoff. Pure: inputs and `now` in, effects out.
//!
//! Everything a lead must learn is in a member's inbox (replies, fallbacks, incidents, unmapped
//! notices) or is an open question, so the mail is two kinds of source: a target's non-empty
//! inbox, and an open question. A batch starts when a lead's mail goes from none to some and
//! ends when it is all read; it gets at most `reminders` nudges, spaced by doubling backoff.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::ids::Target;

/// A lead, by the key the daemon chose for it (a daemon-qualified pane id).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeadId(pub String);

impl std::fmt::Display for LeadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The lead's agent status, reduced to what nudging needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadActivity {
    /// Idle or done: a nudge may be typed.
    Receptive,
    /// Working, or blocked on a dialog (an approval prompt, where typed text and Enter would
    /// answer the dialog): never type into it (SPEC §5).
    Busy,
    /// No reading: treated as busy (never risk interrupting a turn).
    Unknown,
}

/// The push loop's settings (`primary.push*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushConfig {
    /// Nudges per batch before giving up (the mail is kept).
    pub reminders: u32,
    /// Wait after the first nudge; doubles after each.
    pub backoff: SignedDuration,
    /// Cap of the wait.
    pub backoff_max: SignedDuration,
}

/// How an injection into a lead's pane went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectOutcome {
    /// Typed and submitted.
    Delivered,
    /// The multiplexer affirmatively says the lead's pane or agent is gone.
    NotFound,
    /// Nothing was typed (socket error, refusal, a pane that could not be read): the lead is
    /// still presumed alive and the nudge is tried again soon.
    Transient,
    /// The call failed after the nudge may have reached the pane (it timed out or broke once
    /// the request was out). Counted as sent, never typed again at once: a duplicate nudge
    /// interrupts the lead, a missing one is covered by the next reminder. The lead is still
    /// presumed alive.
    Uncertain,
    /// The multiplexer refused before typing because the lead is busy after all (herdr answers
    /// `agent_blocked` to a prompt for an agent showing a dialog): nothing was typed, nothing is
    /// spent, nothing is worth a warning; tried again soon, and meanwhile the lead's next status
    /// reading decides.
    Busy,
}

/// Inputs to the push loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushInput {
    /// The primary lead was learned (or pinned), or lost (`None`).
    Primary(Option<LeadId>),
    /// `target` was delegated to by `lead` (`fleet_send`/`fleet_spawn`).
    Bound {
        /// The member.
        target: Target,
        /// The delegating lead.
        lead: LeadId,
    },
    /// `target` was released: its binding goes.
    Unbound {
        /// The member.
        target: Target,
    },
    /// `target`'s inbox now holds `pending` messages (0 = all read).
    Inbox {
        /// The member whose inbox changed.
        target: Target,
        /// Messages pending.
        pending: u64,
    },
    /// A member opened a question (`fleet_ask`).
    QuestionOpened {
        /// The asking member.
        target: Target,
        /// The question id.
        question_id: String,
    },
    /// A question was answered or withdrawn.
    QuestionClosed {
        /// The question id.
        question_id: String,
    },
    /// A lead's status changed.
    LeadStatus {
        /// The lead.
        lead: LeadId,
        /// Its activity.
        activity: LeadActivity,
    },
    /// The multiplexer affirmatively said `lead` is gone (its pane closed, or a new incarnation
    /// took the pane): its bindings, and the primary if it was that lead, are forgotten.
    LeadGone {
        /// The lead.
        lead: LeadId,
    },
    /// The driver finished an injection it was asked for.
    Injected {
        /// The lead.
        lead: LeadId,
        /// How it went.
        outcome: InjectOutcome,
    },
    /// Time passed.
    Tick,
}

/// Why a decision was made, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PushMetric {
    /// A nudge was sent.
    Nudged,
    /// Mail is waiting but the lead is working (or unknown).
    DeferredBusy,
    /// The batch used its whole budget; the mail stays.
    Exhausted,
    /// Mail is waiting and no lead is known: pull only.
    NoLead,
    /// A binding (or the primary) was forgotten because its lead is affirmatively gone.
    BindingForgotten,
    /// An injection failed transiently; the lead is kept and retried later.
    InjectFailed,
    /// An injection may or may not have been typed; it counts as sent.
    InjectUncertain,
}

impl PushMetric {
    /// The metric label: `nudged`, `deferred_busy`, `exhausted`, `no_lead`,
    /// `binding_forgotten`, `inject_failed`, `inject_uncertain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nudged => "nudged",
            Self::DeferredBusy => "deferred_busy",
            Self::Exhausted => "exhausted",
            Self::NoLead => "no_lead",
            Self::BindingForgotten => "binding_forgotten",
            Self::InjectFailed => "inject_failed",
            Self::InjectUncertain => "inject_uncertain",
        }
    }
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEffect {
    /// Type `text` into `lead`'s pane and report with `Injected`.
    Inject {
        /// The lead.
        lead: LeadId,
        /// The one-line nudge (never any payload).
        text: String,
    },
    /// The binding of `target` to `lead` was forgotten (the lead is gone).
    ForgetBinding {
        /// The member.
        target: Target,
        /// The lead that is gone.
        lead: LeadId,
    },
    /// Count a decision.
    Count(PushMetric),
    /// A batch gave up (warn-level log).
    GaveUp {
        /// The lead.
        lead: LeadId,
        /// Nudges it got.
        reminders: u32,
    },
}

#[derive(Debug, Clone, Default)]
struct LeadState {
    activity: Option<LeadActivity>,
    /// Nudges sent in the current batch.
    sent: u32,
    /// Earliest time the next nudge may go.
    next_at: Option<Timestamp>,
    /// An injection is under way.
    in_flight: bool,
    /// The budget ran out; only new mail starts a new batch.
    exhausted: bool,
    /// The mail the batch was nudged about, with counts (to tell new mail from old).
    seen: BTreeMap<String, u64>,
    /// Deferred-busy was already counted for this wait (count transitions, not ticks).
    deferred: bool,
    /// The multiplexer refused the last nudge because the lead was busy: its retry waits for
    /// the lead to be seen receptive again, not for the retry interval.
    refused_busy: bool,
}

/// The push loop.
#[derive(Debug, Clone)]
pub struct PushLoop {
    config: PushConfig,
    primary: Option<LeadId>,
    bindings: BTreeMap<Target, LeadId>,
    inbox: BTreeMap<Target, u64>,
    questions: BTreeMap<String, Target>,
    leads: BTreeMap<LeadId, LeadState>,
    no_lead_counted: bool,
}

impl PushLoop {
    /// An empty loop with `config`.
    pub fn new(config: PushConfig) -> Self {
        Self {
            config,
            primary: None,
            bindings: BTreeMap::new(),
            inbox: BTreeMap::new(),
            questions: BTreeMap::new(),
            leads: BTreeMap::new(),
            no_lead_counted: false,
        }
    }

    /// Uses `config` from now on (a reload changed the budget or the backoff); a batch already
    /// under way keeps the nudges it has sent and is judged by the new budget.
    pub fn set_config(&mut self, config: PushConfig) {
        self.config = config;
    }

    /// The lead mail about `target` goes to: its delegating lead, else the primary.
    pub fn lead_for(&self, target: &Target) -> Option<&LeadId> {
        self.bindings.get(target).or(self.primary.as_ref())
    }

    /// The current primary.
    pub fn primary(&self) -> Option<&LeadId> {
        self.primary.as_ref()
    }

    /// The delegating lead bound to `target`, if any.
    pub fn binding(&self, target: &Target) -> Option<&LeadId> {
        self.bindings.get(target)
    }

    /// Every lead with something to read: (lead, mail keys).
    fn mail_by_lead(&self) -> BTreeMap<LeadId, Vec<Mail>> {
        let mut out: BTreeMap<LeadId, Vec<Mail>> = BTreeMap::new();
        for (target, pending) in self.inbox.iter().filter(|(_, n)| **n > 0) {
            if let Some(lead) = self.lead_for(target) {
                out.entry(lead.clone())
                    .or_default()
                    .push(Mail::Inbox(target.clone(), *pending));
            }
        }
        for (id, target) in &self.questions {
            if let Some(lead) = self.lead_for(target) {
                out.entry(lead.clone())
                    .or_default()
                    .push(Mail::Question(target.clone(), id.clone()));
            }
        }
        out
    }

    fn has_unrouted_mail(&self) -> bool {
        let unrouted = |t: &Target| self.lead_for(t).is_none();
        self.inbox.iter().any(|(t, n)| *n > 0 && unrouted(t))
            || self.questions.values().any(unrouted)
    }

    /// When the driver must wake next to re-evaluate, if ever.
    pub fn next_wake(&self) -> Option<Timestamp> {
        let mail = self.mail_by_lead();
        self.leads
            .iter()
            .filter(|(lead, s)| mail.contains_key(*lead) && !s.exhausted && !s.in_flight)
            .filter_map(|(_, s)| s.next_at)
            .min()
    }

    /// Handles one input at `now`.
    pub fn handle_at(&mut self, input: PushInput, now: Timestamp) -> Vec<PushEffect> {
        let mut out = Vec::new();
        match input {
            PushInput::Primary(lead) => self.primary = lead,
            PushInput::Bound { target, lead } => {
                self.bindings.insert(target, lead);
            }
            PushInput::Unbound { target } => {
                self.bindings.remove(&target);
            }
            PushInput::Inbox { target, pending } => {
                if pending == 0 {
                    self.inbox.remove(&target);
                } else {
                    self.inbox.insert(target, pending);
                }
            }
            PushInput::QuestionOpened {
                target,
                question_id,
            } => {
                self.questions.insert(question_id, target);
            }
            PushInput::QuestionClosed { question_id } => {
                self.questions.remove(&question_id);
            }
            PushInput::LeadStatus { lead, activity } => {
                let state = self.leads.entry(lead).or_default();
                state.activity = Some(activity);
                if activity != LeadActivity::Receptive {
                    // A new wait begins; count it once when mail is pending (below).
                    state.deferred = false;
                } else if std::mem::take(&mut state.refused_busy) {
                    // The lead that refused the nudge as busy is receptive again: nudge now
                    // (the wake-up a user waits for), not at the retry interval.
                    state.next_at = None;
                }
            }
            PushInput::LeadGone { lead } => self.forget_lead(&lead, &mut out),
            PushInput::Injected { lead, outcome } => self.injected(&lead, outcome, now, &mut out),
            PushInput::Tick => {}
        }
        self.evaluate(now, &mut out);
        out
    }

    fn injected(
        &mut self,
        lead: &LeadId,
        outcome: InjectOutcome,
        now: Timestamp,
        out: &mut Vec<PushEffect>,
    ) {
        match outcome {
            InjectOutcome::Delivered => {
                if let Some(state) = self.leads.get_mut(lead) {
                    state.in_flight = false;
                }
            }
            InjectOutcome::Uncertain => {
                // As if delivered: the budget stays spent and the next reminder waits its
                // backoff (SPEC §13.7: nothing is typed twice because a call timed out).
                out.push(PushEffect::Count(PushMetric::InjectUncertain));
                if let Some(state) = self.leads.get_mut(lead) {
                    state.in_flight = false;
                }
            }
            InjectOutcome::Transient | InjectOutcome::Busy => {
                out.push(PushEffect::Count(if outcome == InjectOutcome::Busy {
                    PushMetric::DeferredBusy
                } else {
                    PushMetric::InjectFailed
                }));
                // Nothing reached the lead: try again soon, not after a whole reminder backoff
                // (and, when it was busy, as soon as it is seen receptive again).
                let backoff = self.config.backoff.min(TRANSIENT_RETRY);
                if let Some(state) = self.leads.get_mut(lead) {
                    state.in_flight = false;
                    state.refused_busy = outcome == InjectOutcome::Busy;
                    // It did not reach the lead: give the budget back, try again later.
                    state.sent = state.sent.saturating_sub(1);
                    state.next_at = now.checked_add(backoff).ok();
                }
            }
            InjectOutcome::NotFound => self.forget_lead(lead, out),
        }
    }

    /// Forgets a lead that is affirmatively gone: its state, its bindings, and the primary if it
    /// was that lead. Its members' mail falls back to the primary (or to pull only).
    fn forget_lead(&mut self, lead: &LeadId, out: &mut Vec<PushEffect>) {
        self.leads.remove(lead);
        let gone: Vec<Target> = self
            .bindings
            .iter()
            .filter(|(_, l)| *l == lead)
            .map(|(t, _)| t.clone())
            .collect();
        for target in gone {
            self.bindings.remove(&target);
            out.push(PushEffect::ForgetBinding {
                target,
                lead: lead.clone(),
            });
            out.push(PushEffect::Count(PushMetric::BindingForgotten));
        }
        if self.primary.as_ref() == Some(lead) {
            self.primary = None;
            out.push(PushEffect::Count(PushMetric::BindingForgotten));
        }
    }

    fn evaluate(&mut self, now: Timestamp, out: &mut Vec<PushEffect>) {
        let mail = self.mail_by_lead();
        if self.has_unrouted_mail() {
            if !self.no_lead_counted {
                self.no_lead_counted = true;
                out.push(PushEffect::Count(PushMetric::NoLead));
            }
        } else {
            self.no_lead_counted = false;
        }
        // Leads whose mail is all read end their batch.
        for (lead, state) in &mut self.leads {
            if !mail.contains_key(lead) {
                state.sent = 0;
                state.next_at = None;
                state.exhausted = false;
                state.seen.clear();
                state.deferred = false;
            }
        }
        for (lead, items) in mail {
            let keys: BTreeMap<String, u64> = items.iter().map(Mail::key).collect();
            let state = self.leads.entry(lead.clone()).or_default();
            let grew = keys
                .iter()
                .any(|(k, n)| state.seen.get(k).is_none_or(|seen| n > seen));
            if state.exhausted && grew {
                // New mail after a batch gave up starts a new batch.
                state.exhausted = false;
                state.sent = 0;
                state.next_at = None;
            }
            if state.exhausted || state.in_flight || state.next_at.is_some_and(|t| now < t) {
                continue;
            }
            if state.activity != Some(LeadActivity::Receptive) {
                if !state.deferred {
                    state.deferred = true;
                    out.push(PushEffect::Count(PushMetric::DeferredBusy));
                }
                continue;
            }
            if state.sent >= self.config.reminders && grew {
                // The budget is spent on mail the lead has since been sent more of: that is a
                // new batch (without this, the new mail waited for some other input to come
                // along after the give-up, and in a quiet fleet none does).
                state.sent = 0;
            }
            if state.sent >= self.config.reminders {
                state.exhausted = true;
                out.push(PushEffect::Count(PushMetric::Exhausted));
                out.push(PushEffect::GaveUp {
                    lead,
                    reminders: state.sent,
                });
                continue;
            }
            state.sent += 1;
            state.in_flight = true;
            state.seen = keys;
            state.next_at = now
                .checked_add(backoff_after(&self.config, state.sent))
                .ok();
            out.push(PushEffect::Count(PushMetric::Nudged));
            out.push(PushEffect::Inject {
                lead,
                text: nudge_text(&items),
            });
        }
    }
}

/// How soon a nudge that typed nothing (socket blip, unreadable pane) is tried again, at most.
pub const TRANSIENT_RETRY: SignedDuration = SignedDuration::from_secs(2);

/// The wait after the `sent`-th nudge: `backoff * 2^(sent-1)`, capped.
fn backoff_after(config: &PushConfig, sent: u32) -> SignedDuration {
    let factor = 2_i32.saturating_pow(sent.saturating_sub(1).min(30));
    config
        .backoff
        .checked_mul(factor)
        .unwrap_or(config.backoff_max)
        .min(config.backoff_max)
}

/// One piece of mail waiting for a lead.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mail {
    Inbox(Target, u64),
    Question(Target, String),
}

impl Mail {
    /// Identity and size: more messages from the same member than last nudged is new mail.
    fn key(&self) -> (String, u64) {
        match self {
            Self::Inbox(t, n) => (format!("inbox:{t}"), *n),
            Self::Question(_, id) => (format!("question:{id}"), 1),
        }
    }
}

/// The nudge: one line, counts and ids only, never a message body, with the calls to make.
fn nudge_text(items: &[Mail]) -> String {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for item in items {
        match item {
            Mail::Inbox(target, n) => {
                let noun = if *n == 1 { "message" } else { "messages" };
                parts.push(format!("{n} {noun} from {target}"));
                calls.push(format!("fleet_poll(target=\"{target}\")"));
            }
            Mail::Question(target, id) => {
                parts.push(format!("question {id} from {target}"));
                calls.push(format!("fleet_answer(questionId=\"{id}\", answer=...)"));
            }
        }
    }
    format!(
        "[fleet] {} waiting — call {} (then fleet_ack the messages you have read)",
        parts.join(", "),
        calls.join(" / ")
    )
}

#[cfg(test)]
mod tests;

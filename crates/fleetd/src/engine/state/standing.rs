//! The lead rule (SPEC §2; docs/SECURITY.md, "Who is a lead"): what a pane of the daemon's user
//! outside the members' workspace is. A member can open such a pane (`tmux new-session`,
//! `new-window -t <the lead's session>`, `split-window -t <the lead's pane>`, herdr's socket):
//! its process is the multiplexer's child, nothing links it to the member, so "not in the
//! members' workspace" proves nothing. A pane is a lead only on a positive fact:
//!
//! 1. it is a lead fleetd already holds (a registered lead's incarnation: it was one of these
//!    when it first called, or the operator admitted it — `fleetd admit`);
//! 2. it was born while no member of this daemon ran: no member existed to open it. fleetd
//!    keeps, durably, the spans of time some member (or a spawn on its way) was here; a pane's
//!    birth is its own process's start time, which the kernel keeps and nobody can change;
//! 3. it is a configured lead tab's lead (`primary.tab`, `leads[].tab`): the pane the scanner
//!    resolved there, or the only pane the tab held at the last scan (the lead started again
//!    after a herdr restart). A pane split off beside a live lead is neither.
//!
//! Everything else is a stray: nobody, until the operator admits it.

use fleetd_core::{QualifiedPaneId, Target, TerminalId};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::State;
use crate::store::{StateOp, StateRecord};

/// The durable record kind, and its one key.
pub(super) const BUSY: &str = "busy";
const SPANS: &str = "spans";

/// How many busy spans are kept; past it the two oldest merge into one covering both (which
/// only ever makes more panes strays, never fewer).
const MAX_SPANS: usize = 64;

/// How long after the last member went a pane's birth still counts as during the members: a
/// released member's pane is closed a moment after its record goes, and its processes with it.
pub(super) const SETTLE: SignedDuration = SignedDuration::from_secs(5);

/// How many stray incarnations are remembered as warned about: a bound, past which one may be
/// warned about again.
const STRAYS_TOLD: usize = 1024;

/// What a pane outside the members' workspace (or any pane, for a member) is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// A member's pane: the member, with its `allowDelegation`.
    Member(Target, bool),
    /// The user's own: a lead (rules 1–3 above).
    Lead,
    /// No fact ties it to the user.
    Stray,
}

/// One stretch of time during which some member was here (`to: None`: still).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Span {
    from: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to: Option<Timestamp>,
}

/// The spans during which members were here, oldest first (durable).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Busy {
    spans: Vec<Span>,
}

impl Busy {
    /// Whether a pane born at `born` may be a member's doing.
    fn covers(&self, born: Timestamp) -> bool {
        self.spans
            .iter()
            .any(|s| s.from <= born && s.to.is_none_or(|to| born < to))
    }

    /// Follows whether members are here at `now`; `true` when that changed the spans.
    fn follow(&mut self, members_here: bool, now: Timestamp) -> bool {
        let open = self.spans.last().is_some_and(|s| s.to.is_none());
        match (members_here, open) {
            (true, false) => {
                self.spans.push(Span {
                    from: now,
                    to: None,
                });
                if self.spans.len() > MAX_SPANS {
                    let first = self.spans.remove(0);
                    self.spans[0].from = first.from;
                }
                true
            }
            (false, true) => {
                if let Some(last) = self.spans.last_mut() {
                    last.to = Some(now.checked_add(SETTLE).unwrap_or(now));
                }
                true
            }
            _ => false,
        }
    }
}

impl State {
    /// What the pane incarnation `pane`/`terminal` is, its own process `age` old (`None`: its
    /// age could not be read, so its birth proves nothing).
    pub(in crate::engine) fn standing(
        &mut self,
        pane: &QualifiedPaneId,
        terminal: &TerminalId,
        age: Option<std::time::Duration>,
        now: Timestamp,
    ) -> Standing {
        if let Some((target, delegates)) = self.member_at(pane, terminal) {
            return Standing::Member(target, delegates);
        }
        let known = self
            .leads
            .get(&fleetd_core::push::LeadId(pane.to_string()))
            .is_some_and(|l| l.terminal == *terminal);
        let born = age
            .and_then(|a| SignedDuration::try_from(a).ok())
            .and_then(|a| now.checked_sub(a).ok());
        let before_members = born.is_some_and(|b| !self.busy.covers(b));
        if known || before_members || self.lead_tabs.holds(pane, terminal) {
            return Standing::Lead;
        }
        if self.strays_told.len() >= STRAYS_TOLD {
            self.strays_told.clear();
        }
        if self.strays_told.insert((pane.clone(), terminal.clone())) {
            tracing::warn!(%pane, born = ?born, "a pane opened while members ran called fleetd: it is nobody until the operator admits it (`fleetd admit {pane}`)");
        }
        Standing::Stray
    }

    /// Follows whether members (or spawns on their way) are here, after each input.
    pub(in crate::engine) fn follow_busy(&mut self, now: Timestamp) {
        let here = !self.members.is_empty() || !self.reserved.is_empty();
        if self.busy.follow(here, now) {
            self.dirty.busy = true;
        }
    }

    pub(super) fn busy_op(&self) -> Option<StateOp> {
        match serde_json::to_string(&self.busy) {
            Ok(value) => Some(StateOp::Put(StateRecord {
                kind: BUSY.to_owned(),
                key: SPANS.to_owned(),
                value,
            })),
            Err(e) => {
                tracing::error!(error = %e, "cannot encode the busy spans");
                None
            }
        }
    }

    pub(super) fn restore_busy(&mut self, value: &str) {
        match serde_json::from_str::<Busy>(value) {
            Ok(busy) => self.busy = busy,
            // Unreadable: the safe reading is that members were always here (every pane not
            // otherwise vouched for is a stray until admitted).
            Err(e) => {
                tracing::error!(error = %e, "the busy spans do not decode; every pane opened before now counts as opened while members ran");
                self.busy = Busy {
                    spans: vec![Span {
                        from: Timestamp::MIN,
                        to: None,
                    }],
                };
                self.dirty.busy = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("time")
    }

    #[test]
    fn a_pane_born_while_members_were_here_is_covered_and_one_born_between_is_not() {
        let mut busy = Busy::default();
        assert!(!busy.covers(at(0)), "no member ever: nothing is covered");
        assert!(busy.follow(true, at(10)));
        assert!(!busy.follow(true, at(20)), "still here: no change");
        assert!(busy.covers(at(10)) && busy.covers(at(1000)));
        assert!(!busy.covers(at(9)));
        assert!(busy.follow(false, at(30)));
        assert!(
            busy.covers(at(34)),
            "within the settle time after the last member"
        );
        assert!(!busy.covers(at(35)));
        busy.follow(true, at(100));
        assert!(!busy.covers(at(50)), "between two spans");
        assert!(busy.covers(at(20)) && busy.covers(at(100)));
    }

    #[test]
    fn past_the_bound_the_oldest_spans_merge_and_cover_more_never_less() {
        let mut busy = Busy::default();
        for i in 0..100 {
            busy.follow(true, at(i * 10));
            busy.follow(false, at(i * 10 + 1));
        }
        assert_eq!(busy.spans.len(), MAX_SPANS);
        for i in 0..100 {
            assert!(busy.covers(at(i * 10)), "span {i} still covered");
        }
    }
}

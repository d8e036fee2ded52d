//! Tickets: one delegated task's life, as a pure state machine (SPEC §3). Owns which transitions
//! are legal and how long a finished ticket is kept (counted from its finish). Knows nothing
//! about panes, MCP or storage; time comes in as `now`.

use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::ids::{Target, Ticket};

/// Where a ticket stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketState {
    /// Waiting in the member's queue until it is ready.
    Queued,
    /// Typed into the member's pane; its turn has not been seen starting yet.
    Delivered,
    /// The member's turn started.
    Working,
    /// The member answered with `fleet_reply`.
    Replied,
    /// The member's turn ended without a reply; a fallback message carries its output.
    EndedWithoutReply,
    /// Delivery could not be verified (the member never left idle, even after one retry).
    Stalled,
    /// The member went away (stopped, exited, reaped) before answering.
    Failed,
    /// Withdrawn before it was answered.
    Cancelled,
}

impl TicketState {
    /// Every state, in lifecycle order.
    pub const ALL: [Self; 8] = [
        Self::Queued,
        Self::Delivered,
        Self::Working,
        Self::Replied,
        Self::EndedWithoutReply,
        Self::Stalled,
        Self::Failed,
        Self::Cancelled,
    ];

    /// True once the ticket will not move on its own any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Replied
                | Self::EndedWithoutReply
                | Self::Stalled
                | Self::Failed
                | Self::Cancelled
        )
    }

    /// The wire name (`ended_without_reply`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Delivered => "delivered",
            Self::Working => "working",
            Self::Replied => "replied",
            Self::EndedWithoutReply => "ended_without_reply",
            Self::Stalled => "stalled",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What happened to a ticket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TicketEvent {
    /// The task was typed into the pane.
    Delivered,
    /// The member left idle: its turn started.
    TurnStarted,
    /// The member called `fleet_reply` for this ticket.
    Replied,
    /// The member's turn ended with no reply for this ticket.
    TurnEndedWithoutReply,
    /// Delivery was not verified after the retry.
    Stalled,
    /// The member is gone; the cause is kept (`stopped`, `exited`, `idle`, `shutdown`).
    MemberGone(String),
    /// The lead or the daemon withdrew it; the cause is kept.
    Cancelled(String),
}

/// Why an event did not apply. A refusal is a value, not an error: callers log and move on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketRefusal {
    /// No such ticket (never opened, or pruned).
    #[error("no ticket {0}")]
    Unknown(Ticket),
    /// The event does not apply in the ticket's current state.
    #[error("ticket {ticket} is {}: {event} does not apply", state.as_str())]
    Illegal {
        /// The ticket.
        ticket: Ticket,
        /// Its state.
        state: TicketState,
        /// The event, described.
        event: String,
    },
}

/// One ticket's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketRecord {
    /// Its id.
    pub ticket: Ticket,
    /// The member it was sent to.
    pub target: Target,
    /// Its state.
    pub state: TicketState,
    /// When it was opened.
    pub created_at: Timestamp,
    /// When it reached a terminal state.
    pub finished_at: Option<Timestamp>,
    /// Why it failed or was cancelled.
    pub cause: Option<String>,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketLookup<'a> {
    /// Known and kept.
    Live(&'a TicketRecord),
    /// Finished longer ago than the retention: the reply, if any, is in the member's inbox.
    Expired,
    /// Never seen.
    Unknown,
}

/// Every ticket the daemon knows, with retention counted from each ticket's finish.
#[derive(Debug, Clone)]
pub struct TicketBook {
    tickets: BTreeMap<Ticket, TicketRecord>,
    /// What every input asks of the whole book, kept as the book changes (a scan of thousands
    /// of open tickets per input made a busy daemon quadratic).
    index: Index,
    ttl_after_finish: SignedDuration,
    /// Ids pruned so far (up to `PRUNED_MEMORY`, oldest dropped first), so a poll of one can
    /// answer `expired` rather than `unknown`.
    pruned: BTreeMap<Ticket, Timestamp>,
}

/// The book's tickets counted by state and its finished ones ordered by their finish.
#[derive(Debug, Clone, Default)]
struct Index {
    counts: BTreeMap<TicketState, usize>,
    by_finish: BTreeSet<(Timestamp, Ticket)>,
}

impl Index {
    fn add(&mut self, record: &TicketRecord) {
        *self.counts.entry(record.state).or_insert(0) += 1;
        if let Some(finished) = record.finished_at {
            self.by_finish.insert((finished, record.ticket));
        }
    }

    fn remove(&mut self, record: &TicketRecord) {
        if let Some(n) = self.counts.get_mut(&record.state) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&record.state);
            }
        }
        if let Some(finished) = record.finished_at {
            self.by_finish.remove(&(finished, record.ticket));
        }
    }
}

/// How many pruned ids are remembered so a poll can answer `expired`; older ones read `unknown`.
const PRUNED_MEMORY: usize = 65_536;

impl TicketBook {
    /// An empty book keeping finished tickets for `ttl_after_finish`.
    pub fn new(ttl_after_finish: SignedDuration) -> Self {
        Self {
            tickets: BTreeMap::new(),
            index: Index::default(),
            ttl_after_finish,
            pruned: BTreeMap::new(),
        }
    }

    /// Keeps finished tickets for `ttl_after_finish` from now on (a reload changed it); tickets
    /// already finished are judged by the new retention too.
    pub fn set_ttl(&mut self, ttl_after_finish: SignedDuration) {
        self.ttl_after_finish = ttl_after_finish;
    }

    /// How many tickets the book holds in each state (finished ones until they are pruned).
    pub fn count_by_state(&self) -> BTreeMap<TicketState, usize> {
        self.index.counts.clone()
    }

    /// Opens a ticket in `Queued`.
    pub fn open_at(&mut self, ticket: Ticket, target: Target, now: Timestamp) -> &TicketRecord {
        let index = &mut self.index;
        self.tickets.entry(ticket).or_insert_with(|| {
            let record = TicketRecord {
                ticket,
                target,
                state: TicketState::Queued,
                created_at: now,
                finished_at: None,
                cause: None,
            };
            index.add(&record);
            record
        })
    }

    /// Puts back a record kept from before a restart, as it was (its state, times and cause).
    pub fn restore(&mut self, record: TicketRecord) {
        self.pruned.remove(&record.ticket);
        if let Some(old) = self.tickets.remove(&record.ticket) {
            self.index.remove(&old);
        }
        self.index.add(&record);
        self.tickets.insert(record.ticket, record);
    }

    /// Remembers a ticket pruned before a restart, so a poll of it answers `expired`.
    pub fn restore_pruned(&mut self, ticket: Ticket, at: Timestamp) {
        if !self.tickets.contains_key(&ticket) {
            self.pruned.insert(ticket, at);
        }
        while self.pruned.len() > PRUNED_MEMORY {
            self.pruned.pop_first();
        }
    }

    /// The record of `ticket`, whatever its age (for persisting it).
    pub fn record(&self, ticket: Ticket) -> Option<&TicketRecord> {
        self.tickets.get(&ticket)
    }

    /// When `ticket` was pruned, if it was (and is still remembered).
    pub fn pruned_at(&self, ticket: Ticket) -> Option<Timestamp> {
        self.pruned.get(&ticket).copied()
    }

    /// Applies `event` to `ticket` at `now` and returns the new state.
    ///
    /// A reply is accepted in every state but `failed`/`cancelled`/`replied`, including after
    /// `stalled` or `ended_without_reply`: a late answer is still the answer.
    pub fn apply_at(
        &mut self,
        ticket: Ticket,
        event: TicketEvent,
        now: Timestamp,
    ) -> Result<TicketState, TicketRefusal> {
        use TicketState as S;
        let record = self
            .tickets
            .get_mut(&ticket)
            .ok_or(TicketRefusal::Unknown(ticket))?;
        let (next, cause) = match (record.state, event) {
            (S::Queued, TicketEvent::Delivered) => (S::Delivered, None),
            (S::Queued | S::Delivered, TicketEvent::TurnStarted) => (S::Working, None),
            (S::Delivered | S::Working, TicketEvent::TurnEndedWithoutReply) => {
                (S::EndedWithoutReply, None)
            }
            (S::Queued | S::Delivered, TicketEvent::Stalled) => (S::Stalled, None),
            (
                S::Queued | S::Delivered | S::Working | S::Stalled | S::EndedWithoutReply,
                TicketEvent::Replied,
            ) => (S::Replied, None),
            (S::Queued | S::Delivered | S::Working, TicketEvent::MemberGone(cause)) => {
                (S::Failed, Some(cause))
            }
            (S::Queued | S::Delivered | S::Working, TicketEvent::Cancelled(cause)) => {
                (S::Cancelled, Some(cause))
            }
            (state, event) => {
                return Err(TicketRefusal::Illegal {
                    ticket,
                    state,
                    event: format!("{event:?}"),
                });
            }
        };
        self.index.remove(record);
        record.state = next;
        if cause.is_some() {
            record.cause = cause;
        }
        if next.is_terminal() {
            // A late reply after stalled/ended keeps the first finish time: retention is about
            // how long the ticket has been settled, and a reply only improves its answer.
            record.finished_at.get_or_insert(now);
        }
        self.index.add(record);
        Ok(next)
    }

    /// Looks a ticket up as of `now` (a finished ticket past its retention reads `Expired`).
    pub fn get_at(&self, ticket: Ticket, now: Timestamp) -> TicketLookup<'_> {
        match self.tickets.get(&ticket) {
            Some(r) if self.expired(r, now) => TicketLookup::Expired,
            Some(r) => TicketLookup::Live(r),
            None if self.pruned.contains_key(&ticket) => TicketLookup::Expired,
            None => TicketLookup::Unknown,
        }
    }

    fn expired(&self, record: &TicketRecord, now: Timestamp) -> bool {
        record
            .finished_at
            .and_then(|f| self.kept_until(f))
            .is_some_and(|deadline| now >= deadline)
    }

    /// When a ticket finished at `finished` expires (`None`: past the end of time).
    fn kept_until(&self, finished: Timestamp) -> Option<Timestamp> {
        finished.checked_add(self.ttl_after_finish).ok()
    }

    /// Drops every ticket finished at least the retention ago; returns the dropped ids.
    pub fn prune_at(&mut self, now: Timestamp) -> Vec<Ticket> {
        // Oldest finish first: once one is not expired, no later one is.
        let gone: Vec<Ticket> = self
            .index
            .by_finish
            .iter()
            .take_while(|(finished, _)| self.kept_until(*finished).is_some_and(|at| now >= at))
            .map(|&(_, ticket)| ticket)
            .collect();
        for ticket in &gone {
            if let Some(record) = self.tickets.remove(ticket) {
                self.index.remove(&record);
            }
            self.pruned.insert(*ticket, now);
        }
        while self.pruned.len() > PRUNED_MEMORY {
            self.pruned.pop_first();
        }
        gone
    }

    /// When the next prune has something to do, if ever.
    pub fn next_expiry(&self) -> Option<Timestamp> {
        let (finished, _) = self.index.by_finish.first()?;
        self.kept_until(*finished)
    }

    /// The member's tickets that are not finished, oldest first.
    pub fn open_for(&self, target: &Target) -> Vec<&TicketRecord> {
        self.tickets
            .values()
            .filter(|r| &r.target == target && !r.state.is_terminal())
            .collect()
    }

    /// The member's tickets, newest first, at most `limit`.
    pub fn recent_for(&self, target: &Target, limit: usize) -> Vec<&TicketRecord> {
        self.tickets
            .values()
            .rev()
            .filter(|r| &r.target == target)
            .take(limit)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_800_000_000).expect("valid")
    }

    fn secs(n: i64) -> SignedDuration {
        SignedDuration::from_secs(n)
    }

    fn alice() -> Target {
        Target::new("alice").expect("valid")
    }

    fn book_with(ticket: Ticket) -> TicketBook {
        let mut book = TicketBook::new(secs(600));
        book.open_at(ticket, alice(), t0());
        book
    }

    /// Runs `events` from a fresh ticket and returns the states (or refusals) step by step.
    fn check(events: &[TicketEvent], expect: &[&str]) {
        let ticket = Ticket::from_parts(1, [0; 10]);
        let mut book = book_with(ticket);
        let got: Vec<String> = events
            .iter()
            .map(|e| match book.apply_at(ticket, e.clone(), t0()) {
                Ok(s) => s.as_str().to_owned(),
                Err(TicketRefusal::Illegal { .. }) => "refused".to_owned(),
                Err(TicketRefusal::Unknown(_)) => "unknown".to_owned(),
            })
            .collect();
        assert_eq!(got, expect, "events {events:?}");
    }

    #[test]
    fn transitions() {
        use TicketEvent as E;
        check(
            &[E::Delivered, E::TurnStarted, E::Replied],
            &["delivered", "working", "replied"],
        );
        check(
            &[
                E::Delivered,
                E::TurnStarted,
                E::TurnEndedWithoutReply,
                E::Replied,
            ],
            &["delivered", "working", "ended_without_reply", "replied"],
        );
        check(
            &[E::Delivered, E::Stalled, E::Replied],
            &["delivered", "stalled", "replied"],
        );
        check(
            &[E::MemberGone("stopped".into()), E::Replied],
            &["failed", "refused"],
        );
        check(
            &[E::Cancelled("lead".into()), E::Delivered],
            &["cancelled", "refused"],
        );
        check(&[E::TurnEndedWithoutReply], &["refused"]);
        check(&[E::Replied, E::Replied], &["replied", "refused"]);
    }

    #[test]
    fn retention_counts_from_the_finish_not_the_creation() {
        let ticket = Ticket::from_parts(1, [0; 10]);
        let mut book = book_with(ticket);
        let finish = t0() + secs(1000);
        book.apply_at(ticket, TicketEvent::Replied, finish)
            .expect("replies");
        assert!(matches!(
            book.get_at(ticket, finish + secs(599)),
            TicketLookup::Live(_)
        ));
        assert_eq!(book.next_expiry(), Some(finish + secs(600)));
        assert!(book.prune_at(finish + secs(599)).is_empty());
        assert_eq!(book.prune_at(finish + secs(600)), vec![ticket]);
        assert_eq!(
            book.get_at(ticket, finish + secs(601)),
            TicketLookup::Expired
        );
        let never = Ticket::from_parts(2, [0; 10]);
        assert_eq!(book.get_at(never, finish), TicketLookup::Unknown);
    }

    #[test]
    fn member_gone_keeps_its_cause() {
        let ticket = Ticket::from_parts(1, [0; 10]);
        let mut book = book_with(ticket);
        book.apply_at(ticket, TicketEvent::MemberGone("exited".into()), t0())
            .expect("fails");
        let TicketLookup::Live(r) = book.get_at(ticket, t0()) else {
            panic!("live")
        };
        assert_eq!(
            (r.state, r.cause.as_deref()),
            (TicketState::Failed, Some("exited"))
        );
        assert!(book.open_for(&alice()).is_empty());
    }

    fn any_event() -> impl Strategy<Value = TicketEvent> {
        prop_oneof![
            Just(TicketEvent::Delivered),
            Just(TicketEvent::TurnStarted),
            Just(TicketEvent::Replied),
            Just(TicketEvent::TurnEndedWithoutReply),
            Just(TicketEvent::Stalled),
            Just(TicketEvent::MemberGone("exited".into())),
            Just(TicketEvent::Cancelled("stop".into())),
        ]
    }

    proptest! {
        /// Whatever happens, an unfinished ticket is never pruned and a finished one is kept
        /// exactly until its finish plus the retention.
        #[test]
        fn pruning_respects_finish_plus_ttl(
            steps in proptest::collection::vec((any_event(), 0i64..2000), 0..12),
            probe in 0i64..5000,
        ) {
            let ticket = Ticket::from_parts(1, [0; 10]);
            let mut book = book_with(ticket);
            let mut now = t0();
            for (event, gap) in steps {
                now += secs(gap);
                let _ = book.apply_at(ticket, event, now);
            }
            let at = now + secs(probe);
            let finished = book.tickets.get(&ticket).and_then(|r| r.finished_at);
            let pruned = book.prune_at(at).contains(&ticket);
            match finished {
                None => prop_assert!(!pruned),
                Some(f) => prop_assert_eq!(pruned, at >= f + secs(600)),
            }
        }

        /// The counts by state and the next expiry the book keeps as it changes are what a
        /// count of the whole book says, whatever is opened, moved, restored and pruned.
        #[test]
        fn the_kept_counts_and_next_expiry_match_a_recount(
            steps in proptest::collection::vec((0u8..4, 0u64..6, any_event(), 0i64..400), 0..40),
        ) {
            let mut book = TicketBook::new(secs(600));
            let mut now = t0();
            for (op, id, event, gap) in steps {
                now += secs(gap);
                let ticket = Ticket::from_parts(id, [0; 10]);
                match op {
                    0 => { book.open_at(ticket, alice(), now); }
                    1 => { let _ = book.apply_at(ticket, event, now); }
                    2 => {
                        let mut record = book.tickets.get(&ticket).cloned().unwrap_or(TicketRecord {
                            ticket, target: alice(), state: TicketState::Queued,
                            created_at: now, finished_at: None, cause: None,
                        });
                        record.state = TicketState::Replied;
                        record.finished_at = Some(now);
                        book.restore(record);
                    }
                    _ => { book.prune_at(now); }
                }
                let mut counts = BTreeMap::new();
                for record in book.tickets.values() {
                    *counts.entry(record.state).or_insert(0) += 1;
                }
                prop_assert_eq!(book.count_by_state(), counts);
                let expiry = book.tickets.values().filter_map(|r| Some(r.finished_at? + secs(600))).min();
                prop_assert_eq!(book.next_expiry(), expiry);
            }
        }
    }
}

//! The wall-clock seam. Everything in the daemon that needs "now" asks a `Clock`; nothing else reads
//! system time, so tests substitute `ManualClock` and never sleep.

use std::sync::{Arc, LazyLock, Mutex};

use jiff::{SignedDuration, Timestamp};

/// A source of wall-clock time, and of the time-ordered ids stamped with it.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;

    /// A new UUIDv7 stamped with [`Clock::now`]: tickets, message and question ids. Ids minted
    /// in one process sort in the order they were minted (a counter orders those within one
    /// millisecond); the rest is random, so they never repeat across restarts.
    fn new_id(&self) -> uuid::Uuid {
        mint_id(self.now())
    }
}

/// The one UUIDv7 context of the process: its counter keeps ids minted within the same
/// millisecond in order.
static CONTEXT_V7: LazyLock<Mutex<uuid::ContextV7>> =
    LazyLock::new(|| Mutex::new(uuid::ContextV7::new()));

/// A UUIDv7 for the instant `at` (see [`Clock::new_id`]).
pub fn mint_id(at: Timestamp) -> uuid::Uuid {
    let context = crate::sync::lock(&CONTEXT_V7);
    let secs = u64::try_from(at.as_second()).unwrap_or(0);
    let nanos = u32::try_from(at.subsec_nanosecond()).unwrap_or(0);
    uuid::Uuid::new_v7(uuid::Timestamp::from_unix(&*context, secs, nanos))
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[expect(
        clippy::disallowed_methods,
        reason = "the clock seam itself: the one place that reads system time"
    )]
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when a test says so.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: SignedDuration) {
        let mut now = crate::sync::lock(&self.0);
        *now = now.saturating_add(by).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *crate::sync::lock(&self.0)
    }
}

/// A clock that follows tokio's timer, so a test on paused time (`start_paused`) sees the
/// engine's sleeps and its `now` agree, and time jumps as soon as every task waits.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioClock {
    start: Timestamp,
    base: tokio::time::Instant,
}

#[cfg(test)]
impl TokioClock {
    /// A clock reading `start` now.
    pub(crate) fn new(start: Timestamp) -> Self {
        Self {
            start,
            base: tokio::time::Instant::now(),
        }
    }
}

#[cfg(test)]
impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.base.elapsed()).unwrap_or(SignedDuration::MAX);
        self.start.saturating_add(elapsed).unwrap_or(self.start)
    }
}

/// Shared handle to whichever clock the daemon runs on.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_minted_in_one_millisecond_keep_their_order() {
        let clock = ManualClock::new(Timestamp::from_second(1_700_000_000).expect("valid"));
        let ids: Vec<uuid::Uuid> = (0..1000).map(|_| clock.new_id()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted, "minted in order, sorted in order");
        sorted.dedup();
        assert_eq!(sorted.len(), 1000, "no repeats");
        assert_eq!(
            ids[0].get_timestamp().map(|t| t.to_unix().0),
            Some(1_700_000_000),
            "stamped with the clock's time, not the system's"
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = Timestamp::from_second(1_700_000_000).expect("valid timestamp");
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(SignedDuration::from_secs(5));
        assert_eq!(clock.now().as_second(), 1_700_000_005);
    }
}

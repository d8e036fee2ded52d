//! The wall-clock seam. Everything in the daemon that needs "now" asks a `Clock`; nothing else reads
//! system time, so tests substitute `ManualClock` and never sleep.

use std::sync::{Arc, Mutex};

use jiff::{SignedDuration, Timestamp};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
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
        let mut now = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *now = now.saturating_add(by).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    fn manual_clock_moves_only_when_told() {
        let start = Timestamp::from_second(1_700_000_000).expect("valid timestamp");
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(SignedDuration::from_secs(5));
        assert_eq!(clock.now().as_second(), 1_700_000_005);
    }
}

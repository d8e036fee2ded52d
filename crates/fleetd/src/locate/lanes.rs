//! Two lanes over one ordered list of checks, stopping at the first hit: the calling thread and
//! one helper thread that lives as long as the daemon. A thread started per search cost 77 µs at
//! the median and 220 µs at p99 on the 2-core machine (spawn and join), more than a third of a
//! search among 200 panes; the helper is started once. Each lane takes the next unclaimed index
//! in turn, so the list's order still decides what is looked at first, and the caller never
//! waits for a helper the machine has not run yet: only for a check it has already claimed.
//! Blocking: called from the locator's `spawn_blocking` work.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};

use crate::sync::lock;

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The thing looked for: the search stops.
    Hit,
    /// Not here.
    Miss,
    /// Not in what was read; the rest was left for a later pass.
    Partly,
}

/// What the lanes found: the hit (the lowest index, if both lanes hit) and the indices checked
/// only partly.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Found {
    pub(super) hit: Option<usize>,
    pub(super) partly: Vec<usize>,
}

impl Found {
    fn add(&mut self, index: usize, step: Step) {
        match step {
            Step::Hit => self.hit = Some(self.hit.map_or(index, |h| h.min(index))),
            Step::Partly => self.partly.push(index),
            Step::Miss => {}
        }
    }
}

/// A check of index `i`.
pub(super) type Work = Arc<dyn Fn(usize) -> Step + Send + Sync>;

/// Fewer checks than this run on the calling thread alone.
const TWO_LANES_MIN: usize = 64;

struct Search {
    len: usize,
    work: Work,
    next: AtomicUsize,
    done: AtomicBool,
    /// Checks the helper has claimed and not finished.
    in_flight: AtomicUsize,
    /// The helper's findings, written before its claim is released.
    helper: Mutex<Found>,
    settled: Condvar,
}

impl Search {
    /// The next index to check, unless the search is over.
    fn claim(&self) -> Option<usize> {
        if self.done.load(Ordering::SeqCst) {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::SeqCst);
        (i < self.len).then_some(i)
    }

    /// The helper's lane: every claim counted in `in_flight` until its finding is written.
    fn help(&self) {
        loop {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            let claimed = self.claim();
            if let Some(i) = claimed {
                let step = (self.work)(i);
                if step == Step::Hit {
                    self.done.store(true, Ordering::SeqCst);
                }
                lock(&self.helper).add(i, step);
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            // Under the lock, so a caller that saw a claim in flight is woken.
            let _guard = lock(&self.helper);
            self.settled.notify_all();
            if claimed.is_none() {
                return;
            }
        }
    }
}

/// The helper thread's queue; `None` when it could not be started (one lane then).
fn helper() -> Option<&'static Mutex<mpsc::Sender<Arc<Search>>>> {
    static HELPER: OnceLock<Option<Mutex<mpsc::Sender<Arc<Search>>>>> = OnceLock::new();
    HELPER
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Arc<Search>>();
            let started = std::thread::Builder::new()
                .name("fleetd-fd-scan".to_owned())
                .spawn(move || {
                    while let Ok(search) = rx.recv() {
                        search.help();
                    }
                });
            match started {
                Ok(_) => Some(Mutex::new(tx)),
                Err(e) => {
                    tracing::warn!(error = %e, "no helper thread for socket searches; one lane");
                    None
                }
            }
        })
        .as_ref()
}

/// Runs `work` over `0..len` in order until one check hits.
pub(super) fn first_hit(len: usize, work: Work) -> Found {
    let search = Arc::new(Search {
        len,
        work,
        next: AtomicUsize::new(0),
        done: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        helper: Mutex::new(Found::default()),
        settled: Condvar::new(),
    });
    if len >= TWO_LANES_MIN
        && let Some(helper) = helper()
    {
        // A failed send (the helper ended) leaves this lane to do it all.
        let _ = lock(helper).send(Arc::clone(&search));
    }
    let mut mine = Found::default();
    while let Some(i) = search.claim() {
        let step = (search.work)(i);
        mine.add(i, step);
        if step == Step::Hit {
            break;
        }
    }
    // Nothing more is claimed; wait only for a check the helper is in the middle of.
    search.done.store(true, Ordering::SeqCst);
    let mut theirs = lock(&search.helper);
    while search.in_flight.load(Ordering::SeqCst) > 0 {
        theirs = search
            .settled
            .wait(theirs)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
    let theirs = std::mem::take(&mut *theirs);
    if let Some(i) = theirs.hit {
        mine.add(i, Step::Hit);
    }
    mine.partly.extend(theirs.partly);
    mine
}

#[cfg(test)]
mod tests {
    use super::*;

    fn over(len: usize, hit: Option<usize>, partly: fn(usize) -> bool) -> Found {
        first_hit(
            len,
            Arc::new(move |i| {
                if Some(i) == hit {
                    Step::Hit
                } else if partly(i) {
                    Step::Partly
                } else {
                    Step::Miss
                }
            }),
        )
    }

    #[test]
    fn the_hit_and_every_partial_check_are_reported_from_both_lanes() {
        for len in [0, 1, 10, TWO_LANES_MIN, 500] {
            let found = over(len, None, |i| i % 7 == 0);
            let mut partly = found.partly;
            partly.sort_unstable();
            assert_eq!(found.hit, None);
            assert_eq!(partly, (0..len).filter(|i| i % 7 == 0).collect::<Vec<_>>());
        }
        for hit in [0, 63, 64, 250, 499] {
            assert_eq!(over(500, Some(hit), |_| false).hit, Some(hit));
        }
    }

    #[test]
    fn a_search_stops_soon_after_its_hit() {
        let checked = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&checked);
        let found = first_hit(
            10_000,
            Arc::new(move |i| {
                counter.fetch_add(1, Ordering::SeqCst);
                if i == 100 { Step::Hit } else { Step::Miss }
            }),
        );
        assert_eq!(found.hit, Some(100));
        // Each lane finishes at most the check it had claimed.
        assert!(checked.load(Ordering::SeqCst) <= 103, "{checked:?}");
    }
}

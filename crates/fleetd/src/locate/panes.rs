//! The locator's pane map (pane process pid → pane incarnation) and how it stays current without
//! making lookups wait. Lookups read a shared snapshot (an `Arc` taken under a lock held only for
//! the clone); a refresh lists the panes with no lock on the snapshot across its I/O, one refresh
//! at a time, and swaps its result in. Who waits for a refresh:
//!
//! - nobody, when the map is only older than `pane_ttl`: the lookup answers from the snapshot and
//!   one refresh runs in the background (a failed one is tried again after `miss_refresh`);
//! - a lookup whose caller is in no pane of the snapshot (a pane opened a moment ago): unless the
//!   miss is final — the reading was complete (every pane with its process and start time) and
//!   its listing was asked for after the caller and all its ancestors had started, so any pane
//!   one of them is the process of was in it (a pane exists before its process starts) — it waits for
//!   a reading whose listing was asked for after the lookup began (one already listing may have
//!   listed before the pane opened), at most one refresh per `miss_refresh` unless fleetd opened
//!   a pane since the map was read, shared by every such lookup at the time — and only that
//!   lookup waits;
//! - every lookup, when the map is stale (never read yet, or pane events were missed);
//!
//! and after a failed reading nobody, until `miss_refresh` has passed: the map as it is answers.
//!
//! A pane the multiplexer reports `Gone` is taken out of the snapshot at once (no listing), and a
//! refresh that was listing meanwhile cannot bring it back. Every match is checked against the
//! process's start time, so a recycled pid is never mistaken for the old pane process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fleetd_core::{QualifiedPaneId, TerminalId};
use tokio::time::Instant;

use super::{CallerPane, LocateError, LocatorConfig, lock, platform};
use crate::mux::MuxRouter;

#[derive(Debug, Clone)]
struct ShellEntry {
    pane: QualifiedPaneId,
    terminal: TerminalId,
    start_time: u64,
    workspace_label: Option<String>,
}

/// One reading of the panes: which process is which pane's.
#[derive(Debug, Default, Clone)]
pub(super) struct PaneMap {
    /// When the listing it came from was asked for (before its I/O: every pane that existed
    /// then is in it); `None` for the empty map before the first one.
    fetched: Option<Instant>,
    /// The same moment on the clock process start times count on (`None`: not read).
    fetched_ticks: Option<u64>,
    /// Every pane the listing had is in `by_shell` (its process and start time were read).
    complete: bool,
    by_shell: HashMap<u32, ShellEntry>,
    /// (pane, terminal) → shell pid, so a refresh only asks for new incarnations.
    known: HashMap<(QualifiedPaneId, TerminalId), u32>,
}

impl PaneMap {
    /// Every pane's own process: the roots of the pane trees a socket's holder is looked for in.
    pub(super) fn shells(&self) -> Vec<u32> {
        self.by_shell.keys().copied().collect()
    }

    /// The pane of the nearest process in `chain` (the caller first, then its ancestors) that is
    /// a pane's process with the start time the map recorded for it.
    pub(super) fn find(&self, chain: &[platform::ProcStat]) -> Option<CallerPane> {
        chain.iter().find_map(|stat| {
            self.by_shell
                .get(&stat.pid)
                .filter(|entry| entry.start_time == stat.start_time)
                .map(|entry| CallerPane {
                    pane: entry.pane.clone(),
                    terminal: entry.terminal.clone(),
                    shell_pid: stat.pid,
                    workspace_label: entry.workspace_label.clone(),
                    started: entry.start_time,
                })
        })
    }

    /// Pane `pane` as this reading has it (its live incarnation), if it is in it.
    pub(super) fn pane(&self, pane: &QualifiedPaneId) -> Option<CallerPane> {
        self.by_shell
            .iter()
            .find(|(_, entry)| entry.pane == *pane)
            .map(|(pid, entry)| CallerPane {
                pane: entry.pane.clone(),
                terminal: entry.terminal.clone(),
                shell_pid: *pid,
                workspace_label: entry.workspace_label.clone(),
                started: entry.start_time,
            })
    }

    /// Whether a miss of `chain` (the caller first, then its ancestors) in this reading is
    /// final: the reading is complete and every process in the chain started at least one clock
    /// tick before its listing was asked for, so a pane any of them is the process of existed
    /// then and is in it. A later listing could only add panes whose processes started later.
    pub(super) fn miss_is_final(&self, chain: &[platform::ProcStat]) -> bool {
        self.complete
            && !chain.is_empty()
            && self.fetched_ticks.is_some_and(|listed| {
                chain
                    .iter()
                    .all(|stat| stat.start_time.saturating_add(1) < listed)
            })
    }

    /// Whether `pane` holds incarnation `terminal` in this reading.
    pub(super) fn holds(&self, pane: &QualifiedPaneId, terminal: &TerminalId) -> bool {
        self.known.contains_key(&(pane.clone(), terminal.clone()))
    }

    /// Takes out an incarnation reported gone (every incarnation of the pane for `None`).
    fn forget(&mut self, gone: &Gone) {
        let (pane, terminal) = gone;
        let hit = |p: &QualifiedPaneId, t: &TerminalId| {
            p == pane && terminal.as_ref().is_none_or(|gone| gone == t)
        };
        self.known.retain(|(p, t), _| !hit(p, t));
        self.by_shell.retain(|_, e| !hit(&e.pane, &e.terminal));
    }
}

/// A pane incarnation the multiplexer reported gone (`None`: the pane, whatever incarnation).
type Gone = (QualifiedPaneId, Option<TerminalId>);

/// The pane map and its refreshes, shared by every clone of a `Locator`.
#[derive(Debug)]
pub(super) struct Panes {
    router: MuxRouter,
    config: LocatorConfig,
    /// The current reading. Written only to swap a new `Arc` in (or take a gone pane out).
    snapshot: RwLock<Arc<PaneMap>>,
    /// One refresh at a time. Held across a refresh's I/O; never by a lookup that only reads.
    refreshing: tokio::sync::Mutex<()>,
    /// Set when pane events were missed: every lookup waits for the next reading.
    stale: AtomicBool,
    /// When fleetd last opened a pane: a miss in a map read before then refreshes without
    /// waiting for `miss_refresh` (every such miss, not only the first: spawns run in parallel).
    grown: Mutex<Option<Instant>>,
    /// A background refresh is running.
    background: AtomicBool,
    /// Not before this does a background refresh run again (after a failed one).
    retry_at: Mutex<Option<Instant>>,
    /// Incarnations reported gone while the refresh running now was listing. Written and read
    /// under the `snapshot` write lock.
    gone_during: Mutex<Vec<Gone>>,
}

impl Panes {
    pub(super) fn new(router: MuxRouter, config: LocatorConfig) -> Self {
        Self {
            router,
            config,
            snapshot: RwLock::new(Arc::new(PaneMap::default())),
            refreshing: tokio::sync::Mutex::new(()),
            stale: AtomicBool::new(false),
            grown: Mutex::new(None),
            background: AtomicBool::new(false),
            retry_at: Mutex::new(None),
            gone_during: Mutex::new(Vec::new()),
        }
    }

    fn snapshot(&self) -> Arc<PaneMap> {
        Arc::clone(
            &self
                .snapshot
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Pane events were missed: the next lookups wait for a new reading.
    pub(super) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// fleetd opened a pane: the next miss reads the panes at once.
    pub(super) fn mark_grown(&self) {
        *lock(&self.grown) = Some(Instant::now());
    }

    /// An incarnation ended: it leaves the snapshot now, and the refresh running (if any) will
    /// not put it back.
    pub(super) fn gone(&self, pane: QualifiedPaneId, terminal: Option<TerminalId>) {
        let gone = (pane, terminal);
        let mut snapshot = self
            .snapshot
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut map = PaneMap::clone(&snapshot);
        map.forget(&gone);
        *snapshot = Arc::new(map);
        lock(&self.gone_during).push(gone);
    }

    /// The map to answer from now: the snapshot, unless it is stale (or was never read), in which
    /// case the next reading. An expired snapshot is answered from while one refresh runs in the
    /// background.
    pub(super) async fn current(self: &Arc<Self>) -> Result<Arc<PaneMap>, LocateError> {
        let map = self.snapshot();
        if map.fetched.is_none() || self.stale.load(Ordering::Relaxed) {
            return self.read_since(Instant::now()).await;
        }
        if map
            .fetched
            .is_some_and(|at| at.elapsed() >= self.config.pane_ttl)
        {
            self.refresh_in_background(self.config.pane_ttl);
        }
        Ok(map)
    }

    /// A reading taken after a lookup missed in `missed`: at once when fleetd has just opened a
    /// pane, otherwise no sooner than `miss_refresh` after `missed` was read (anonymous callers
    /// must not turn every request into a multiplexer listing).
    /// How long a lookup that missed waits before the panes are read again.
    pub(super) fn miss_refresh(&self) -> std::time::Duration {
        self.config.miss_refresh
    }

    ///
    /// The caller's process existed when its lookup began, and so did its pane: only a listing
    /// asked for after that can have it. A refresh that was already listing when the lookup
    /// missed is not enough (it may have listed before the pane opened).
    pub(super) async fn after_miss(
        self: &Arc<Self>,
        missed: &Arc<PaneMap>,
        chain: &[platform::ProcStat],
        looked_at: Instant,
    ) -> Result<Arc<PaneMap>, LocateError> {
        if missed.miss_is_final(chain) && !self.stale.load(Ordering::Relaxed) {
            return Ok(Arc::clone(missed));
        }
        let grown_since =
            lock(&self.grown).is_some_and(|grown| missed.fetched.is_none_or(|read| read <= grown));
        if !grown_since && let Some(at) = missed.fetched {
            tokio::time::sleep_until(at + self.config.miss_refresh).await;
        }
        self.read_since(looked_at).await
    }

    /// Waits for a reading whose listing was asked for at `since` or later: the one a refresh
    /// running now produces if it started in time, or one this call makes. Only one refresh
    /// runs at a time; callers queued behind it take its answer when it is recent enough.
    /// A reading asked for now (or one already under way that began after now).
    pub(super) async fn read_now(&self) -> Result<Arc<PaneMap>, LocateError> {
        self.read_since(Instant::now()).await
    }

    async fn read_since(&self, since: Instant) -> Result<Arc<PaneMap>, LocateError> {
        let _turn = self.refreshing.lock().await;
        let map = self.snapshot();
        if map.fetched.is_some_and(|read| read >= since) && !self.stale.load(Ordering::Relaxed) {
            return Ok(map);
        }
        // A reading failed a moment ago (perhaps the one this call queued behind): the
        // multiplexer is not asked again before `retry_at` (the map as it is answers; with none
        // read yet that is no pane at all), so callers a down multiplexer cannot place do not
        // each spawn a listing of their own.
        if lock(&self.retry_at).is_some_and(|at| Instant::now() < at) {
            return Ok(map);
        }
        self.refresh_now(map).await
    }

    /// Reads the panes (the caller holds `refreshing`) and swaps the reading in. A failed reading
    /// keeps the previous map when there is one.
    async fn refresh_now(&self, previous: Arc<PaneMap>) -> Result<Arc<PaneMap>, LocateError> {
        self.stale.store(false, Ordering::Relaxed);
        lock(&self.gone_during).clear();
        let outcome = self.read(&previous).await;
        match outcome {
            Ok(mut map) => {
                let mut snapshot = self
                    .snapshot
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for gone in lock(&self.gone_during).drain(..) {
                    map.forget(&gone);
                }
                let map = Arc::new(map);
                *snapshot = Arc::clone(&map);
                *lock(&self.retry_at) = None;
                Ok(map)
            }
            Err(e) => {
                *lock(&self.retry_at) = Some(Instant::now() + self.config.miss_refresh);
                if previous.fetched.is_some() {
                    tracing::debug!(error = %e, "pane map refresh failed; keeping the previous one");
                    Ok(self.snapshot())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Starts one refresh on a task of its own, when the map is older than `max_age` then, unless
    /// one is running or a failed one is too recent.
    pub(super) fn refresh_in_background(self: &Arc<Self>, max_age: std::time::Duration) {
        if lock(&self.retry_at).is_some_and(|at| Instant::now() < at)
            || self.background.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let turn = this.refreshing.lock().await;
            let map = this.snapshot();
            if map.fetched.is_none_or(|at| at.elapsed() >= max_age) {
                let _ = this.refresh_now(map).await;
            }
            drop(turn);
            this.background.store(false, Ordering::Release);
        });
    }

    /// One reading of the panes, reusing the shell pids `previous` knows: the listing, a
    /// `process_info` per new incarnation whose listing has no pid, and each shell's start time.
    async fn read(&self, previous: &PaneMap) -> Result<PaneMap, LocateError> {
        let asked = Instant::now();
        let asked_ticks = platform::start_clock_now().ok();
        let panes = self.router.list_panes().await?;
        let listed = panes.len();
        let mut known = HashMap::new();
        let mut labels = HashMap::new();
        for routed in panes {
            let key = (routed.id.clone(), routed.info.terminal.clone());
            let shell = match (previous.known.get(&key).copied(), routed.info.shell_pid) {
                (Some(pid), _) | (None, Some(pid)) => Some(pid),
                (None, None) => match self.router.process_info(&routed.id).await {
                    Ok(info) => info.shell_pid,
                    Err(e) if e.is_not_found() => None,
                    Err(e) => return Err(e.into()),
                },
            };
            if let Some(pid) = shell {
                labels.insert(key.clone(), routed.info.workspace_label.clone());
                known.insert(key, pid);
            }
        }
        // A start time already read for the same pid and incarnation is still right: the pid
        // cannot have been recycled while the incarnation it belongs to lives on.
        let mut starts: HashMap<u32, u64> = HashMap::new();
        let mut unread = Vec::new();
        for (key, pid) in &known {
            match previous.by_shell.get(pid) {
                Some(e) if e.pane == key.0 && e.terminal == key.1 => {
                    starts.insert(*pid, e.start_time);
                }
                _ => unread.push(*pid),
            }
        }
        let read = tokio::task::spawn_blocking(move || {
            unread
                .into_iter()
                .filter_map(|pid| platform::read_stat(pid).ok().map(|s| (pid, s.start_time)))
                .collect::<HashMap<u32, u64>>()
        })
        .await
        .map_err(|e| LocateError::Proc(std::io::Error::other(e)))?;
        starts.extend(read);
        let by_shell: HashMap<u32, ShellEntry> = known
            .iter()
            .filter_map(|(key, pid)| {
                starts.get(pid).map(|start| {
                    (
                        *pid,
                        ShellEntry {
                            pane: key.0.clone(),
                            terminal: key.1.clone(),
                            start_time: *start,
                            workspace_label: labels.get(key).cloned().flatten(),
                        },
                    )
                })
            })
            .collect();
        let complete = known.len() == listed && by_shell.len() == known.len();
        Ok(PaneMap {
            fetched: Some(asked),
            fetched_ticks: asked_ticks,
            complete,
            by_shell,
            known,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fleetd_core::AgentStatus;

    use super::*;
    use crate::mux::fake::FakeMux;

    /// The pane cache over `fake`, its readings kept a minute, a miss waiting `miss_refresh`
    /// for a newer one.
    fn panes_over(fake: &FakeMux, miss_refresh: Duration) -> Arc<Panes> {
        let router = MuxRouter::new(Arc::new(fake.clone()), None);
        let config = LocatorConfig {
            pane_ttl: Duration::from_secs(60),
            miss_refresh,
        };
        Arc::new(Panes::new(router, config))
    }

    /// A pane opens while a refresh is listing (the listing missed it); its process calls at
    /// once. The lookup must not take that refresh's answer, which cannot hold the pane: it
    /// waits for a listing asked for after it began (the `fleet_spawn`s of 200 members, 8 at a
    /// time, left some agents anonymous for good this way: they call once).
    #[tokio::test]
    async fn a_miss_takes_only_a_listing_asked_for_after_it_began() {
        let fake = FakeMux::new();
        let panes = panes_over(&fake, Duration::from_millis(50));
        let empty = panes.current().await.expect("first reading");
        assert!(empty.shells().is_empty());

        fake.hold_listings(true);
        panes.refresh_in_background(Duration::ZERO);
        while fake.listings() < 2 {
            tokio::task::yield_now().await;
        }
        // The pane opens behind that listing, and its process's lookup misses.
        fake.add_pane("w1:p1", "t1", "w1:t1", AgentStatus::Idle);
        fake.set_shell_pid("w1:p1", std::process::id());
        panes.mark_grown();
        let looked_at = Instant::now();
        let lookup = tokio::spawn({
            let panes = Arc::clone(&panes);
            async move { panes.after_miss(&empty, &[], looked_at).await }
        });
        tokio::task::yield_now().await;
        fake.hold_listings(false);

        let map = lookup.await.expect("lookup").expect("a reading");
        let me = platform::read_stat(std::process::id()).expect("own stat");
        let found = map.find(&[me]).expect("the new pane is found");
        assert_eq!(found.pane.pane.as_str(), "w1:p1");
        assert_eq!(fake.listings(), 3, "one listing after the miss, no more");
    }

    /// A caller in no pane whose every ancestor started before a complete listing is in no pane
    /// for good: its lookup answers at once, without waiting `miss_refresh` or listing again.
    /// A caller with a process younger than the listing still gets a new one.
    #[tokio::test]
    async fn a_final_miss_neither_waits_nor_lists() {
        let fake = FakeMux::new();
        fake.add_pane("w1:p1", "t1", "w1:t1", AgentStatus::Idle);
        fake.set_shell_pid("w1:p1", std::process::id());
        let panes = panes_over(&fake, Duration::from_secs(3600));
        let map = panes.current().await.expect("a reading");
        assert_eq!(fake.listings(), 1);
        let old = platform::ProcStat {
            pid: 4_000_001,
            ppid: 1,
            session: 1,
            start_time: 0,
        };
        assert!(map.miss_is_final(&[old]));
        let again = tokio::time::timeout(
            Duration::from_secs(5),
            panes.after_miss(&map, &[old], Instant::now()),
        )
        .await
        .expect("answered without waiting an hour")
        .expect("the map");
        assert!(again.find(&[old]).is_none());
        assert_eq!(fake.listings(), 1, "no listing for a final miss");

        let young = platform::ProcStat {
            start_time: u64::MAX - 1,
            ..old
        };
        assert!(
            !map.miss_is_final(&[old, young]),
            "an ancestor younger than the listing"
        );
        assert!(!map.miss_is_final(&[]), "no chain read: nothing is final");
        let incomplete = PaneMap {
            complete: false,
            ..PaneMap::clone(&map)
        };
        assert!(
            !incomplete.miss_is_final(&[old]),
            "a pane without its process"
        );
    }
}

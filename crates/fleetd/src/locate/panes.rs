//! The locator's pane map (pane process pid → pane incarnation) and how it stays current without
//! making lookups wait. Lookups read a shared snapshot (an `Arc` taken under a lock held only for
//! the clone); a refresh lists the panes with no lock on the snapshot across its I/O, one refresh
//! at a time, and swaps its result in. Who waits for a refresh:
//!
//! - nobody, when the map is only older than `pane_ttl`: the lookup answers from the snapshot and
//!   one refresh runs in the background (a failed one is tried again after `miss_refresh`);
//! - a lookup whose caller is in no pane of the snapshot (a pane opened a moment ago): it waits for
//!   a map newer than the one it missed in, at most one refresh per `miss_refresh`, shared by every
//!   such lookup at the time — and only that lookup waits;
//! - every lookup, when the map is stale (never read yet, or pane events were missed);
//!
//! and after a failed reading nobody, until `miss_refresh` has passed: the map as it is answers.
//!
//! A pane the multiplexer reports `Gone` is taken out of the snapshot at once (no listing), and a
//! refresh that was listing meanwhile cannot bring it back. Every match is checked against the
//! process's start time, so a recycled pid is never mistaken for the old pane process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// When the listing it came from was read; `None` for the empty map before the first one.
    fetched: Option<Instant>,
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
                })
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
    /// Set when a pane was just opened by fleetd: the next miss refreshes without waiting for
    /// `miss_refresh`.
    grown: AtomicBool,
    /// Counts refresh attempts, so lookups that queued behind one take its answer.
    attempts: AtomicU64,
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
            grown: AtomicBool::new(false),
            attempts: AtomicU64::new(0),
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
        self.grown.store(true, Ordering::Relaxed);
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
            return self.newer_than(&map).await;
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

    pub(super) async fn after_miss(
        self: &Arc<Self>,
        missed: &Arc<PaneMap>,
    ) -> Result<Arc<PaneMap>, LocateError> {
        if !self.grown.swap(false, Ordering::Relaxed)
            && let Some(at) = missed.fetched
        {
            tokio::time::sleep_until(at + self.config.miss_refresh).await;
        }
        self.newer_than(missed).await
    }

    /// Waits for a reading newer than `seen`: the one a refresh running now produces, or one
    /// this call makes. Only one refresh runs at a time; callers queued behind it take its answer.
    async fn newer_than(&self, seen: &Arc<PaneMap>) -> Result<Arc<PaneMap>, LocateError> {
        let attempts = self.attempts.load(Ordering::Acquire);
        let _turn = self.refreshing.lock().await;
        let map = self.snapshot();
        let someone_read = self.attempts.load(Ordering::Acquire) != attempts;
        // A newer reading, not merely the same one with a gone pane taken out.
        if (someone_read || map.fetched != seen.fetched)
            && map.fetched.is_some()
            && !self.stale.load(Ordering::Relaxed)
        {
            return Ok(map);
        }
        // A reading failed a moment ago: the multiplexer is not asked again before `retry_at`
        // (the map as it is answers; with none read yet that is no pane at all), so callers a
        // down multiplexer cannot place do not each spawn a listing of their own.
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
        self.attempts.fetch_add(1, Ordering::Release);
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
        let panes = self.router.list_panes().await?;
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
        let by_shell = known
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
        Ok(PaneMap {
            fetched: Some(Instant::now()),
            by_shell,
            known,
        })
    }
}

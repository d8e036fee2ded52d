//! tmux status watches: one task reads every watched pane, woken by tmux's own notifications.
//! Each session holding a watched pane gets an event client (a control client attached to it
//! with output on, `control`): a pane's `%output` marks that pane for an immediate reading (one
//! `list-panes` filtered to it, plus its screen when its status depends on it), at most one per
//! [`COALESCE`] however chatty the pane; a window or pane coming or going (`%window-close`,
//! `%unlinked-window-close`, `%window-add`, `%pane-mode-changed`, `%sessions-changed`, ...), an
//! event client leaving, or a lagging notification stream reads everything: one `list-panes -a`
//! for all watched panes. A safety poll does the same every `safety_poll_interval` to catch
//! anything missed (a title set without output), and every `poll_interval` while some watched
//! session has no event client (control mode off or failing: the old polling). The safety poll
//! judges a pane that printed nothing since its last screen read on that screen again (up to
//! [`SCREEN_REUSE`] old) instead of capturing it: an idle fleet costs one `list-panes`.
//!
//! Readings are de-duplicated into `PaneEvent`s, and `Gone` is published when a successful
//! listing lacks the pane or shows it re-incarnated. All readings come from the one task, so
//! they reach the event stream in the order they were read; a poke (watching a pane again)
//! makes the task read at once and publish that pane's status even when unchanged.
//!
//! tmux sends `%output` only for panes of the session a control client is attached to, hence
//! one event client per watched session; attaching bumps that session's activity (which
//! session a bare `tmux attach` picks). Format subscriptions (`refresh-client -B`) would need
//! no output stream, but tmux checks them on a one-second timer: too slow for a wake-up.
//!
//! The task and the event pumps hold the backend weakly: dropping the last `Tmux` ends them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fleetd_core::{AgentStatus, PaneId, TerminalId};
use tokio::sync::{Notify, broadcast};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::control::{Conn, Notification};
use super::{Inner, RawPane, Tmux};
use crate::mux::PaneEvent;

/// After reading panes on their output, the task waits this long before reading on output
/// again: a pane printing continuously costs at most one reading per window, and a quiet pane's
/// first output is read at once.
const COALESCE: Duration = Duration::from_millis(25);

/// More panes than this marked at once are read with one listing of all of them.
const MAX_SINGLE_READS: usize = 4;

/// How long after an event client failed to attach the task tries again (meanwhile it polls).
const EVENT_CLIENT_BACKOFF: Duration = Duration::from_secs(2);

/// A safety poll reuses a pane's last screen when tmux reported no output from it since (its
/// session's event client would have), for at most this long: with 200 agents at rest, the
/// poll is one `list-panes`, not 200 `capture-pane`s.
const SCREEN_REUSE: Duration = Duration::from_secs(60);

/// The watched panes and the task polling them.
#[derive(Debug, Default)]
pub(super) struct Watches {
    panes: HashMap<PaneId, Watched>,
    task: Option<AbortHandle>,
    /// Wakes the task before its interval: a pane to read and publish now.
    poke: Arc<Notify>,
    /// Panes whose output tmux reported since their last reading.
    dirty: HashSet<PaneId>,
    /// A pane or window came or went, or an event client left: read every watched pane.
    relist: bool,
    /// The event clients, by the name of the session each is attached to.
    clients: HashMap<String, EventClient>,
    /// No event client is attached before this (one failed to just now).
    clients_retry_at: Option<Instant>,
}

/// A control client attached to one session for its notifications, and the task passing them
/// on to the watches.
#[derive(Debug)]
struct EventClient {
    conn: Arc<Conn>,
    pump: AbortHandle,
}

impl Drop for EventClient {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

#[derive(Debug, Default)]
struct Watched {
    /// The last published incarnation and status.
    last: Option<(TerminalId, AgentStatus)>,
    /// Publish the next reading even if unchanged (a new watch, or a poke).
    force: bool,
    /// The screen tail its status was last derived from, and when it was read.
    screen: Option<(String, Instant)>,
}

impl Watches {
    /// Stops the polling task (the backend is going away).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.clients.clear();
        self.dirty.clear();
    }
}

impl Tmux {
    fn watches(&self) -> std::sync::MutexGuard<'_, Watches> {
        lock(&self.inner)
    }

    /// Watches `pane`, or has its watch publish the current status again.
    pub(super) fn start_watch(&self, pane: PaneId) {
        let mut watches = self.watches();
        watches.panes.entry(pane).or_default().force = true;
        let running = watches.task.as_ref().is_some_and(|t| !t.is_finished());
        if running {
            watches.poke.notify_one();
            return;
        }
        let inner = Arc::downgrade(&self.inner);
        let poke = Arc::clone(&watches.poke);
        let task = tokio::spawn(poll_loop(inner, poke));
        watches.task = Some(task.abort_handle());
    }

    /// Stops watching `pane`; the task ends with the last watch.
    pub(super) fn stop_watch(&self, pane: &PaneId) {
        let mut watches = self.watches();
        watches.panes.remove(pane);
        if watches.panes.is_empty() {
            watches.stop();
        }
    }

    /// One reading of every watched pane from one listing; true when every watched session's
    /// event client is attached (so the next full reading can wait for the safety poll). Unless
    /// `fresh`, a pane whose session has an event client and that printed nothing since its last
    /// screen read (not in `dirty`) is judged on that screen again (see [`SCREEN_REUSE`]).
    async fn poll_once(&self, fresh: bool, dirty: &HashSet<PaneId>) -> bool {
        let watched: Vec<PaneId> = self.watches().panes.keys().cloned().collect();
        if watched.is_empty() {
            return false;
        }
        let listed: HashMap<String, RawPane> = match self.raw_panes().await {
            Ok(listed) => listed
                .into_iter()
                .map(|raw| (raw.pane.clone(), raw))
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "tmux status poll failed; will retry");
                return false;
            }
        };
        let sessions: HashSet<String> = watched
            .iter()
            .filter_map(|pane| listed.get(pane.as_str()).map(|raw| raw.session.clone()))
            .collect();
        let covered = self.attach_event_clients(sessions).await;
        for pane in watched {
            let reuse = if fresh || dirty.contains(&pane) {
                None
            } else {
                listed
                    .get(pane.as_str())
                    .and_then(|raw| self.reusable_screen(&pane, &raw.session))
            };
            let reading = match listed.get(pane.as_str()) {
                // A successful listing without the pane: affirmatively gone.
                None => None,
                Some(raw) => match self.read_status_with(&pane, raw, reuse).await {
                    Ok(reading) => Some(reading),
                    Err(e) if e.is_not_found() => None,
                    Err(e) => {
                        tracing::debug!(%pane, error = %e, "tmux status poll failed; will retry");
                        continue;
                    }
                },
            };
            self.publish(&pane, reading);
        }
        covered
    }

    /// One reading of `pane` alone (its output was seen).
    async fn poll_pane(&self, pane: &PaneId) {
        let reading = match self.raw_pane(pane).await {
            Ok(raw) => match self.read_status(pane, &raw).await {
                Ok(reading) => Some(reading),
                Err(e) if e.is_not_found() => None,
                Err(e) => {
                    tracing::debug!(%pane, error = %e, "tmux status read failed; will retry");
                    return;
                }
            },
            // A successful listing without the pane: affirmatively gone.
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                tracing::debug!(%pane, error = %e, "tmux status read failed; will retry");
                return;
            }
        };
        self.publish(pane, reading);
    }

    /// Keeps one event client attached to each of `sessions` (and none to any other); true when
    /// every one is attached.
    async fn attach_event_clients(&self, sessions: HashSet<String>) -> bool {
        let config = &self.inner.config;
        if !config.control_mode {
            return false;
        }
        let missing: Vec<String> = {
            let mut watches = self.watches();
            watches
                .clients
                .retain(|session, client| sessions.contains(session) && !client.conn.is_closed());
            let now = Instant::now();
            if watches.clients_retry_at.is_some_and(|at| now < at) {
                return sessions.iter().all(|s| watches.clients.contains_key(s));
            }
            sessions
                .into_iter()
                .filter(|s| !watches.clients.contains_key(s))
                .collect()
        };
        let mut covered = true;
        for session in missing {
            let target = format!("={session}");
            match self.attach(Some(&target), true).await {
                Ok(conn) => {
                    let conn = Arc::new(conn);
                    let mut watches = self.watches();
                    let pump = tokio::spawn(pump(
                        Arc::downgrade(&self.inner),
                        conn.notifications(),
                        Arc::clone(&watches.poke),
                    ));
                    // Output between this listing and the attach would be missed: read again.
                    watches.relist = true;
                    watches.poke.notify_one();
                    watches.clients.insert(
                        session,
                        EventClient {
                            conn,
                            pump: pump.abort_handle(),
                        },
                    );
                }
                Err(reason) => {
                    tracing::debug!(%session, %reason, "no tmux event client; polling");
                    self.watches().clients_retry_at = Some(Instant::now() + EVENT_CLIENT_BACKOFF);
                    covered = false;
                }
            }
        }
        covered
    }

    /// The screen `pane` was last judged on, when it may be judged on it again: its session's
    /// event client is attached (it would have reported output), and it is recent.
    fn reusable_screen(&self, pane: &PaneId, session: &str) -> Option<String> {
        let watches = self.watches();
        let attached = watches
            .clients
            .get(session)
            .is_some_and(|c| !c.conn.is_closed());
        let (screen, at) = watches.panes.get(pane)?.screen.as_ref()?;
        (attached && at.elapsed() < SCREEN_REUSE).then(|| screen.clone())
    }

    /// The incarnation and status of a listed pane: its screen is read only when the status
    /// depends on it.
    async fn read_status(
        &self,
        pane: &PaneId,
        raw: &RawPane,
    ) -> Result<(TerminalId, AgentStatus), crate::mux::MuxError> {
        self.read_status_with(pane, raw, None).await
    }

    /// [`Tmux::read_status`], judging on `screen` instead of reading it when one is given.
    async fn read_status_with(
        &self,
        pane: &PaneId,
        raw: &RawPane,
        screen: Option<String>,
    ) -> Result<(TerminalId, AgentStatus), crate::mux::MuxError> {
        let needs_screen = crate::mux::screen_status::needs_screen(&raw.title, &raw.command);
        let screen = match (needs_screen, screen) {
            (false, _) => None,
            (true, Some(kept)) => Some(kept),
            (true, None) => {
                let read = self.read_tail_inner(pane, 40).await?;
                if let Some(watched) = self.watches().panes.get_mut(pane) {
                    watched.screen = Some((read.clone(), Instant::now()));
                }
                Some(read)
            }
        };
        let info = Self::convert(raw, screen.as_deref())?;
        Ok((info.terminal, info.status))
    }

    /// Publishes what changed for `pane` (`None`: it is gone, and its watch ends).
    fn publish(&self, pane: &PaneId, reading: Option<(TerminalId, AgentStatus)>) {
        let mut watches = self.watches();
        // Unwatched while it was being read: nobody wants this reading.
        let Some(watched) = watches.panes.get_mut(pane) else {
            return;
        };
        let events = &self.inner.events;
        let Some((terminal, status)) = reading else {
            let last = watched.last.take().map(|(t, _)| t);
            watches.panes.remove(pane);
            let _ = events.send(PaneEvent::Gone {
                pane: pane.clone(),
                terminal: last,
            });
            return;
        };
        let changed = watched.force || watched.last.as_ref() != Some(&(terminal.clone(), status));
        watched.force = false;
        if !changed {
            return;
        }
        if let Some((old, _)) = watched.last.as_ref().filter(|(t, _)| *t != terminal) {
            let _ = events.send(PaneEvent::Gone {
                pane: pane.clone(),
                terminal: Some(old.clone()),
            });
        }
        watched.last = Some((terminal.clone(), status));
        let _ = events.send(PaneEvent::StatusChanged {
            pane: pane.clone(),
            terminal,
            status,
        });
    }
}

fn lock(inner: &Inner) -> std::sync::MutexGuard<'_, Watches> {
    crate::sync::lock(&inner.watches)
}

/// Passes one event client's notifications on to the watches: output of a watched pane marks
/// it, anything about panes and windows (or a lag, or the client leaving) asks for a full read.
async fn pump(inner: Weak<Inner>, mut notes: broadcast::Receiver<Notification>, poke: Arc<Notify>) {
    loop {
        let note = match notes.recv().await {
            Ok(note) => note,
            Err(broadcast::error::RecvError::Lagged(_)) => Notification::Layout { pane: None },
            Err(broadcast::error::RecvError::Closed) => Notification::Exit,
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let mut watches = lock(&inner);
        match &note {
            Notification::Output { pane } => {
                let Ok(pane) = PaneId::new(pane.clone()) else {
                    continue;
                };
                if watches.panes.contains_key(&pane) && watches.dirty.insert(pane) {
                    poke.notify_one();
                }
            }
            Notification::Layout { .. } | Notification::Exit => {
                watches.relist = true;
                poke.notify_one();
            }
        }
        if note == Notification::Exit {
            return;
        }
    }
}

async fn poll_loop(inner: Weak<Inner>, poke: Arc<Notify>) {
    // The first round reads everything (and attaches the event clients).
    let mut next_full = Instant::now();
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let tmux = Tmux { inner };
        let (full, dirty, forced_or_relisted) = {
            let mut watches = tmux.watches();
            let forced = watches.panes.values().any(|w| w.force);
            let dirty: Vec<PaneId> = watches.dirty.drain().collect();
            let forced_or_relisted = forced || watches.relist;
            let full =
                Instant::now() >= next_full || forced_or_relisted || dirty.len() > MAX_SINGLE_READS;
            if full {
                watches.relist = false;
            }
            (full, dirty, forced_or_relisted)
        };
        if full {
            // Only a poll the timer alone asked for may judge quiet panes on their last screen.
            let fresh = forced_or_relisted;
            let dirty: HashSet<PaneId> = dirty.iter().cloned().collect();
            let covered = tmux.poll_once(fresh, &dirty).await;
            let config = &tmux.inner.config;
            let interval = if covered {
                config.safety_poll_interval
            } else {
                config.poll_interval
            };
            next_full = Instant::now() + interval;
        } else {
            for pane in &dirty {
                tmux.poll_pane(pane).await;
            }
        }
        {
            let mut watches = lock(&tmux.inner);
            if watches.panes.is_empty() {
                // Under the lock: a watch added from now on starts a new task.
                watches.task = None;
                watches.clients.clear();
                return;
            }
        }
        // Not held while waiting: the backend can be dropped meanwhile.
        drop(tmux);
        if !full && !dirty.is_empty() {
            tokio::time::sleep(COALESCE).await;
        }
        tokio::select! {
            () = tokio::time::sleep_until(next_full) => {}
            () = poke.notified() => {}
        }
    }
}

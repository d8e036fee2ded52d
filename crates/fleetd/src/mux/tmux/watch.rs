//! tmux status watches: one polling task for every watched pane (tmux pushes nothing). Each poll
//! is one `list-panes -a` for all of them, plus a `capture-pane` only for a pane whose status
//! depends on its screen (an agent that is not showing a spinner: is it at a prompt or in an
//! approval dialog?). Readings are de-duplicated into `PaneEvent`s, and `Gone` is published when
//! a successful listing lacks the pane or shows it re-incarnated. All readings come from the one
//! task, so they reach the event stream in the order they were read; a poke (watching a pane
//! again) makes the task read at once and publish that pane's status even when unchanged.
//!
//! The task holds the backend weakly: dropping the last `Tmux` ends it.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use fleetd_core::{AgentStatus, PaneId, TerminalId};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::{Inner, RawPane, Tmux};
use crate::mux::PaneEvent;
use crate::mux::status::SHELLS;

/// The watched panes and the task polling them.
#[derive(Debug, Default)]
pub(super) struct Watches {
    panes: HashMap<PaneId, Watched>,
    task: Option<AbortHandle>,
    /// Wakes the task before its interval: a pane to read and publish now.
    poke: Arc<Notify>,
}

#[derive(Debug, Default)]
struct Watched {
    /// The last published incarnation and status.
    last: Option<(TerminalId, AgentStatus)>,
    /// Publish the next reading even if unchanged (a new watch, or a poke).
    force: bool,
}

impl Watches {
    /// Stops the polling task (the backend is going away).
    pub(super) fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
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
        let interval = self.inner.config.poll_interval;
        let task = tokio::spawn(poll_loop(inner, poke, interval));
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

    /// One poll over every watched pane.
    async fn poll_once(&self) {
        let watched: Vec<PaneId> = self.watches().panes.keys().cloned().collect();
        if watched.is_empty() {
            return;
        }
        let listed: HashMap<String, RawPane> = match self.raw_panes().await {
            Ok(listed) => listed
                .into_iter()
                .map(|raw| (raw.pane.clone(), raw))
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "tmux status poll failed; will retry");
                return;
            }
        };
        for pane in watched {
            let reading = match listed.get(pane.as_str()) {
                // A successful listing without the pane: affirmatively gone.
                None => None,
                Some(raw) => match self.read_status(&pane, raw).await {
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
    }

    /// The incarnation and status of a listed pane: its screen is read only when the status
    /// depends on it.
    async fn read_status(
        &self,
        pane: &PaneId,
        raw: &RawPane,
    ) -> Result<(TerminalId, AgentStatus), crate::mux::MuxError> {
        let needs_screen =
            !SHELLS.contains(&raw.command.as_str()) && !crate::mux::status::has_spinner(&raw.title);
        let screen = if needs_screen {
            Some(self.read_tail_inner(pane, 40).await?)
        } else {
            None
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
    inner
        .watches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn poll_loop(inner: Weak<Inner>, poke: Arc<Notify>, interval: std::time::Duration) {
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let tmux = Tmux { inner };
        tmux.poll_once().await;
        {
            let mut watches = lock(&tmux.inner);
            if watches.panes.is_empty() {
                // Under the lock: a watch added from now on starts a new task.
                watches.task = None;
                return;
            }
        }
        // Not held while waiting: the backend can be dropped meanwhile.
        drop(tmux);
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = poke.notified() => {}
        }
    }
}

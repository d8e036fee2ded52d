//! tmux status watches: one polling task per watched pane (tmux pushes nothing), publishing
//! de-duplicated `PaneEvent`s and `Gone` when the pane disappears or re-incarnates. Every reading
//! of a watched pane comes from its one task, so they reach the event stream in the order they
//! were read; a poke (watching it again) makes the task read and publish at once.

use std::sync::Arc;

use fleetd_core::{AgentStatus, PaneId, TerminalId};
use tokio::sync::Notify;

use super::Tmux;
use crate::mux::PaneEvent;

impl Tmux {
    pub(super) fn start_watch(&self, pane: PaneId) {
        let mut watches = self
            .inner
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((task, poke)) = watches.get(&pane)
            && !task.is_finished()
        {
            // Watched already: read and publish now, in order with the task's other readings.
            poke.notify_one();
            return;
        }
        let me = self.clone();
        let key = pane.clone();
        let poke = Arc::new(Notify::new());
        let poked = Arc::clone(&poke);
        let task = tokio::spawn(async move { me.poll_loop(pane, poked).await });
        watches.insert(key, (task.abort_handle(), poke));
    }

    async fn poll_loop(self, pane: PaneId, poke: Arc<Notify>) {
        let mut last: Option<(TerminalId, AgentStatus)> = None;
        let events = self.inner.events.clone();
        // The first reading is always published: the watch's "current status".
        let mut force = true;
        loop {
            match self.pane_inner(&pane).await {
                Ok(info) => {
                    let changed =
                        force || last.as_ref() != Some(&(info.terminal.clone(), info.status));
                    if changed {
                        if let Some((old, _)) = last.as_ref().filter(|(t, _)| *t != info.terminal) {
                            let _ = events.send(PaneEvent::Gone {
                                pane: pane.clone(),
                                terminal: Some(old.clone()),
                            });
                        }
                        last = Some((info.terminal.clone(), info.status));
                        let _ = events.send(PaneEvent::StatusChanged {
                            pane: pane.clone(),
                            terminal: info.terminal,
                            status: info.status,
                        });
                    }
                }
                Err(e) if e.is_not_found() => {
                    let _ = events.send(PaneEvent::Gone {
                        pane: pane.clone(),
                        terminal: last.map(|(t, _)| t),
                    });
                    return;
                }
                Err(e) => tracing::debug!(%pane, error = %e, "tmux status poll failed; will retry"),
            }
            force = tokio::select! {
                () = tokio::time::sleep(self.inner.config.poll_interval) => false,
                () = poke.notified() => true,
            };
        }
    }
}

//! tmux status watches: one polling task per watched pane (tmux pushes nothing), publishing
//! de-duplicated `PaneEvent`s and `Gone` when the pane disappears or re-incarnates.

use fleetd_core::{AgentStatus, PaneId, TerminalId};

use super::Tmux;
use crate::mux::PaneEvent;

impl Tmux {
    pub(super) fn start_watch(&self, pane: PaneId) {
        let mut watches = self
            .inner
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if watches.get(&pane).is_some_and(|t| !t.is_finished()) {
            return;
        }
        let me = self.clone();
        let key = pane.clone();
        let task = tokio::spawn(async move { me.poll_loop(pane).await });
        watches.insert(key, task.abort_handle());
    }

    async fn poll_loop(self, pane: PaneId) {
        let mut last: Option<(TerminalId, AgentStatus)> = None;
        let events = self.inner.events.clone();
        loop {
            match self.pane_inner(&pane).await {
                Ok(info) => {
                    let changed = last.as_ref() != Some(&(info.terminal.clone(), info.status));
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
            tokio::time::sleep(self.inner.config.poll_interval).await;
        }
    }
}

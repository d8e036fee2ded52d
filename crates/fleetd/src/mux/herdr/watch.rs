//! Per-pane herdr status watches: one read-only `events.subscribe` connection per watched pane,
//! de-duplication of replayed and repeated statuses against a `pane.get` snapshot, and reconnect
//! with backoff after EOF (server restart, live handoff). herdr 0.9 ends a subscription that lost
//! events with `events_lost`: the watch drops that connection at once,
//! resubscribes and reads the pane again (resync), whether or not herdr has closed it yet.
//! Subscribing comes before that reading, as always: 0.9's lifecycle subscriptions start at the
//! live edge, so a change between the two still arrives as an event.
//! Never writes on a subscription socket.
//! Every reading of a watched pane comes from its one task, so they reach the event stream in
//! order; a poke (watching it again) makes the task read the pane and publish at once.
//!
//! A pane where herdr knows no agent (status `unknown`, no agent label: a `custom` agent) gets
//! no status events from herdr at all, so its watch also reads the pane every
//! [`DERIVE_EVERY`] and derives the status itself (`Herdr::derived_inner`, SPEC §8), until
//! herdr names an agent there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::{AgentStatus, PaneId, TerminalId};
use serde_json::json;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{Notify, broadcast};
use tokio::task::AbortHandle;

use super::Herdr;
use super::wire::{self, WireEvent};
use crate::mux::{MuxError, PaneEvent};

/// First reconnect delay after a lost subscription.
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest reconnect delay: a restarting herdr is back within a second or two.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often a pane whose agent herdr does not know is read to derive its status (tmux's poll).
const DERIVE_EVERY: Duration = Duration::from_millis(400);

/// The table of running watches and the channel they publish on.
#[derive(Debug)]
pub(super) struct Watches {
    /// Each watch's task and the poke that makes it read at once.
    tasks: Mutex<HashMap<PaneId, (AbortHandle, Arc<Notify>)>>,
    events: broadcast::Sender<PaneEvent>,
}

impl Watches {
    pub(super) fn new(events: broadcast::Sender<PaneEvent>) -> Self {
        Self {
            tasks: Mutex::new(HashMap::new()),
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PaneId, (AbortHandle, Arc<Notify>)>> {
        crate::sync::lock(&self.tasks)
    }

    /// Makes a running watch of `pane` read and publish its status now; false when there is
    /// none.
    pub(super) fn poke(&self, pane: &PaneId) -> bool {
        match self.lock().get(pane) {
            Some((task, poke)) if !task.is_finished() => {
                poke.notify_one();
                true
            }
            _ => false,
        }
    }

    pub(super) fn subscribe(&self) -> broadcast::Receiver<PaneEvent> {
        self.events.subscribe()
    }

    pub(super) fn start(&self, herdr: Herdr, pane: PaneId) {
        let mut tasks = self.lock();
        if tasks.get(&pane).is_some_and(|(t, _)| !t.is_finished()) {
            return;
        }
        // Watches that ended (their pane gone) are dropped here, so the table holds live ones.
        tasks.retain(|_, (task, _)| !task.is_finished());
        let poke = Arc::new(Notify::new());
        let watcher = Watcher {
            herdr,
            pane: pane.clone(),
            events: self.events.clone(),
            last: None,
            poke: Arc::clone(&poke),
            derive: false,
        };
        let handle = tokio::spawn(watcher.run());
        tasks.insert(pane, (handle.abort_handle(), poke));
    }

    pub(super) fn remove(&self, pane: &PaneId) {
        if let Some((task, _)) = self.lock().remove(pane) {
            task.abort();
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for (task, _) in self.lock().values() {
            task.abort();
        }
    }
}

/// Why one subscription session ended.
enum SessionEnd {
    /// The pane or its incarnation is gone for good: stop watching.
    Gone,
    /// The connection broke: reconnect.
    Lost(String),
    /// herdr ended the subscription because it lost events (`dropped`, when it said how many):
    /// resubscribe and resync.
    EventsLost(Option<u64>),
}

struct Watcher {
    herdr: Herdr,
    pane: PaneId,
    events: broadcast::Sender<PaneEvent>,
    /// The last (terminal, status) published, for de-duplication.
    last: Option<(TerminalId, AgentStatus)>,
    /// Watching the pane again: read it and publish now.
    poke: Arc<Notify>,
    /// herdr knows no agent in the pane: fleetd derives its status.
    derive: bool,
}

impl Watcher {
    async fn run(mut self) {
        let mut backoff = BACKOFF_START;
        // Whether the last session too ended with lost events, moments after it began: then the
        // next resync backs off like a reconnect, so a server that keeps losing them is not
        // hammered.
        let mut lost_before = false;
        loop {
            let began = tokio::time::Instant::now();
            let (established, end) = self.session().await;
            match end {
                SessionEnd::Gone => {
                    self.publish_gone();
                    return;
                }
                SessionEnd::Lost(reason) => {
                    lost_before = false;
                    tracing::debug!(pane = %self.pane, %reason, "herdr status subscription lost; reconnecting");
                }
                SessionEnd::EventsLost(dropped) => {
                    tracing::info!(pane = %self.pane, ?dropped, "herdr lost status events; resubscribing and reading the pane again");
                    let again = std::mem::replace(&mut lost_before, true);
                    if !again || began.elapsed() > BACKOFF_MAX {
                        backoff = BACKOFF_START;
                        continue;
                    }
                }
            }
            if established {
                backoff = BACKOFF_START;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    fn publish(&self, event: PaneEvent) {
        // No receiver is fine: nobody is listening yet.
        let _ = self.events.send(event);
    }

    fn publish_gone(&mut self) {
        let terminal = self.last.take().map(|(t, _)| t);
        self.publish(PaneEvent::Gone {
            pane: self.pane.clone(),
            terminal,
        });
    }

    /// Publishes `status` for `terminal` unless it repeats the last one; a new terminal first
    /// retires the old incarnation.
    fn observe(&mut self, terminal: TerminalId, status: AgentStatus) {
        if let Some((old, old_status)) = &self.last {
            if *old == terminal && *old_status == status {
                return;
            }
            if *old != terminal {
                self.publish(PaneEvent::Gone {
                    pane: self.pane.clone(),
                    terminal: Some(old.clone()),
                });
            }
        }
        self.last = Some((terminal.clone(), status));
        self.publish(PaneEvent::StatusChanged {
            pane: self.pane.clone(),
            terminal,
            status,
        });
    }

    /// Publishes a reading asked for by a poke, even when it repeats the last one (whoever
    /// watched again wants the current status).
    fn observe_forced(&mut self, terminal: TerminalId, status: AgentStatus) {
        if self.last.as_ref() == Some(&(terminal.clone(), status)) {
            self.publish(PaneEvent::StatusChanged {
                pane: self.pane.clone(),
                terminal,
                status,
            });
        } else {
            self.observe(terminal, status);
        }
    }

    /// One subscription: subscribe, read the ack, take a snapshot, then follow events until the
    /// connection ends. Subscribing before the snapshot means no change between the two is lost;
    /// events older than the snapshot are dropped by `observe`'s de-duplication.
    async fn session(&mut self) -> (bool, SessionEnd) {
        let socket = self.herdr.socket().to_path_buf();
        let mut reader = match self.subscribe(&socket).await {
            Ok(reader) => reader,
            Err(e) if e.is_not_found() => return (false, SessionEnd::Gone),
            Err(e) => return (false, SessionEnd::Lost(e.to_string())),
        };
        let terminal = match self.herdr.derived_inner(&self.pane).await {
            Ok((info, derived)) => {
                self.derive = derived.is_some();
                self.observe(info.terminal.clone(), derived.unwrap_or(info.status));
                info.terminal
            }
            Err(e) if e.is_not_found() => return (true, SessionEnd::Gone),
            Err(e) => return (true, SessionEnd::Lost(e.to_string())),
        };
        (true, self.follow(&mut reader, &terminal).await)
    }

    /// Reads the pane (deriving its status when herdr knows no agent there) and publishes the
    /// reading: always when `forced` (a poke), else only a change. `Err` when the pane is gone;
    /// any other failure is logged and the watch goes on.
    async fn read_pane(&mut self, forced: bool) -> Result<(), ()> {
        match self.herdr.derived_inner(&self.pane).await {
            Ok((info, derived)) => {
                self.derive = derived.is_some();
                let status = derived.unwrap_or(info.status);
                if forced {
                    self.observe_forced(info.terminal, status);
                } else {
                    self.observe(info.terminal, status);
                }
                Ok(())
            }
            Err(e) if e.is_not_found() => Err(()),
            Err(e) => {
                tracing::debug!(pane = %self.pane, error = %e, "herdr pane read failed; the watch goes on");
                Ok(())
            }
        }
    }

    /// Reads pushed events until the connection ends or the pane is gone.
    async fn follow(
        &mut self,
        reader: &mut BufReader<UnixStream>,
        terminal: &TerminalId,
    ) -> SessionEnd {
        let mut derive_tick = tokio::time::interval(DERIVE_EVERY);
        derive_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let read = tokio::select! {
                read = wire::read_line_limited(reader, wire::MAX_LINE_BYTES) => read,
                () = self.poke.notified() => {
                    if self.read_pane(true).await.is_err() {
                        return SessionEnd::Gone;
                    }
                    continue;
                }
                _ = derive_tick.tick(), if self.derive => {
                    if self.read_pane(false).await.is_err() {
                        return SessionEnd::Gone;
                    }
                    continue;
                }
            };
            let line = match read {
                Ok(Some(line)) => line,
                Ok(None) => return SessionEnd::Lost("subscription closed".to_owned()),
                Err(e) => return SessionEnd::Lost(e.to_string()),
            };
            let Ok(event) = serde_json::from_str::<WireEvent>(&line) else {
                tracing::debug!(pane = %self.pane, "ignoring undecodable herdr event line");
                continue;
            };
            if event.event == wire::EVENTS_LOST {
                // About no pane: the subscription is over, whatever it was watching.
                let dropped = event
                    .data
                    .get("dropped")
                    .and_then(serde_json::Value::as_u64);
                return SessionEnd::EventsLost(dropped);
            }
            let about_us =
                event.data.get("pane_id").and_then(|v| v.as_str()) == Some(self.pane.as_str());
            if !about_us {
                // Lifecycle subscriptions replay herdr's ring buffer: other panes' history.
                continue;
            }
            match event.event.as_str() {
                "pane.agent_status_changed" => {
                    let status = event
                        .data
                        .get("agent_status")
                        .and_then(|v| v.as_str())
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(AgentStatus::Unknown);
                    let named = event
                        .data
                        .get("agent")
                        .is_some_and(|a| a.as_str().is_some_and(|a| !a.is_empty()));
                    if named {
                        // herdr knows the agent now: its status wins over fleetd's derivation.
                        self.derive = false;
                    } else if self.derive {
                        continue;
                    }
                    self.observe(terminal.clone(), status);
                }
                // herdr never reuses a pane id within a server's lifetime and its ring buffer does
                // not survive a restart, so an exit or close for this id ends this incarnation.
                "pane_exited" | "pane_closed" => return SessionEnd::Gone,
                _ => {}
            }
        }
    }

    async fn subscribe(&self, socket: &std::path::Path) -> Result<BufReader<UnixStream>, MuxError> {
        let op = "events.subscribe";
        let setup = async {
            let mut stream = UnixStream::connect(socket)
                .await
                .map_err(|e| MuxError::transient(op, format!("connect: {e}")))?;
            let params = json!({ "subscriptions": [
                { "type": "pane.agent_status_changed", "pane_id": self.pane.as_str() },
                { "type": "pane.exited" },
                { "type": "pane.closed" },
            ]});
            let mut line = wire::request_line(op, &params);
            line.push('\n');
            stream
                .write_all(line.as_bytes())
                .await
                .map_err(|e| MuxError::transient(op, format!("write: {e}")))?;
            // From here on the socket is only read. It is kept whole (not split) so our write side
            // is never shut down: herdr treats any inbound byte or EOF on a subscription as the
            // client going away.
            let mut reader = BufReader::new(stream);
            let ack = wire::read_line_limited(&mut reader, wire::MAX_LINE_BYTES)
                .await
                .map_err(|e| MuxError::transient(op, format!("read: {e}")))?
                .ok_or_else(|| MuxError::transient(op, "closed before the ack"))?;
            match wire::parse_response(&ack).map_err(|e| MuxError::transient(op, e))? {
                Ok(result) => wire::check_type(op, &result, &["subscription_started"])?,
                Err(body) => return Err(body.into_mux_error(op, &format!("pane {}", self.pane))),
            }
            Ok(reader)
        };
        tokio::time::timeout(self.herdr.inner.config.call_timeout, setup)
            .await
            .map_err(|_| MuxError::transient(op, "no ack in time"))?
    }
}

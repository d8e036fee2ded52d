//! The router over the configured multiplexer daemons: `lead` (`herdrSocket`, or tmux) and the
//! optional `member` daemon (`memberHerdrSocket`). It owns daemon-qualified pane ids
//! (`lead:w1:p2`, `member:w1:p2`): everything above it sees only qualified ids, and a bare id is
//! accepted only when exactly one daemon has it. It must not know any backend's wire format.

use std::sync::Arc;

use fleetd_core::{MuxDaemon, PaneId, PaneRef, QualifiedPaneId};
use tokio::sync::broadcast;

use crate::mux::{
    Multiplexer, MuxError, OpenPane, PaneEvent, PaneInfo, ProcessInfo, ServerInfo, Submitted,
    TabInfo,
};

/// A pane with its qualified id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedPane {
    /// `daemon:pane`.
    pub id: QualifiedPaneId,
    /// What the daemon reported.
    pub info: PaneInfo,
}

/// A tab with the daemon it lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedTab {
    /// The daemon.
    pub daemon: MuxDaemon,
    /// What the daemon reported.
    pub info: TabInfo,
}

/// A pane event with the daemon it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedEvent {
    /// The daemon.
    pub daemon: MuxDaemon,
    /// The event (its pane id is the daemon's own; qualify with `daemon`).
    pub event: PaneEvent,
}

impl RoutedEvent {
    /// The qualified pane the event is about.
    pub fn pane(&self) -> QualifiedPaneId {
        QualifiedPaneId::new(self.daemon, self.event.pane().clone())
    }
}

/// Routes calls to the right daemon by qualified pane id.
#[derive(Debug, Clone)]
pub struct MuxRouter {
    lead: Arc<dyn Multiplexer>,
    member: Option<Arc<dyn Multiplexer>>,
    events: broadcast::Sender<RoutedEvent>,
    /// How many backend events the router's own forwarding missed (a lagged receiver): a
    /// subscriber must re-read every pane it watches when this moves.
    lagged: Arc<tokio::sync::watch::Sender<u64>>,
}

impl MuxRouter {
    /// A router over `lead` and, when configured, a separate `member` daemon. Spawns one task per
    /// daemon that forwards its pane events, so it must be called inside a tokio runtime.
    pub fn new(lead: Arc<dyn Multiplexer>, member: Option<Arc<dyn Multiplexer>>) -> Self {
        let (events, _) = broadcast::channel(crate::mux::PANE_EVENT_CAPACITY);
        let router = Self {
            lead,
            member,
            events,
            lagged: Arc::new(tokio::sync::watch::channel(0).0),
        };
        for daemon in router.daemons() {
            if let Ok(mux) = router.daemon(daemon) {
                let mut rx = mux.events();
                let tx = router.events.clone();
                let lagged = Arc::clone(&router.lagged);
                tokio::spawn(async move {
                    loop {
                        match rx.recv().await {
                            Ok(event) => {
                                let _ = tx.send(RoutedEvent { daemon, event });
                            }
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                tracing::warn!(%daemon, missed = n, "pane events lagged; statuses must be re-read");
                                lagged.send_modify(|missed| *missed += n);
                            }
                            Err(broadcast::error::RecvError::Closed) => return,
                        }
                    }
                });
            }
        }
        router
    }

    /// The configured daemons, lead first.
    pub fn daemons(&self) -> Vec<MuxDaemon> {
        let mut all = vec![MuxDaemon::Lead];
        if self.member.is_some() {
            all.push(MuxDaemon::Member);
        }
        all
    }

    /// The daemon where members are spawned: `member` when configured, else `lead`.
    pub fn member_daemon(&self) -> MuxDaemon {
        if self.member.is_some() {
            MuxDaemon::Member
        } else {
            MuxDaemon::Lead
        }
    }

    /// The backend of `daemon`.
    pub fn daemon(&self, daemon: MuxDaemon) -> Result<&Arc<dyn Multiplexer>, MuxError> {
        match daemon {
            MuxDaemon::Lead => Ok(&self.lead),
            MuxDaemon::Member => self
                .member
                .as_ref()
                .ok_or_else(|| MuxError::NoSuchDaemon(daemon.to_string())),
        }
    }

    /// Pings every daemon.
    pub async fn ping_all(&self) -> Vec<(MuxDaemon, Result<ServerInfo, MuxError>)> {
        let mut out = Vec::new();
        for daemon in self.daemons() {
            let result = match self.daemon(daemon) {
                Ok(mux) => mux.ping().await,
                Err(e) => Err(e),
            };
            out.push((daemon, result));
        }
        out
    }

    /// Resolves a pane id as a user or tool gave it. A qualified id must name a configured
    /// daemon; a bare id must exist on exactly one daemon (on two it is `Ambiguous`; on none it is
    /// `NotFound`, unless a daemon could not answer, which is `Transient`).
    pub async fn resolve(&self, text: &str) -> Result<QualifiedPaneId, MuxError> {
        let parsed = PaneRef::parse(text).map_err(|e| MuxError::Rejected {
            op: "resolve pane id".to_owned(),
            code: "invalid_pane_id".to_owned(),
            message: e.to_string(),
        })?;
        let bare = match parsed {
            PaneRef::Qualified(q) => {
                self.daemon(q.daemon)?;
                return Ok(q);
            }
            PaneRef::Bare(bare) => bare,
        };
        let daemons = self.daemons();
        if daemons.len() == 1 {
            return Ok(QualifiedPaneId::new(MuxDaemon::Lead, bare));
        }
        let mut found = Vec::new();
        let mut unsure = None;
        for daemon in daemons {
            match self.daemon(daemon)?.pane(&bare).await {
                Ok(_) => found.push(daemon),
                Err(e) if e.is_not_found() => {}
                Err(e) => unsure = Some(e),
            }
        }
        match (found.as_slice(), unsure) {
            ([one], None) => Ok(QualifiedPaneId::new(*one, bare)),
            ([_, _, ..], _) => Err(MuxError::Ambiguous {
                pane: bare.to_string(),
                daemons: found
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
            // One daemon has it but another could not answer: it might have it too.
            ([_], Some(e)) | ([], Some(e)) => Err(e),
            ([], None) => Err(MuxError::NotFound {
                what: format!("pane {bare}"),
                code: "pane_not_found".to_owned(),
                message: "no configured multiplexer daemon has this pane".to_owned(),
            }),
        }
    }

    fn qualify(daemon: MuxDaemon, info: PaneInfo) -> RoutedPane {
        RoutedPane {
            id: QualifiedPaneId::new(daemon, info.pane.clone()),
            info,
        }
    }

    /// Every pane on every daemon. Fails (transiently) if any daemon cannot answer, so a caller
    /// never mistakes a partial list for the truth.
    pub async fn list_panes(&self) -> Result<Vec<RoutedPane>, MuxError> {
        let mut out = Vec::new();
        for daemon in self.daemons() {
            let panes = self.daemon(daemon)?.list_panes().await?;
            out.extend(panes.into_iter().map(|p| Self::qualify(daemon, p)));
        }
        Ok(out)
    }

    /// Every tab on every daemon.
    pub async fn list_tabs(&self) -> Result<Vec<RoutedTab>, MuxError> {
        let mut out = Vec::new();
        for daemon in self.daemons() {
            let tabs = self.daemon(daemon)?.list_tabs().await?;
            out.extend(tabs.into_iter().map(|info| RoutedTab { daemon, info }));
        }
        Ok(out)
    }

    /// One pane.
    pub async fn pane(&self, id: &QualifiedPaneId) -> Result<RoutedPane, MuxError> {
        let info = self.daemon(id.daemon)?.pane(&id.pane).await?;
        Ok(Self::qualify(id.daemon, info))
    }

    /// A pane's shell pid.
    pub async fn process_info(&self, id: &QualifiedPaneId) -> Result<ProcessInfo, MuxError> {
        self.daemon(id.daemon)?.process_info(&id.pane).await
    }

    /// Opens a member pane on the member daemon (see [`MuxRouter::member_daemon`]).
    pub async fn open_member_pane(&self, req: OpenPane) -> Result<RoutedPane, MuxError> {
        let daemon = self.member_daemon();
        let info = self.daemon(daemon)?.open_pane(req).await?;
        Ok(Self::qualify(daemon, info))
    }

    /// Submits text to a pane's agent.
    pub async fn submit(&self, id: &QualifiedPaneId, text: &str) -> Result<Submitted, MuxError> {
        self.daemon(id.daemon)?.submit(&id.pane, text).await
    }

    /// Types a nudge into a lead's pane (see [`Multiplexer::nudge`]).
    pub async fn nudge(&self, id: &QualifiedPaneId, text: &str) -> Result<Submitted, MuxError> {
        self.daemon(id.daemon)?.nudge(&id.pane, text).await
    }

    /// Presses Enter once in a pane.
    pub async fn press_enter(&self, id: &QualifiedPaneId) -> Result<(), MuxError> {
        self.daemon(id.daemon)?.press_enter(&id.pane).await
    }

    /// Types `keys` into the pane as they are, no Enter (see [`Multiplexer::type_keys`]).
    pub async fn type_keys(&self, id: &QualifiedPaneId, keys: &str) -> Result<(), MuxError> {
        self.daemon(id.daemon)?.type_keys(&id.pane, keys).await
    }

    /// The tail of a pane's output.
    pub async fn read_tail(&self, id: &QualifiedPaneId, lines: u32) -> Result<String, MuxError> {
        self.daemon(id.daemon)?.read_tail(&id.pane, lines).await
    }

    /// Closes a pane.
    pub async fn close_pane(&self, id: &QualifiedPaneId) -> Result<(), MuxError> {
        self.daemon(id.daemon)?.close_pane(&id.pane).await
    }

    /// Watches a pane's status.
    pub async fn watch(&self, id: &QualifiedPaneId) -> Result<(), MuxError> {
        self.daemon(id.daemon)?.watch(&id.pane).await
    }

    /// Stops watching a pane.
    pub fn unwatch(&self, id: &QualifiedPaneId) {
        if let Ok(mux) = self.daemon(id.daemon) {
            mux.unwatch(&id.pane);
        }
    }

    /// Moves whenever events were missed on the way through the router (see
    /// [`RoutedEvent`]); a subscriber then re-reads every pane it watches, as it does when its
    /// own receiver lags.
    pub fn lagged(&self) -> tokio::sync::watch::Receiver<u64> {
        self.lagged.subscribe()
    }

    /// Pane events of every daemon, tagged with their daemon.
    pub fn events(&self) -> broadcast::Receiver<RoutedEvent> {
        self.events.subscribe()
    }

    /// Qualifies a pane id of `daemon`.
    pub fn qualified(daemon: MuxDaemon, pane: PaneId) -> QualifiedPaneId {
        QualifiedPaneId::new(daemon, pane)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use fleetd_core::{AgentStatus, TabId, TerminalId, WorkspaceId};

    use super::*;
    use crate::mux::{BackendKind, MuxFuture};

    /// A daemon that knows a fixed set of pane ids, or cannot answer at all.
    #[derive(Debug)]
    struct Panes {
        ids: HashSet<&'static str>,
        broken: bool,
        events: broadcast::Sender<PaneEvent>,
    }

    fn daemon(ids: &[&'static str], broken: bool) -> Arc<dyn Multiplexer> {
        Arc::new(Panes {
            ids: ids.iter().copied().collect(),
            broken,
            events: broadcast::channel(4).0,
        })
    }

    fn unsupported<'a, T: Send + 'a>() -> MuxFuture<'a, T> {
        Box::pin(async { Err(MuxError::Unsupported("test".to_owned())) })
    }

    impl Multiplexer for Panes {
        fn kind(&self) -> BackendKind {
            BackendKind::Herdr
        }
        fn ping(&self) -> MuxFuture<'_, ServerInfo> {
            unsupported()
        }
        fn list_panes(&self) -> MuxFuture<'_, Vec<PaneInfo>> {
            unsupported()
        }
        fn list_tabs(&self) -> MuxFuture<'_, Vec<TabInfo>> {
            unsupported()
        }
        fn pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, PaneInfo> {
            Box::pin(async move {
                if self.broken {
                    return Err(MuxError::transient("pane.get", "socket closed"));
                }
                if !self.ids.contains(pane.as_str()) {
                    return Err(MuxError::NotFound {
                        what: pane.to_string(),
                        code: "pane_not_found".to_owned(),
                        message: String::new(),
                    });
                }
                Ok(PaneInfo {
                    pane: pane.clone(),
                    terminal: TerminalId::new("term_1").expect("id"),
                    tab: TabId::new("w1:t1").expect("id"),
                    workspace: WorkspaceId::new("w1").expect("id"),
                    label: None,
                    title: None,
                    agent: None,
                    status: AgentStatus::Unknown,
                    shell_pid: None,
                    workspace_label: None,
                })
            })
        }
        fn process_info<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ProcessInfo> {
            unsupported()
        }
        fn open_pane(&self, _: OpenPane) -> MuxFuture<'_, PaneInfo> {
            unsupported()
        }
        fn submit<'a>(&'a self, _: &'a PaneId, _: &'a str) -> MuxFuture<'a, Submitted> {
            unsupported()
        }
        fn press_enter<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
            unsupported()
        }
        fn type_keys<'a>(&'a self, _: &'a PaneId, _: &'a str) -> MuxFuture<'a, ()> {
            unsupported()
        }
        fn read_tail<'a>(&'a self, _: &'a PaneId, _: u32) -> MuxFuture<'a, String> {
            unsupported()
        }
        fn close_pane<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
            unsupported()
        }
        fn watch<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
            unsupported()
        }
        fn unwatch(&self, _: &PaneId) {}
        fn events(&self) -> broadcast::Receiver<PaneEvent> {
            self.events.subscribe()
        }
    }

    async fn check(router: &MuxRouter, input: &str, expect: &str) {
        let got = match router.resolve(input).await {
            Ok(q) => q.to_string(),
            Err(MuxError::Ambiguous { .. }) => "ambiguous".to_owned(),
            Err(e) if e.is_not_found() => "not found".to_owned(),
            Err(e) if e.is_transient() => "transient".to_owned(),
            Err(MuxError::NoSuchDaemon(_)) => "no such daemon".to_owned(),
            Err(e) => format!("error: {e}"),
        };
        assert_eq!(got, expect, "resolving {input:?}");
    }

    #[tokio::test]
    async fn bare_ids_resolve_only_when_unambiguous() {
        let two = MuxRouter::new(
            daemon(&["w1:p1", "w1:p2"], false),
            Some(daemon(&["w1:p1", "w1:p3"], false)),
        );
        check(&two, "w1:p1", "ambiguous").await;
        check(&two, "w1:p2", "lead:w1:p2").await;
        check(&two, "w1:p3", "member:w1:p3").await;
        check(&two, "w1:p9", "not found").await;
        check(&two, "member:w1:p1", "member:w1:p1").await;
        check(&two, "lead:w1:p1", "lead:w1:p1").await;
        check(&two, "nonsense", "error: resolve pane id refused (invalid_pane_id): invalid pane id \"nonsense\": expected a herdr pane id such as w1:p2 or a tmux pane id such as %3").await;

        let one = MuxRouter::new(daemon(&["w1:p1"], false), None);
        check(&one, "w1:p1", "lead:w1:p1").await;
        check(&one, "member:w1:p1", "no such daemon").await;
        assert_eq!(one.member_daemon(), MuxDaemon::Lead);
        assert_eq!(two.member_daemon(), MuxDaemon::Member);

        let flaky = MuxRouter::new(daemon(&["w1:p1"], false), Some(daemon(&[], true)));
        check(&flaky, "w1:p1", "transient").await;
        check(&flaky, "w1:p7", "transient").await;
    }
}

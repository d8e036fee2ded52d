//! The herdr backend (socket protocols 20 to 22: herdr 0.8 and 0.9): a `Multiplexer` over herdr's NDJSON unix socket, one
//! request per connection with a per-call timeout, a `ping` protocol gate, prompt submission
//! (reporting whether herdr saw the turn start), and per-pane status subscriptions. Only this
//! module (with `wire` and `watch`) knows herdr's wire format; it must not decide fleetd policy:
//! it retries nothing and presses no Enter of its own (the core's injector does, once).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use fleetd_core::{AgentStatus, PaneId, TabId, TerminalId, WorkspaceId};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::mux::{
    BackendKind, Multiplexer, MuxError, MuxFuture, PaneEvent, PaneInfo, ProcessInfo, ServerInfo,
    SubmitPath, Submitted, TabInfo,
};

mod config;
mod open;
mod watch;
pub mod wire;

pub use config::HerdrConfig;

use wire::{WirePane, WireProcessInfo, WireRead, WireTab, WireWorkspace, check_type, field};

/// Agent kinds herdr knows (its `detect::lookup_agent` list, PROTOCOL.md §3): `agent.prompt` and
/// `agent.start` work for these; any other program is a `custom` agent, submitted with `pane.send_input`.
pub const KNOWN_AGENT_KINDS: &[&str] = &[
    "pi",
    "claude",
    "codex",
    "gemini",
    "cursor",
    "devin",
    "agy",
    "cline",
    "omp",
    "mastracode",
    "opencode",
    "copilot",
    "kimi",
    "kiro",
    "droid",
    "amp",
    "grok",
    "hermes",
    "kilo",
    "qodercli",
    "maki",
];

/// Whether the pane runs an agent herdr knows (then it takes `agent.*` calls; other panes take
/// `pane.send_input`).
fn runs_known_agent(info: &PaneInfo) -> bool {
    info.agent
        .as_deref()
        .is_some_and(|a| KNOWN_AGENT_KINDS.contains(&a))
}

/// The herdr backend. Cheap to clone (shares its watch table and event channel).
#[derive(Debug, Clone)]
pub struct Herdr {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: HerdrConfig,
    watches: watch::Watches,
    /// The protocol the server answered the last `ping` with; 0 until one was answered.
    protocol: AtomicU32,
}

impl Herdr {
    /// A client for `config`; does no I/O (see [`Herdr::connect`] for the checked form).
    pub fn new(config: HerdrConfig) -> Self {
        let (events, _) = broadcast::channel(crate::mux::PANE_EVENT_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                config,
                watches: watch::Watches::new(events),
                protocol: AtomicU32::new(0),
            }),
        }
    }

    /// A client that has checked the server's protocol with `ping`: older than 20 is refused,
    /// 20 to 22 (herdr 0.8 and 0.9) are accepted, newer ones with a warning.
    pub async fn connect(config: HerdrConfig) -> Result<(Self, ServerInfo), MuxError> {
        let herdr = Self::new(config);
        let info = herdr.check_protocol().await?;
        Ok((herdr, info))
    }

    /// Pings the server and applies the protocol gate.
    pub async fn check_protocol(&self) -> Result<ServerInfo, MuxError> {
        let (info, capabilities) = self.ping_wire().await?;
        let protocol = info.protocol.unwrap_or(0);
        if protocol < wire::PROTOCOL {
            return Err(MuxError::Protocol(format!(
                "herdr {} at {} speaks protocol {protocol}; fleetd needs {} (upgrade herdr)",
                info.version,
                self.socket().display(),
                wire::PROTOCOL
            )));
        }
        tracing::debug!(version = %info.version, protocol, ?capabilities, "herdr capabilities");
        if protocol > wire::NEWEST_PROTOCOL {
            tracing::warn!(
                version = %info.version,
                protocol,
                newest_known = wire::NEWEST_PROTOCOL,
                socket = %self.socket().display(),
                "herdr speaks a newer protocol than fleetd was built for; continuing"
            );
        }
        Ok(info)
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.inner.config.socket
    }

    /// One call: returns the result object after checking its `type`, or a classified error.
    async fn request(
        &self,
        method: &str,
        params: Value,
        accepted: &[&str],
        what: &str,
    ) -> Result<Value, MuxError> {
        self.request_with_timeout(
            method,
            params,
            accepted,
            what,
            self.inner.config.call_timeout,
        )
        .await
    }

    async fn request_with_timeout(
        &self,
        method: &str,
        params: Value,
        accepted: &[&str],
        what: &str,
        timeout: Duration,
    ) -> Result<Value, MuxError> {
        match wire::call(self.socket(), method, params, timeout).await {
            Ok(Ok(result)) => {
                check_type(method, &result, accepted)?;
                Ok(result)
            }
            Ok(Err(body)) => Err(body.into_mux_error(method, what)),
            Err(no_answer) => Err(no_answer.into_mux_error()),
        }
    }

    /// One call that types into a pane: like [`Herdr::request_with_timeout`], except that a
    /// failure after herdr may have typed is [`MuxError::Uncertain`] — no answer once the request
    /// line was out, an undecodable or unexpected answer, or an error code herdr gives after
    /// typing (see `wire::ErrorBody::into_input_error`).
    async fn input_request(
        &self,
        method: &str,
        params: Value,
        accepted: &[&str],
        what: &str,
        timeout: Duration,
    ) -> Result<Value, MuxError> {
        match wire::call(self.socket(), method, params, timeout).await {
            Ok(Ok(result)) => {
                check_type(method, &result, accepted)
                    .map_err(|e| MuxError::uncertain(method, e))?;
                Ok(result)
            }
            Ok(Err(body)) => Err(body.into_input_error(method, what, self.protocol())),
            Err(no_answer) => Err(no_answer.into_input_error()),
        }
    }

    /// The server's protocol as last answered to `ping` (`None` before any).
    fn protocol(&self) -> Option<u32> {
        Some(self.inner.protocol.load(Ordering::Relaxed)).filter(|p| *p > 0)
    }

    async fn ping_inner(&self) -> Result<ServerInfo, MuxError> {
        self.ping_wire().await.map(|(info, _)| info)
    }

    /// `ping`, remembering the protocol (herdr may be upgraded under a running fleetd: a live
    /// handoff keeps the socket), with the capabilities read loosely.
    async fn ping_wire(&self) -> Result<(ServerInfo, wire::Capabilities), MuxError> {
        let result = self.request("ping", json!({}), &["pong"], "server").await?;
        let protocol: u32 = field("ping", &result, "protocol")?;
        self.inner.protocol.store(protocol, Ordering::Relaxed);
        let info = ServerInfo {
            backend: BackendKind::Herdr,
            version: field("ping", &result, "version")?,
            protocol: Some(protocol),
        };
        Ok((info, wire::Capabilities::read(result.get("capabilities"))))
    }

    async fn pane_inner(&self, pane: &PaneId) -> Result<PaneInfo, MuxError> {
        let result = self
            .request(
                "pane.get",
                json!({ "pane_id": pane.as_str() }),
                &["pane_info"],
                &format!("pane {pane}"),
            )
            .await?;
        convert_pane("pane.get", field("pane.get", &result, "pane")?)
    }

    async fn list_panes_inner(&self) -> Result<Vec<PaneInfo>, MuxError> {
        let result = self
            .request("pane.list", json!({}), &["pane_list"], "panes")
            .await?;
        let panes: Vec<WirePane> = field("pane.list", &result, "panes")?;
        // herdr's panes name their workspace by id; its label (what `membersWorkspace` names)
        // comes from the workspace list.
        let labels: std::collections::HashMap<String, String> = self
            .workspaces()
            .await?
            .into_iter()
            .map(|w| (w.workspace_id, w.label))
            .collect();
        panes
            .into_iter()
            .map(|p| {
                let label = labels.get(&p.workspace_id).cloned();
                convert_pane("pane.list", p).map(|info| PaneInfo {
                    workspace_label: label,
                    ..info
                })
            })
            .collect()
    }

    async fn workspaces(&self) -> Result<Vec<WireWorkspace>, MuxError> {
        let result = self
            .request(
                "workspace.list",
                json!({}),
                &["workspace_list"],
                "workspaces",
            )
            .await?;
        field("workspace.list", &result, "workspaces")
    }

    async fn list_tabs_inner(&self) -> Result<Vec<TabInfo>, MuxError> {
        let result = self
            .request("tab.list", json!({}), &["tab_list"], "tabs")
            .await?;
        let tabs: Vec<WireTab> = field("tab.list", &result, "tabs")?;
        tabs.into_iter()
            .map(|t| {
                Ok(TabInfo {
                    tab: TabId::new(t.tab_id).map_err(|e| MuxError::transient("tab.list", e))?,
                    workspace: WorkspaceId::new(t.workspace_id)
                        .map_err(|e| MuxError::transient("tab.list", e))?,
                    label: t.label,
                    pane_count: t.pane_count,
                })
            })
            .collect()
    }

    async fn process_wire(&self, pane: &PaneId) -> Result<WireProcessInfo, MuxError> {
        let result = self
            .request(
                "pane.process_info",
                json!({ "pane_id": pane.as_str() }),
                &["pane_process_info"],
                &format!("pane {pane}"),
            )
            .await?;
        field("pane.process_info", &result, "process_info")
    }

    async fn process_info_inner(&self, pane: &PaneId) -> Result<ProcessInfo, MuxError> {
        let info = self.process_wire(pane).await?;
        Ok(ProcessInfo {
            pane: PaneId::new(info.pane_id)
                .map_err(|e| MuxError::transient("pane.process_info", e))?,
            shell_pid: info.shell_pid,
            foreground_pids: info.foreground_processes.iter().map(|p| p.pid).collect(),
        })
    }

    /// Types `text` and submits it: `agent.prompt` to an agent herdr knows, else
    /// `pane.send_input` with Enter. `wait` asks herdr to answer once it sees the agent
    /// `working` (up to `prompt_wait`; its 5 s stall rule answers an agent never seen working,
    /// a turn quicker than its screen detection). A nudge does not wait: herdr types the prompt
    /// and schedules the Enter 300 ms later (v0.8.2 src/app/api/agents.rs:121-130), and the
    /// lead's next nudge must not queue behind a stall (the ~3 s slow nudge round). herdr 0.9
    /// (protocol 22) answers only once that Enter was sent: the same call, the same outcome, a
    /// 300 ms later answer; an error it answers for the Enter is uncertain (the text is typed).
    /// Either way herdr presses the one Enter, so nothing here presses another.
    async fn submit_inner(
        &self,
        pane: &PaneId,
        text: &str,
        wait: bool,
    ) -> Result<Submitted, MuxError> {
        let info = self.pane_inner(pane).await?;
        let what = format!("pane {pane}");
        let known = runs_known_agent(&info);
        let call_timeout = self.inner.config.call_timeout;
        if !known {
            self.input_request(
                "pane.send_input",
                json!({ "pane_id": pane.as_str(), "text": text, "keys": ["enter"] }),
                &["ok"],
                &what,
                call_timeout,
            )
            .await?;
            return Ok(Submitted {
                path: SubmitPath::PaneInput,
                started: None,
            });
        }
        let wait = wait.then_some(self.inner.config.prompt_wait);
        let mut params = json!({ "target": pane.as_str(), "text": text });
        if let Some(wait) = wait {
            params["wait"] = json!({ "until": ["working"],
                "timeout_ms": u64::try_from(wait.as_millis()).unwrap_or(u64::MAX) });
        }
        let outcome = self
            .input_request(
                "agent.prompt",
                params,
                &["agent_prompted"],
                &what,
                wait.unwrap_or_default() + call_timeout,
            )
            .await;
        match outcome {
            Ok(_) => Ok(Submitted {
                path: SubmitPath::AgentPrompt,
                started: wait.map(|_| true),
            }),
            // Typed, and herdr saw no state change within its 5 s: the prompt may sit in the
            // composer (agent TUIs sometimes swallow the Enter after a paste). Whether and when
            // to press Enter again is the caller's decision, not this adapter's.
            Err(MuxError::Rejected { code, .. }) if code == "agent_prompt_stalled" => {
                Ok(Submitted {
                    path: SubmitPath::AgentPrompt,
                    started: Some(false),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The last `lines` non-blank-ended lines of the pane. herdr's `recent` read counts the
    /// screen's blank rows below the output before it trims them (v0.8.2
    /// src/pane/terminal.rs:2727-2739, 3284-3298): asked for 40 rows of a 120-row pane holding
    /// ten lines, it answers "". So fleetd asks for [`READ_SLACK_ROWS`] more rows (herdr caps a
    /// read at 1000) and keeps the last `lines` itself. herdr 0.9's `recent` reads include the
    /// on-screen output: more rows than asked for are then just more output, and
    /// keeping the last `lines` is right with either.
    async fn read_tail_inner(&self, pane: &PaneId, lines: u32) -> Result<String, MuxError> {
        let asked = lines.saturating_add(READ_SLACK_ROWS).min(READ_MAX_ROWS);
        let result = self
            .request(
                "pane.read",
                json!({ "pane_id": pane.as_str(), "source": "recent", "lines": asked,
                        "format": "text" }),
                &["pane_read"],
                &format!("pane {pane}"),
            )
            .await?;
        let read: WireRead = field("pane.read", &result, "read")?;
        Ok(last_lines(&read.text, lines))
    }

    /// The pane and, when herdr knows no agent there (status `unknown`, no agent label: a
    /// `custom` agent, SPEC §8), the status fleetd derives itself the way it does on tmux: a
    /// spinner in the terminal title is working; a shell in the foreground is no agent; else the
    /// screen's bottom lines tell a dialog (blocked) from a prompt (idle).
    async fn derived_inner(
        &self,
        pane: &PaneId,
    ) -> Result<(PaneInfo, Option<AgentStatus>), MuxError> {
        let info = self.pane_inner(pane).await?;
        if info.agent.is_some() {
            return Ok((info, None));
        }
        let title = info.title.clone().unwrap_or_default();
        if crate::mux::screen_status::has_spinner(&title) {
            return Ok((info, Some(AgentStatus::Working)));
        }
        let process = self.process_wire(pane).await?;
        let command = process
            .foreground_processes
            .first()
            .map(|p| p.name.clone())
            .unwrap_or_default();
        let screen = if crate::mux::screen_status::SHELLS.contains(&command.as_str()) {
            None
        } else {
            let result = self
                .request(
                    "pane.read",
                    json!({ "pane_id": pane.as_str(), "source": "visible", "lines": 12, "format": "text" }),
                    &["pane_read"],
                    &format!("pane {pane}"),
                )
                .await?;
            Some(field::<WireRead>("pane.read", &result, "read")?.text)
        };
        let (_, status) =
            crate::mux::screen_status::derive_status(&title, &command, screen.as_deref());
        Ok((info, Some(status)))
    }

    async fn close_inner(&self, pane: &PaneId) -> Result<(), MuxError> {
        self.request(
            "pane.close",
            json!({ "pane_id": pane.as_str() }),
            &["ok"],
            &format!("pane {pane}"),
        )
        .await?;
        self.inner.watches.remove(pane);
        Ok(())
    }
}

/// Rows asked for beyond the wanted lines: room for a pane this much taller than its output.
const READ_SLACK_ROWS: u32 = 400;

/// herdr's cap on one `pane.read` (v0.8.2 src/app/api_helpers.rs:109-141).
const READ_MAX_ROWS: u32 = 1000;

/// The last `n` lines of `text` after its trailing blank lines are dropped.
fn last_lines(text: &str, n: u32) -> String {
    let rows: Vec<&str> = text.trim_end().lines().collect();
    let keep = usize::try_from(n).unwrap_or(usize::MAX).min(rows.len());
    rows[rows.len() - keep..].join("\n")
}

/// Converts herdr's pane into fleetd's; an id herdr sent that fleetd cannot parse is a decode
/// failure (transient), never "not found".
pub(crate) fn convert_pane(op: &str, p: WirePane) -> Result<PaneInfo, MuxError> {
    let bad = |e: fleetd_core::PaneIdError| MuxError::transient(op, e);
    Ok(PaneInfo {
        pane: PaneId::new(p.pane_id).map_err(bad)?,
        terminal: TerminalId::new(p.terminal_id).map_err(bad)?,
        tab: TabId::new(p.tab_id).map_err(bad)?,
        workspace: WorkspaceId::new(p.workspace_id).map_err(bad)?,
        label: p.label,
        title: p.terminal_title.or(p.title),
        agent: p.agent,
        status: p.agent_status.parse().unwrap_or(AgentStatus::Unknown),
        shell_pid: None,
        workspace_label: None,
    })
}

impl Multiplexer for Herdr {
    fn kind(&self) -> BackendKind {
        BackendKind::Herdr
    }

    fn ping(&self) -> MuxFuture<'_, ServerInfo> {
        Box::pin(self.ping_inner())
    }

    super::reading_methods!();

    fn submit<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted> {
        Box::pin(self.submit_inner(pane, text, true))
    }

    fn nudge<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted> {
        Box::pin(self.submit_inner(pane, text, false))
    }

    fn type_keys<'a>(&'a self, pane: &'a PaneId, keys: &'a str) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            let what = format!("pane {pane}");
            // Raw bytes to the pane's terminal: no paste wrapping, no Enter (PROTOCOL.md).
            let params = json!({ "pane_id": pane.as_str(), "text": keys });
            let timeout = self.inner.config.call_timeout;
            self.input_request("pane.send_text", params, &["ok"], &what, timeout)
                .await
                .map(|_| ())
        })
    }

    fn press_enter<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            let info = self.pane_inner(pane).await?;
            let what = format!("pane {pane}");
            let known = runs_known_agent(&info);
            // An agent target takes logical keys; a plain pane takes input with keys.
            let (method, params) = if known {
                (
                    "agent.send_keys",
                    json!({ "target": pane.as_str(), "keys": ["enter"] }),
                )
            } else {
                (
                    "pane.send_input",
                    json!({ "pane_id": pane.as_str(), "text": "", "keys": ["enter"] }),
                )
            };
            let timeout = self.inner.config.call_timeout;
            self.input_request(method, params, &["ok"], &what, timeout)
                .await
                .map(|_| ())
        })
    }

    fn read_tail<'a>(&'a self, pane: &'a PaneId, lines: u32) -> MuxFuture<'a, String> {
        Box::pin(self.read_tail_inner(pane, lines))
    }

    fn close_pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(self.close_inner(pane))
    }

    fn watch<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            if self.inner.watches.poke(pane) {
                return Ok(());
            }
            // Fail fast (and affirmatively) for a pane that does not exist.
            self.pane_inner(pane).await?;
            self.inner.watches.start(self.clone(), pane.clone());
            Ok(())
        })
    }

    fn unwatch(&self, pane: &PaneId) {
        self.inner.watches.remove(pane);
    }

    fn events(&self) -> broadcast::Receiver<PaneEvent> {
        self.inner.watches.subscribe()
    }
}

#[cfg(test)]
mod tests;

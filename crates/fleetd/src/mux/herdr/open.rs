//! Opening a member's pane on herdr: the workspace found or created, the pane laid out with
//! its argv (or split from another), and a known agent kind started herdr's way with
//! `agent.start`, tried again while the new pane's shell is still busy starting up.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fleetd_core::PaneId;
use serde_json::{Value, json};

use super::wire::{WirePane, WireTab, WireWorkspace, field, first_layout_pane_id};
use super::{Herdr, KNOWN_AGENT_KINDS};
use crate::mux::{
    Launch, MuxError, OpenPane, PaneInfo, Placement, SplitDirection, shell_quote_argv,
};

/// How long `agent.start` is tried again while a new pane's shell is still starting up.
const AGENT_START_SHELL_WAIT: Duration = Duration::from_secs(20);

/// The pause between those tries.
const AGENT_START_RETRY: Duration = Duration::from_millis(200);

impl Herdr {
    /// Finds the workspace labelled `label`, creating it (with one shell tab) when absent.
    /// Returns the workspace id and, when it was just created, its first tab.
    async fn ensure_workspace(
        &self,
        label: &str,
        cwd: Option<&Path>,
    ) -> Result<(String, Option<String>), MuxError> {
        if let Some(ws) = self
            .workspaces()
            .await?
            .into_iter()
            .find(|w| w.label == label)
        {
            return Ok((ws.workspace_id, None));
        }
        let created = self
            .request(
                "workspace.create",
                json!({ "label": label, "cwd": cwd.map(Path::to_string_lossy), "focus": false, "env": {} }),
                &["workspace_created"],
                "workspace",
            )
            .await?;
        let ws: WireWorkspace = field("workspace.create", &created, "workspace")?;
        let tab: WireTab = field("workspace.create", &created, "tab")?;
        Ok((ws.workspace_id, Some(tab.tab_id)))
    }

    /// Opens the pane. A known agent kind without its own command is started herdr's way: the
    /// tab opens with a shell and `agent.start` types the kind's canonical executable into it, so
    /// herdr knows it launched that agent; if that fails the pane is closed again. Anything else
    /// runs its argv.
    pub(super) async fn open_pane_inner(&self, req: OpenPane) -> Result<PaneInfo, MuxError> {
        let (command, agent) = match &req.launch {
            Launch::Agent { name, kind, args } if KNOWN_AGENT_KINDS.contains(&kind.as_str()) => {
                (Vec::new(), Some((name, kind, args)))
            }
            launch => (launch.argv(), None),
        };
        let pane = self.open_command(&req, &command).await?;
        if let Some((name, kind, args)) = agent
            && let Err(e) = self.start_agent(&pane.pane, name, kind, args).await
        {
            if let Err(closing) = self.close_inner(&pane.pane).await {
                tracing::warn!(pane = %pane.pane, error = %closing, "cannot close a pane whose agent did not start");
            }
            return Err(e);
        }
        Ok(pane)
    }

    /// `agent.start`: `kind`'s canonical executable plus `args`, typed into the idle shell of
    /// `pane`, as agent `name`.
    async fn start_agent(
        &self,
        pane: &PaneId,
        name: &str,
        kind: &str,
        args: &[String],
    ) -> Result<(), MuxError> {
        // herdr refuses with `agent_pane_busy` until the shell alone holds the terminal (v0.8.2
        // src/app/agents.rs:185-193): a fresh pane's shell is still running its startup files
        // (`.bashrc`), so the start is tried again until the shell is free or the wait is over.
        let deadline = tokio::time::Instant::now() + AGENT_START_SHELL_WAIT;
        loop {
            let outcome = self
                .request(
                    "agent.start",
                    json!({ "name": name, "kind": kind, "pane_id": pane.as_str(), "args": args }),
                    &["agent_started"],
                    &format!("pane {pane}"),
                )
                .await;
            match outcome {
                Err(MuxError::Rejected { code, message, .. })
                    if code == "agent_pane_busy" && tokio::time::Instant::now() < deadline =>
                {
                    tracing::debug!(%pane, %message, "the new pane's shell is still busy; agent.start again soon");
                    tokio::time::sleep(AGENT_START_RETRY).await;
                }
                Err(MuxError::Rejected { op, code, message }) if code == "agent_pane_busy" => {
                    return Err(MuxError::Rejected {
                        op,
                        code,
                        message: format!(
                            "{message}; the new pane's shell was still busy after {} s (a slow shell startup file, or a program it runs in the foreground?)",
                            AGENT_START_SHELL_WAIT.as_secs()
                        ),
                    });
                }
                other => return other.map(|_| ()),
            }
        }
    }

    /// Opens a pane running `command` (empty: herdr's default shell).
    async fn open_command(&self, req: &OpenPane, command: &[String]) -> Result<PaneInfo, MuxError> {
        let env = env_json(&req.env);
        let cwd = req.cwd.as_deref().map(Path::to_string_lossy);
        let pane_id = match &req.placement {
            Placement::NewTab { workspace } => {
                let (workspace_id, fresh_tab) =
                    self.ensure_workspace(workspace, req.cwd.as_deref()).await?;
                let command = (!command.is_empty()).then_some(command);
                // A pane that runs an argv directly (no shell) is only possible via layout.apply;
                // applying onto a just-created workspace's tab replaces its placeholder shell.
                let target = match fresh_tab {
                    Some(tab_id) => json!({ "tab_id": tab_id, "tab_label": req.label }),
                    None => json!({ "workspace_id": workspace_id, "tab_label": req.label }),
                };
                let mut params = target;
                params["focus"] = json!(false);
                params["root"] = json!({
                    "type": "pane", "command": command, "env": env, "cwd": cwd, "label": req.label,
                });
                let result = self
                    .request("layout.apply", params, &["layout_apply"], "workspace")
                    .await?;
                let layout = result.get("layout").cloned().unwrap_or(Value::Null);
                first_layout_pane_id(&layout)
                    .ok_or_else(|| MuxError::transient("layout.apply", "layout has no pane id"))?
            }
            Placement::Split { of, direction } => {
                let direction = match direction {
                    SplitDirection::Right => "right",
                    SplitDirection::Down => "down",
                };
                let result = self
                    .request(
                        "pane.split",
                        json!({ "target_pane_id": of.as_str(), "direction": direction,
                                "cwd": cwd, "focus": false, "env": env }),
                        &["pane_info"],
                        &format!("pane {of}"),
                    )
                    .await?;
                let pane: WirePane = field("pane.split", &result, "pane")?;
                if !command.is_empty() {
                    // pane.split always starts the default shell; `exec` makes the command the
                    // pane's process, so the pane closes when it exits, as with layout.apply.
                    let line = format!("exec {}", shell_quote_argv(command));
                    self.request(
                        "pane.send_input",
                        json!({ "pane_id": pane.pane_id, "text": line, "keys": ["enter"] }),
                        &["ok"],
                        &format!("pane {}", pane.pane_id),
                    )
                    .await?;
                }
                pane.pane_id
            }
        };
        let pane = PaneId::new(pane_id).map_err(|e| MuxError::transient("open pane", e))?;
        self.pane_inner(&pane).await
    }
}

fn env_json(env: &BTreeMap<String, String>) -> Value {
    Value::Object(
        env.iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect(),
    )
}

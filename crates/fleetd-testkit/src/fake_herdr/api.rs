//! fake-herdr's socket API: request parsing, the method table, herdr's JSON result shapes and
//! error codes, and `events.subscribe` streaming with replay. Built from herdr's published schema
//! (`shared/herdr/herdr-api.schema.json`), never from fleetd's client code.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::pane::{PaneRt, PaneSpec};
use super::shapes::{agent_info, pane_info, process_info, snapshot, tabs, workspaces};
use super::{Server, agent, lock};

/// A parsed request.
pub(super) struct Request {
    pub(super) id: String,
    pub(super) method: String,
    pub(super) params: Value,
    /// Set by the `input_timeout` fault: carry the input out, then answer this many ms late.
    pub(super) late_ms: Option<u64>,
}

/// An error response line.
pub(super) fn error(id: &str, code: &str, message: &str) -> String {
    json!({ "id": id, "error": { "code": code, "message": message } }).to_string()
}

pub(super) fn success(id: &str, result: &Value) -> String {
    json!({ "id": id, "result": result }).to_string()
}

/// Parses a request line as herdr does: `id`, `method` and `params` are all required.
pub(super) fn parse_request(line: &str) -> Result<Request, String> {
    let invalid = |m: &str| error("", "invalid_request", &format!("invalid request: {m}"));
    let v: Value = serde_json::from_str(line).map_err(|e| invalid(&e.to_string()))?;
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("missing field `id`"))?;
    let method = v
        .get("method")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("missing field `method`"))?;
    let params = v
        .get("params")
        .filter(|p| p.is_object())
        .ok_or_else(|| invalid("missing field `params`"))?;
    Ok(Request {
        id: id.to_owned(),
        method: method.to_owned(),
        params: params.clone(),
        late_ms: None,
    })
}

pub(super) type Outcome = Result<Value, (&'static str, String)>;

pub(super) fn str_param<'a>(
    params: &'a Value,
    name: &str,
) -> Result<&'a str, (&'static str, String)> {
    params.get(name).and_then(Value::as_str).ok_or((
        "invalid_request",
        format!("invalid request: missing field `{name}`"),
    ))
}

pub(super) fn opt_str(params: &Value, name: &str) -> Option<String> {
    params.get(name).and_then(Value::as_str).map(str::to_owned)
}

fn env_param(params: &Value) -> std::collections::BTreeMap<String, String> {
    params
        .get("env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs one non-streaming method.
pub(super) async fn dispatch(server: &Arc<Server>, req: Request) -> String {
    let p = &req.params;
    let outcome: Outcome = match req.method.as_str() {
        "ping" => Ok(json!({ "type": "pong", "version": server.opts.version,
            "protocol": server.opts.protocol, "capabilities": server.opts.herdr.capabilities() })),
        "server.stop" => {
            server.server_stop();
            tokio::spawn(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                std::process::exit(0);
            });
            Ok(json!({ "type": "ok" }))
        }
        "session.snapshot" => Ok(snapshot(server)),
        "workspace.list" => {
            Ok(json!({ "type": "workspace_list", "workspaces": workspaces(server) }))
        }
        "workspace.create" => workspace_create(server, p),
        "workspace.close" => super::version::workspace_close(server, p),
        "workspace.get" => str_param(p, "workspace_id").and_then(|id| {
            workspaces(server)
                .into_iter()
                .find(|w| w["workspace_id"] == id)
                .map(|w| json!({ "type": "workspace_info", "workspace": w }))
                .ok_or(("workspace_not_found", format!("workspace {id} not found")))
        }),
        "tab.list" => {
            let filter = opt_str(p, "workspace_id");
            let tabs: Vec<Value> = tabs(server)
                .into_iter()
                .filter(|t| filter.as_deref().is_none_or(|w| t["workspace_id"] == w))
                .collect();
            Ok(json!({ "type": "tab_list", "tabs": tabs }))
        }
        "tab.create" => tab_create(server, p),
        "tab.get" => str_param(p, "tab_id").and_then(|id| {
            tabs(server)
                .into_iter()
                .find(|t| t["tab_id"] == id)
                .map(|t| json!({ "type": "tab_info", "tab": t }))
                .ok_or(("tab_not_found", format!("tab {id} not found")))
        }),
        "pane.list" => {
            let filter = opt_str(p, "workspace_id");
            let panes: Vec<Value> = live_panes(server)
                .iter()
                .filter(|pane| {
                    filter
                        .as_deref()
                        .is_none_or(|w| pane.identity.workspace_id == w)
                })
                .map(|pane| pane_info(server, pane))
                .collect();
            Ok(json!({ "type": "pane_list", "panes": panes }))
        }
        "pane.get" => pane_param(server, p, "pane_id")
            .map(|pane| json!({ "type": "pane_info", "pane": pane_info(server, &pane) })),
        "pane.process_info" => pane_param(server, p, "pane_id").map(
            |pane| json!({ "type": "pane_process_info", "process_info": process_info(&pane) }),
        ),
        "pane.split" => pane_split(server, p),
        "pane.close" => pane_param(server, p, "pane_id").map(|pane| {
            close_pane(server, &pane);
            json!({ "type": "ok" })
        }),
        "pane.send_text" => match pane_param(server, p, "pane_id") {
            Ok(pane) => {
                let text = opt_str(p, "text").unwrap_or_default();
                write_or_fail(&pane, text.as_bytes()).await
            }
            Err(e) => Err(e),
        },
        "pane.send_keys" => pane_input(server, p).await,
        "pane.send_input" => {
            let outcome = pane_input(server, p).await;
            if let Some(ms) = req.late_ms {
                // herdr answers an ordinary request when its app loop gets to it, with no
                // timeout of its own (v0.8.2 src/api/server.rs:379): the input is applied, the
                // answer is late.
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            outcome
        }
        "pane.read" => pane_param(server, p, "pane_id")
            .and_then(|pane| read(&pane, p, server.opts.herdr.recent_counts_output_only())),
        "layout.apply" => layout_apply(server, p),
        "agent.list" => {
            let agents: Vec<Value> = live_panes(server)
                .iter()
                .filter(|pane| pane.detected().agent.is_some())
                .map(|pane| agent_info(server, pane))
                .collect();
            Ok(json!({ "type": "agent_list", "agents": agents }))
        }
        "agent.get" => agent_target(server, p)
            .map(|pane| json!({ "type": "agent_info", "agent": agent_info(server, &pane) })),
        "agent.send_keys" => match agent_target(server, p) {
            Ok(pane) => match keys_bytes(p) {
                Ok(bytes) => write_or_fail(&pane, &bytes).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        },
        "agent.prompt" => agent::prompt(server, p, req.late_ms).await,
        "agent.start" => agent::start(server, p).await,
        "agent.wait" => agent::wait(server, p).await,
        other => Err((
            "invalid_request",
            format!("invalid request: fake-herdr does not implement method `{other}`"),
        )),
    };
    match outcome {
        Ok(result) => success(&req.id, &result),
        Err((code, message)) => error(&req.id, code, &message),
    }
}

pub(super) fn live_panes(server: &Server) -> Vec<Arc<PaneRt>> {
    let topo = lock(&server.topo);
    topo.pane_ids()
        .iter()
        .filter_map(|id| topo.panes.get(id).cloned())
        .collect()
}

pub(super) fn find_pane(server: &Server, id: &str) -> Option<Arc<PaneRt>> {
    lock(&server.topo).panes.get(id).cloned()
}

fn pane_param(
    server: &Server,
    p: &Value,
    name: &str,
) -> Result<Arc<PaneRt>, (&'static str, String)> {
    let id = str_param(p, name)?;
    find_pane(server, id).ok_or(("pane_not_found", format!("pane {id} not found")))
}

/// Resolves an agent target (a pane id hosting an agent; fake-herdr has no agent names).
pub(super) fn agent_target(
    server: &Server,
    p: &Value,
) -> Result<Arc<PaneRt>, (&'static str, String)> {
    let target = str_param(p, "target")?;
    let pane = find_pane(server, target)
        .ok_or(("agent_not_found", format!("agent {target} not found")))?;
    if pane.detected().agent.is_none() {
        return Err(("agent_not_found", format!("pane {target} hosts no agent")));
    }
    Ok(pane)
}

/// Creates a tab (in workspace `ws`) whose root pane runs `spec`; returns (tab index, pane).
fn new_tab_with_pane(
    server: &Arc<Server>,
    ws: usize,
    tab_label: Option<String>,
    spec: PaneSpec,
) -> Result<(usize, Arc<PaneRt>), (&'static str, String)> {
    // herdr creates a tab, its pane and the pane's process in one step of its app loop (v0.8.2
    // src/api/server.rs:379 answers each request there), so no other request sees one without
    // the others — a `pane.list` never misses a pane whose process already runs. The topology
    // stays locked across the spawn for the same reason.
    let mut topo = lock(&server.topo);
    let ti = topo.add_tab(ws, tab_label);
    let pane_id = topo.next_pane_id(ws);
    let ws_id = topo.workspaces[ws].id.clone();
    let tab_id = topo.workspaces[ws].tabs[ti].id.clone();
    let pane = server
        .spawn_pane(&pane_id, &tab_id, &ws_id, spec)
        .map_err(|e| ("tab_create_failed", e.to_string()))?;
    topo.workspaces[ws].tabs[ti].panes.push(pane_id.clone());
    topo.panes.insert(pane_id.clone(), Arc::clone(&pane));
    if topo.focused_pane.is_none() {
        topo.focused_pane = Some(pane_id);
    }
    Ok((ti, pane))
}

fn announce_tab(server: &Server, pane: &PaneRt) {
    if let Some(tab) = tabs(server)
        .into_iter()
        .find(|t| t["tab_id"] == pane.identity.tab_id.as_str())
    {
        server.push_event("tab_created", json!({ "tab": tab }));
    }
    server.push_event("pane_created", json!({ "pane": pane_info(server, pane) }));
}

fn shell_spec(p: &Value, label: Option<String>) -> PaneSpec {
    PaneSpec {
        command: None,
        env: env_param(p),
        cwd: opt_str(p, "cwd").map(Into::into),
        label,
    }
}

fn workspace_create(server: &Arc<Server>, p: &Value) -> Outcome {
    let ws = lock(&server.topo).add_workspace(opt_str(p, "label"));
    let (_, pane) = new_tab_with_pane(server, ws, None, shell_spec(p, None))?;
    let workspace = workspaces(server)
        .into_iter()
        .find(|w| w["workspace_id"] == pane.identity.workspace_id.as_str())
        .unwrap_or(Value::Null);
    server.push_event("workspace_created", json!({ "workspace": workspace }));
    announce_tab(server, &pane);
    let tab = tabs(server)
        .into_iter()
        .find(|t| t["tab_id"] == pane.identity.tab_id.as_str())
        .unwrap_or(Value::Null);
    Ok(
        json!({ "type": "workspace_created", "workspace": workspace, "tab": tab,
               "root_pane": pane_info(server, &pane) }),
    )
}

fn resolve_workspace(server: &Server, p: &Value) -> Result<usize, (&'static str, String)> {
    let topo = lock(&server.topo);
    match opt_str(p, "workspace_id") {
        Some(id) => topo
            .workspace_index(&id)
            .ok_or(("workspace_not_found", format!("workspace {id} not found"))),
        None if topo.workspaces.is_empty() => {
            Err(("workspace_not_found", "no active workspace".to_owned()))
        }
        None => Ok(0),
    }
}

fn tab_create(server: &Arc<Server>, p: &Value) -> Outcome {
    let ws = resolve_workspace(server, p)?;
    let (_, pane) = new_tab_with_pane(server, ws, opt_str(p, "label"), shell_spec(p, None))?;
    announce_tab(server, &pane);
    let tab = tabs(server)
        .into_iter()
        .find(|t| t["tab_id"] == pane.identity.tab_id.as_str())
        .unwrap_or(Value::Null);
    Ok(json!({ "type": "tab_created", "tab": tab, "root_pane": pane_info(server, &pane) }))
}

fn layout_apply(server: &Arc<Server>, p: &Value) -> Outcome {
    let root = p.get("root").cloned().unwrap_or(Value::Null);
    if root.get("type").and_then(Value::as_str) != Some("pane") {
        return Err((
            "invalid_layout",
            "fake-herdr applies single-pane layouts only".to_owned(),
        ));
    }
    let replace = opt_str(p, "tab_id");
    if replace.is_some() && p.get("workspace_id").is_some_and(|w| !w.is_null()) {
        return Err((
            "invalid_target",
            "use either tab_id or workspace_id, not both".to_owned(),
        ));
    }
    let (ws, replaced) = match &replace {
        Some(tab_id) => {
            let (ws, ti) = lock(&server.topo)
                .tab_index(tab_id)
                .ok_or(("tab_not_found", format!("tab {tab_id} not found")))?;
            (ws, Some(ti))
        }
        None => (resolve_workspace(server, p)?, None),
    };
    let command: Option<Vec<String>> = root
        .get("command")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .filter(|a: &Vec<String>| !a.is_empty());
    let spec = PaneSpec {
        command,
        env: env_param(&root),
        cwd: opt_str(&root, "cwd").map(Into::into),
        label: opt_str(&root, "label"),
    };
    let (_, pane) = new_tab_with_pane(server, ws, opt_str(p, "tab_label"), spec)?;
    if let Some(old_tab) = replace {
        let old_panes: Vec<Arc<PaneRt>> = {
            let topo = lock(&server.topo);
            replaced
                .and_then(|_| topo.tab_index(&old_tab))
                .map(|(w, t)| topo.workspaces[w].tabs[t].panes.clone())
                .unwrap_or_default()
                .iter()
                .filter_map(|id| topo.panes.get(id).cloned())
                .collect()
        };
        for old in old_panes {
            close_pane(server, &old);
        }
    }
    announce_tab(server, &pane);
    let id = &pane.identity;
    Ok(json!({ "type": "layout_apply", "layout": {
        "workspace_id": id.workspace_id, "tab_id": id.tab_id, "zoomed": false,
        "focused_pane_id": id.pane_id,
        "root": { "type": "pane", "pane_id": id.pane_id, "label": pane.spec.label,
                  "cwd": pane.spec.cwd.as_ref().map(|c| c.display().to_string()),
                  "command": pane.spec.command, "env": {} },
    }}))
}

fn pane_split(server: &Arc<Server>, p: &Value) -> Outcome {
    let target = match opt_str(p, "target_pane_id") {
        Some(id) => id,
        None => lock(&server.topo)
            .focused_pane
            .clone()
            .ok_or(("no_active_pane", "no active pane".to_owned()))?,
    };
    if !matches!(
        p.get("direction").and_then(Value::as_str),
        Some("right" | "down")
    ) {
        return Err((
            "invalid_request",
            "invalid request: unknown or missing `direction`".to_owned(),
        ));
    }
    // One step, as herdr's app loop takes it (see `new_tab_with_pane`).
    let pane = {
        let mut topo = lock(&server.topo);
        let (ws, ti) = topo
            .pane_location(&target)
            .ok_or(("pane_not_found", format!("pane {target} not found")))?;
        let pane_id = topo.next_pane_id(ws);
        let tab_id = topo.workspaces[ws].tabs[ti].id.clone();
        let ws_id = topo.workspaces[ws].id.clone();
        let pane = server
            .spawn_pane(&pane_id, &tab_id, &ws_id, shell_spec(p, None))
            .map_err(|e| ("pane_split_failed", e.to_string()))?;
        topo.workspaces[ws].tabs[ti].panes.push(pane_id.clone());
        topo.panes.insert(pane_id, Arc::clone(&pane));
        pane
    };
    server.push_event("pane_created", json!({ "pane": pane_info(server, &pane) }));
    Ok(json!({ "type": "pane_info", "pane": pane_info(server, &pane) }))
}

fn close_pane(server: &Server, pane: &Arc<PaneRt>) {
    let events = lock(&server.topo).remove_pane(&pane.identity.pane_id);
    pane.kill();
    for (kind, data) in events {
        server.push_event(kind, data);
    }
}

/// herdr key names → bytes (legacy encoding).
fn key_bytes(key: &str) -> Option<&'static [u8]> {
    Some(match key.to_ascii_lowercase().as_str() {
        "enter" | "return" => b"\r",
        "esc" | "escape" => b"\x1b",
        "tab" => b"\t",
        "space" => b" ",
        "backspace" => b"\x7f",
        "up" => b"\x1b[A",
        "down" => b"\x1b[B",
        "right" => b"\x1b[C",
        "left" => b"\x1b[D",
        "ctrl+c" => b"\x03",
        "ctrl+d" => b"\x04",
        "minus" => b"-",
        _ => return None,
    })
}

fn keys_bytes(p: &Value) -> Result<Vec<u8>, (&'static str, String)> {
    let mut out = Vec::new();
    for key in p
        .get("keys")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = key.as_str().unwrap_or("");
        out.extend_from_slice(
            key_bytes(name).ok_or(("invalid_key", format!("invalid key {name:?}")))?,
        );
    }
    Ok(out)
}

pub(super) fn paste_bytes(pane: &PaneRt, text: &str) -> Vec<u8> {
    if pane.bracketed_paste() {
        [b"\x1b[200~".as_slice(), text.as_bytes(), b"\x1b[201~"].concat()
    } else {
        text.as_bytes().to_vec()
    }
}

async fn write_or_fail(pane: &PaneRt, bytes: &[u8]) -> Outcome {
    pane.write(bytes)
        .await
        .map(|()| json!({ "type": "ok" }))
        .map_err(|e| ("pane_send_failed", e.to_string()))
}

async fn pane_input(server: &Server, p: &Value) -> Outcome {
    let pane = pane_param(server, p, "pane_id")?;
    // Every key is validated before any byte is written, as herdr does.
    let keys = keys_bytes(p)?;
    let mut bytes = paste_bytes(&pane, &opt_str(p, "text").unwrap_or_default());
    bytes.extend_from_slice(&keys);
    write_or_fail(&pane, &bytes).await
}

/// `pane.read`; `output_only`: `recent` counts its lines after trailing blank rows are trimmed
/// (0.9, see `version`).
fn read(pane: &PaneRt, p: &Value, output_only: bool) -> Outcome {
    let source = p.get("source").and_then(Value::as_str).unwrap_or("");
    let recent = match source {
        "recent" | "recent_unwrapped" => true,
        "visible" | "detection" => false,
        other => {
            return Err((
                "invalid_request",
                format!("invalid request: unknown source {other:?}"),
            ));
        }
    };
    let lines = p
        .get("lines")
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok());
    let text = pane.read(recent, lines, output_only);
    Ok(json!({ "type": "pane_read", "read": {
        "pane_id": pane.identity.pane_id, "workspace_id": pane.identity.workspace_id,
        "tab_id": pane.identity.tab_id, "source": source, "format": "text", "text": text,
        "revision": pane.revision(), "truncated": false,
    }}))
}

/// A title without one leading spinner glyph (braille U+2800–U+28FF or `·✢✳✶✻✽◐◓◑◒`) and the
/// space after it, as herdr v0.8.2 strips it (src/terminal/title.rs:1-23).
pub(super) fn strip_spinner(title: &str) -> String {
    let mut chars = title.chars();
    match chars.next() {
        Some(c) if ('\u{2800}'..='\u{28FF}').contains(&c) || "·✢✳✶✻✽◐◓◑◒".contains(c) => {
            chars.as_str().trim_start().to_owned()
        }
        _ => title.to_owned(),
    }
}

//! herdr's JSON result shapes for what fake-herdr holds: a pane, its agent, its process, the
//! workspaces and tabs, and the whole snapshot (herdr's published schema,
//! `shared/herdr/herdr-api.schema.json`).

use serde_json::{Value, json};

use super::api::{live_panes, strip_spinner};
use super::pane::PaneRt;
use super::{Server, lock};

pub(super) fn pane_info(server: &Server, pane: &PaneRt) -> Value {
    let d = pane.detected();
    let title = pane.title();
    let focused =
        lock(&server.topo).focused_pane.as_deref() == Some(pane.identity.pane_id.as_str());
    json!({
        "pane_id": pane.identity.pane_id,
        "terminal_id": pane.identity.terminal_id,
        "workspace_id": pane.identity.workspace_id,
        "tab_id": pane.identity.tab_id,
        "focused": focused,
        "cwd": pane.spec.cwd.as_ref().map(|c| c.display().to_string()),
        "label": pane.spec.label,
        "agent": d.agent,
        "display_agent": d.agent,
        // `title` is the newest `pane.report_metadata` title, never the OSC title (herdr v0.8.2
        // src/app/creation.rs:459; src/terminal/metadata.rs:395-423): none here. The OSC title
        // is `terminal_title`, and without one leading spinner glyph `terminal_title_stripped`
        // (src/app/terminal_titles.rs:36-77; src/terminal/title.rs:1-23).
        "title": null,
        "terminal_title": title,
        "terminal_title_stripped": title.as_deref().map(strip_spinner).filter(|t| !t.is_empty()),
        "agent_status": d.status,
        "state_labels": {},
        "tokens": {},
        "revision": pane.revision(),
    })
}

pub(super) fn agent_info(server: &Server, pane: &PaneRt) -> Value {
    let mut info = pane_info(server, pane);
    let d = pane.detected();
    if let Value::Object(map) = &mut info {
        map.remove("label");
        map.insert("name".to_owned(), Value::Null);
        map.insert("screen_detection_skipped".to_owned(), json!(false));
        map.insert("launch_pending".to_owned(), json!(false));
        map.insert("interactive_ready".to_owned(), json!(true));
        map.insert("state_change_seq".to_owned(), json!(d.state_change_seq));
    }
    info
}

pub(super) fn process_info(pane: &PaneRt) -> Value {
    let fg = procfs::process::Process::new(i32::try_from(pane.shell_pid).unwrap_or(0))
        .ok()
        .and_then(|p| p.stat().ok())
        .map(|s| s.tpgid);
    let processes: Vec<Value> = fg
        .and_then(|pgid| procfs::process::Process::new(pgid).ok())
        .map(|p| {
            let name = p.stat().map(|s| s.comm).unwrap_or_default();
            let argv = p.cmdline().unwrap_or_default();
            vec![json!({ "pid": p.pid, "name": name, "argv0": argv.first(), "argv": argv })]
        })
        .unwrap_or_default();
    json!({
        "pane_id": pane.identity.pane_id,
        "shell_pid": pane.shell_pid,
        "foreground_process_group_id": fg,
        "tty": null,
        "foreground_processes": processes,
    })
}

pub(super) fn workspaces(server: &Server) -> Vec<Value> {
    let topo = lock(&server.topo);
    topo.workspaces
        .iter()
        .map(|w| {
            json!({
                "workspace_id": w.id, "number": w.number, "label": w.label, "focused": false,
                "pane_count": w.tabs.iter().map(|t| t.panes.len()).sum::<usize>(),
                "tab_count": w.tabs.len(),
                "active_tab_id": w.tabs.first().map(|t| t.id.clone()).unwrap_or_default(),
                "agent_status": "unknown", "tokens": {},
            })
        })
        .collect()
}

pub(super) fn tabs(server: &Server) -> Vec<Value> {
    let topo = lock(&server.topo);
    topo.workspaces
        .iter()
        .flat_map(|w| {
            w.tabs.iter().map(|t| {
                json!({ "tab_id": t.id, "workspace_id": w.id, "number": t.number, "label": t.label,
                        "focused": false, "pane_count": t.panes.len(), "agent_status": "unknown" })
            })
        })
        .collect()
}

pub(super) fn snapshot(server: &Server) -> Value {
    let panes = live_panes(server);
    json!({ "type": "session_snapshot", "snapshot": {
        "version": server.opts.version, "protocol": server.opts.protocol,
        "workspaces": workspaces(server), "tabs": tabs(server),
        "panes": panes.iter().map(|p| pane_info(server, p)).collect::<Vec<_>>(),
        "layouts": [],
        "agents": panes.iter().filter(|p| p.detected().agent.is_some()).map(|p| agent_info(server, p)).collect::<Vec<_>>(),
        "focused_pane_id": lock(&server.topo).focused_pane,
    }})
}

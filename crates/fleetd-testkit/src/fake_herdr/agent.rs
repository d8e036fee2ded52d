//! fake-herdr's agent methods that wait or launch: `agent.prompt` (paste, Enter 300 ms later —
//! on 0.8 scheduled and answered at once or after the optional wait with herdr's 5 s
//! `agent_prompt_stalled` rule, which starts at the paste; on 0.9 answered, or waited on, only
//! once the Enter is written, see `version`), `agent.wait`, and
//! `agent.start` (the canonical executable typed into an idle shell pane, as herdr does: which
//! program runs is whatever `kind` resolves to on that shell's PATH). No socket code.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Server;
use super::api::{Outcome, agent_target, find_pane, opt_str, paste_bytes, str_param};
use super::pane::PaneRt;
use super::shapes::agent_info;

/// How long herdr lets a prompt go without any state change before `agent_prompt_stalled`.
const PROMPT_EFFECT_MS: u64 = 5_000;
/// herdr presses Enter this long after pasting a prompt, because agent TUIs swallow a glued one.
const PROMPT_ENTER_DELAY: Duration = Duration::from_millis(300);

fn until_param(p: &Value, default: &[&str]) -> Vec<String> {
    match p.get("until").and_then(Value::as_array) {
        Some(list) if !list.is_empty() => list
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => default.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// Waits until `pane`'s status is in `until` or `deadline` passes; `Err` when the pane ended.
async fn wait_status(
    pane: &PaneRt,
    until: &[String],
    deadline: Option<tokio::time::Instant>,
) -> Result<bool, ()> {
    loop {
        let notified = pane.changed.notified();
        if pane.is_exited() {
            return Err(());
        }
        if until.iter().any(|u| u == pane.detected().status) {
            return Ok(true);
        }
        let tick = tokio::time::sleep(Duration::from_millis(100));
        match deadline {
            Some(d) if tokio::time::Instant::now() >= d => return Ok(false),
            Some(d) => {
                tokio::select! { () = notified => {}, () = tick => {}, () = tokio::time::sleep_until(d) => {} }
            }
            None => tokio::select! { () = notified => {}, () = tick => {} },
        }
    }
}

/// `agent.prompt`. `late_ms` (the `input_timeout` fault) answers that long after the prompt was
/// typed, whatever the agent did: herdr's `timeout` when a wait was asked for, else the ack.
pub(super) async fn prompt(server: &Server, p: &Value, late_ms: Option<u64>) -> Outcome {
    let pane = agent_target(server, p)?;
    let text = opt_str(p, "text").unwrap_or_default();
    if text.is_empty() {
        return Err(("empty_agent_prompt", "prompt text is empty".to_owned()));
    }
    // A blocked agent (a dialog is up) is refused before anything is typed (herdr v0.8.2
    // src/app/api/agents.rs:82-91), ahead of the readiness checks.
    if pane.detected().status == "blocked" {
        let target = opt_str(p, "target").unwrap_or_default();
        return Err((
            "agent_blocked",
            format!("agent {target} is blocked and requires interactive input"),
        ));
    }
    let baseline = pane.detected().state_change_seq;
    pane.write(&paste_bytes(&pane, &text))
        .await
        .map_err(|e| ("agent_prompt_failed", e.to_string()))?;
    let lose_enter = {
        let mut faults = super::lock(&server.faults);
        let hit = faults.enter_fails > 0;
        faults.enter_fails = faults.enter_fails.saturating_sub(u32::from(hit));
        hit
    };
    if server.opts.herdr.prompt_answers_after_enter() {
        // 0.9 (as modelled in `version`): the answer comes after the Enter, and a failed Enter
        // is answered, after the text was typed.
        tokio::time::sleep(PROMPT_ENTER_DELAY).await;
        let written = if lose_enter {
            Err("the Enter could not be written (injected fault)".to_owned())
        } else {
            pane.write(b"\r").await.map_err(|e| e.to_string())
        };
        written.map_err(|e| ("agent_prompt_failed", e))?;
    } else {
        // herdr schedules the Enter and answers at once (v0.8.2 src/app/api/agents.rs:121-130,
        // `send_bytes_after(enter, AGENT_PROMPT_SUBMIT_DELAY)`, src/terminal/runtime.rs:461): the
        // answer does not wait for the Enter, and a failed Enter is nobody's answer.
        let enter = Arc::clone(&pane);
        tokio::spawn(async move {
            tokio::time::sleep(PROMPT_ENTER_DELAY).await;
            if !lose_enter {
                let _ = enter.write(b"\r").await;
            }
        });
    }
    let wait = p.get("wait").filter(|w| w.is_object());
    if let Some(ms) = late_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        if wait.is_some() {
            // herdr types the prompt before it waits (v0.8.2 src/api/wait.rs:206-213) and
            // answers `timeout` when that wait runs out (:492, :617-618): the text is in the
            // pane either way. Without a wait there is no `timeout` to answer, only a late ack.
            return Err(("timeout", "timed out waiting for agent status".to_owned()));
        }
    }
    let Some(wait) = wait else {
        return Ok(json!({ "type": "agent_prompted", "agent": agent_info(server, &pane) }));
    };
    let started = tokio::time::Instant::now();
    let timeout_ms = wait.get("timeout_ms").and_then(Value::as_u64);
    let until = until_param(wait, &["idle", "done", "blocked"]);
    if pane.detected().status != "working" {
        let effect_ms = timeout_ms.map_or(PROMPT_EFFECT_MS, |t| t.min(PROMPT_EFFECT_MS));
        let effect_deadline = started + Duration::from_millis(effect_ms);
        loop {
            let notified = pane.changed.notified();
            if pane.is_exited() {
                return Err((
                    "agent_not_running",
                    "agent is no longer running in the target pane".to_owned(),
                ));
            }
            if pane.detected().state_change_seq != baseline {
                break;
            }
            if tokio::time::Instant::now() >= effect_deadline {
                let d = pane.detected();
                return Err(if timeout_ms.is_some_and(|t| t <= PROMPT_EFFECT_MS) {
                    ("timeout", "timed out waiting for agent status".to_owned())
                } else {
                    (
                        "agent_prompt_stalled",
                        format!(
                            "agent prompt produced no observed state change within {effect_ms} ms; status is {} and state_change_seq remained {baseline}",
                            d.status
                        ),
                    )
                });
            }
            tokio::select! {
                () = notified => {},
                () = tokio::time::sleep(Duration::from_millis(100)) => {},
            }
        }
    }
    let deadline = timeout_ms.map(|t| started + Duration::from_millis(t));
    answer_on_status(server, &pane, &until, deadline, "agent_prompted").await
}

pub(super) async fn wait(server: &Server, p: &Value) -> Outcome {
    let pane = agent_target(server, p)?;
    let until = until_param(p, &["idle", "done", "blocked"]);
    let deadline = p
        .get("timeout_ms")
        .and_then(Value::as_u64)
        .map(|t| tokio::time::Instant::now() + Duration::from_millis(t));
    answer_on_status(server, &pane, &until, deadline, "agent_info").await
}

/// Waits until `pane`'s agent shows a status in `until` and answers `{type: kind, agent}`, as
/// `agent.prompt` and `agent.wait` both do; herdr's `timeout` past `deadline`, and
/// `agent_not_running` once the agent is gone.
async fn answer_on_status(
    server: &Server,
    pane: &PaneRt,
    until: &[String],
    deadline: Option<tokio::time::Instant>,
    kind: &str,
) -> Outcome {
    match wait_status(pane, until, deadline).await {
        Ok(true) => Ok(json!({ "type": kind, "agent": agent_info(server, pane) })),
        Ok(false) => Err(("timeout", "timed out waiting for agent status".to_owned())),
        Err(()) => Err((
            "agent_not_running",
            "agent is no longer running in the target pane".to_owned(),
        )),
    }
}

/// `agent.start {name, kind, pane_id, args?, timeout_ms?}`: types `kind args…` and Enter into an
/// idle shell pane (`agent_pane_busy` when an agent already runs there) and reports the launch
/// as pending; detection picks the agent up like any other.
pub(super) async fn start(server: &Server, p: &Value) -> Outcome {
    let name = str_param(p, "name")?;
    let valid_name = name.len() <= 32
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid_name {
        return Err((
            "invalid_agent_name",
            format!("invalid agent name {name:?}: use [a-z][a-z0-9_-]{{0,31}}"),
        ));
    }
    let kind = str_param(p, "kind")?;
    if !super::pane::KNOWN_AGENTS.contains(&kind) {
        return Err((
            "unsupported_agent_kind",
            format!("unsupported agent kind {kind:?}"),
        ));
    }
    if let Some(t) = p.get("timeout_ms").and_then(Value::as_u64)
        && !(3001..=300_000).contains(&t)
    {
        return Err((
            "invalid_agent_timeout",
            "timeout_ms must be greater than 3000 and at most 300000".to_owned(),
        ));
    }
    let pane_id = str_param(p, "pane_id")?;
    let pane = find_pane(server, pane_id)
        .ok_or(("agent_pane_not_found", format!("pane {pane_id} not found")))?;
    // Busy unless the shell alone holds the terminal: an agent there (herdr v0.8.2
    // src/app/agents.rs:185-187), or `available_pane_shell` failing (:192-193) — the
    // foreground group is not the shell's, another process is in it (a `.bashrc` still
    // running), or the leader is no shell (src/platform/mod.rs:231-242, 293-312).
    if pane.detected().agent.is_some() || !shell_alone(pane.shell_pid) {
        return Err((
            "agent_pane_busy",
            format!("agent target pane {pane_id} is not an available shell"),
        ));
    }
    let mut argv = vec![kind.to_owned()];
    argv.extend(
        p.get("args")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_owned)),
    );
    let line = argv
        .iter()
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect::<Vec<_>>()
        .join(" ");
    let mut bytes = paste_bytes(&pane, &line);
    bytes.push(b'\r');
    pane.write(&bytes).await.map_err(|e| {
        (
            "agent_start_input_failed",
            format!("could not type into pane {pane_id}: {e}"),
        )
    })?;
    let mut agent = agent_info(server, &pane);
    agent["name"] = json!(name);
    agent["launch_pending"] = json!(true);
    Ok(json!({ "type": "agent_started", "agent": agent, "argv": argv }))
}

/// Shell names herdr accepts as an available pane shell (v0.8.2 src/platform/mod.rs:293-312).
const SHELL_NAMES: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "fish",
    "ksh",
    "mksh",
    "csh",
    "tcsh",
    "elvish",
    "xonsh",
    "nu",
    "pwsh",
    "powershell",
    "cmd",
];

/// Whether the pane's shell is the only process of the terminal's foreground job, as herdr's
/// `available_pane_shell` checks before `agent.start` types anything.
fn shell_alone(shell_pid: u32) -> bool {
    let Ok(pid) = i32::try_from(shell_pid) else {
        return false;
    };
    let Some(stat) = procfs::process::Process::new(pid)
        .ok()
        .and_then(|p| p.stat().ok())
    else {
        return false;
    };
    if stat.tpgid != pid || !SHELL_NAMES.contains(&stat.comm.as_str()) {
        return false;
    }
    let others = procfs::process::all_processes()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| p.stat().ok())
        .any(|s| s.pgrp == pid && s.pid != pid);
    !others
}

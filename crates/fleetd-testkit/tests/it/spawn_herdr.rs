//! `fleet_spawn` on herdr (fake-herdr): a profile of a known agent kind without its own command
//! is started herdr's way — a tab with the member's environment, then `agent.start`, which types
//! the kind's canonical executable into the tab's shell. Here `claude` on the member's PATH is a
//! link to `sim-agent`, so the whole path runs for real: the shell resolves it, herdr detects a
//! `claude` agent by argv0, the member connects and replies.

use std::time::Duration;

use fleetd_testkit::rig_herdr::HerdrRig;
use fleetd_testkit::{bin_path, http, wait_until};
use serde_json::json;

#[test]
fn e2e_herdr_spawn_starts_a_known_agent_kind_with_agent_start() {
    let bin = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(bin_path("sim-agent"), bin.path().join("claude")).expect("link");
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n  cl:\n    agent: claude\n    env:\n      PATH: \"{}:/usr/bin:/bin\"\n      SIM_AGENT_WORK_MS: \"300\"\n",
        bin.path().display()
    ));
    let (_, lead) = rig.agent_lead("boss");
    let pane = rig.spawned(&lead, "cl", "ann");
    let info = rig.call("pane.process_info", &json!({ "pane_id": pane }));
    let argv0 = info["process_info"]["foreground_processes"][0]["argv0"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        argv0, "claude",
        "herdr typed the canonical executable: {info}"
    );
    // herdr detects the agent by its process on a poll of its own, which may come after
    // fleetd found the member ready (its own reading of the pane, and its MCP session).
    wait_until("herdr lists ann's claude", Duration::from_secs(30), || {
        let agents = rig.call("agent.list", &json!({}));
        agents["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["pane_id"] == pane.as_str() && a["agent"] == "claude")
    });
    rig.call_from(
        &lead,
        r#"fleet_send {"target":"ann","task":"hello","wait":false}"#,
    );
    wait_until("ann's reply", Duration::from_secs(60), || {
        http::reply_texts(rig.daemon.operator(), "ann")
            .first()
            .is_some_and(|t| t.contains("sim-agent did: hello"))
    });
}

#[test]
fn e2e_herdr_agent_start_waits_for_a_shell_still_starting() {
    // The panes' shell takes a second before it is an interactive `sh` alone on its terminal,
    // as a login shell running `.bashrc` does: meanwhile herdr answers `agent_pane_busy`.
    let bin = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(bin_path("sim-agent"), bin.path().join("claude")).expect("link");
    let shell = bin.path().join("slow-shell");
    std::fs::write(&shell, "#!/bin/sh\nsleep 1\nexec /bin/sh \"$@\"\n").expect("shell");
    std::fs::set_permissions(&shell, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let rig = HerdrRig::start_with_shell(
        &format!(
            "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n  cl:\n    agent: claude\n    env:\n      PATH: \"{}:/usr/bin:/bin\"\n",
            bin.path().display()
        ),
        &shell.display().to_string(),
    );
    let (_, lead) = rig.agent_lead("boss");
    // ann was spawned once the shell was free.
    rig.spawned(&lead, "cl", "ann");
}

#[test]
fn e2e_herdr_a_custom_agent_herdr_does_not_know_is_spawned_and_served() {
    // A `custom` profile with no HERDR_AGENT hint: herdr reports the pane `unknown` with no
    // agent, so fleetd derives its status from the title and the screen, as on tmux.
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n  own:\n    agent: custom\n    command: {}\n    env:\n      SIM_AGENT_WORK_MS: \"300\"\n",
        bin_path("sim-agent").display()
    ));
    let (_, lead) = rig.agent_lead("boss");
    let pane = rig.spawned(&lead, "own", "ann");
    let info = rig.call("pane.get", &json!({ "pane_id": pane }));
    assert_eq!(
        info["pane"]["agent_status"], "unknown",
        "herdr does not know this agent: {info}"
    );
    assert!(info["pane"]["agent"].is_null(), "{info}");
    let body = json!({ "task": "hello", "wait": true, "timeoutSecs": 60 }).to_string();
    let answer = http::request(
        rig.daemon.operator(),
        "POST",
        "/sessions/ann/tasks",
        Some(&body),
    )
    .expect("fleetd answers");
    assert!(
        answer.body.contains("sim-agent did: hello"),
        "the task was typed and answered: {}",
        answer.body
    );
}

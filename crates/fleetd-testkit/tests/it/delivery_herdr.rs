//! End-to-end tests of task delivery on herdr (the `fake-herdr` server: real PTYs, herdr's
//! protocol and agent detection, fault injection) and the built `fleetd`: a prompt herdr typed
//! but answered with its `timeout` error is never typed again (SPEC §13.7), and a prompt herdr
//! reports stalled gets exactly one Enter retry in all, decided by fleetd's core (review M6).

use std::path::Path;
use std::time::Duration;

use fleetd_testkit::rig_herdr::{HerdrRig, sim_profile};
use fleetd_testkit::sim_agent::logged;
use fleetd_testkit::{bin_path, http, wait_until};
use serde_json::{Value, json};

/// Spawns `name` from `profile` through the lead's `fleet_spawn` and returns its bare pane id.
fn spawn(rig: &HerdrRig, lead: &str, profile: &str, name: &str) -> String {
    rig.call_from(
        lead,
        &format!(r#"fleet_spawn {{"profile":"{profile}","name":"{name}"}}"#),
    );
    let mut pane = None;
    wait_until(
        &format!("{name} to be listed"),
        Duration::from_secs(60),
        || {
            pane = http::get(rig.daemon.operator(), &format!("/sessions/{name}"))
                .ok()
                .filter(|r| r.status == 200)
                .and_then(|r| r.json()["paneId"].as_str().map(str::to_owned));
            pane.is_some()
        },
    );
    let pane = pane.expect("listed with a pane");
    pane.strip_prefix("lead:").unwrap_or(&pane).to_owned()
}

/// Sends a task to `target` as the operator (`fleet_send`'s REST route, with `body`); the
/// answer, which must be a 200.
fn post_task(rig: &HerdrRig, target: &str, body: &Value) -> Value {
    let answer = http::request(
        rig.daemon.operator(),
        "POST",
        &format!("/sessions/{target}/tasks"),
        Some(&body.to_string()),
    )
    .expect("fleetd answers");
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.json()
}

/// Sends `task` to `target` as the operator and waits for the ticket to settle; returns the
/// tool's answer.
fn send_and_wait(rig: &HerdrRig, target: &str, task: &str) -> Value {
    post_task(
        rig,
        target,
        &json!({ "task": task, "wait": true, "timeoutSecs": 90 }),
    )
}

/// A rig whose one profile `name` runs a sim-agent (seen by herdr as claude) with the extra
/// `env` lines, logging what it does to `log`; `extra` is added to the top-level config.
fn rig_with_logged_member(name: &str, env: &str, log: &Path, extra: &str) -> HerdrRig {
    HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 0\n{extra}profiles:\n  {name}:\n    agent: custom\n    command: {}\n    env:\n      HERDR_AGENT: claude\n{env}      SIM_AGENT_LOG: {}\n",
        bin_path("sim-agent").display(),
        log.display()
    ))
}

#[test]
fn e2e_herdr_a_task_herdr_typed_but_answered_timeout_is_typed_once_and_completes() {
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile("slow", 1500)
    ));
    let (_, lead) = rig.agent_lead("boss");
    let member = spawn(&rig, &lead, "slow", "nia");
    // herdr types the next prompt, then answers `timeout` at once — before it (or fleetd) could
    // see the member start: the worst case for a blind retry.
    rig.herdr
        .fault(&json!({ "fault": "input_timeout", "count": 1, "ms": 0 }))
        .expect("fault");
    let task = "count the files exactly once";
    let sent = send_and_wait(&rig, "nia", task);
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"], format!("sim-agent did: {task}"), "{sent}");
    wait_until("nia at rest again", Duration::from_secs(30), || {
        http::get(rig.daemon.operator(), "/sessions/nia")
            .is_ok_and(|r| r.json()["status"] == "done" || r.json()["status"] == "idle")
    });
    let screen = rig.history(&member);
    assert_eq!(
        screen.matches(task).count(),
        1,
        "the task was typed exactly once:\n{screen}"
    );
}

#[test]
fn e2e_herdr_a_stalled_prompt_gets_exactly_one_enter_retry() {
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("sticky.jsonl");
    // The member swallows every Enter: its turn never starts, so every retry shows in its log.
    let rig = rig_with_logged_member(
        "sticky",
        "      SIM_AGENT_WORK_MS: \"300\"\n      SIM_AGENT_SWALLOW: \"9\"\n",
        &log,
        "delivery:\n  verifyGraceMs: 1000\n",
    );
    let (_, lead) = rig.agent_lead("boss");
    spawn(&rig, &lead, "sticky", "max");
    let sent = send_and_wait(&rig, "max", "stuck in the composer");
    assert_eq!(sent["status"], "stalled", "{sent}");
    // herdr's own Enter after the paste, then fleetd's one retry: two Enters, never three.
    assert_eq!(
        logged(&log, "swallowed"),
        2,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn e2e_herdr_a_turn_without_reply_on_a_tall_pane_shows_the_lead_its_last_lines() {
    // A 120-row pane with a few lines of output: herdr's `recent` read counts the blank rows
    // below them, so a read of the last 40 rows alone is empty.
    let rig = HerdrRig::start_with_rows(
        &format!(
            "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n{}    # turns end without fleet_reply\n",
            sim_profile("quiet", 200).replace(
                "      SIM_AGENT_WORK_MS",
                "      SIM_AGENT_SCRIPT: silent\n      SIM_AGENT_WORK_MS"
            )
        ),
        120,
    );
    let (_, lead) = rig.agent_lead("boss");
    spawn(&rig, &lead, "quiet", "nia");
    // The waiting send gets the fallback as its answer.
    let answer = send_and_wait(&rig, "nia", "tidy the attic").to_string();
    assert!(
        answer.contains("ended without fleet_reply"),
        "the turn ended without a reply: {answer}"
    );
    assert!(
        answer.contains("tidy the attic") && answer.contains("sim-agent: turn done"),
        "the fallback shows the member's last lines: {answer}"
    );
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that nothing is typed again means waiting out the prompt wait"
)]
fn e2e_herdr_a_task_that_takes_its_member_straight_to_a_dialog_is_typed_once() {
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("careful.jsonl");
    // The member shows a dialog at once: idle → blocked, never working, so herdr's wait for
    // `working` runs out and answers `timeout` (v0.8.2 src/api/wait.rs:232-306).
    let rig = rig_with_logged_member("careful", "      SIM_AGENT_SCRIPT: dialog\n", &log, "");
    let (_, lead) = rig.agent_lead("boss");
    let pane = spawn(&rig, &lead, "careful", "cat");
    post_task(
        &rig,
        "cat",
        &json!({ "task": "delete the cache", "wait": false }),
    );
    wait_until("the member's dialog", Duration::from_secs(30), || {
        rig.history(&pane).contains("Enter to confirm")
    });
    // Past herdr's whole prompt wait (fleetd asks for 15 s) and a verify grace after it.
    std::thread::sleep(Duration::from_secs(18));
    assert_eq!(
        logged(&log, "dialog_answered"),
        0,
        "nothing typed into the dialog (a second typing of the task would answer it): {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    rig.type_line(&pane, "");
    wait_until(
        "the dialog answered by the person",
        Duration::from_secs(30),
        || logged(&log, "dialog_answered") == 1,
    );
    assert_eq!(logged(&log, "turn"), 1, "the task was typed once");
}

//! End-to-end tests of the push loop on herdr (the `fake-herdr` server: real PTYs, herdr's
//! protocol, status detection and restart behaviour): a late reply nudges the idle lead, a working
//! lead is nudged only after its turn, a closed delegating lead's mail goes to the primary, a
//! herdr restart between reply and nudge loses nothing — the nudge reaches the agent started again
//! in the primary tab — and a nudge herdr typed but answered with `timeout` is typed only once.
//! The late-reply nudge runs against herdr 0.8.2 and herdr 0.9 alike.

use std::time::Duration;

use fleetd_testkit::fake_herdr::HerdrVersion;
use fleetd_testkit::rig_herdr::{HerdrRig, sim_profile};
use fleetd_testkit::{http, wait_until};
use serde_json::json;

/// A rig whose primary tab is the first lead tab (`w1:t1`), with members `slow` (2.5 s turns)
/// and `slower` (8 s).
fn rig() -> HerdrRig {
    HerdrRig::start(&rig_config())
}

fn rig_config() -> String {
    format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 3\n  pushBackoffMs: 1000\n  pushBackoffMaxMs: 2000\nprofiles:\n{}{}",
        sim_profile("slow", 2500),
        sim_profile("slower", 8000)
    )
}

fn nudge(target: &str) -> String {
    format!("[fleet] 1 message from {target}")
}

/// Waits (naming `what`) for the nudge about `from`'s reply in `pane`.
fn nudged(rig: &HerdrRig, pane: &str, from: &str, what: &str) {
    wait_until(what, Duration::from_secs(60), || {
        rig.history(pane).contains(&nudge(from))
    });
}

fn spawn(rig: &HerdrRig, lead: &str, profile: &str, name: &str) {
    rig.call_from(
        lead,
        &format!(r#"fleet_spawn {{"profile":"{profile}","name":"{name}"}}"#),
    );
    wait_until(
        &format!("{name} to be listed"),
        Duration::from_secs(60),
        || {
            http::get(rig.daemon.operator(), &format!("/sessions/{name}"))
                .is_ok_and(|r| r.status == 200)
        },
    );
}

fn send(rig: &HerdrRig, lead: &str, target: &str, timeout_secs: u32) {
    rig.call_from(
        lead,
        &format!(r#"fleet_send {{"target":"{target}","task":"job for {target}","timeoutSecs":{timeout_secs}}}"#),
    );
}

/// Restarts herdr: every pane comes back with a new terminal and a fresh shell. Returns once it
/// answers again.
fn restart_herdr(rig: &HerdrRig) {
    rig.herdr
        .fault(&json!({ "fault": "restart", "down_ms": 800 }))
        .expect("restart");
    // The fault only starts the restart: wait for herdr to go away before waiting for it back
    // (a ping answered before it went was read as "back", and the next call hit the gap).
    wait_until("herdr to go down", Duration::from_secs(30), || {
        rig.herdr.call("ping", &json!({})).is_err()
    });
    wait_until("herdr to answer again", Duration::from_secs(30), || {
        rig.herdr.call("ping", &json!({})).is_ok()
    });
}

/// fleetd's log lines so far that hold `needle`.
fn logged_with(rig: &mut HerdrRig, needle: &str) -> Vec<String> {
    rig.daemon
        .logs_so_far()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

fn reply_waiting(rig: &HerdrRig, target: &str) -> bool {
    http::get(
        rig.daemon.operator(),
        &format!("/sessions/{target}/replies"),
    )
    .is_ok_and(|r| r.json()["replies"][0]["msgId"].is_string())
}

/// Opens the lead `boss`, spawns nia (2.5 s turns) and zed (8 s), sends nia a task with a 1 s
/// window, then keeps the lead working on zed's task while nia's reply lands (no nudge yet).
fn lead_busy_when_nia_replies(rig: &HerdrRig) -> String {
    let (_, lead) = rig.agent_lead("boss");
    spawn(rig, &lead, "slow", "nia");
    spawn(rig, &lead, "slower", "zed");
    send(rig, &lead, "nia", 1);
    rig.type_line(
        &lead,
        r#"fleet_send {"target":"zed","task":"long job","timeoutSecs":30}"#,
    );
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        reply_waiting(rig, "nia")
    });
    assert!(
        !rig.history(&lead).contains(&nudge("nia")),
        "no nudge while the lead works"
    );
    lead
}

/// A member spawned, a task delivered, its late reply nudging the idle lead — on herdr 0.8.2
/// and on herdr 0.9 (protocol 22, which fleetd knows: no warning about a newer protocol).
fn late_reply_nudges_the_idle_lead(version: HerdrVersion) {
    let mut rig = HerdrRig::start_as(&rig_config(), version);
    let (_, lead) = rig.agent_lead("boss");
    spawn(&rig, &lead, "slow", "nia");
    send(&rig, &lead, "nia", 1);
    nudged(&rig, &lead, "nia", "the nudge in the lead's pane");
    assert!(
        !rig.history(&lead).contains("sim-agent did: job"),
        "no payload"
    );
    let protocol_warnings = logged_with(&mut rig, "newer protocol");
    assert!(
        protocol_warnings.is_empty(),
        "{version:?}: {protocol_warnings:#?}"
    );
}

#[test]
fn e2e_herdr_late_reply_nudges_the_idle_lead() {
    late_reply_nudges_the_idle_lead(HerdrVersion::V0_8);
}

#[test]
fn e2e_herdr_0_9_late_reply_nudges_the_idle_lead() {
    late_reply_nudges_the_idle_lead(HerdrVersion::V0_9);
}

#[test]
fn e2e_herdr_closing_the_delegating_lead_sends_the_nudge_to_the_primary() {
    let rig = rig();
    let (_, primary) = rig.agent_lead("boss");
    let (_, delegator) = rig.agent_lead("helper");
    spawn(&rig, &delegator, "slow", "nia");
    send(&rig, &delegator, "nia", 1);
    rig.call("pane.close", &json!({ "pane_id": delegator }));
    nudged(&rig, &primary, "nia", "the nudge in the primary's pane");
}

/// herdr restarts while the lead works and nia's reply waits; the user starts the lead agent
/// again in the primary tab with `start_again`: fleetd finds it and nudges it, and the reply is
/// still in the inbox.
fn restart_then_the_lead_started_again_is_nudged(start_again: impl FnOnce(&HerdrRig, &str)) {
    let rig = rig();
    let lead = lead_busy_when_nia_replies(&rig);
    restart_herdr(&rig);
    start_again(&rig, &lead);
    nudged(&rig, &lead, "nia", "the nudge in the restarted lead");
    assert!(
        reply_waiting(&rig, "nia"),
        "the reply is still in the inbox"
    );
}

#[test]
fn e2e_herdr_restart_between_reply_and_nudge_loses_nothing() {
    restart_then_the_lead_started_again_is_nudged(|rig, lead| rig.start_agent(lead));
}

#[test]
fn e2e_herdr_restart_the_lead_started_again_is_found_even_when_herdr_names_no_agent_in_it() {
    // Seen on a real herdr 0.8.2: the agent started again in the primary tab was not detected
    // (no agent kind), so the tab scanner had nothing to pick and the mail waited. Its MCP
    // connection at start is enough: fleetd registers it as the lead there and nudges it.
    restart_then_the_lead_started_again_is_nudged(|rig, lead| {
        rig.start_agent_with(lead, &["HERDR_AGENT=none".to_owned()]);
        let listed = rig.call("pane.get", &json!({ "pane_id": lead }));
        assert!(
            listed["pane"]["agent"].is_null(),
            "herdr names no agent in it: {listed}"
        );
    });
}

#[test]
fn e2e_herdr_a_working_lead_is_nudged_only_after_its_turn() {
    let rig = rig();
    let lead = lead_busy_when_nia_replies(&rig);
    nudged(&rig, &lead, "nia", "the nudge after the turn");
    let screen = rig.history(&lead);
    let turn_end = screen
        .match_indices("turn done")
        .nth(3) // spawn, spawn, send nia, send zed
        .map(|(i, _)| i)
        .expect("zed's turn ended");
    assert!(
        screen.find(&nudge("nia")).expect("nudge") > turn_end,
        "typed only after the working turn:\n{screen}"
    );
}

#[test]
fn e2e_herdr_with_no_lead_at_all_the_reply_waits_for_a_poll() {
    // No primary: the only lead spawns and delegates, then its pane closes.
    let rig = HerdrRig::start(&format!("profiles:\n{}", sim_profile("slow", 2500)));
    let (_, lead) = rig.agent_lead("solo");
    spawn(&rig, &lead, "slow", "nia");
    send(&rig, &lead, "nia", 1);
    rig.call("pane.close", &json!({ "pane_id": lead }));
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        reply_waiting(&rig, "nia")
    });
    let replies = http::reply_texts(rig.daemon.operator(), "nia");
    assert!(
        replies
            .first()
            .is_some_and(|t| t.contains("sim-agent did: job for nia")),
        "{replies:?}"
    );
}

#[test]
fn e2e_herdr_a_nudge_herdr_typed_but_answered_timeout_is_typed_once() {
    // One reminder per batch: any second nudge in the lead's pane is a retyped one.
    let mut rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 1\n  pushBackoffMs: 1000\nprofiles:\n{}",
        sim_profile("slow", 2500)
    ));
    let (_, lead) = rig.agent_lead("boss");
    spawn(&rig, &lead, "slow", "nia");
    send(&rig, &lead, "nia", 1);
    // nia is working on the task (typed already); the next prompt herdr types is the nudge,
    // answered with herdr's `timeout`.
    rig.herdr
        .fault(&json!({ "fault": "input_timeout", "count": 1, "ms": 0 }))
        .expect("fault");
    nudged(&rig, &lead, "nia", "the nudge in the lead's pane");
    rig.daemon.wait_for_log(
        "the push loop to spend its budget",
        Duration::from_secs(60),
        |line| line.contains("stopped nudging"),
    );
    let screen = rig.history(&lead);
    assert_eq!(
        screen.matches(&nudge("nia")).count(),
        1,
        "typed once:\n{screen}"
    );
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that nothing is typed into the dialog means waiting out several nudge chances"
)]
fn e2e_herdr_a_blocked_lead_gets_nothing_typed_and_no_warnings() {
    let mut rig = rig();
    // Turns one and two spawn and delegate; turn three shows an approval dialog and waits.
    let (_, lead) = rig.agent_lead_with("boss", &["SIM_AGENT_SCRIPT=call,call,block".to_owned()]);
    spawn(&rig, &lead, "slow", "nia");
    send(&rig, &lead, "nia", 1);
    rig.type_line(&lead, "do something risky");
    wait_until("the lead's dialog", Duration::from_secs(30), || {
        rig.history(&lead).contains("Enter to confirm")
    });
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        reply_waiting(&rig, "nia")
    });
    // Reminders are 1 s then 2 s apart: an idle lead would have had two nudges by now.
    std::thread::sleep(Duration::from_secs(4));
    let history = rig.history(&lead);
    assert!(
        !history.contains(&nudge("nia")),
        "nothing is typed into a dialog: {history}"
    );
    assert!(
        history.contains("Enter to confirm"),
        "the dialog is still up"
    );
    let warnings = logged_with(&mut rig, "\"WARN\"");
    assert!(
        warnings.is_empty(),
        "a blocked lead is busy, not a failure: {warnings:#?}"
    );
    // The person answers the dialog; the turn ends and the nudge follows.
    rig.type_line(&lead, "");
    wait_until(
        "the nudge once the dialog is gone",
        Duration::from_secs(30),
        || rig.history(&lead).contains(&nudge("nia")),
    );
}

#[test]
fn e2e_herdr_a_lead_herdr_does_not_know_is_nudged_when_idle() {
    let rig = rig();
    // No HERDR_AGENT hint: herdr reports the lead's pane `unknown`; fleetd derives its status.
    let (_, lead) = rig.agent_lead_with("boss", &["HERDR_AGENT=".to_owned()]);
    let info = rig.call("pane.get", &json!({ "pane_id": lead }));
    assert_eq!(info["pane"]["agent_status"], "unknown", "{info}");
    spawn(&rig, &lead, "slow", "nia");
    send(&rig, &lead, "nia", 1);
    nudged(&rig, &lead, "nia", "the nudge in the lead's pane");
}

#[test]
fn e2e_herdr_a_restart_leaves_no_restored_shells_of_released_members() {
    let rig = rig();
    let (_, lead) = rig.agent_lead("boss");
    spawn(&rig, &lead, "slow", "nia");
    spawn(&rig, &lead, "slower", "zed");
    restart_herdr(&rig);
    wait_until("both members released", Duration::from_secs(30), || {
        ["nia", "zed"].iter().all(|m| {
            http::get(rig.daemon.operator(), &format!("/sessions/{m}"))
                .is_ok_and(|r| r.status == 404)
        })
    });
    let members_workspace = |rig: &HerdrRig| -> Option<String> {
        rig.call("workspace.list", &json!({}))["workspaces"]
            .as_array()?
            .iter()
            .find(|w| w["label"] == "fleet")
            .and_then(|w| w["workspace_id"].as_str().map(str::to_owned))
    };
    let workspace = members_workspace(&rig);
    wait_until(
        "the released members' restored shells to be closed",
        Duration::from_secs(30),
        || {
            let panes = rig.call("pane.list", &json!({}));
            !panes["panes"].as_array().into_iter().flatten().any(|p| {
                Some(p["workspace_id"].as_str().unwrap_or_default()) == workspace.as_deref()
            })
        },
    );
    // The lead's own restored pane is the user's: left alone.
    assert!(
        rig.call("pane.get", &json!({ "pane_id": lead }))["pane"].is_object(),
        "the lead's pane stays"
    );
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that no Enter comes means waiting out herdr's 5 s stall window"
)]
fn e2e_herdr_a_nudge_the_lead_does_not_start_on_gets_no_bare_enter() {
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("boss.jsonl");
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 1\nprofiles:\n{}",
        sim_profile("slow", 300)
    ));
    // The lead swallows the Enter after the nudge's paste: the nudge stays in its composer and
    // its turn never starts, so herdr answers agent_prompt_stalled after 5 s.
    let _lead = rig.agent_lead_with(
        "boss",
        &[
            "SIM_AGENT_SWALLOW=1".to_owned(),
            format!("SIM_AGENT_LOG={}", log.display()),
        ],
    );
    // The operator spawns and delegates (typing into the lead would use up its swallow).
    let call = |name: &str, args: serde_json::Value| {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": { "name": name, "arguments": args } })
        .to_string();
        let answer = http::request(rig.daemon.operator(), "POST", "/mcp", Some(&body))
            .expect("fleetd answers");
        assert!(
            answer.body.contains("\"isError\":false"),
            "{name}: {}",
            answer.body
        );
    };
    call("fleet_spawn", json!({ "profile": "slow", "name": "nia" }));
    call(
        "fleet_send",
        json!({ "target": "nia", "task": "job", "wait": false }),
    );
    let events = |event: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .count()
    };
    wait_until(
        "the nudge in the lead's composer",
        Duration::from_secs(60),
        || events("swallowed") == 1,
    );
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        events("turn"),
        0,
        "no bare Enter submitted the nudge behind the lead's back: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A lead whose turns end before herdr's screen detection looks again (it reads the screen
/// every 120 ms, fake-herdr as herdr) never shows herdr `working`. A nudge typed with a status
/// wait then holds fleetd's push loop until herdr's 5 s stall rule answers, and the next reply's
/// nudge waited behind it (the ~3 s slow round of the nudge benchmark). A nudge is typed without
/// a wait: the next one goes out as soon as its reply lands.
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "the test measures how long the second nudge took against herdr's 5 s stall rule"
)]
fn e2e_herdr_a_lead_too_quick_for_herdr_to_see_working_gets_the_next_nudge_at_once() {
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\nprofiles:\n{}",
        sim_profile("quick", 300)
    ));
    let (_, lead) = rig.agent_lead_with("boss", &["SIM_AGENT_WORK_MS=0".to_owned()]);
    spawn(&rig, &lead, "quick", "nia");
    let nudges = || rig.history(&lead).matches(&nudge("nia")).count();
    send(&rig, &lead, "nia", 0);
    let turns = || rig.history(&lead).matches("turn done").count();
    let before = turns();
    wait_until("the first nudge", Duration::from_secs(60), || nudges() == 1);
    // Wait for the nudge's own turn to end: a line typed inside herdr's 300 ms Enter window
    // would join the nudge's line.
    wait_until("the first nudge's turn", Duration::from_secs(60), || {
        turns() > before
    });
    http::ack_all(rig.daemon.operator(), "nia").expect("acknowledge the first reply");
    let sent = std::time::Instant::now();
    send(&rig, &lead, "nia", 0);
    wait_until("the second nudge", Duration::from_secs(60), || {
        nudges() == 2
    });
    let took = sent.elapsed();
    assert!(
        took < Duration::from_millis(3500),
        "the second nudge took {took:?} after its task was sent: it waited behind the first \
         nudge's prompt (herdr answers a wait its agent never shows `working` for after 5 s)"
    );
}

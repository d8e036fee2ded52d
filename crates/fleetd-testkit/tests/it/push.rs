//! End-to-end tests of the push loop (issue 6) with real tmux: leads are `sim-agent`s in `call`
//! mode (agents, so their status is real and a nudge typed into them is visible), members are
//! `sim-agent`s spawned through `fleet_spawn`. The same scenarios against fake-herdr live in
//! `push_herdr`.

use std::time::Duration;

use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use fleetd_testkit::{http, wait_until};

/// Primary pinned to the window named `boss` (an agent lead the test opens), three reminders 1 s then
/// 2 s apart; profiles `slow` (a 2.5 s turn) and `slower` (8 s).
fn rig() -> Option<Rig> {
    let yaml = format!(
        "primary:\n  tab: base:boss\n  pushReminders: 3\n  pushBackoffMs: 1000\n  pushBackoffMaxMs: 2000\nprofiles:\n{}{}",
        sim_profile("slow", &[("SIM_AGENT_WORK_MS", "2500")]),
        sim_profile("slower", &[("SIM_AGENT_WORK_MS", "8000")]),
    );
    Rig::start_if_tmux(&yaml)
}

/// A nudge about `n` message(s) from `target`, as it appears in a pane.
fn nudge(n: u32, target: &str) -> String {
    let noun = if n == 1 { "message" } else { "messages" };
    format!("[fleet] {n} {noun} from {target} waiting")
}

/// Types a `fleet_send` into an agent lead and waits for the turn that made it to end.
fn send_from(rig: &Rig, lead: &str, target: &str, task: &str, timeout_secs: u32) {
    let done = rig.history(lead).matches("turn done").count();
    rig.type_line(
        lead,
        &format!(
            r#"fleet_send {{"target":"{target}","task":"{task}","timeoutSecs":{timeout_secs}}}"#
        ),
    );
    wait_until(
        "the lead's fleet_send turn to end",
        Duration::from_secs(60),
        || rig.history(lead).matches("turn done").count() > done,
    );
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that no nudge comes means waiting out the backoff window"
)]
fn e2e_late_reply_nudges_the_idle_lead_until_read() {
    let Some(rig) = rig() else {
        return;
    };
    let lead = rig.agent_lead("boss");
    rig.spawn("slow", "nia");
    // The agent lead delegates with a one-second window: the reply will come after it closes.
    send_from(&rig, &lead, "nia", "long job", 1);
    wait_until(
        "the nudge in the lead's pane",
        Duration::from_secs(60),
        || rig.screen(&lead).contains(&nudge(1, "nia")),
    );
    let screen = rig.history(&lead);
    assert!(
        !screen.contains("sim-agent did: long job"),
        "a nudge never carries the reply: {screen}"
    );
    // Reading (fleet_poll) and acknowledging (fleet_ack) the mail stops the reminders.
    let inbox = structured_ok(&rig.lead("fleet_poll", &serde_json::json!({ "target": "nia" })));
    let id = inbox["replies"][0]["msgId"]
        .as_str()
        .unwrap_or_else(|| panic!("a pending reply: {inbox}"))
        .to_owned();
    structured_ok(&rig.lead(
        "fleet_ack",
        &serde_json::json!({ "target": "nia", "msgId": id }),
    ));
    let count = |s: &str| s.matches(&nudge(1, "nia")).count();
    let after_ack = count(&rig.history(&lead));
    assert!(after_ack <= 3, "never over the budget of three");
    // Three reminders would need 1 s + 2 s of backoff; wait past that and see none came.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        count(&rig.history(&lead)),
        after_ack,
        "no nudge after the mail was read"
    );
}

#[test]
fn e2e_a_working_lead_is_nudged_only_after_it_goes_idle() {
    let Some(rig) = rig() else {
        return;
    };
    let lead = rig.agent_lead("boss");
    rig.spawn("slow", "nia");
    rig.spawn("slower", "zed");
    send_from(&rig, &lead, "nia", "quick-ish job", 1);
    // Now the lead waits up to 30 s on zed's 8 s turn: it is working when nia's reply lands.
    rig.type_line(
        &lead,
        r#"fleet_send {"target":"zed","task":"long job","timeoutSecs":30}"#,
    );
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        http::get(rig.daemon.operator(), "/sessions/nia/replies")
            .is_ok_and(|r| r.json()["replies"][0]["msgId"].is_string())
    });
    assert!(
        !rig.history(&lead).contains(&nudge(1, "nia")),
        "no nudge while the lead is working"
    );
    wait_until(
        "the nudge once the lead is idle",
        Duration::from_secs(60),
        || rig.history(&lead).contains(&nudge(1, "nia")),
    );
    let screen = rig.history(&lead);
    let zed_turn_end = screen
        .match_indices("turn done")
        .nth(1)
        .map(|(i, _)| i)
        .expect("the zed turn ended");
    let nudged_at = screen.find(&nudge(1, "nia")).expect("nudge");
    assert!(
        nudged_at > zed_turn_end,
        "the nudge was typed only after the working turn ended:\n{screen}"
    );
}

#[test]
fn e2e_closing_the_delegating_lead_sends_the_next_nudge_to_the_primary() {
    let Some(rig) = rig() else {
        return;
    };
    let primary = rig.agent_lead("boss"); // the pinned primary tab
    let delegator = rig.agent_lead("helper");
    rig.spawn("slow", "nia");
    send_from(&rig, &delegator, "nia", "long job", 1);
    // The delegating lead goes away before the reply comes.
    let out = rig
        .tmux
        .run(&["kill-window", "-t", &delegator])
        .expect("tmux");
    assert!(out.status.success());
    wait_until(
        "the nudge in the primary's pane",
        Duration::from_secs(60),
        || rig.history(&primary).contains(&nudge(1, "nia")),
    );
}

#[test]
fn e2e_with_no_lead_at_all_the_reply_waits_for_a_poll() {
    // No primary configured: the only lead is the agent that spawns and delegates, then leaves.
    let Some(rig) = Rig::start_if_tmux(&format!(
        "profiles:\n{}",
        sim_profile("slow", &[("SIM_AGENT_WORK_MS", "2500")])
    )) else {
        return;
    };
    let lead = rig.agent_lead("solo");
    let done = rig.history(&lead).matches("turn done").count();
    rig.type_line(&lead, r#"fleet_spawn {"profile":"slow","name":"nia"}"#);
    wait_until("the spawn turn to end", Duration::from_secs(60), || {
        rig.history(&lead).matches("turn done").count() > done
    });
    send_from(&rig, &lead, "nia", "long job", 1);
    let out = rig.tmux.run(&["kill-window", "-t", &lead]).expect("tmux");
    assert!(out.status.success());
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        http::get(rig.daemon.operator(), "/sessions/nia/replies")
            .is_ok_and(|r| r.json()["replies"][0]["msgId"].is_string())
    });
    // Anyone may read it later: a new lead pane polls and gets it.
    let result = rig.lead("fleet_poll", &serde_json::json!({ "target": "nia" }));
    let text = result.to_string();
    assert!(text.contains("sim-agent did: long job"), "{text}");
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that nothing is typed into the dialog means waiting out several nudge chances"
)]
fn e2e_a_lead_showing_an_approval_dialog_gets_nothing_typed() {
    let Some(rig) = rig() else {
        return;
    };
    // Turn one delegates; turn two shows an approval dialog and waits for its answer.
    let lead = rig.agent_lead_with("boss", &["SIM_AGENT_SCRIPT=call,block".to_owned()]);
    rig.spawn("slow", "nia");
    send_from(&rig, &lead, "nia", "long job", 1);
    rig.type_line(&lead, "do something risky");
    wait_until("the lead's dialog", Duration::from_secs(30), || {
        rig.screen(&lead).contains("Enter to confirm")
    });
    wait_until("nia's reply in the inbox", Duration::from_secs(60), || {
        http::get(rig.daemon.operator(), "/sessions/nia/replies")
            .is_ok_and(|r| r.json()["replies"][0]["msgId"].is_string())
    });
    // Reminders are 1 s then 2 s apart: an idle lead would have had two nudges by now.
    std::thread::sleep(Duration::from_secs(4));
    let history = rig.history(&lead);
    assert!(
        !history.contains(&nudge(1, "nia")),
        "nothing is typed into a dialog: {history}"
    );
    assert!(
        rig.screen(&lead).contains("Enter to confirm"),
        "the dialog is still up, unanswered"
    );
    // The person answers the dialog; the turn ends and the nudge follows.
    rig.type_line(&lead, "");
    wait_until(
        "the nudge once the dialog is gone",
        Duration::from_secs(30),
        || rig.history(&lead).contains(&nudge(1, "nia")),
    );
}

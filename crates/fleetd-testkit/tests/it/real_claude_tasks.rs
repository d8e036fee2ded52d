//! The keystroke-free wake with the real Claude Code (issue 33): a lead whose client takes MCP
//! tasks gets `fleet_send`'s wait as a task, its turn ends, and when the member replies Claude
//! Code starts the next turn by itself — nothing typed into its pane, no nudge.

use std::time::Duration;

use fleetd_testkit::agents::claude::{self, Transport};
use fleetd_testkit::agents::rig::AgentRig;
use fleetd_testkit::agents::turns::{answer, finished, nudges, prompt};
use fleetd_testkit::agents::{Cli, stories, versions};
use fleetd_testkit::fake_model::Logged;
use fleetd_testkit::{Service, require_tmux};

/// A rig with the newest Claude Code as lead over `via` and a member `alice` spawned idle.
fn fleet_with_alice(via: Transport, extra_env: &[(&str, &str)]) -> Option<(AgentRig, String)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let newest = versions("claude-code").into_iter().next()?;
    let cli = Cli::require("claude-code", &newest)?;
    let mut rig = AgentRig::start(&[&cli], &claude::profile("claude"), "");
    let lead = claude::start_lead_with(&mut rig, &cli, via, extra_env);
    rig.say(&lead, "@spawn claude alice");
    rig.wait("alice to be spawned", Duration::from_secs(120), || {
        finished(&rig.lead_model.turns(), |r| {
            prompt(r) == "@spawn claude alice"
        })
    });
    Some((rig, lead))
}

/// How many replies of `target` wait in the inbox.
fn pending_replies(rig: &AgentRig, target: &str) -> usize {
    fleetd_testkit::http::get(
        rig.daemon.operator(),
        &format!("/sessions/{target}/replies"),
    )
    .expect("the REST API answers")
    .json()["replies"]
        .as_array()
        .map_or(0, Vec::len)
}

/// The lead's turns a task notification started.
fn wakes(turns: &[Logged]) -> Vec<Logged> {
    turns
        .iter()
        .filter(|r| prompt(r).contains("<task-notification>") && r["steps"] == 0)
        .cloned()
        .collect()
}

/// When fleetd's log says `tool` succeeded for `caller` (its first such line), in unix ms.
fn logged_ms(rig: &mut AgentRig, tool: &str, caller: &str) -> i64 {
    rig.log()
        .iter()
        .find(|l| l["message"] == "tool call ok" && l["tool"] == tool && l["caller"] == caller)
        .and_then(|l| l["timestamp"].as_str()?.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_millisecond())
        .unwrap_or_else(|| panic!("no `{tool}` by {caller} in fleetd's log"))
}

/// The lead sent alice `task` with `fleet_send`'s default wait: a task came back at once, the
/// turn ended, and a later turn started by itself with alice's reply; the model gateway kept its
/// books (`stories::gateway_kept_its_books`).
fn woken_with(rig: &mut AgentRig, lead: &str, reply: &str) -> Logged {
    rig.wait(
        "a task notification to start the lead's next turn",
        Duration::from_secs(120),
        || {
            wakes(&rig.lead_model.turns())
                .iter()
                .any(|w| prompt(w).contains(reply))
        },
    );
    let turns = rig.lead_model.turns();
    let sent = turns
        .iter()
        .find(|r| prompt(r).starts_with("@send alice") && r["steps"] == 1)
        .expect("the lead's fleet_send step");
    assert!(
        answer(sent).starts_with("Text("),
        "the task result ended the turn: {sent}"
    );
    assert!(
        nudges(&turns).is_empty(),
        "a nudge was typed: {:#?}",
        nudges(&turns)
    );
    assert!(
        !rig.history(lead).contains("[fleet]"),
        "something of fleetd's was typed into the lead's pane"
    );
    let nudged = rig
        .log()
        .iter()
        .any(|l| l["message"] == "push decision" && l["metric"] == "Nudged");
    assert!(!nudged, "fleetd decided to nudge");
    stories::gateway_kept_its_books(rig, lead, "alice");
    wakes(&turns)
        .into_iter()
        .find(|w| prompt(w).contains(reply))
        .expect("the wake")
}

#[test]
fn e2e_claude_lead_is_woken_by_its_task_with_nothing_typed() {
    let Some((mut rig, lead)) = fleet_with_alice(Transport::Http, &[]) else {
        return;
    };
    rig.say(&lead, "@send alice @sleep 2 @reply forty-two");
    let wake = woken_with(&mut rig, &lead, "forty-two");
    // Within a poll of the reply (fleetd's `pollIntervalMs`), plus Claude Code's own turn start
    // and this machine's noise: the bench measures it closely.
    let replied = logged_ms(&mut rig, "fleet_reply", "member alice");
    let woke = wake["t"].as_i64().expect("the request's time");
    let poll = i64::try_from(fleetd::mcp::wake::TASK_POLL.as_millis()).expect("ms");
    assert!(
        woke - replied <= 2 * poll + 1000,
        "woken {} ms after the reply",
        woke - replied
    );
    // The wake's turn read the reply and acknowledged it (the result names the call): alice's
    // inbox holds nothing more.
    rig.wait(
        "the wake's turn to acknowledge",
        Duration::from_secs(60),
        || {
            finished(&rig.lead_model.turns(), |r| {
                prompt(r).contains("<task-notification>") && answer(r).contains(r#"\"acked\":true"#)
            })
        },
    );
    assert_eq!(pending_replies(&rig, "alice"), 0);
}

#[test]
fn e2e_claude_lead_over_the_stdio_shim_is_woken_by_its_task() {
    let Some((mut rig, lead)) = fleet_with_alice(Transport::Stdio, &[]) else {
        return;
    };
    rig.say(&lead, "@send alice @reply over the shim");
    woken_with(&mut rig, &lead, "over the shim");
}

/// The lead sends alice a task she answers `reply` to 10 s later; fleetd is killed with SIGKILL
/// and started again once the task is armed; the reply still wakes the lead through it.
fn task_survives_a_kill_9(via: Transport, reply: &str) {
    let Some((mut rig, lead)) = fleet_with_alice(via, &[]) else {
        return;
    };
    rig.say(&lead, &format!("@send alice @sleep 10 @reply {reply}"));
    rig.wait("the task to be armed", Duration::from_secs(60), || {
        finished(&rig.lead_model.turns(), |r| {
            prompt(r).starts_with("@send alice")
        })
    });
    rig.restart_daemon();
    woken_with(&mut rig, &lead, reply);
}

#[test]
fn e2e_claude_task_survives_a_kill_9_of_fleetd_before_the_reply() {
    task_survives_a_kill_9(Transport::Http, "after the restart");
}

#[test]
fn e2e_claude_member_question_reaches_the_lead_through_its_task_and_the_answer_goes_back() {
    let Some((mut rig, lead)) = fleet_with_alice(Transport::Http, &[]) else {
        return;
    };
    rig.say(&lead, "@send alice @ask which branch should I use?");
    // The question wakes the lead; it answers and waits on with fleet_poll{ticket, wait}.
    let question = woken_with(&mut rig, &lead, "which branch should I use?");
    assert!(
        prompt(&question).contains("fleet_answer"),
        "{}",
        prompt(&question)
    );
    // The answer reached alice, whose reply wakes the lead through the second task.
    woken_with(&mut rig, &lead, fleetd_testkit::agents::rig::ANSWER);
    let asked = rig
        .member_model
        .turns()
        .into_iter()
        .any(|r| answer(&r).contains(fleetd_testkit::agents::rig::ANSWER));
    assert!(asked, "alice's model got the answer");
}

#[test]
fn e2e_claude_task_over_the_stdio_shim_survives_a_kill_9_of_fleetd() {
    task_survives_a_kill_9(Transport::Stdio, "the shim held on");
}

#[test]
fn e2e_claude_keeps_polling_a_task_held_past_its_long_poll() {
    let Some((mut rig, lead)) = fleet_with_alice(Transport::Http, &[]) else {
        return;
    };
    // The member takes longer than a held `tasks/get` (TASK_HOLD): Claude Code hears `working`,
    // polls again, and is woken by the reply all the same.
    let hold = fleetd::mcp::wake::TASK_HOLD.as_secs();
    rig.say(
        &lead,
        &format!("@send alice @sleep {} @reply worth holding for", hold + 8),
    );
    woken_with(&mut rig, &lead, "worth holding for");
    let replied = logged_ms(&mut rig, "fleet_reply", "member alice");
    let woke = wakes(&rig.lead_model.turns())[0]["t"]
        .as_i64()
        .expect("the request's time");
    let poll = i64::try_from(fleetd::mcp::wake::TASK_POLL.as_millis()).expect("ms");
    assert!(
        woke - replied <= 2 * poll + 1000,
        "woken {} ms after the reply",
        woke - replied
    );
}

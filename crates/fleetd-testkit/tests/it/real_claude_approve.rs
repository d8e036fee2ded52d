//! The human in the loop with the real agents (issue 39, SPEC §20). Claude Code: a member whose
//! Bash command needs its user's approval blocks on its permission prompt; fleetd tells
//! `/events` (`member.blocked`, the dialog as shown and its choices) and the webhook (one
//! notice), `fleetd approve` types the choice, the member's task completes, and an approval
//! sent once the dialog is gone types nothing. Codex: a command outside its sandbox waits on its
//! approval prompt, and `fleetd approve` types that option's own key (`y`).

use std::time::Duration;

use fleetd_testkit::agents::claude::{self, Transport};
use fleetd_testkit::agents::rig::AgentRig;
use fleetd_testkit::agents::{Cli, stories};
use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::events::SseReader;
use fleetd_testkit::webhook::{Answer, Webhook};
use fleetd_testkit::{if_tmux, wait_until};

/// This machine's clock, as the events' times are stamped.
#[expect(
    clippy::disallowed_methods,
    reason = "compared with the daemon's event times, which are wall-clock stamps"
)]
fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// A Claude Code member that asks before running a shell command (Claude Code's default
/// permission mode; the fleet's own tools are allowed by `fleetd install claude`).
const ASKER: &str = "  asker:\n    agent: claude\n    backend: model\n    cwd: {work}\n    args: [\"--permission-mode\", \"default\"]\n";

/// Waits until member `name`'s window shows Claude Code's permission prompt.
fn prompt_on_screen(rig: &AgentRig, name: &str) {
    rig.wait(
        &format!("{name}'s prompt on its screen"),
        Duration::from_secs(90),
        || {
            rig.windows().iter().any(|w| w.contains(name))
                && rig
                    .screen(&format!("fleet:{name}"))
                    .contains("Do you want to proceed?")
        },
    );
}

/// `fleetd approve alice 1` for the dialog `fingerprint` names: the dialog goes, alice runs
/// her command (it writes `ran.txt`) and the lead reads her reply.
fn approve_and_finish(rig: &AgentRig, fingerprint: &str) {
    let typed = rig.fleetd(&["approve", "alice", "1", "--dialog", fingerprint]);
    assert!(
        typed.contains("the dialog went"),
        "{typed}\n---- alice's screen ----\n{}",
        rig.screen("fleet:alice")
    );
    finishes_the_approved_command(rig, "alice");
}

/// Member `member`, its dialog answered, runs its command (it writes `ran.txt`) and replies
/// `done`, which the lead reads.
fn finishes_the_approved_command(rig: &AgentRig, member: &str) {
    stories::lead_reads(rig, member, "done", Duration::from_secs(120));
    let ran = std::fs::read_to_string(rig.work.join("ran.txt")).expect("the command ran");
    assert_eq!(ran.trim(), "approved");
}

#[test]
fn e2e_claude_member_on_a_permission_prompt_is_told_answered_and_finishes() {
    let Some(cli) = if_tmux(|| Cli::newest("claude-code")) else {
        return;
    };
    let hook = Webhook::start(Answer::Ok);
    let mut rig = AgentRig::start(
        &[&cli],
        ASKER,
        &format!(
            "notify:\n  sinks:\n    - kind: webhook\n      url: {}\n",
            hook.url()
        ),
    );
    let lead = claude::start_lead(&mut rig, &cli, Transport::Http);
    let mut events =
        SseReader::unix(&state_dir(rig.home()).join("api.sock"), None).expect("the event stream");
    rig.say(
        &lead,
        "@spawn asker alice @bash echo approved > ran.txt @reply done",
    );

    // It blocks, and /events carries the dialog as shown, with its choices, within a second of
    // the prompt being on its screen (Claude Code says "Waiting for permission…", which reads
    // as blocked, a moment before it draws the prompt: under load, more than a second).
    prompt_on_screen(&rig, "alice");
    let drawn = now();
    let seen = events.until("alice's member.blocked", |e| {
        e.event == "member.blocked" && e.data["target"] == "alice"
    });
    let at = |e: &fleetd_testkit::http::events::SseEvent| {
        e.data["at"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .expect("an event time")
    };
    let status = seen
        .iter()
        .find(|e| {
            e.event == "member.status"
                && e.data["target"] == "alice"
                && e.data["status"] == "blocked"
        })
        .expect("alice's status turned blocked first");
    let blocked = seen.last().expect("the match");
    assert!(at(blocked) >= at(status), "told after the status turned");
    let late = at(blocked).duration_since(drawn);
    assert!(
        late <= jiff::SignedDuration::from_secs(1),
        "member.blocked came {late:?} after the prompt was on screen"
    );
    let dialog = &blocked.data;
    assert_eq!(dialog["question"], "Do you want to proceed?", "{dialog}");
    assert_eq!(dialog["choices"][0]["key"], "1", "{dialog}");
    assert_eq!(dialog["choices"][0]["label"], "Yes", "{dialog}");
    let lines = dialog["lines"].to_string();
    assert!(
        lines.contains("echo approved > ran.txt"),
        "the command asked about: {dialog}"
    );
    let fingerprint = dialog["dialog"].as_str().expect("a fingerprint").to_owned();

    // The webhook hears of it once: who and what, a link, no task text.
    wait_until("the webhook's notice", Duration::from_secs(10), || {
        !hook.received().is_empty()
    });
    let notice = &hook.received()[0].body;
    assert_eq!(notice["type"], "member.blocked", "{notice}");
    assert_eq!(notice["target"], "alice", "{notice}");
    assert!(
        notice["link"]
            .as_str()
            .is_some_and(|l| l.ends_with("/#member=alice")),
        "{notice}"
    );
    assert!(
        !notice.to_string().contains("@reply"),
        "a task's text in a notice: {notice}"
    );

    // `fleetd approve` types the choice; the member runs its command and finishes its task.
    approve_and_finish(&rig, &fingerprint);
    events.until("alice's member.unblocked", |e| {
        e.event == "member.unblocked" && e.data["target"] == "alice"
    });

    // Once the dialog is gone an approval types nothing, and says why.
    let before = rig.screen("fleet:alice");
    let again = rig.fleetd_output(&["approve", "alice", "1"]);
    assert!(!again.status.success(), "{again:?}");
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains("not_blocked") && said.contains("nothing typed"),
        "{said}"
    );
    fleetd_testkit::agents::rig::pause(Duration::from_millis(500));
    assert_eq!(
        rig.screen("fleet:alice"),
        before,
        "nothing was typed into alice's pane"
    );
    assert_eq!(hook.received().len(), 1, "one notice for the episode");
}

#[test]
fn e2e_codex_member_on_its_approval_prompt_is_answered_by_its_own_key() {
    let Some(cli) = if_tmux(|| Cli::newest("codex")) else {
        return;
    };
    let mut rig = AgentRig::start(
        &[&cli],
        &fleetd_testkit::agents::codex::profile("codex"),
        "",
    );
    let lead = fleetd_testkit::agents::codex::start_lead(&mut rig, false);
    // Codex asks before running a command outside its sandbox (its default on-request policy).
    rig.say(
        &lead,
        "@spawn codex bob @exec echo approved > ran.txt @reply done",
    );
    let mut episode = serde_json::Value::Null;
    rig.wait("bob's approval prompt", Duration::from_secs(90), || {
        let out = rig.fleetd_output(&["approve", "bob", "--json"]);
        episode = serde_json::from_slice(&out.stdout).unwrap_or_default();
        episode["choices"].as_array().is_some_and(|c| c.len() == 3)
    });
    assert_eq!(
        episode["question"], "Would you like to run the following command?",
        "{episode}"
    );
    assert_eq!(
        episode["choices"][0]["label"], "Yes, proceed (y)",
        "{episode}"
    );
    let typed = rig.fleetd(&["approve", "bob", "1", "--json"]);
    let typed: serde_json::Value = serde_json::from_str(typed.trim()).expect("JSON");
    assert_eq!(typed["keys"], "y", "Codex's own key for it: {typed}");
    assert_eq!(typed["outcome"], "answered", "{typed}");
    finishes_the_approved_command(&rig, "bob");
}

#[test]
fn e2e_claude_older_release_on_its_permission_prompt_is_answered_too() {
    // The older pinned release (MCP 2025-11-25), as a user who has not updated runs it.
    let Some(cli) = if_tmux(|| Cli::pinned("claude-code", 1)) else {
        return;
    };
    let mut rig = AgentRig::start(&[&cli], ASKER, "");
    let lead = claude::start_lead(&mut rig, &cli, Transport::Http);
    rig.say(
        &lead,
        "@spawn asker alice @bash echo approved > ran.txt @reply done",
    );
    prompt_on_screen(&rig, "alice");
    // fleetd reads the older prompt as the newer: the question, the command, its choices.
    let operator = fleetd_testkit::http::Endpoint::Unix(state_dir(rig.home()).join("api.sock"));
    let mut dialog = serde_json::Value::Null;
    wait_until("alice listed as blocked", Duration::from_secs(10), || {
        let listed = fleetd_testkit::http::get(&operator, "/blocked").expect("GET /blocked");
        dialog = listed.json()["blocked"]
            .as_array()
            .and_then(|b| b.iter().find(|d| d["target"] == "alice").cloned())
            .unwrap_or_default();
        !dialog.is_null()
    });
    assert_eq!(dialog["question"], "Do you want to proceed?", "{dialog}");
    assert_eq!(dialog["choices"][0]["key"], "1", "{dialog}");
    assert_eq!(dialog["choices"][0]["label"], "Yes", "{dialog}");
    assert!(
        dialog["lines"]
            .to_string()
            .contains("echo approved > ran.txt"),
        "{dialog}"
    );
    let fingerprint = dialog["dialog"].as_str().expect("a fingerprint").to_owned();
    approve_and_finish(&rig, &fingerprint);
}

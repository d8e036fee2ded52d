//! The real Codex CLI (from npm, `agents/pins`) as lead and member on tmux, against the scripted
//! model (`fake_model`), set up as the README tells a user to.

use std::time::Duration;

use fleetd_testkit::agents::rig::{AgentRig, MEMBER_TOKEN};
use fleetd_testkit::agents::turns::{answer, nudges, offers, prompt, read_on_nudge};
use fleetd_testkit::agents::{Cli, claude, codex};
use fleetd_testkit::fake_model::Logged;
use fleetd_testkit::{Service, require_tmux};

/// Every file under `dir` that holds `secret`.
fn files_holding(dir: &std::path::Path, secret: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if std::fs::read(&path)
                .is_ok_and(|b| b.windows(secret.len()).any(|w| w == secret.as_bytes()))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[test]
fn e2e_codex_lead_delegates_to_a_codex_member_and_reads_the_reply_on_its_first_nudge() {
    if require_tmux() == Service::Skip {
        return;
    }
    let Some(cli) = Cli::newest("codex") else {
        return;
    };
    let mut rig = AgentRig::start(&[&cli], &codex::profile("codex"), "");
    let lead = codex::start_lead(&mut rig, false);
    rig.say(&lead, "@spawn codex alice @reply forty-two");
    rig.wait(
        "the lead to poll and ack alice's reply",
        Duration::from_secs(120),
        || read_on_nudge(&rig.lead_model.turns(), "forty-two"),
    );
    let lead_turns = rig.lead_model.turns();
    assert!(
        answer(lead_turns.last().expect("turns")).contains(r#"\"acked\":true"#),
        "the lead acknowledged what it read"
    );
    // The task was typed once the member's Codex had fleetd's tools, and started on its first
    // Enter; the lead's nudge likewise (one turn, one copy).
    rig.assert_task_typed_after_tools("alice");
    let member = rig.member_model.turns();
    let starts: Vec<&Logged> = member
        .iter()
        .filter(|r| prompt(r) == "@reply forty-two" && r["steps"] == 0)
        .collect();
    assert_eq!(starts.len(), 1, "the task started one turn: {member:#?}");
    assert!(offers(starts[0], "fleet_reply"), "{}", starts[0]);
    let nudges = nudges(&lead_turns);
    assert_eq!(nudges.len(), 1, "{nudges:#?}");
    assert_eq!(prompt(&nudges[0]).matches("[fleet]").count(), 1);
    // The member used the members' backend through fleetd's provider entry, and its key is in
    // no file under Codex's home (no shell snapshot), nor anywhere on the lead's side.
    rig.assert_member_token_only_with_members(&lead);
    let leaked = files_holding(&rig.home().join(".codex"), MEMBER_TOKEN);
    assert!(leaked.is_empty(), "the token is on disk in {leaked:?}");

    rig.say(&lead, r#"@call fleet_stop {"target":"alice"}"#);
    rig.wait("alice to be released", Duration::from_secs(60), || {
        rig.member("alice").is_none()
    });
}

#[test]
fn e2e_codex_member_under_a_claude_lead_over_the_stdio_shim() {
    if require_tmux() == Service::Skip {
        return;
    }
    let (Some(codex_cli), Some(claude_cli)) = (Cli::newest("codex"), Cli::newest("claude-code"))
    else {
        return;
    };
    let mut rig = AgentRig::start(&[&codex_cli, &claude_cli], &codex::profile("codex"), "");
    let lead = claude::start_lead(&mut rig, &claude_cli, claude::Transport::Stdio);
    rig.say(&lead, "@spawn codex bob @reply from codex");
    rig.wait(
        "the lead to poll and ack bob's reply",
        Duration::from_secs(120),
        || read_on_nudge(&rig.lead_model.turns(), "from codex"),
    );
    rig.assert_task_typed_after_tools("bob");
    rig.assert_member_token_only_with_members(&lead);
}

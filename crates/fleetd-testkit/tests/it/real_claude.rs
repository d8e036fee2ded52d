//! The real Claude Code CLI (from npm, `agents/pins`) as lead and member on tmux, against the
//! scripted model (`fake_model`), set up as the README tells a user to. Each test is a
//! transcript: what the user types into the lead, and what then reached each model.

use std::time::Duration;

use fleetd_testkit::agents::claude::{self, Transport};
use fleetd_testkit::agents::rig::AgentRig;
use fleetd_testkit::agents::turns::{answer, finished, nudges, offers, one_nudge, prompt};
use fleetd_testkit::agents::{Cli, stories, versions};
use fleetd_testkit::{Service, if_tmux, require_tmux};

/// A rig for Claude Code of `version` (newest when `None`) with a `claude` profile, and that
/// CLI; no lead yet.
fn claude_rig(version: Option<&str>) -> Option<(AgentRig, Cli)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let newest = versions("claude-code").into_iter().next()?;
    let cli = Cli::require("claude-code", version.unwrap_or(&newest))?;
    let boxed = "  boxed:\n    agent: claude\n    backend: model\n    cwd: {work}/../boxed-work\n    sandbox:\n      homeFrom: {work}/../boxed-home\n";
    let rig = AgentRig::start(
        &[&cli],
        &format!("{}{boxed}", claude::profile("claude")),
        "",
    );
    Some((rig, cli))
}

/// A rig with a Claude Code lead of `version` (newest when `None`) and a `claude` profile.
fn claude_fleet(version: Option<&str>, via: Transport) -> Option<(AgentRig, String)> {
    let (mut rig, cli) = claude_rig(version)?;
    let lead = claude::start_lead(&mut rig, &cli, via);
    Some((rig, lead))
}

#[test]
fn e2e_claude_lead_delegates_reads_the_reply_on_its_first_nudge_and_stops_the_member() {
    let Some((mut rig, lead)) = claude_fleet(None, Transport::Http) else {
        return;
    };
    rig.say(&lead, "@spawn claude alice @reply forty-two");
    let lead_turns =
        stories::lead_reads_and_acks(&rig, "alice", "forty-two", Duration::from_secs(90));
    // Fix 2: the task was typed only once the member's agent had the tools, and its first turn
    // offered them, so its model could reply.
    rig.assert_task_typed_after_tools("alice");
    let member_first = rig.member_model.turns().into_iter().next().expect("a turn");
    assert_eq!(
        prompt(&member_first),
        "@reply forty-two",
        "the task as typed"
    );
    assert!(
        offers(&member_first, "mcp__fleet__fleet_reply"),
        "the member's first turn had no fleet tools: {:?}",
        member_first["tools"]
    );
    // Fix 1: one nudge, submitted by its first Enter: one turn, one copy of the text.
    one_nudge(&lead_turns);
    rig.assert_member_token_only_with_members(&lead);
    rig.assert_usage_is_what_was_served("alice");
    stories::lead_stops(&rig, &lead, "alice");
    rig.assert_usage_outlives("alice", "claude");
}

#[test]
fn e2e_claude_member_question_is_answered_by_the_lead() {
    let Some((rig, lead)) = claude_fleet(None, Transport::Http) else {
        return;
    };
    stories::member_question_is_answered(&rig, &lead, "claude", "bob");
}

#[test]
fn e2e_claude_lead_is_never_typed_to_mid_turn() {
    let Some((rig, lead)) = claude_fleet(None, Transport::Http) else {
        return;
    };
    stories::reply_waits_for_the_busy_lead(&rig, &lead, "claude", "carol");
}

#[test]
fn e2e_claude_with_tasks_off_fleet_send_waits_past_a_minute() {
    let Some((mut rig, cli)) = claude_rig(None) else {
        return;
    };
    // Without MCP tasks (an older client, or turned off) the wait is a plain call.
    let lead = claude::start_lead_with(
        &mut rig,
        &cli,
        Transport::Http,
        &[("CLAUDE_CODE_DISABLE_MCP_TASKS", "1")],
    );
    rig.say(&lead, "@spawn claude dave");
    rig.wait("the spawn turn to end", Duration::from_secs(90), || {
        finished(&rig.lead_model.turns(), |r| answer(r).contains("dave"))
    });
    // Claude Code gives up on a call that sends nothing for 60 s; fleet_send waits 120 s.
    let done = stories::turn(
        &rig,
        &lead,
        "@send dave @sleep 70 @reply worth the wait",
        Duration::from_secs(150),
    );
    assert!(
        answer(&done).contains("worth the wait") && answer(&done).contains("replied"),
        "fleet_send returned the reply, not a timeout: {}",
        answer(&done)
    );
    stories::gateway_kept_its_books(&rig, &lead, "dave");
}

#[test]
fn e2e_claude_older_release_over_the_stdio_shim() {
    let older = versions("claude-code")
        .into_iter()
        .nth(1)
        .expect("an older pin");
    let Some((mut rig, lead)) = claude_fleet(Some(&older), Transport::Stdio) else {
        return;
    };
    let member_first = stories::member_replies(
        &mut rig,
        &lead,
        ["claude", "erin"],
        "over stdio",
        Duration::from_secs(90),
    );
    assert!(
        offers(&member_first, "mcp__fleet__fleet_reply"),
        "{member_first}"
    );
    assert_eq!(nudges(&rig.lead_model.turns()).len(), 1);
    stories::gateway_kept_its_books(&rig, &lead, "erin");
}

#[test]
fn e2e_claude_lead_started_without_exec_behind_a_shell() {
    let Some((mut rig, cli)) = claude_rig(None) else {
        return;
    };
    // A wrapper that does not `exec` the agent: tmux reports the shell in front of it.
    let lead = claude::start_lead_as(
        &mut rig,
        &cli,
        Transport::Http,
        &["sh", "-c", "claude; echo the lead exited"],
    );
    let command = rig
        .panes
        .tmux()
        .run(&[
            "display-message",
            "-p",
            "-t",
            &lead,
            "#{pane_current_command}",
        ])
        .expect("tmux");
    assert_eq!(String::from_utf8_lossy(&command.stdout).trim(), "sh");
    // fleetd still sees Claude Code at rest (its title names it), so the reply is nudged.
    rig.say(&lead, "@spawn claude fay @reply behind a shell");
    stories::lead_reads(&rig, "fay", "behind a shell", Duration::from_secs(90));
    let nudges = nudges(&rig.lead_model.turns());
    assert_eq!(nudges.len(), 1, "{nudges:#?}");
    stories::gateway_kept_its_books(&rig, &lead, "fay");
}

#[test]
fn e2e_claude_member_in_a_sandbox_works_end_to_end() {
    let Some((mut rig, cli)) = claude_rig(None) else {
        return;
    };
    if std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "a sandboxed member needs bubblewrap: apt-get install bubblewrap (.ci/run does)"
        );
        return;
    }
    // The member's home is a template the user made once, as they would: Claude Code set up
    // for fleetd (`fleetd install claude` with HOME there) and its working directory trusted.
    let template = rig.home().join("boxed-home");
    let workdir = rig.home().join("boxed-work");
    std::fs::create_dir_all(&template).expect("template");
    std::fs::create_dir_all(&workdir).expect("workdir");
    let home = template.display().to_string();
    rig.fleetd_with(
        &[("HOME", &home)],
        &["install", "claude", "--scope", "user"],
    );
    claude::seed_home(&template, &cli.version, "unused-key", &[workdir.as_path()]);
    let lead = claude::start_lead(&mut rig, &cli, Transport::Http);
    rig.say(&lead, "@spawn boxed bob @reply from inside the box");
    stories::lead_reads_and_acks(&rig, "bob", "from inside the box", Duration::from_secs(120));
    // Its agent ran under bubblewrap, and its model calls went through fleetd from in there.
    let envs = rig.environments("fleet:bob");
    assert!(
        envs.iter().any(|e| e.contains("FLEETD_SHIM_SOCKET=")),
        "bob's agent runs in a box: {envs:?}"
    );
    rig.assert_usage_is_what_was_served("bob");
    stories::lead_stops(&rig, &lead, "bob");
}

#[test]
fn e2e_claude_member_as_a_second_user_works_end_to_end() {
    let Some(cli) = if_tmux(|| Cli::newest("claude-code")) else {
        return;
    };
    let Some(fleetd::sandbox::user::User { uid, gid, .. }) = crate::run_as::agent_user() else {
        return;
    };
    // What the user sets up once for the member's user, where that user can reach it: Claude
    // Code's install (here a copy of the cache's, by hard links), a home with Claude Code set up
    // for fleetd (`fleetd install claude --scope user` as that user) and a directory to work in.
    let apart = tempfile::tempdir().expect("tempdir");
    let root = apart.path();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let install = cli
        .bin
        .ancestors()
        .find(|a| a.join("node_modules").is_dir())
        .expect("the CLI's install")
        .to_owned();
    let copy = root.join("claude-code");
    fleetd_testkit::run_ok(
        std::process::Command::new("cp")
            .arg("-al")
            .arg(&install)
            .arg(&copy),
        "a copy of Claude Code's install",
    );
    let (home, work) = (root.join("home"), root.join("work"));
    std::fs::create_dir(&home).expect("home");
    std::fs::create_dir(&work).expect("work");
    let bin = copy.join("node_modules/.bin");
    let profile = format!(
        "  apart:\n    agent: claude\n    backend: model\n    runAs: fleetd-agent\n    cwd: {}\n    env:\n      HOME: {}\n      PATH: {}:/usr/bin:/bin\n",
        work.display(),
        home.display(),
        bin.display()
    );
    let mut rig = AgentRig::start(&[&cli], &profile, "");
    let home_text = home.display().to_string();
    rig.fleetd_with(
        &[("HOME", &home_text)],
        &["install", "claude", "--scope", "user"],
    );
    claude::seed_home(&home, &cli.version, "unused-key", &[work.as_path()]);
    fleetd_testkit::run_ok(
        std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(&home)
            .arg(&work),
        "give the member's user its home and directory",
    );
    let lead = claude::start_lead(&mut rig, &cli, Transport::Http);
    rig.say(&lead, "@spawn apart bob @reply as a user of its own");
    stories::lead_reads_and_acks(
        &rig,
        "bob",
        "as a user of its own",
        Duration::from_secs(120),
    );
    // Its agent ran as that user, and its model calls went through fleetd, counted on it.
    let processes = rig.processes("fleet:bob");
    assert!(
        processes
            .iter()
            .any(|(u, cmd)| *u == uid && cmd.contains("claude")),
        "bob's Claude Code runs as fleetd-agent: {processes:?}"
    );
    rig.assert_usage_is_what_was_served("bob");
    stories::lead_stops(&rig, &lead, "bob");
}

//! The real Codex CLI (from npm, `agents/pins`) as lead and member on tmux, against the scripted
//! model (`fake_model`), set up as the README tells a user to.

use std::time::Duration;

use fleetd_testkit::agents::gateway::KEY_PREFIX;
use fleetd_testkit::agents::rig::{AgentRig, MEMBER_TOKEN, pause};
use fleetd_testkit::agents::turns::{answer, nudges, offers, one_nudge, prompt};
use fleetd_testkit::agents::{Cli, claude, codex, stories};
use fleetd_testkit::fake_model::Logged;
use fleetd_testkit::{Service, if_tmux, require_tmux};

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

/// `screen` with Codex's blinking bullet in front of a call under way (`•`, then `◦`, about once
/// a second, whichever model backend it uses) held still: what is left changes only when
/// something is typed or shown.
fn still(screen: &str) -> String {
    screen.replace('◦', "•")
}

/// A rig with the newest Codex as the lead (over HTTP) and a `codex` profile.
fn codex_fleet() -> Option<(AgentRig, String)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let cli = Cli::newest("codex")?;
    let mut rig = AgentRig::start(&[&cli], &codex::profile("codex"), "");
    let lead = codex::start_lead(&mut rig, false);
    Some((rig, lead))
}

/// A rig with the newest Claude Code as the lead (over `via`), the newest Codex for members and
/// `profiles` for them.
fn claude_led(profiles: &str, via: claude::Transport) -> Option<(AgentRig, String)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let (Some(codex_cli), Some(claude_cli)) = (Cli::newest("codex"), Cli::newest("claude-code"))
    else {
        return None;
    };
    let mut rig = AgentRig::start(&[&codex_cli, &claude_cli], profiles, "");
    let lead = claude::start_lead(&mut rig, &claude_cli, via);
    Some((rig, lead))
}

/// [`stories::member_replies`] by a Codex member: its first turn had `fleet_reply`, and it
/// replied with it.
fn codex_member_replies(rig: &mut AgentRig, lead: &str, [profile, member]: [&str; 2], text: &str) {
    let first =
        stories::member_replies(rig, lead, [profile, member], text, Duration::from_secs(120));
    assert!(
        offers(&first, "fleet_reply") && answer(&first).contains("fleet_reply"),
        "{member} replied with fleet_reply: {first}"
    );
}

#[test]
fn e2e_codex_lead_delegates_to_a_codex_member_and_reads_the_reply_on_its_first_nudge() {
    let Some((mut rig, lead)) = codex_fleet() else {
        return;
    };
    rig.say(&lead, "@spawn codex alice @reply forty-two");
    let lead_turns =
        stories::lead_reads_and_acks(&rig, "alice", "forty-two", Duration::from_secs(120));
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
    one_nudge(&lead_turns);
    // The member used the members' backend through fleetd's provider entry with its own model
    // key, which is in no file under Codex's home (no shell snapshot), nor anywhere on the
    // lead's side; the backend's token is in none of them either. fleetd counted what it spent.
    rig.assert_member_token_only_with_members(&lead);
    rig.assert_usage_is_what_was_served("alice");
    assert_eq!(
        rig.codex_daemons(),
        Vec::<u32>::new(),
        "a plain `codex` after `fleetd install codex` runs no shared daemon"
    );
    for secret in [MEMBER_TOKEN, KEY_PREFIX] {
        let leaked = files_holding(&rig.home().join(".codex"), secret);
        assert!(leaked.is_empty(), "{secret} is on disk in {leaked:?}");
    }

    rig.say(&lead, r#"@call fleet_stop {"target":"alice"}"#);
    rig.wait("alice to be released", Duration::from_secs(60), || {
        rig.member("alice").is_none()
    });
    rig.assert_usage_outlives("alice", "codex");
}

#[test]
fn e2e_codex_member_under_a_claude_lead_over_the_stdio_shim() {
    let Some((mut rig, lead)) = claude_led(&codex::profile("codex"), claude::Transport::Stdio)
    else {
        return;
    };
    codex_member_replies(&mut rig, &lead, ["codex", "bob"], "from codex");
    stories::gateway_kept_its_books(&rig, &lead, "bob");
}

#[test]
fn e2e_codex_member_at_its_approval_dialog_is_blocked_and_never_typed_into() {
    // A profile that leaves Codex asking before each of fleetd's tools (its own default).
    let asking = format!(
        "{}    args: [\"-c\", \"mcp_servers.fleet.default_tools_approval_mode=\\\"auto\\\"\"]\n",
        codex::profile("asking")
    );
    let Some((rig, lead)) = claude_led(&asking, claude::Transport::Http) else {
        return;
    };
    rig.say(&lead, "@spawn asking frank @reply approved");
    rig.wait(
        "frank to be blocked on its approval dialog",
        Duration::from_secs(120),
        || {
            rig.member("frank")
                .is_some_and(|m| m["status"] == "blocked")
        },
    );
    // fleetd's pane id is `<tmux session>:<tmux pane id>`.
    let pane = rig.member("frank").expect("frank")["paneId"]
        .as_str()
        .and_then(|p| p.rsplit(':').next())
        .expect("a pane")
        .to_owned();
    let dialog = still(&rig.screen(&pane));
    assert!(dialog.contains("to run tool \"fleet_reply\""), "{dialog}");

    // A second task for frank waits: nothing is typed into the dialog.
    stories::turn(
        &rig,
        &lead,
        "@send-nowait frank @reply second",
        Duration::from_secs(60),
    );
    pause(Duration::from_secs(8));
    assert_eq!(still(&rig.screen(&pane)), dialog, "the dialog changed");
    assert_eq!(rig.member("frank").expect("frank")["status"], "blocked");

    // The person answers it; the reply goes through, then the waiting task is typed.
    rig.panes
        .tmux()
        .run_ok(&["send-keys", "-t", &pane, "Enter"]);
    stories::lead_reads(&rig, "frank", "approved", Duration::from_secs(60));
    rig.wait("the second task to start", Duration::from_secs(60), || {
        rig.member_model
            .turns()
            .iter()
            .any(|r| prompt(r) == "@reply second")
    });
    stories::gateway_kept_its_books(&rig, &lead, "frank");
}

#[test]
fn e2e_a_codex_in_its_shared_daemon_is_refused_by_name_and_members_keep_their_identity() {
    let Some((mut rig, lead)) = claude_led(&codex::profile("codex"), claude::Transport::Http)
    else {
        return;
    };
    // The user's own Codex with its daemon on, as Codex ships: `fleetd install codex` turns the
    // automatic start off, and this user turned it back on. Its threads, and their calls to
    // fleetd, run in `codex app-server`.
    codex::install(&rig, false);
    let config = rig.home().join(".codex/config.toml");
    let text = std::fs::read_to_string(&config).expect("config.toml");
    assert!(text.contains("daemon_auto_start = false"), "{text}");
    std::fs::write(&config, text.replace("daemon_auto_start = false", "")).expect("write");
    let solo = codex::open(&rig, "solo", &[]);
    rig.wait("Codex's daemon to start", Duration::from_secs(30), || {
        !rig.codex_daemons().is_empty()
    });

    // A Codex member spawned beside it still calls from its own pane.
    rig.say(&lead, "@spawn codex gina @reply kept apart");
    stories::lead_reads(&rig, "gina", "kept apart", Duration::from_secs(120));
    let first = rig.member_model.turns().into_iter().next().expect("a turn");
    assert!(
        answer(&first).contains("fleet_reply"),
        "gina replied with fleet_reply: {first}"
    );

    // The daemon's Codex is told why it is refused, and what to do.
    let refused = stories::turn(
        &rig,
        &solo,
        r#"@call fleet_poll {"target":"gina"}"#,
        Duration::from_secs(60),
    );
    assert!(
        answer(&refused).contains("shared_daemon") && answer(&refused).contains("--no-daemon"),
        "{}",
        answer(&refused)
    );
    let daemon = rig.codex_daemons();
    assert!(
        rig.log().iter().any(|l| l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("shared app-server daemon"))
            && daemon.iter().any(|d| l["daemon"] == *d)),
        "fleetd's log names the daemon {daemon:?}"
    );
    stories::gateway_kept_its_books(&rig, &lead, "gina");
}

/// A Codex member a user set up by hand to speak to fleetd over the stdio shim: the profile runs
/// a script (so fleetd adds nothing to its command line), which starts Codex with fleetd's
/// backend as its provider and `fleetd mcp` as its fleet server.
const STDIO_MEMBER: &str = r#"exec codex --no-daemon -c model='"gpt-5"' -c model_provider='"fleet"' \
  -c model_providers.fleet.name='"fleetd backend"' \
  -c model_providers.fleet.base_url="\"$OPENAI_BASE_URL\"" \
  -c model_providers.fleet.env_key='"OPENAI_API_KEY"' -c model_providers.fleet.wire_api='"responses"' \
  -c mcp_servers.fleet.command='"fleetd"' -c 'mcp_servers.fleet.args=["mcp"]' \
  -c mcp_servers.fleet.default_tools_approval_mode='"approve"' -c mcp_servers.fleet.tool_timeout_sec=3700 \
  -c features.shell_snapshot=false -c check_for_update_on_startup=false \
  -c "projects={\"$PWD\"={trust_level=\"trusted\"}}"
"#;

#[test]
fn e2e_codex_lead_and_member_over_the_stdio_shim() {
    let Some(cli) = if_tmux(|| Cli::newest("codex")) else {
        return;
    };
    let profile = "  codex-stdio:\n    agent: codex\n    backend: model\n    command: /bin/sh\n    args: [\"{work}/codex-stdio.sh\"]\n    cwd: {work}\n";
    let mut rig = AgentRig::start(&[&cli], profile, "");
    std::fs::write(rig.work.join("codex-stdio.sh"), STDIO_MEMBER).expect("script");
    let lead = codex::start_lead(&mut rig, true);
    codex_member_replies(&mut rig, &lead, ["codex-stdio", "hal"], "over the shim");
    assert_eq!(nudges(&rig.lead_model.turns()).len(), 1);
    stories::gateway_kept_its_books(&rig, &lead, "hal");
    assert!(rig.codex_daemons().is_empty());
}

#[test]
fn e2e_codex_member_question_is_answered_by_a_codex_lead() {
    let Some((rig, lead)) = codex_fleet() else {
        return;
    };
    stories::member_question_is_answered(&rig, &lead, "codex", "ivy");
}

#[test]
fn e2e_codex_lead_is_never_typed_to_mid_turn() {
    let Some((rig, lead)) = codex_fleet() else {
        return;
    };
    stories::reply_waits_for_the_busy_lead(&rig, &lead, "codex", "jo");
}

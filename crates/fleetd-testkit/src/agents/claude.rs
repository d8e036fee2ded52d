//! Claude Code as a user's machine has it after a first interactive run: `~/.claude.json` with
//! onboarding done, the lead's API key approved (its last 20 characters, as Claude Code stores
//! it) and the working directories trusted. Everything fleetd adds (its MCP server, the fleet
//! charter, its tools allowed) comes from `fleetd install claude`, not from here.

use std::path::Path;

use serde_json::{Value, json};

/// The environment a headless Claude Code runs with in the tests: no update checks or other
/// traffic beyond the model, and MCP tools in each request's `tools` (tool search would defer
/// them behind a `ToolSearch` call the scripted model does not make).
pub const ENV: &[(&str, &str)] = &[
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("ENABLE_TOOL_SEARCH", "false"),
];

/// Writes (or merges into) `<home>/.claude.json`: onboarding done for `version`, `api_key`
/// approved, each of `trusted` trusted.
pub fn seed_home(home: &Path, version: &str, api_key: &str, trusted: &[&Path]) {
    let path = home.join(".claude.json");
    let mut root: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    let tail: String = api_key
        .chars()
        .rev()
        .take(20)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    root["hasCompletedOnboarding"] = json!(true);
    root["lastOnboardingVersion"] = json!(version);
    root["theme"] = json!("dark");
    root["customApiKeyResponses"] = json!({ "approved": [tail], "rejected": [] });
    for dir in trusted {
        root["projects"][dir.display().to_string()] = json!({
            "hasTrustDialogAccepted": true,
            "hasCompletedProjectOnboarding": true,
        });
    }
    std::fs::write(&path, serde_json::to_string_pretty(&root).expect("JSON"))
        .expect("write ~/.claude.json");
}

/// Whether `screen` shows Claude Code ready for input.
pub fn ready(screen: &str) -> bool {
    screen.contains("❯\u{a0}") || screen.lines().any(|l| l.trim_end() == "❯")
}

/// How a Claude Code lead reaches fleetd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `fleetd install claude --scope user`: the HTTP endpoint.
    Http,
    /// `fleetd install claude --scope user --stdio`: the stdio shim.
    Stdio,
}

/// A profile `name` running Claude Code as a member in the lead's working directory, on the
/// rig's members' backend.
pub fn profile(name: &str) -> String {
    format!("  {name}:\n    agent: claude\n    backend: model\n    cwd: {{work}}\n")
}

/// Starts a Claude Code lead as the README tells a user to: `fleetd install claude --scope user`
/// (with `--stdio` for the shim), then `claude` in a tmux window of the user's, with the user's
/// own model key. Returns its tmux target once it shows its input box and has listed fleetd's
/// tools (typing earlier would start a turn without them, as for a member).
pub fn start_lead(rig: &mut super::rig::AgentRig, cli: &super::Cli, via: Transport) -> String {
    start_lead_as(rig, cli, via, &["claude"])
}

/// [`start_lead`] with `env` added to the lead's (`CLAUDE_CODE_DISABLE_MCP_TASKS=1`, …).
pub fn start_lead_with(
    rig: &mut super::rig::AgentRig,
    cli: &super::Cli,
    via: Transport,
    env: &[(&str, &str)],
) -> String {
    launch(rig, cli, via, &["claude"], env)
}

/// [`start_lead`] with the window running `argv` (which starts `claude` somehow).
pub fn start_lead_as(
    rig: &mut super::rig::AgentRig,
    cli: &super::Cli,
    via: Transport,
    argv: &[&str],
) -> String {
    launch(rig, cli, via, argv, &[])
}

fn launch(
    rig: &mut super::rig::AgentRig,
    cli: &super::Cli,
    via: Transport,
    argv: &[&str],
    extra: &[(&str, &str)],
) -> String {
    seed_home(
        rig.home(),
        &cli.version,
        super::rig::LEAD_KEY,
        &[rig.work.as_path()],
    );
    let mut install = vec!["install", "claude", "--scope", "user"];
    if via == Transport::Stdio {
        install.push("--stdio");
    }
    rig.fleetd(&install);
    let url = rig.lead_model.url();
    let mut env = vec![
        ("ANTHROPIC_BASE_URL", url.as_str()),
        ("ANTHROPIC_API_KEY", super::rig::LEAD_KEY),
    ];
    env.extend_from_slice(extra);
    let lead = rig.open("lead", &env, argv);
    rig.wait_screen(
        &lead,
        "the lead's input box",
        std::time::Duration::from_secs(60),
        ready,
    );
    rig.wait_lead_tools();
    lead
}

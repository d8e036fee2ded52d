//! Codex as a user's machine has it before fleetd: a `config.toml` naming the user's own model
//! provider (the lead's backend stand-in), which Codex reads its key for from `OPENAI_API_KEY`.
//! Everything fleetd adds (its MCP server, approvals, trust, the charter) comes from
//! `fleetd install codex`; what a member needs, fleetd passes on its command line.

use std::path::Path;

/// Writes `<home>/.codex/config.toml`: the user's own provider at `base_url`.
pub fn seed_home(home: &Path, base_url: &str) {
    let dir = home.join(".codex");
    std::fs::create_dir_all(&dir).expect("~/.codex");
    let config = format!(
        "model = \"gpt-5\"\nmodel_provider = \"mine\"\ncheck_for_update_on_startup = false\n\n[model_providers.mine]\nname = \"my backend\"\nbase_url = \"{base_url}/v1\"\nenv_key = \"OPENAI_API_KEY\"\nwire_api = \"responses\"\n"
    );
    std::fs::write(dir.join("config.toml"), config).expect("config.toml");
}

/// A profile `name` running Codex as a member in the lead's working directory, on the rig's
/// members' backend, with a model named (Codex 0.171's own default, `gpt-6.2-sol`, sends its
/// turns without any tools).
pub fn profile(name: &str) -> String {
    format!(
        "  {name}:\n    agent: codex\n    backend: model\n    model: gpt-5\n    cwd: {{work}}\n"
    )
}

/// Whether `screen` shows Codex's composer ready for input.
pub fn ready(screen: &str) -> bool {
    screen.lines().any(|l| l.trim_start().starts_with('›')) && !screen.contains("Working (")
}

/// Starts a Codex lead as the README tells a user to (`fleetd install codex`, then `codex` in a
/// tmux window with the user's own key); returns its tmux target once it shows its composer and
/// has listed fleetd's tools.
pub fn start_lead(rig: &mut super::rig::AgentRig, stdio: bool) -> String {
    install(rig, stdio);
    let lead = open(rig, "lead", &[]);
    rig.wait_lead_tools();
    lead
}

/// The user's Codex configuration (`seed_home`), then `fleetd install codex` (`--stdio` for the
/// shim).
pub fn install(rig: &super::rig::AgentRig, stdio: bool) {
    seed_home(rig.home(), &rig.lead_model.url());
    let mut install = vec!["install", "codex"];
    if stdio {
        install.push("--stdio");
    }
    rig.fleetd(&install);
}

/// Opens window `name` running `codex ARGS` with the user's own key; returns its tmux target
/// once it shows its composer.
pub fn open(rig: &super::rig::AgentRig, name: &str, args: &[&str]) -> String {
    let argv: Vec<&str> = std::iter::once("codex")
        .chain(args.iter().copied())
        .collect();
    let pane = rig.open(name, &[("OPENAI_API_KEY", super::rig::LEAD_KEY)], &argv);
    rig.wait_screen(
        &pane,
        "Codex's composer",
        std::time::Duration::from_secs(60),
        ready,
    );
    super::rig::pause(std::time::Duration::from_millis(600));
    pane
}

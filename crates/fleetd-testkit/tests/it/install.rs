//! Integration tests: `fleetd install claude` and `fleetd install codex` run as the built binary
//! — the charter block it writes is byte-identical to `docs/charter.md`, other content and other
//! MCP servers are kept, fleetd's tools are allowed, a second run changes nothing, and `--print`
//! writes nothing.

use std::path::Path;
use std::process::Output;

use fleetd_testkit::daemon::command;
use fleetd_testkit::run_ok;
use serde_json::{Value, json};

const START: &str = "<!-- fleetd:charter:start -->";
const END: &str = "<!-- fleetd:charter:end -->";

fn charter_doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/charter.md");
    std::fs::read_to_string(path).expect("docs/charter.md")
}

/// Runs `fleetd install claude args...` in `cwd` with HOME isolated in `home`.
fn install(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    install_for("claude", home, cwd, args)
}

/// Runs `fleetd install AGENT args...` in `cwd` with HOME isolated in `home`; panics with its
/// error output unless it succeeds.
fn install_for(agent: &str, home: &Path, cwd: &Path, args: &[&str]) -> Output {
    run_ok(
        command(home)
            .current_dir(cwd)
            .args(["install", agent])
            .args(args),
        &format!("fleetd install {agent} {args:?}"),
    )
}

/// The charter block in `text`, from its start marker through its end marker's line.
fn block(text: &str) -> &str {
    let start = text.find(START).expect("a start marker");
    let end = text.find(END).expect("an end marker") + END.len() + 1;
    &text[start..end]
}

#[test]
fn install_claude_writes_the_charter_byte_identical_to_the_doc() {
    let home = tempfile::tempdir().expect("tempdir");
    let project = tempfile::tempdir().expect("tempdir");
    let memory = project.path().join("CLAUDE.md");
    let mcp = project.path().join(".mcp.json");
    std::fs::write(&memory, "# My project\n\nUse tabs.\n").expect("write");
    std::fs::write(
        &mcp,
        r#"{"mcpServers": {"docs": {"type": "http", "url": "http://docs/mcp"}}}"#,
    )
    .expect("write");

    install(home.path(), project.path(), &[]);
    let written = std::fs::read_to_string(&memory).expect("CLAUDE.md");
    assert_eq!(
        block(&written),
        charter_doc(),
        "the block is the doc, byte for byte"
    );
    assert!(
        written.starts_with("# My project\n\nUse tabs.\n\n"),
        "{written}"
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(&mcp).expect("read")).expect("JSON");
    assert_eq!(
        config["mcpServers"],
        json!({
            "docs": { "type": "http", "url": "http://docs/mcp" },
            "fleet": { "type": "http", "url": "http://127.0.0.1:7797/mcp" },
        })
    );

    // Twice changes nothing, and says so.
    let before = (
        std::fs::read(&memory).expect("read"),
        std::fs::read(&mcp).expect("read"),
    );
    let out = install(home.path(), project.path(), &[]);
    let after = (
        std::fs::read(&memory).expect("read"),
        std::fs::read(&mcp).expect("read"),
    );
    assert_eq!(before, after);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(said.matches("is up to date").count(), 3, "{said}");
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(project.path().join(".claude/settings.local.json"))
            .expect("the project's local settings"),
    )
    .expect("JSON");
    assert_eq!(
        settings,
        json!({ "permissions": { "allow": ["mcp__fleet"] }, "enabledMcpjsonServers": ["fleet"] })
    );

    // A stale block (an older charter) is replaced in place; text after it stays.
    std::fs::write(
        &memory,
        format!("# P\n\n{START}\nold words\n{END}\n\n## Later\n"),
    )
    .expect("write");
    install(home.path(), project.path(), &[]);
    let replaced = std::fs::read_to_string(&memory).expect("read");
    assert_eq!(replaced, format!("# P\n\n{}\n## Later\n", charter_doc()));
}

#[test]
fn install_claude_user_scope_merges_into_claude_json() {
    let home = tempfile::tempdir().expect("tempdir");
    let cwd = tempfile::tempdir().expect("tempdir");
    let claude_json = home.path().join(".claude.json");
    std::fs::write(
        &claude_json,
        r#"{"numStartups": 7, "mcpServers": {"other": {"command": "x", "args": []}}}"#,
    )
    .expect("write");

    let out = install(
        home.path(),
        cwd.path(),
        &["--scope", "user", "--stdio", "--print"],
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains(r#""command": "fleetd""#), "{printed}");
    assert!(printed.contains(&charter_doc()), "{printed}");
    assert!(
        !home.path().join(".claude").exists(),
        "--print writes nothing"
    );

    install(home.path(), cwd.path(), &["--scope", "user", "--stdio"]);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(&claude_json).expect("read")).expect("JSON");
    assert_eq!(config["numStartups"], 7);
    assert_eq!(config["mcpServers"]["other"]["command"], "x");
    // The shim is handed the state and config directories the installer had, so it finds
    // the same daemon whatever the agent passes on to a stdio server.
    assert_eq!(
        config["mcpServers"]["fleet"],
        json!({ "command": "fleetd", "args": ["mcp"], "env": {
            "XDG_STATE_HOME": home.path().join("state").display().to_string(),
            "XDG_CONFIG_HOME": home.path().join("config").display().to_string(),
        } })
    );
    let memory =
        std::fs::read_to_string(home.path().join(".claude/CLAUDE.md")).expect("user CLAUDE.md");
    assert_eq!(memory, charter_doc());
    assert!(
        std::fs::read_dir(cwd.path()).expect("cwd").next().is_none(),
        "user scope leaves the project alone"
    );
}

#[test]
fn install_codex_adds_the_server_trust_and_charter_and_keeps_the_users_config() {
    let home = tempfile::tempdir().expect("tempdir");
    let project = tempfile::tempdir().expect("tempdir");
    let codex = home.path().join(".codex");
    std::fs::create_dir_all(&codex).expect("mkdir");
    let config = codex.join("config.toml");
    let mine = "# mine\nmodel = \"gpt-5\"\n\n[mcp_servers.docs]\nurl = \"http://docs/mcp\"\n";
    std::fs::write(&config, mine).expect("write");
    let run = |args: &[&str]| {
        String::from_utf8_lossy(&install_for("codex", home.path(), project.path(), args).stdout)
            .into_owned()
    };
    let printed = run(&["--print"]);
    assert!(printed.contains("[mcp_servers.fleet]"), "{printed}");
    assert_eq!(
        std::fs::read_to_string(&config).expect("read"),
        mine,
        "--print writes nothing"
    );

    run(&[]);
    let written = std::fs::read_to_string(&config).expect("read");
    assert!(
        written.starts_with(mine),
        "the user's lines stay first, as they were: {written}"
    );
    let dir = project
        .path()
        .canonicalize()
        .expect("canonical")
        .display()
        .to_string();
    for line in [
        "[mcp_servers.fleet]",
        "url = \"http://127.0.0.1:7797/mcp\"",
        "tool_timeout_sec = 3700",
        "default_tools_approval_mode = \"approve\"",
        &format!("[projects.\"{dir}\"]"),
        "trust_level = \"trusted\"",
    ] {
        assert!(written.contains(line), "no {line:?} in {written}");
    }
    let agents = std::fs::read_to_string(codex.join("AGENTS.md")).expect("AGENTS.md");
    assert_eq!(block(&agents), charter_doc());
    let again = run(&[]);
    assert_eq!(again.matches("is up to date").count(), 2, "{again}");
    assert_eq!(std::fs::read_to_string(&config).expect("read"), written);
}

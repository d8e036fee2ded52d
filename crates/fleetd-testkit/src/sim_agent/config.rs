//! sim-agent's script and settings: the actions its turns take (`SIM_AGENT_SCRIPT`) and what it
//! reads from its arguments and environment.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

/// One turn's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Call `fleet_reply` with the reply text.
    Reply,
    /// Call `fleet_ask`, then reply with the answer.
    Ask,
    /// End the turn without calling anything.
    Silent,
    /// Stay working forever.
    Hang,
    /// Show an approval UI (herdr reads it as blocked) until Enter, then end the turn.
    Block,
    /// Like `Block`, with no working first: the prompt takes the agent from idle straight to a
    /// dialog (a permission check before any work), so it never shows `working`.
    Dialog,
    /// Show a permission prompt as Claude Code draws one (a question over numbered choices, an
    /// Esc footer) and take one key, no Enter, as its TUI does: `1` (Yes) runs the task's
    /// reply, anything else replies that it was denied.
    Permission,
    /// Exit the process.
    Exit,
    /// Treat the task as `TOOL {json args}`: call that tool, then reply with its result (lets a
    /// test make a member call any tool, e.g. a lead's, and read what fleetd answered).
    Call,
    /// Run the task as a shell command line (a child in this process's session, like an agent's
    /// shell tool), then reply with `exit N` and its output (lets a test make a member run a
    /// program from its pane, e.g. the `fleetd` CLI).
    Shell,
    /// Run the task as a shell command line, show its output in the pane and end the turn
    /// without replying (what the turn-done fallback is for).
    Print,
    /// Hand the task to a member of its own (spawned once) without waiting; end the turn.
    Delegate,
    /// Read and acknowledge the replies a nudge names; reply with them.
    Collect,
    /// Answer the questions a nudge names; end the turn.
    Answer,
}

impl std::str::FromStr for Action {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s.trim() {
            "reply" => Action::Reply,
            "ask" => Action::Ask,
            "silent" => Action::Silent,
            "hang" => Action::Hang,
            "block" => Action::Block,
            "dialog" => Action::Dialog,
            "permission" => Action::Permission,
            "exit" => Action::Exit,
            "call" => Action::Call,
            "shell" => Action::Shell,
            "print" => Action::Print,
            "delegate" => Action::Delegate,
            "collect" => Action::Collect,
            "answer" => Action::Answer,
            other => anyhow::bail!("unknown sim-agent action {other:?}"),
        })
    }
}

/// sim-agent's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Actions, one per turn; the last repeats.
    pub script: Vec<Action>,
    /// Working time per turn.
    pub work: Duration,
    /// Reply template.
    pub reply: String,
    /// Question template.
    pub question: String,
    /// How many submitted lines are kept as an unsent draft before one goes through.
    pub swallow: u32,
    /// How long after its title reads idle a permission prompt is drawn (an agent whose title
    /// is set apart from its screen).
    pub dialog_after: Duration,
    /// Event log file.
    pub log: Option<PathBuf>,
    /// TCP address to connect to and hold.
    pub connect: Option<String>,
    /// How many process levels below this one hold the connection.
    pub connect_depth: u32,
    /// A word the connection's hello line carries, so a test can tell connections apart.
    pub connect_tag: String,
    /// fleetd's MCP endpoint.
    pub fleetd_url: Option<String>,
    /// Whether every MCP call goes over one kept-alive connection, as real agents' clients do
    /// (`--keep-alive 1` / `SIM_AGENT_KEEP_ALIVE=1`); otherwise each call connects anew.
    pub keep_alive: bool,
}

impl Config {
    /// Reads arguments (after the program name) over environment variables.
    pub fn from_args_and_env(args: &[String]) -> anyhow::Result<Self> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let get = |flag: &str, var: &str| -> Option<String> {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1).cloned())
                .or_else(|| env(var))
        };
        let script = get("--script", "SIM_AGENT_SCRIPT").unwrap_or_else(|| "reply".to_owned());
        let script = script
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(str::parse)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let work_ms: u64 = get("--work-ms", "SIM_AGENT_WORK_MS")
            .map(|v| v.parse().context("work ms must be a number"))
            .transpose()?
            .unwrap_or(1500);
        let connect_depth = get("--connect-depth", "SIM_AGENT_CONNECT_DEPTH")
            .map(|v| v.parse().context("connect depth must be a number"))
            .transpose()?
            .unwrap_or(0);
        let swallow = get("--swallow", "SIM_AGENT_SWALLOW")
            .map(|v| v.parse().context("swallow must be a number"))
            .transpose()?
            .unwrap_or(0);
        let dialog_after_ms: u64 = get("--dialog-after-ms", "SIM_AGENT_DIALOG_AFTER_MS")
            .map(|v| v.parse().context("dialog-after ms must be a number"))
            .transpose()?
            .unwrap_or(0);
        Ok(Self {
            swallow,
            dialog_after: Duration::from_millis(dialog_after_ms),
            script: if script.is_empty() {
                vec![Action::Reply]
            } else {
                script
            },
            work: Duration::from_millis(work_ms),
            reply: get("--reply", "SIM_AGENT_REPLY")
                .unwrap_or_else(|| "sim-agent did: {prompt}".to_owned()),
            question: get("--question", "SIM_AGENT_QUESTION")
                .unwrap_or_else(|| "sim-agent asks about: {prompt}".to_owned()),
            log: get("--log", "SIM_AGENT_LOG").map(PathBuf::from),
            connect: get("--connect", "SIM_AGENT_CONNECT"),
            connect_depth,
            connect_tag: get("--connect-tag", "SIM_AGENT_CONNECT_TAG")
                .unwrap_or_else(|| "-".to_owned()),
            fleetd_url: env("FLEETD_URL"),
            keep_alive: get("--keep-alive", "SIM_AGENT_KEEP_ALIVE").is_some_and(|v| v == "1"),
        })
    }
}

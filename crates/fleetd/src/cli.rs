//! The command line: every subcommand and flag of the `fleetd` binary, as clap derive structs.
//! Owns argument shapes and help text only; what a command does lives in its own module.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::LogFormat;

/// fleetd — the daemon between a lead coding agent and the member agents it delegates to.
///
/// A lead (Claude Code, Codex, pi, ...) in a terminal pane hands tasks to members in other panes
/// through fleetd's MCP tools; replies land in a durable inbox and the lead is nudged when idle.
#[derive(Debug, Parser)]
#[command(name = "fleetd", version, about, long_about)]
pub struct Cli {
    /// Configuration file. Default: $XDG_CONFIG_HOME/fleetd/fleetd.yaml if it exists, else
    /// built-in defaults.
    #[arg(long, global = true, env = "FLEETD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground: MCP at /mcp, /healthz and the REST API on one
    /// listener. SIGINT or SIGTERM shut it down cleanly.
    Serve(ServeArgs),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Speak MCP on stdin/stdout by relaying to the running daemon's unix socket: the MCP
    /// server command for agents that only speak stdio MCP. The daemon identifies the calling
    /// agent by this process (SO_PEERCRED), exactly as over HTTP.
    Mcp,
    /// Inside a sandbox without a network: listen on fleetd's address, forward each connection
    /// to fleetd's door for boxed members, and run the member's command (started by fleetd).
    #[command(hide = true)]
    BoxRelay {
        /// fleetd's address, as the member is given it.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// fleetd's door for boxed members (`<state>/door/http.sock`).
        #[arg(long)]
        socket: std::path::PathBuf,
        /// The member's command.
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Show the running daemon's members: target, profile, pane, status, inbox depth, open
    /// tickets and delegating lead.
    Status(ClientArgs),
    /// Show the replies waiting in a member's inbox, a page at a time (non-destructive: `fleetd
    /// ack` removes one).
    Inbox {
        /// The member's name.
        target: String,
        /// Start after this reply (the last msgId of the page before).
        #[arg(long, value_name = "MSGID")]
        after: Option<String>,
        /// Most replies on the page (1 to 100; default 20). A page also holds at most about 1 MiB
        /// of text.
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Acknowledge (remove) one reply from a member's inbox. Acknowledging an id that is not
    /// there is not an error.
    Ack {
        /// The member's name.
        target: String,
        /// The reply's msgId (as `fleetd inbox` shows it).
        msg_id: String,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Answer a member's open question (from fleet_ask), as a lead's fleet_answer does.
    /// `fleetd watch` and the dashboard show the open questions with their ids.
    Answer {
        /// The question's id.
        question_id: String,
        /// The answer, in plain words (several words are joined with spaces; `-` reads it from
        /// stdin).
        #[arg(required = true, num_args = 1.., value_name = "TEXT")]
        text: Vec<String>,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Stop a member: close its pane and release it; its open tickets are cancelled and the
    /// replies it already sent stay in its inbox.
    Stop {
        /// The member's name.
        target: String,
        /// Why (recorded on its open tickets; default "stopped").
        #[arg(long, value_name = "TEXT")]
        cause: Option<String>,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show the recent tickets (the last ten of each member, or of TARGET), newest first, with
    /// their states and ages.
    Tickets {
        /// Only this member's.
        target: Option<String>,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Admit a pane as a lead: a pane outside the members' workspace opened while members were
    /// running is nobody until the operator vouches for it (docs/SECURITY.md, "Who is a lead").
    /// Run it from a lead's pane or a shell outside the multiplexer; PANE is what `echo
    /// $TMUX_PANE` (tmux) or `echo $HERDR_PANE_ID` (herdr) prints in that pane.
    Admit {
        /// The pane.
        pane: String,
        /// How to reach the daemon.
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set, replace or lift a member's model budget (or, with --tree, the budget of the
    /// delegation tree it heads): what it may spend on its model backend through fleetd before
    /// its requests are refused. The limits given replace the whole budget; the answer shows
    /// what was set and what was spent so far. Needs the operator's role (the default unix
    /// socket).
    Budget(BudgetArgs),
    /// Show the dialog a member waits on (a permission prompt) with the choices fleetd can
    /// type, or answer it: `fleetd approve NAME 1` types choice 1 into its pane, only while the
    /// member is blocked on that dialog (with --dialog, only if it is still the same one). Needs
    /// the operator's role (the default unix socket).
    Approve(ApproveArgs),
    /// Sign a browser in to the dashboard: prints fleetd's address with a one-time key (valid
    /// two minutes, used once). Needs the operator's role (the default unix socket).
    Dashboard(ClientArgs),
    /// Follow the fleet live: a member table (status, inbox depth, open tickets with their
    /// ages, delegating lead) above the latest events, redrawn as they come; piped, the table
    /// once and then one line per event (--json: each event's JSON). Reconnects by itself.
    /// Needs the lead's or the operator's role (the default unix socket makes you the operator).
    Watch(ClientArgs),
    /// Hand a task to a member, as a lead's fleet_send does. Without --wait prints the ticket at
    /// once; the reply lands in the member's inbox (and the primary lead is nudged).
    Send(SendArgs),
    /// Configure an agent to use fleetd.
    #[command(subcommand)]
    Install(InstallCommand),
    /// Several hosts, one fleet: the shared broker's side.
    #[command(subcommand)]
    Gateway(GatewayCommand),
    /// Watch fleetd work: a scripted session in a private tmux server (a lead agent, two
    /// members, a reply while the lead is busy, a nudge, a question, a stop, a SIGKILL and
    /// restart) that ends with a report of what happened and how many replies were lost. Needs
    /// tmux and the fleetd-demo program built next to fleetd.
    Demo(DemoArgs),
}

/// Flags of `fleetd demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Start at once instead of pausing for you to attach to the tmux server, and do not pace
    /// the steps.
    #[arg(long)]
    pub no_pause: bool,
}

/// How the client commands find the daemon and print its answers.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The daemon's URL, e.g. http://127.0.0.1:7797 (presents the API token) or
    /// unix:/path/api.sock. Default: $FLEETD_URL, else the daemon's own unix socket
    /// (`<state dir>/api.sock`), where it knows you as its user: the operator.
    #[arg(long, env = "FLEETD_URL", value_name = "URL")]
    pub daemon: Option<String>,
    /// The API token to present over TCP (needed from another host or as another user).
    /// Default: $FLEETD_TOKEN, else the value of the config's `apiToken` secret when it
    /// resolves here.
    #[arg(
        long,
        env = "FLEETD_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Print the daemon's JSON answer instead of the human form.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `fleetd approve`.
#[derive(Debug, Args)]
pub struct ApproveArgs {
    /// The member's name.
    pub target: String,
    /// The choice to type: its number as the dialog shows it, or its words. Without it, the
    /// dialog and its choices are shown.
    pub choice: Option<String>,
    /// The dialog's fingerprint (shown with it, and in its `member.blocked` event): nothing is
    /// typed unless this very dialog is still on screen.
    #[arg(long, value_name = "FINGERPRINT")]
    pub dialog: Option<String>,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Flags of `fleetd budget`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("limit").required(true).args(["tokens", "cost_usd", "lift"])))]
pub struct BudgetArgs {
    /// The member's name.
    pub target: String,
    /// A limit on tokens of every kind together (input, output, cache reads and writes).
    #[arg(long, value_name = "N")]
    pub tokens: Option<u64>,
    /// A limit on cost, in US dollars at the backend's configured prices.
    #[arg(long, value_name = "USD")]
    pub cost_usd: Option<f64>,
    /// Warn the member's lead at this fraction of a limit (0 to 1; default 0.8).
    #[arg(long, value_name = "F")]
    pub warn_at: Option<f64>,
    /// Set the budget of the delegation tree TARGET heads (it and every member under it
    /// together) rather than its own.
    #[arg(long)]
    pub tree: bool,
    /// Lift the budget: no limit.
    #[arg(long, conflicts_with_all = ["tokens", "cost_usd", "warn_at"])]
    pub lift: bool,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Flags of `fleetd send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The member's name.
    pub target: String,
    /// The task, in plain words (several words are joined with spaces; `-` reads it from stdin).
    #[arg(required = true, num_args = 1.., value_name = "TEXT")]
    pub text: Vec<String>,
    /// Wait for the ticket to settle and print the reply. Exit status 1 unless a reply came
    /// back (the ticket stalled, failed or was cancelled, or the wait ran out first).
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, in seconds; when it passes first the reply lands in the inbox.
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub timeout: u64,
    /// How to reach the daemon.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `fleetd gateway ...`.
#[derive(Debug, Subcommand)]
pub enum GatewayCommand {
    /// Print the broker topology and permissions of a multi-host fleet as a definitions
    /// document (JSON), to load once with `rabbitmqctl import_definitions FILE` (LavinMQ:
    /// `lavinmqctl import_definitions FILE`). Gateways need no configure permission: they only
    /// check that this topology is there.
    Provision(ProvisionArgs),
}

/// Flags of `fleetd gateway provision`.
#[derive(Debug, Args)]
pub struct ProvisionArgs {
    /// The gateways' names, comma-separated (each one is also its broker user).
    #[arg(long, value_delimiter = ',', required = true, value_name = "NAME,...")]
    pub gateways: Vec<String>,
    /// The broker virtual host the fleet lives in.
    #[arg(long, default_value = "fleet")]
    pub vhost: String,
    /// Which broker the document is for (LavinMQ has no topic permissions).
    #[arg(long, value_enum, default_value = "rabbitmq")]
    pub broker: crate::gateway::provision::Broker,
    /// Also create each gateway's user, with a new random password written to DIR/NAME (0600;
    /// give it to that gateway as its `passwordSecret` file). The document holds only the
    /// password's salted hash. Without it, create the users yourself (`rabbitmqctl add_user`).
    #[arg(long, value_name = "DIR")]
    pub passwords_dir: Option<std::path::PathBuf>,
}

/// `fleetd install ...`.
#[derive(Debug, Subcommand)]
pub enum InstallCommand {
    /// Add fleetd to Claude Code: its MCP server entry (`.mcp.json` in this directory, or
    /// `~/.claude.json` with --scope user; other entries and keys are kept), the fleet
    /// charter block in CLAUDE.md (replaced between its markers when present, else appended)
    /// and fleetd's tools allowed without a prompt (`permissions.allow: ["mcp__fleet"]` in
    /// `.claude/settings.local.json`, which also enables the project's server, or
    /// `~/.claude/settings.json`). Running it again changes nothing.
    Claude(InstallClaudeArgs),
    /// Add fleetd to Codex: the `fleet` MCP server in `$CODEX_HOME/config.toml` (`~/.codex`),
    /// with its tools approved and a tool timeout past fleet_send's longest wait, this
    /// directory trusted, and the fleet charter in `$CODEX_HOME/AGENTS.md`. Every other key and
    /// comment is kept; running it again changes nothing.
    Codex(InstallCodexArgs),
}

/// Flags of `fleetd install codex`.
#[derive(Debug, Args)]
pub struct InstallCodexArgs {
    /// Print what would be written instead of writing it.
    #[arg(long)]
    pub print: bool,
    /// Use the stdio shim (`fleetd mcp`) instead of the HTTP endpoint.
    #[arg(long)]
    pub stdio: bool,
}

/// Where `fleetd install claude` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InstallScope {
    /// `.mcp.json` and `CLAUDE.md` in the current directory.
    Project,
    /// `~/.claude.json` and `~/.claude/CLAUDE.md`.
    User,
}

/// Flags of `fleetd install claude`.
#[derive(Debug, Args)]
pub struct InstallClaudeArgs {
    /// Which Claude Code configuration to change.
    #[arg(long, value_enum, default_value_t = InstallScope::Project)]
    pub scope: InstallScope,
    /// Print what would be written instead of writing it.
    #[arg(long)]
    pub print: bool,
    /// Use the stdio shim (`fleetd mcp`) instead of the HTTP endpoint, for agents that only
    /// speak stdio MCP.
    #[arg(long)]
    pub stdio: bool,
}

/// Flags of `fleetd serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, overriding the config's `listen` (e.g. 127.0.0.1:7797).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Log line format, overriding the config's `log.format`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Test-only fault hook: make the engine panic this many milliseconds after start.
    #[arg(long, hide = true, value_name = "MS")]
    pub test_engine_panic_after_ms: Option<u64>,
}

/// `fleetd config ...`.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate FILE without starting and print the effective configuration (defaults applied,
    /// secrets shown by name only). Exit status 1 and the error when the file is refused.
    Check {
        /// The file to check.
        file: PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_subcommand_has_help() {
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            assert!(
                sub.get_about().is_some(),
                "subcommand {} has no help",
                sub.get_name()
            );
        }
    }
}

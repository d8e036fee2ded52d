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

//! What fleetd knows about each agent kind's CLI when it starts one as a member: the environment
//! variables that hand it its model backend, and the arguments a member needs that a user's own
//! configuration does not give it. Pure: no I/O.
//!
//! Codex (0.171) needs both, measured with the real CLI (`../shared/research/codex-cli.md`):
//! it ignores `OPENAI_BASE_URL` and its built-in provider reads no key from the environment, so
//! the backend must be a `model_providers` entry with `base_url`, `env_key` and
//! `wire_api = "responses"`; by default its TUI runs its threads in a shared background
//! `codex app-server` that outlives the pane and calls fleetd from another process tree, so a
//! member starts with `--no-daemon`; and it writes the whole environment, backend token
//! included, to `$CODEX_HOME/shell_snapshots/*.sh` (0644) unless `features.shell_snapshot` is
//! off. Every value goes in as a `-c key=value` override (TOML), for this process only: the
//! user's `config.toml` is never changed.

use std::path::Path;

/// The environment variables a backend is handed in, by agent kind: its URL and its token.
pub(super) fn backend_vars(agent: &str) -> (&'static str, &'static str) {
    match agent {
        "claude" => ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"),
        "codex" => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        _ => ("FLEETD_BACKEND_URL", "FLEETD_BACKEND_TOKEN"),
    }
}

/// The name of the provider a Codex member's backend is configured as.
const CODEX_PROVIDER: &str = "fleet";

/// How long Codex lets one call to fleetd run: `fleet_send` and `fleet_ask` may wait an hour
/// (Codex's own default, 60 s, would cut a waiting call off).
const CODEX_TOOL_TIMEOUT_SECS: u64 = 3700;

/// What a member of kind `agent` needs on its command line, before the profile's own `args`.
pub(super) struct MemberArgs<'a> {
    /// The agent kind.
    pub(super) agent: &'a str,
    /// The model backend's URL, when the profile names one.
    pub(super) backend_url: Option<&'a str>,
    /// The profile's model, when it names one.
    pub(super) model: Option<&'a str>,
    /// fleetd's URL as members reach it.
    pub(super) fleet_url: &'a str,
    /// The member's working directory, when fleetd sets one.
    pub(super) cwd: Option<&'a Path>,
    /// The user's own configuration of this agent already reaches fleetd through the stdio
    /// shim (Codex: `fleetd install codex --stdio`): the member uses it rather than the URL.
    pub(super) fleet_over_stdio: bool,
}

impl MemberArgs<'_> {
    /// The arguments (empty for a kind that needs none).
    pub(super) fn build(&self) -> Vec<String> {
        match self.agent {
            "codex" => self.codex(),
            _ => Vec::new(),
        }
    }

    fn codex(&self) -> Vec<String> {
        let mut set = vec![
            ("features.shell_snapshot".to_owned(), "false".to_owned()),
            ("check_for_update_on_startup".to_owned(), "false".to_owned()),
        ];
        // Codex merges `-c` into the user's table: a URL beside its `command` stops it starting.
        if !self.fleet_over_stdio {
            set.push((
                "mcp_servers.fleet.url".to_owned(),
                toml_string(&format!("{}/mcp", self.fleet_url)),
            ));
        }
        set.extend([
            (
                "mcp_servers.fleet.tool_timeout_sec".to_owned(),
                CODEX_TOOL_TIMEOUT_SECS.to_string(),
            ),
            (
                "mcp_servers.fleet.default_tools_approval_mode".to_owned(),
                toml_string("approve"),
            ),
        ]);
        if let Some(url) = self.backend_url {
            let (_, token_var) = backend_vars("codex");
            let provider = format!("model_providers.{CODEX_PROVIDER}");
            set.extend([
                ("model_provider".to_owned(), toml_string(CODEX_PROVIDER)),
                (format!("{provider}.name"), toml_string("fleetd backend")),
                (format!("{provider}.base_url"), toml_string(url)),
                (format!("{provider}.env_key"), toml_string(token_var)),
                (format!("{provider}.wire_api"), toml_string("responses")),
            ]);
        }
        if let Some(model) = self.model {
            set.push(("model".to_owned(), toml_string(model)));
        }
        if let Some(cwd) = self.cwd {
            // fleetd chose the directory, so Codex does not ask the member's pane to trust it.
            set.push((
                "projects".to_owned(),
                format!(
                    "{{{}={{trust_level=\"trusted\"}}}}",
                    toml_string(&cwd.display().to_string())
                ),
            ));
        }
        let mut args = vec!["--no-daemon".to_owned()];
        for (key, value) in set {
            args.push("-c".to_owned());
            args.push(format!("{key}={value}"));
        }
        args
    }
}

/// `s` as a TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codex(backend: Option<&str>) -> Vec<String> {
        MemberArgs {
            agent: "codex",
            backend_url: backend,
            model: Some("gpt-5"),
            fleet_url: "http://127.0.0.1:7797",
            cwd: Some(Path::new("/w/a \"b\"")),
            fleet_over_stdio: false,
        }
        .build()
    }

    fn value<'a>(args: &'a [String], key: &str) -> Option<&'a str> {
        args.iter()
            .filter_map(|a| a.strip_prefix(&format!("{key}=")))
            .next()
    }

    #[test]
    fn a_codex_member_gets_its_backend_fleetd_and_no_daemon() {
        let args = codex(Some("http://backend/v1"));
        assert_eq!(args[0], "--no-daemon");
        assert!(args[1..].chunks(2).all(|p| p[0] == "-c"), "{args:?}");
        assert_eq!(value(&args, "model_provider"), Some("\"fleet\""));
        assert_eq!(
            value(&args, "model_providers.fleet.base_url"),
            Some("\"http://backend/v1\"")
        );
        assert_eq!(
            value(&args, "model_providers.fleet.env_key"),
            Some("\"OPENAI_API_KEY\"")
        );
        assert_eq!(
            value(&args, "model_providers.fleet.wire_api"),
            Some("\"responses\"")
        );
        assert_eq!(value(&args, "features.shell_snapshot"), Some("false"));
        assert_eq!(
            value(&args, "mcp_servers.fleet.url"),
            Some("\"http://127.0.0.1:7797/mcp\"")
        );
        assert_eq!(value(&args, "model"), Some("\"gpt-5\""));
        assert_eq!(
            value(&args, "projects"),
            Some(r#"{"/w/a \"b\""={trust_level="trusted"}}"#)
        );
    }

    #[test]
    fn without_a_backend_codex_keeps_the_users_provider() {
        let args = codex(None);
        assert_eq!(value(&args, "model_provider"), None);
        assert!(value(&args, "mcp_servers.fleet.url").is_some());
    }

    #[test]
    fn under_a_users_stdio_entry_a_codex_member_gets_no_url_beside_its_command() {
        let args = MemberArgs {
            agent: "codex",
            backend_url: None,
            model: None,
            fleet_url: "http://127.0.0.1:7797",
            cwd: None,
            fleet_over_stdio: true,
        }
        .build();
        assert_eq!(value(&args, "mcp_servers.fleet.url"), None, "{args:?}");
        assert_eq!(
            value(&args, "mcp_servers.fleet.tool_timeout_sec"),
            Some("3700")
        );
        assert!(crate::ops::install::codex::fleet_server_is_stdio(
            "[mcp_servers.fleet]\ncommand = \"fleetd\"\nargs = [\"mcp\"]\n"
        ));
        assert!(!crate::ops::install::codex::fleet_server_is_stdio(
            "[mcp_servers.fleet]\nurl = \"http://127.0.0.1:7797/mcp\"\n"
        ));
        assert!(!crate::ops::install::codex::fleet_server_is_stdio(
            "not toml ["
        ));
    }

    #[test]
    fn other_kinds_get_nothing_added() {
        for agent in ["claude", "pi", "custom"] {
            let args = MemberArgs {
                agent,
                backend_url: Some("http://b"),
                model: None,
                fleet_url: "http://f",
                cwd: None,
                fleet_over_stdio: false,
            }
            .build();
            assert!(args.is_empty(), "{agent}: {args:?}");
        }
    }
}

//! `fleetd install codex`: Codex's side of fleetd, in `$CODEX_HOME/config.toml` (`~/.codex`):
//! the `fleet` MCP server (HTTP or the stdio shim) with a tool timeout past `fleet_send`'s and
//! `fleet_ask`'s longest wait (Codex's own default, 60 s, cuts a waiting call off) and its tools
//! approved, so a lead under Codex's default `approval_policy` is never stopped by a dialog for a
//! fleet call; the directory it is run in trusted (Codex otherwise asks on its first start
//! there); Codex's shared `app-server` daemon not started by itself (`features.daemon_auto_start
//! = false`): a Codex in that daemon calls fleetd from the daemon's process tree rather than its
//! pane's, so fleetd cannot tell who it is and refuses it (`shared_daemon`); and the fleet
//! charter in `$CODEX_HOME/AGENTS.md`, the instructions Codex reads in every session. Every other
//! key, comment and the file's layout are kept (`toml_edit`).

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table, value};

use super::{InstallError, McpServer, Outcome, SERVER_NAME, read_optional, with_charter};

/// How long Codex lets one call to fleetd run, in seconds: past the longest wait of
/// `fleet_send` and `fleet_ask` (an hour).
pub const TOOL_TIMEOUT_SECS: i64 = 3700;

/// The files `install codex` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodexPaths {
    /// `$CODEX_HOME/config.toml`.
    pub config: PathBuf,
    /// `$CODEX_HOME/AGENTS.md`.
    pub memory: PathBuf,
    /// The directory to trust.
    pub trust: PathBuf,
}

impl CodexPaths {
    /// The files under `codex_home` (`$CODEX_HOME`, else `~/.codex`), trusting `dir`.
    pub fn new(codex_home: &Path, dir: &Path) -> Self {
        Self {
            config: codex_home.join("config.toml"),
            memory: codex_home.join("AGENTS.md"),
            trust: dir.to_owned(),
        }
    }
}

/// `existing` config.toml (None: no file yet) with `[mcp_servers.fleet]` set for `server`,
/// `[projects."<trust>"] trust_level = "trusted"` and `[features] daemon_auto_start = false`;
/// `None` when it already says exactly that.
pub fn merge_config(
    path: &Path,
    existing: Option<&str>,
    server: &McpServer,
    trust: &Path,
) -> Result<Option<String>, InstallError> {
    let refuse = |reason: String| InstallError::NotCodexConfig {
        path: path.to_owned(),
        reason,
    };
    let text = existing.unwrap_or_default();
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| refuse(format!("it is not valid TOML ({e})")))?;
    let fleet = table_at(&mut doc, &["mcp_servers", SERVER_NAME]).map_err(&refuse)?;
    match server {
        McpServer::Http { url } => {
            fleet.remove("command");
            fleet.remove("args");
            fleet["url"] = value(url.as_str());
        }
        McpServer::Stdio { command, args, env } => {
            fleet.remove("url");
            fleet["command"] = value(command.as_str());
            fleet["args"] = value(
                args.iter()
                    .map(String::as_str)
                    .collect::<toml_edit::Array>(),
            );
            if env.is_empty() {
                fleet.remove("env");
            } else {
                let mut table = toml_edit::InlineTable::new();
                for (k, v) in env {
                    table.insert(k, v.as_str().into());
                }
                fleet["env"] = value(table);
            }
        }
    }
    fleet["tool_timeout_sec"] = value(TOOL_TIMEOUT_SECS);
    fleet["default_tools_approval_mode"] = value("approve");
    let dir = trust.display().to_string();
    let project = table_at(&mut doc, &["projects", &dir]).map_err(&refuse)?;
    project["trust_level"] = value("trusted");
    table_at(&mut doc, &["features"]).map_err(&refuse)?["daemon_auto_start"] = value(false);
    let new = doc.to_string();
    Ok((existing.is_none() || new != text).then_some(new))
}

/// The table at `keys` (made, implicit for the parents, when absent).
/// Whether the Codex configuration `text` (a `config.toml`) reaches fleetd through the stdio shim:
/// its `[mcp_servers.fleet]` has a `command` (as `fleetd install codex --stdio` writes). A member
/// started under it must not be given fleetd's URL as well: Codex merges `-c` overrides into the
/// table and refuses to start a server with both ("url is not supported for stdio").
pub fn fleet_server_is_stdio(text: &str) -> bool {
    text.parse::<DocumentMut>().is_ok_and(|doc| {
        doc.get("mcp_servers")
            .and_then(|s| s.get(SERVER_NAME))
            .and_then(|f| f.get("command"))
            .is_some()
    })
}

fn table_at<'a>(doc: &'a mut DocumentMut, keys: &[&str]) -> Result<&'a mut Table, String> {
    let mut table = doc.as_table_mut();
    for (i, key) in keys.iter().enumerate() {
        let entry = table.entry(key).or_insert_with(|| {
            let mut t = Table::new();
            t.set_implicit(i + 1 < keys.len());
            Item::Table(t)
        });
        table = entry
            .as_table_mut()
            .ok_or_else(|| format!("its `{}` is not a table", keys[..=i].join(".")))?;
    }
    Ok(table)
}

/// Writes fleetd's server, the trust and the charter into `paths`, each only if it would change.
pub fn install_codex(paths: &CodexPaths, server: &McpServer) -> Result<Vec<Outcome>, InstallError> {
    let config = read_optional(&paths.config)?;
    let merged = merge_config(&paths.config, config.as_deref(), server, &paths.trust)?;
    let memory = read_optional(&paths.memory)?.unwrap_or_default();
    let charter = with_charter(&paths.memory, &memory)?;
    super::write_changed([(&paths.config, merged), (&paths.memory, charter)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http() -> McpServer {
        McpServer::Http {
            url: "http://127.0.0.1:7797/mcp".into(),
        }
    }

    #[test]
    fn the_server_and_trust_are_added_and_the_users_file_kept() {
        let path = Path::new("config.toml");
        let existing = "# my settings\nmodel = \"gpt-5\" # the best\n\n[mcp_servers.docs]\ncommand = \"docs-mcp\"\n";
        let merged = merge_config(path, Some(existing), &http(), Path::new("/w/p"))
            .expect("merges")
            .expect("changes");
        assert!(merged.starts_with(existing), "{merged}");
        let doc: DocumentMut = merged.parse().expect("TOML");
        assert_eq!(
            doc["mcp_servers"]["fleet"]["url"].as_str(),
            Some("http://127.0.0.1:7797/mcp")
        );
        assert_eq!(
            doc["mcp_servers"]["fleet"]["tool_timeout_sec"].as_integer(),
            Some(TOOL_TIMEOUT_SECS)
        );
        assert_eq!(
            doc["mcp_servers"]["fleet"]["default_tools_approval_mode"].as_str(),
            Some("approve")
        );
        assert_eq!(
            doc["projects"]["/w/p"]["trust_level"].as_str(),
            Some("trusted")
        );
        assert_eq!(doc["features"]["daemon_auto_start"].as_bool(), Some(false));
        assert_eq!(
            doc["mcp_servers"]["docs"]["command"].as_str(),
            Some("docs-mcp")
        );
        assert_eq!(
            merge_config(path, Some(&merged), &http(), Path::new("/w/p")).expect("ok"),
            None,
            "a second run changes nothing"
        );
        let stdio = McpServer::Stdio {
            env: vec![("XDG_STATE_HOME".into(), "/h/state".into())],
            command: "fleetd".into(),
            args: vec!["mcp".into()],
        };
        let switched = merge_config(path, Some(&merged), &stdio, Path::new("/w/p"))
            .expect("merges")
            .expect("changes");
        let doc: DocumentMut = switched.parse().expect("TOML");
        assert!(doc["mcp_servers"]["fleet"].get("url").is_none());
        assert_eq!(
            doc["mcp_servers"]["fleet"]["env"]["XDG_STATE_HOME"].as_str(),
            Some("/h/state"),
            "the shim finds the daemon Codex hands it only a few variables"
        );
        assert_eq!(
            doc["mcp_servers"]["fleet"]["command"].as_str(),
            Some("fleetd")
        );
    }

    #[test]
    fn a_file_fleetd_cannot_change_is_left_alone() {
        let path = Path::new("config.toml");
        for bad in [
            "model = ",
            "mcp_servers = 3",
            "[projects]\n\"/w/p\" = \"yes\"",
        ] {
            let err =
                merge_config(path, Some(bad), &http(), Path::new("/w/p")).expect_err("refused");
            assert!(err.to_string().contains("config.toml"), "{err}");
        }
    }

    #[test]
    fn install_twice_writes_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = CodexPaths::new(dir.path(), Path::new("/w/p"));
        let first = install_codex(&paths, &http()).expect("installs");
        assert!(
            first.iter().all(|o| matches!(o, Outcome::Written(_))),
            "{first:?}"
        );
        let second = install_codex(&paths, &http()).expect("installs");
        assert!(
            second.iter().all(|o| matches!(o, Outcome::Unchanged(_))),
            "{second:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&paths.memory).expect("AGENTS.md"),
            super::super::CHARTER
        );
    }
}

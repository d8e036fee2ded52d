//! `fleetd install claude`: Claude Code's MCP server entry for fleetd (merged into `.mcp.json` or
//! `~/.claude.json`, every other key kept), the fleet charter block in CLAUDE.md (between its
//! markers, replaced when present, appended when not) and the permission for fleetd's tools.
//! Owns those file formats and the charter text (`docs/charter.md`, embedded); `codex` does the
//! same for Codex. Idempotent: a file whose content would not change is not written at all.
//! Never touches the daemon.

pub mod codex;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// The charter block, byte for byte as `docs/charter.md`, markers included.
pub const CHARTER: &str = include_str!("../../../../../docs/charter.md");
/// The line that opens the charter block in CLAUDE.md.
pub const CHARTER_START: &str = "<!-- fleetd:charter:start -->";
/// The line that closes it.
pub const CHARTER_END: &str = "<!-- fleetd:charter:end -->";
/// The name fleetd's entry has under `mcpServers`.
pub const SERVER_NAME: &str = "fleet";

/// How Claude Code reaches fleetd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpServer {
    /// Streamable HTTP at this URL (`http://127.0.0.1:7797/mcp`).
    Http {
        /// The endpoint.
        url: String,
    },
    /// The stdio shim: `command args...` (`fleetd mcp`).
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables it needs to find the same daemon (`XDG_STATE_HOME`, `XDG_CONFIG_HOME`,
        /// when the installer had them): Codex hands a stdio server only a few variables of
        /// its own environment, and the shim finds the daemon's socket under the state dir.
        env: Vec<(String, String)>,
    },
}

impl McpServer {
    /// The entry as Claude Code's configuration spells it.
    pub fn entry(&self) -> Value {
        match self {
            Self::Http { url } => json!({ "type": "http", "url": url }),
            Self::Stdio { command, args, env } if env.is_empty() => {
                json!({ "command": command, "args": args })
            }
            Self::Stdio { command, args, env } => {
                let env: serde_json::Map<String, Value> = env
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                json!({ "command": command, "args": args, "env": env })
            }
        }
    }
}

/// The three files `install claude` changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudePaths {
    /// `.mcp.json` (project) or `~/.claude.json` (user).
    pub mcp_config: PathBuf,
    /// `CLAUDE.md` (project) or `~/.claude/CLAUDE.md` (user).
    pub memory: PathBuf,
    /// The settings that allow fleetd's tools: `.claude/settings.local.json` (project: the
    /// user's own, which Claude Code keeps out of git) or `~/.claude/settings.json` (user).
    pub settings: PathBuf,
    /// Whether these are a project's files (its `.mcp.json` server needs enabling).
    pub project: bool,
}

impl ClaudePaths {
    /// The project's files, in `dir`.
    pub fn project(dir: &Path) -> Self {
        Self {
            mcp_config: dir.join(".mcp.json"),
            memory: dir.join("CLAUDE.md"),
            settings: dir.join(".claude").join("settings.local.json"),
            project: true,
        }
    }

    /// The user's files, under `home`.
    pub fn user(home: &Path) -> Self {
        Self {
            mcp_config: home.join(".claude.json"),
            memory: home.join(".claude").join("CLAUDE.md"),
            settings: home.join(".claude").join("settings.json"),
            project: false,
        }
    }
}

/// Why installing failed; messages read after "failed to ...".
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An existing MCP configuration is not a JSON object; it is left alone.
    #[error(
        "update {path}: it is not a JSON object ({reason}); fix or move it, then run this again"
    )]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A Codex `config.toml` fleetd cannot change as it must; it is left alone.
    #[error("update {path}: {reason}; fix or move it, then run this again")]
    NotCodexConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// CLAUDE.md has one charter marker without the other (or in the wrong order).
    #[error(
        "update {path}: it has a broken fleetd charter block (one of `{CHARTER_START}` / `{CHARTER_END}` is missing or they are out of order); remove the stray marker, then run this again"
    )]
    BrokenMarkers {
        /// The file.
        path: PathBuf,
    },
    /// A file could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What happened to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It was created or changed.
    Written(PathBuf),
    /// It already had the content.
    Unchanged(PathBuf),
}

/// `existing` JSON (None: no file yet) as `edit` leaves its top-level object, every other key
/// kept; `None` when that changes nothing. `edit` says what in the object is not as it expects.
fn merge_json(
    path: &Path,
    existing: Option<&str>,
    edit: impl FnOnce(&mut Map<String, Value>) -> Result<(), String>,
) -> Result<Option<String>, InstallError> {
    let not_object = |reason: String| InstallError::NotAnObject {
        path: path.to_owned(),
        reason,
    };
    let mut root = match existing.filter(|t| !t.trim().is_empty()) {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Err(not_object("its top level is not an object".into())),
            Err(e) => return Err(not_object(e.to_string())),
        },
    };
    let before = root.clone();
    edit(&mut root).map_err(not_object)?;
    if existing.is_some() && root == before {
        return Ok(None);
    }
    let mut text =
        serde_json::to_string_pretty(&Value::Object(root)).expect("a JSON value always serializes");
    text.push('\n');
    Ok(Some(text))
}

/// The object under `key` in `map`, made when absent.
fn object_at<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
) -> Result<&'a mut Map<String, Value>, String> {
    match map.entry(key).or_insert_with(|| Value::Object(Map::new())) {
        Value::Object(inner) => Ok(inner),
        _ => Err(format!("its `{key}` is not an object")),
    }
}

/// Adds `item` to the array under `key` in `map` (made when absent) unless it is there.
fn add_to_list(map: &mut Map<String, Value>, key: &str, item: &str) -> Result<(), String> {
    match map.entry(key).or_insert_with(|| Value::Array(Vec::new())) {
        Value::Array(items) => {
            if !items.iter().any(|v| v.as_str() == Some(item)) {
                items.push(Value::from(item));
            }
            Ok(())
        }
        _ => Err(format!("its `{key}` is not a list")),
    }
}

/// `existing` MCP configuration JSON (None: no file yet) with `mcpServers.fleet` set to `entry`
/// and everything else kept. `None` when it already says exactly that.
pub fn merge_mcp_config(
    path: &Path,
    existing: Option<&str>,
    entry: &Value,
) -> Result<Option<String>, InstallError> {
    merge_json(path, existing, |root| {
        object_at(root, "mcpServers")?.insert(SERVER_NAME.to_owned(), entry.clone());
        Ok(())
    })
}

/// The permission rule that lets Claude Code run every tool of fleetd's server without asking.
pub const ALLOW_RULE: &str = "mcp__fleet";

/// `existing` Claude Code settings JSON with fleetd's tools allowed (`permissions.allow` holds
/// [`ALLOW_RULE`]) and, for a project's `.mcp.json`, its `fleet` server enabled
/// (`enabledMcpjsonServers`), which Claude Code otherwise asks the user to approve.
pub fn merge_settings(
    path: &Path,
    existing: Option<&str>,
    project: bool,
) -> Result<Option<String>, InstallError> {
    merge_json(path, existing, |root| {
        add_to_list(object_at(root, "permissions")?, "allow", ALLOW_RULE)?;
        if project {
            add_to_list(root, "enabledMcpjsonServers", SERVER_NAME)?;
        }
        Ok(())
    })
}

/// `existing` CLAUDE.md with the charter block in it: the block between the markers is replaced,
/// or the charter is appended after a blank line. `None` when nothing would change.
pub fn with_charter(path: &Path, existing: &str) -> Result<Option<String>, InstallError> {
    let new = match (existing.find(CHARTER_START), existing.find(CHARTER_END)) {
        (Some(start), Some(end)) if end > start => {
            let mut end = end + CHARTER_END.len();
            if existing[end..].starts_with('\n') {
                end += 1;
            }
            format!("{}{CHARTER}{}", &existing[..start], &existing[end..])
        }
        (None, None) if existing.is_empty() => CHARTER.to_owned(),
        (None, None) => {
            let gap = if existing.ends_with("\n\n") {
                ""
            } else if existing.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{existing}{gap}{CHARTER}")
        }
        _ => {
            return Err(InstallError::BrokenMarkers {
                path: path.to_owned(),
            });
        }
    };
    Ok((new != existing).then_some(new))
}

/// Writes fleetd's MCP entry, the charter and the permission for fleetd's tools into `paths`,
/// each only if it would change.
pub fn install_claude(
    paths: &ClaudePaths,
    server: &McpServer,
) -> Result<Vec<Outcome>, InstallError> {
    let config = read_optional(&paths.mcp_config)?;
    let merged = merge_mcp_config(&paths.mcp_config, config.as_deref(), &server.entry())?;
    let memory = read_optional(&paths.memory)?.unwrap_or_default();
    let charter = with_charter(&paths.memory, &memory)?;
    let settings = read_optional(&paths.settings)?;
    let allowed = merge_settings(&paths.settings, settings.as_deref(), paths.project)?;
    write_changed([
        (&paths.mcp_config, merged),
        (&paths.memory, charter),
        (&paths.settings, allowed),
    ])
}

/// Writes each file whose new content is `Some`, in order; says what happened to each.
pub(crate) fn write_changed<'a>(
    changes: impl IntoIterator<Item = (&'a PathBuf, Option<String>)>,
) -> Result<Vec<Outcome>, InstallError> {
    let mut outcomes = Vec::new();
    for (path, content) in changes {
        match content {
            Some(text) => {
                write_atomically(path, &text)?;
                outcomes.push(Outcome::Written(path.clone()));
            }
            None => outcomes.push(Outcome::Unchanged(path.clone())),
        }
    }
    Ok(outcomes)
}

pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, InstallError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(InstallError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`, keeping the old
/// file's permissions (`~/.claude.json` is private), so a crash never leaves half a file.
fn write_atomically(path: &Path, text: &str) -> Result<(), InstallError> {
    let err = |source| InstallError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".fleetd-{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(err)?;
    if let Ok(meta) = std::fs::metadata(path) {
        std::fs::set_permissions(&tmp, meta.permissions()).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http() -> Value {
        McpServer::Http {
            url: "http://127.0.0.1:7797/mcp".into(),
        }
        .entry()
    }

    #[test]
    fn the_charter_is_one_marked_block() {
        assert!(CHARTER.starts_with(CHARTER_START), "{CHARTER}");
        assert!(CHARTER.ends_with(&format!("{CHARTER_END}\n")), "{CHARTER}");
        assert_eq!(CHARTER.matches(CHARTER_START).count(), 1);
        for tool in [
            "fleet_send",
            "fleet_poll",
            "fleet_ack",
            "fleet_reply",
            "fleet_ask",
        ] {
            assert!(
                CHARTER.contains(tool),
                "the charter does not mention {tool}"
            );
        }
        assert!(CHARTER.contains("text printed in a pane reaches nobody"));
    }

    #[test]
    fn the_mcp_entry_is_merged_and_other_keys_are_kept() {
        let path = Path::new(".mcp.json");
        let existing = r#"{"mcpServers": {"other": {"command": "x"}}, "theme": "dark"}"#;
        let merged = merge_mcp_config(path, Some(existing), &http())
            .expect("merges")
            .expect("changes");
        let v: Value = serde_json::from_str(&merged).expect("JSON");
        assert_eq!(v["theme"], "dark");
        assert_eq!(v["mcpServers"]["other"]["command"], "x");
        assert_eq!(v["mcpServers"]["fleet"]["type"], "http");
        assert_eq!(
            merge_mcp_config(path, Some(&merged), &http()).expect("merges"),
            None,
            "a second run changes nothing"
        );
        let fresh = merge_mcp_config(path, None, &http())
            .expect("merges")
            .expect("changes");
        assert_eq!(
            serde_json::from_str::<Value>(&fresh).expect("JSON"),
            json!({ "mcpServers": { "fleet": http() } })
        );
    }

    #[test]
    fn a_config_that_is_not_an_object_is_left_alone() {
        let path = Path::new("x.json");
        for bad in ["[1]", "{not json", r#"{"mcpServers": 3}"#] {
            let err = merge_mcp_config(path, Some(bad), &http()).expect_err("refused");
            assert!(err.to_string().contains("x.json"), "{err}");
        }
    }

    #[test]
    fn the_charter_is_appended_then_replaced_in_place() {
        let path = Path::new("CLAUDE.md");
        let first = with_charter(path, "# Project\n\nRules.\n")
            .expect("ok")
            .expect("changes");
        assert_eq!(first, format!("# Project\n\nRules.\n\n{CHARTER}"));
        assert_eq!(with_charter(path, &first).expect("ok"), None);
        let stale = format!("# P\n\n{CHARTER_START}\nold text\n{CHARTER_END}\n\n## After\n");
        let fixed = with_charter(path, &stale).expect("ok").expect("changes");
        assert_eq!(fixed, format!("# P\n\n{CHARTER}\n## After\n"));
        assert_eq!(
            with_charter(path, "").expect("ok"),
            Some(CHARTER.to_owned())
        );
        assert_eq!(
            with_charter(path, "no newline").expect("ok"),
            Some(format!("no newline\n\n{CHARTER}"))
        );
    }

    #[test]
    fn a_stray_marker_is_refused() {
        let path = Path::new("CLAUDE.md");
        let err = with_charter(path, &format!("x\n{CHARTER_START}\n")).expect_err("refused");
        assert!(matches!(err, InstallError::BrokenMarkers { .. }), "{err}");
        let err =
            with_charter(path, &format!("{CHARTER_END}\n{CHARTER_START}\n")).expect_err("refused");
        assert!(matches!(err, InstallError::BrokenMarkers { .. }), "{err}");
    }

    #[test]
    fn install_twice_writes_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = ClaudePaths::user(dir.path());
        let server = McpServer::Stdio {
            env: Vec::new(),
            command: "fleetd".into(),
            args: vec!["mcp".into()],
        };
        let first = install_claude(&paths, &server).expect("installs");
        assert!(
            first.iter().all(|o| matches!(o, Outcome::Written(_))),
            "{first:?}"
        );
        let second = install_claude(&paths, &server).expect("installs");
        assert!(
            second.iter().all(|o| matches!(o, Outcome::Unchanged(_))),
            "{second:?}"
        );
        let memory = std::fs::read_to_string(&paths.memory).expect("CLAUDE.md");
        assert_eq!(memory, CHARTER);
    }

    #[test]
    fn fleetds_tools_are_allowed_and_a_projects_server_enabled() {
        let path = Path::new("settings.json");
        let existing =
            r#"{"permissions": {"allow": ["Bash(ls)"], "deny": ["Read(.env)"]}, "model": "x"}"#;
        let merged = merge_settings(path, Some(existing), false)
            .expect("merges")
            .expect("changes");
        let v: Value = serde_json::from_str(&merged).expect("JSON");
        assert_eq!(v["permissions"]["allow"], json!(["Bash(ls)", ALLOW_RULE]));
        assert_eq!(v["permissions"]["deny"], json!(["Read(.env)"]));
        assert_eq!(v["model"], "x");
        assert_eq!(v.get("enabledMcpjsonServers"), None);
        assert_eq!(
            merge_settings(path, Some(&merged), false).expect("ok"),
            None
        );
        let project = merge_settings(path, None, true)
            .expect("merges")
            .expect("changes");
        assert_eq!(
            serde_json::from_str::<Value>(&project).expect("JSON"),
            json!({ "permissions": { "allow": [ALLOW_RULE] }, "enabledMcpjsonServers": ["fleet"] })
        );
        let err = merge_settings(path, Some(r#"{"permissions": {"allow": "all"}}"#), false)
            .expect_err("refused");
        assert!(err.to_string().contains("`allow` is not a list"), "{err}");
    }
}

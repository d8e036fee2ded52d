//! The real agent CLIs (Claude Code, Codex) as the real-agent tests and benchmarks run them: the
//! pinned versions (`agents/pins`), where `scripts/install-agents` put them, and the headless
//! set-up a user's machine would have after a first interactive run (onboarding done, the API key
//! approved, the working directory trusted). What fleetd itself configures in them comes from
//! `fleetd install claude` / `fleetd install codex`, run as the README tells a user to.
//! Never used by the daemon.

use std::path::{Path, PathBuf};

pub mod claude;
pub mod codex;
pub mod gateway;
pub mod panes;
pub mod rig;
pub mod stories;
pub mod turns;

/// The pins file: `<name> <npm package> <version>` per line.
const PINS: &str = include_str!("../../agents/pins");

/// A pinned CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// `claude-code` or `codex`.
    pub name: String,
    /// The npm package.
    pub package: String,
    /// The version.
    pub version: String,
}

/// Every pinned CLI, in the pins file's order (the newest of each first).
pub fn pins() -> Vec<Pin> {
    PINS.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(Pin {
                name: f.next()?.to_owned(),
                package: f.next()?.to_owned(),
                version: f.next()?.to_owned(),
            })
        })
        .collect()
}

/// The pinned versions of `name`, newest first.
pub fn versions(name: &str) -> Vec<String> {
    pins()
        .into_iter()
        .filter(|p| p.name == name)
        .map(|p| p.version)
        .collect()
}

/// Where `scripts/install-agents` installs: `$FLEETD_AGENTS_CACHE`, else
/// `$XDG_CACHE_HOME/fleetd/agents`, else `~/.cache/fleetd/agents`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FLEETD_AGENTS_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("fleetd").join("agents")
}

/// An installed CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cli {
    /// `claude-code` or `codex`.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The executable (`claude`, `codex`).
    pub bin: PathBuf,
}

impl Cli {
    /// The installed `name` at `version`, if `scripts/install-agents` put it in the cache.
    pub fn find(name: &str, version: &str) -> Option<Self> {
        let exe = match name {
            "claude-code" => "claude",
            "codex" => "codex",
            _ => return None,
        };
        let dir = cache_dir().join(format!("{name}-{version}"));
        let bin = dir.join("node_modules").join(".bin").join(exe);
        (dir.join(".installed").exists() && bin.exists()).then(|| Self {
            name: name.to_owned(),
            version: version.to_owned(),
            bin,
        })
    }

    /// The installed `name` at `version`. Under CI a missing CLI fails the test with how to
    /// install it; elsewhere the test is skipped (`None`, with the reason printed).
    pub fn require(name: &str, version: &str) -> Option<Self> {
        let found = Self::find(name, version);
        let how = format!(
            "run scripts/install-agents (it installs the pinned CLIs into {}; .ci/run does)",
            cache_dir().display()
        );
        match crate::require(&format!("{name} {version}"), found.is_some(), &how) {
            crate::Service::Present => found,
            crate::Service::Skip => None,
        }
    }

    /// The newest pinned version of `name`, required as [`Cli::require`] does.
    pub fn newest(name: &str) -> Option<Self> {
        Self::pinned(name, 0)
    }

    /// The `nth` pinned version of `name`, newest first (1: the older one kept), required as
    /// [`Cli::require`] does.
    pub fn pinned(name: &str, nth: usize) -> Option<Self> {
        let version = versions(name).into_iter().nth(nth)?;
        Self::require(name, &version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pins_name_the_newest_claude_code_first_and_an_older_one() {
        let claude = versions("claude-code");
        assert!(claude.len() >= 2, "{claude:?}");
        assert_eq!(versions("codex").len(), 1);
    }
}

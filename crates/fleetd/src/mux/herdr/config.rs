//! How fleetd reaches one herdr daemon: its socket, found the way herdr finds it, and the
//! bounds on a call and on `agent.prompt`'s wait.

use std::path::PathBuf;
use std::time::Duration;

/// How to reach one herdr daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HerdrConfig {
    /// The JSON API socket (`herdr.sock`).
    pub socket: PathBuf,
    /// Bound on one ordinary call. herdr answers within its own 5 s app timeout, so the default
    /// of 8 s only fires when the server is wedged.
    pub call_timeout: Duration,
    /// How long `agent.prompt` may wait for the agent to reach `working` (herdr's `timeout_ms`).
    /// herdr itself reports `agent_prompt_stalled` after 5 s without a state change.
    pub prompt_wait: Duration,
}

impl HerdrConfig {
    /// A config for `socket` with default timeouts.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            call_timeout: Duration::from_secs(8),
            prompt_wait: Duration::from_secs(15),
        }
    }

    /// Finds the socket the way herdr does: `HERDR_SOCKET_PATH`, else the named session
    /// `HERDR_SESSION` (`default` meaning none), else `<config>/herdr.sock` where `<config>` is
    /// `$XDG_CONFIG_HOME/herdr` or `~/.config/herdr`. `env` looks a variable up (pass
    /// `|k| std::env::var(k).ok()` in the daemon; tests pass a map). `None` when no home is known.
    pub fn discover_socket(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        let non_empty = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(path) = non_empty("HERDR_SOCKET_PATH") {
            return Some(PathBuf::from(path));
        }
        let config = match non_empty("XDG_CONFIG_HOME") {
            Some(xdg) => PathBuf::from(xdg).join("herdr"),
            None => PathBuf::from(non_empty("HOME")?)
                .join(".config")
                .join("herdr"),
        };
        match non_empty("HERDR_SESSION") {
            Some(session) if session != "default" => {
                Some(config.join("sessions").join(session).join("herdr.sock"))
            }
            _ => Some(config.join("herdr.sock")),
        }
    }
}

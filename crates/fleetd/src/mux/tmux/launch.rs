//! What a new tmux window runs, and with which environment. A member's environment goes into a
//! 0600 launch file in the owner-only launch directory, never onto an argv or into tmux's own
//! environment; the window runs [`LAUNCHER`], which reads the file, removes it and `exec`s the
//! member's command. `tmux` itself runs with only an allowlisted part of fleetd's environment.

use std::path::PathBuf;
use std::time::Duration;

use super::Tmux;
use crate::mux::{MuxError, OpenPane, shell_quote_argv};

/// Environment variables passed to `tmux`; everything else is cleared.
const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TMPDIR",
    "TMUX_TMPDIR",
    "XDG_RUNTIME_DIR",
];

/// The allowlisted variables of fleetd's own environment, as they are now.
pub(super) fn inherited_env() -> Vec<(&'static str, std::ffi::OsString)> {
    ENV_ALLOWLIST
        .iter()
        .filter_map(|key| std::env::var_os(key).map(|value| (*key, value)))
        .collect()
}

/// How long a launch file may wait for its pane's launcher before fleetd removes it itself (the
/// launcher removes it at once; this only covers a pane that never ran).
const LAUNCH_FILE_TTL: Duration = Duration::from_secs(60);

/// The launcher a member window runs: `sh -c LAUNCHER fleetd-launch FILE ARGV...` reads the
/// variables from FILE (exported), removes FILE and `exec`s ARGV (the user's shell when empty).
const LAUNCHER: &str = r#"f=$1; shift; set -a; . "$f"; set +a; rm -f -- "$f"; [ "$#" -gt 0 ] || set -- "${SHELL:-/bin/sh}"; exec "$@""#;

/// Writes `env` as a launch file in `dir` (0600, a fresh random name) and returns its path.
#[expect(
    clippy::disallowed_methods,
    reason = "a unique file name, not an id anything orders or keeps"
)]
fn write_launch_file(
    dir: &std::path::Path,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<PathBuf, MuxError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |e: std::io::Error| MuxError::transient("write a launch file", e);
    let mut text = String::new();
    for (name, value) in env {
        if !crate::config::is_env_name(name) {
            return Err(MuxError::Rejected {
                op: "open a pane".to_owned(),
                code: "invalid_env_name".to_owned(),
                message: format!("{name:?} is not an environment variable name"),
            });
        }
        text.push_str(name);
        text.push('=');
        text.push_str(&shell_quote_argv(std::slice::from_ref(value)));
        text.push('\n');
    }
    crate::state_dir::private_dir(dir).map_err(failed)?;
    // A fresh name opened with `create_new` in the owner-only directory: nothing can be there
    // before us, and nobody else can look in.
    let path = dir.join(format!("env-{}", uuid::Uuid::now_v7().simple()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(crate::state_dir::FILE_MODE)
        .open(&path)
        .map_err(failed)?;
    file.write_all(text.as_bytes()).map_err(failed)?;
    Ok(path)
}

impl Tmux {
    /// The shell command line a new window runs: the launch's argv itself (tmux has no agent
    /// launcher: an agent kind runs its canonical executable), or the launcher that gives it
    /// `req.env` (see the module header). The command becomes the pane's process (its pid is
    /// `#{pane_pid}`) and no argument is re-split.
    pub(super) fn window_command(&self, req: &OpenPane) -> Result<Option<String>, MuxError> {
        let command = req.launch.argv();
        if req.env.is_empty() {
            return Ok(
                (!command.is_empty()).then(|| format!("exec {}", shell_quote_argv(&command)))
            );
        }
        let Some(dir) = &self.inner.config.launch_dir else {
            return Err(MuxError::Unsupported(
                "a pane environment without a launch directory".to_owned(),
            ));
        };
        let file = write_launch_file(dir, &req.env)?;
        let leftover = file.clone();
        tokio::spawn(async move {
            tokio::time::sleep(LAUNCH_FILE_TTL).await;
            // Normally gone already: the launcher removed it when it read it.
            let _ = std::fs::remove_file(leftover);
        });
        let mut argv = vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            LAUNCHER.to_owned(),
            "fleetd-launch".to_owned(),
            file.display().to_string(),
        ];
        argv.extend(command);
        Ok(Some(format!("exec {}", shell_quote_argv(&argv))))
    }
}

//! A private tmux server for tests: a `-S` socket in its own tempdir, started with `-f /dev/null`
//! and with `TMUX`, `TMUX_PANE` and `HERDR_*` stripped from its environment, killed on drop. Never
//! touches the user's own tmux server.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::Context as _;

use crate::fake_herdr::process::strip_mux_env;

/// The session a server starts with (a tmux server needs a session to live).
const BASE_SESSION: [&str; 8] = ["new-session", "-d", "-s", "base", "-x", "200", "-y", "50"];

/// A running private tmux server.
#[derive(Debug)]
pub struct TmuxServer {
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl TmuxServer {
    /// Starts a server with one detached session `base` (a tmux server needs a session to live).
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with_env(&[])
    }

    /// Like [`TmuxServer::start`], the server started with `env` on top of this process's
    /// environment: what every pane it opens inherits (a user's login environment: `HOME`,
    /// `PATH`, `XDG_*`).
    pub fn start_with_env(env: &[(String, String)]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("tmux.sock");
        let me = Self { dir, socket };
        let out = me
            .command()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(BASE_SESSION)
            .output()
            .context("running tmux new-session")?;
        anyhow::ensure!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(me)
    }

    /// A socket path in a fresh tempdir with no server yet (for code that starts the server
    /// itself); a server started there is still killed on drop.
    pub fn unstarted() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("tmux.sock");
        Ok(Self { dir, socket })
    }

    /// The `-S` socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The server's tempdir (for files tests want to put next to it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// fleetd's tmux backend settings for this server, with the launch directory (where a
    /// pane's environment waits for its launcher) beside the socket.
    pub fn backend_config(&self) -> fleetd::mux::tmux::TmuxConfig {
        fleetd::mux::tmux::TmuxConfig {
            launch_dir: Some(self.dir.path().join("launch")),
            ..fleetd::mux::tmux::TmuxConfig::new(fleetd::mux::tmux::TmuxSocket::Path(
                self.socket.clone(),
            ))
        }
    }

    /// A `tmux -S <socket> -f /dev/null` command with a cleaned environment.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("tmux");
        strip_mux_env(&mut cmd)
            .arg("-S")
            .arg(&self.socket)
            .arg("-f")
            .arg("/dev/null");
        cmd
    }

    /// Runs a tmux command on this server.
    pub fn run(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.command()
            .args(args)
            .output()
            .with_context(|| format!("running tmux {args:?}"))
    }

    /// Runs a tmux command on this server; panics with its output unless it succeeds.
    pub fn run_ok(&self, args: &[&str]) -> Output {
        crate::succeeded(
            self.run(args).expect("tmux runs"),
            &format!("tmux {args:?}"),
        )
    }

    /// Starts tmux again on this socket after its server died, with the `base` session
    /// [`TmuxServer::start`] made; panics unless it starts.
    pub fn restart(&self) {
        self.run_ok(&BASE_SESSION);
    }
}

/// Attaches a control-mode client (`tmux -C`, the way fleetd's backend does: at no size of its
/// own) to `session` with `tmux`, a command naming the server; its stdin and stdout piped.
pub fn attach_control(mut tmux: Command, session: &str) -> anyhow::Result<std::process::Child> {
    tmux.args(["-C", "attach-session", "-t", &format!("={session}")])
        .args(["-f", "ignore-size"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("tmux -C attach-session")
}

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

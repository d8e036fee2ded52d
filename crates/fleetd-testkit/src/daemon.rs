//! A `fleetd` process started for a test, with its own HOME, state and config directories. It is
//! killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::Duration;

/// The `fleetd` binary [`command`] runs, when not the one built next to the current
/// executable.
static FLEETD_BINARY: OnceLock<PathBuf> = OnceLock::new();

/// Makes [`command`] run `path` rather than the `fleetd` next to the current executable: the
/// demo is handed the binary that launched it (`fleetd demo`). Only the first call counts;
/// false when a binary was already chosen.
pub fn use_fleetd_binary(path: PathBuf) -> bool {
    FLEETD_BINARY.set(path).is_ok()
}

/// The `fleetd` binary [`command`] runs.
pub fn fleetd_binary() -> PathBuf {
    FLEETD_BINARY
        .get()
        .cloned()
        .unwrap_or_else(|| crate::bin_path("fleetd"))
}

/// The running process and where it listens.
#[derive(Debug)]
pub struct Daemon {
    /// The child process.
    pub child: Child,
    /// The bound address, read from its "listening" log line.
    pub addr: SocketAddr,
    /// Log lines (stderr) received so far are forwarded here.
    pub logs: mpsc::Receiver<String>,
    /// Lines already read (while waiting for the daemon to listen, or by
    /// [`Daemon::wait_for_log`]), kept for the log printed when a test fails.
    early: Vec<String>,
    /// The daemon's HOME.
    home: PathBuf,
}

/// A `fleetd` command isolated in `home`: HOME and XDG dirs point inside it, and the
/// multiplexer, daemon-URL, token and service-manager variables of the developer's own
/// session are removed.
pub fn command(home: &Path) -> Command {
    let mut cmd = Command::new(fleetd_binary());
    cmd.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("FLEETD_CONFIG")
        .env_remove("FLEETD_LOG")
        .env_remove("FLEETD_URL")
        .env_remove("FLEETD_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("TMUX")
        .env_remove("TMUX_PANE");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERDR_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Writes `yaml` as the daemon's default config file under `home`
/// (`$XDG_CONFIG_HOME/fleetd/fleetd.yaml`).
pub fn write_config(home: &Path, yaml: &str) {
    let dir = home.join("config").join("fleetd");
    std::fs::create_dir_all(&dir).expect("create config dir");
    std::fs::write(dir.join("fleetd.yaml"), yaml).expect("write config");
}

/// A config that keeps the daemon off every real multiplexer: tmux on a socket inside
/// `home` that no server listens on (so `/healthz` reports it down), unless the test wrote
/// its own config first.
pub fn isolated_config(home: &Path) -> String {
    format!(
        "multiplexer: tmux\ntmuxSocket: {}\n",
        home.join("no-tmux.sock").display()
    )
}

impl Daemon {
    /// Starts `fleetd serve --listen 127.0.0.1:0` plus `args` and waits until it listens.
    /// Without a config file in `home`, [`isolated_config`] is written first.
    pub fn start(home: &Path, args: &[&str]) -> Self {
        Self::start_on(home, "127.0.0.1:0", args)
    }

    /// Like [`Daemon::start`], listening on `listen` (e.g. the address of a daemon that was
    /// killed, so clients holding its URL reach the restarted one).
    pub fn start_on(home: &Path, listen: &str, args: &[&str]) -> Self {
        Self::start_with_env(home, listen, args, &[])
    }

    /// Like [`Daemon::start_on`], with `env` set on top of [`command`]'s (a user's own
    /// `PATH`: fleetd opens members' panes with it, as tmux takes a command client's `PATH`).
    pub fn start_with_env(
        home: &Path,
        listen: &str,
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        if !home.join("config/fleetd/fleetd.yaml").exists() {
            write_config(home, &isolated_config(home));
        }
        let mut cmd = command(home);
        cmd.envs(env.iter().map(|(k, v)| (k, v)))
            .args(["serve", "--listen", listen, "--log-format", "json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("fleetd starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, logs) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        let addr = loop {
            let line = logs
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| {
                    let _ = child.kill();
                    panic!("fleetd did not report listening; log so far: {seen:#?}")
                });
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line)
                && let Some(addr) = v.get("listen").and_then(|a| a.as_str())
            {
                break addr.parse().expect("listen field is an address");
            }
            seen.push(line);
        };
        let daemon = Self {
            child,
            addr,
            logs,
            early: seen,
            home: home.to_owned(),
        };
        // The operator's socket is bound just after the TCP listener (and a killed
        // daemon's stale file refuses connections until then).
        let socket = state_dir(home).join("api.sock");
        crate::wait_until(
            "fleetd's operator socket to accept",
            Duration::from_secs(30),
            || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        );
        daemon
    }

    /// The daemon's operator socket (`<state dir>/api.sock`): requests sent there come from
    /// the operator (this process, the daemon's own user, in no member's pane).
    pub fn operator(&self) -> crate::http::Endpoint {
        crate::http::Endpoint::Unix(state_dir(&self.home).join("api.sock"))
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How many inotify instances the daemon holds open (its config file watcher's).
    pub fn inotify_instances(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|fds| {
                fds.flatten()
                    .filter(|fd| {
                        std::fs::read_link(fd.path())
                            .is_ok_and(|l| l.as_os_str() == "anon_inode:inotify")
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// Sends `signal` (e.g. "TERM") to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits up to `timeout` for a log line (stderr) that `matches` and returns it; lines
    /// read on the way are kept for the failure print-out. Panics naming `what` on timeout.
    pub fn wait_for_log(
        &mut self,
        what: &str,
        timeout: Duration,
        mut matches: impl FnMut(&str) -> bool,
    ) -> String {
        let Self { logs, early, .. } = self;
        let mut found = None;
        crate::wait_until(what, timeout, || {
            while let Ok(line) = logs.try_recv() {
                let hit = matches(&line);
                early.push(line);
                if hit {
                    found = early.last().cloned();
                    return true;
                }
            }
            false
        });
        found.expect("wait_until returned, so a line matched")
    }

    /// Prints every log line received so far (read or not) to stderr: a failing check's
    /// evidence when the daemon is not dropped while panicking.
    pub fn print_logs(&mut self) {
        self.logs_so_far();
        eprintln!("---- fleetd log (pid {}) ----", self.child.id());
        for line in &self.early {
            eprintln!("{line}");
        }
    }

    /// Every log line the daemon wrote so far (reads what is waiting first).
    pub fn logs_so_far(&mut self) -> &[String] {
        while let Ok(line) = self.logs.try_recv() {
            self.early.push(line);
        }
        &self.early
    }

    /// Every log line read so far by [`Daemon::wait_for_log`] or while starting.
    pub fn seen_logs(&self) -> &[String] {
        &self.early
    }

    /// Waits up to `timeout` for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = &mut self.child;
        let mut status = None;
        crate::wait_until("fleetd to exit", timeout, || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        status.and_then(|s| s.code())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the daemon said: the first thing anyone needs.
        if std::thread::panicking() {
            eprintln!("---- fleetd log ----");
            for line in &self.early {
                eprintln!("{line}");
            }
            while let Ok(line) = self.logs.try_recv() {
                eprintln!("{line}");
            }
        }
    }
}

/// The state directory a daemon started in `home` uses by default.
pub fn state_dir(home: &Path) -> PathBuf {
    home.join("state").join("fleetd")
}

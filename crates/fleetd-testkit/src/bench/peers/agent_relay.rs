//! Agent Relay (npm `agent-relay`). Two builds are tried, each `npm install`ed into its own
//! prefix in the scratch dir:
//!
//! - **the latest** (9.x): its local broker (`agent-relay-broker init`, as `agent-relay local up`
//!   starts it) first creates a workspace on the vendor's Relaycast service over HTTPS and exits
//!   when it cannot; its error is the row's reason. Nothing else of it runs without that service.
//! - **1.6.0**, the last release whose daemon is self-contained (a Unix socket, SQLite at
//!   `messages.sqlite`): `agent-relay up --no-dashboard --no-spawn` in a scratch project, driven
//!   by the package's own client (`dist/wrapper/client.js`) from a node script: sender →
//!   receiver over the daemon (SEND → DELIVER push). Its wake-up: `agent-relay create-agent`
//!   wraps an idle stand-in agent (a python prompt loop) in its `relay-pty` binary, which types an
//!   incoming message into the agent's terminal once the terminal has been silent for its idle
//!   timeout; measured until the agent reads the typed line.
//!
//! relay-pty puts its socket and outbox at fixed paths in /tmp (`/tmp/relay-pty-NAME.sock`,
//! `/tmp/relay-outbox/NAME`); the agent's name carries this process's id and both are removed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{Peer, Scratch, Series, TEXT, WARMUP, installed, mark_installed, summary_us};
use crate::bench::mailbox::tail;

/// The last release with a self-contained local daemon.
const LOCAL_DAEMON_VERSION: &str = "1.6.0";
/// npm install of 1.6.0 compiles better-sqlite3 and node-pty (minutes on 2 cores).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// The latest broker's own start-up timeout is 45 s; it fails much sooner without the service.
const BROKER_TIMEOUT: Duration = Duration::from_secs(60);
const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Between wake-up rounds: relay-pty types only after 500 ms of silence in the terminal (its
/// default idle timeout), and the stand-in answers each line, so the agent is idle again first.
const WAKE_PACE_MS: u64 = 1000;
const DRIVER: &str = include_str!("agent_relay_driver.mjs");
const IDLE_AGENT: &str = include_str!("idle_agent.py");

/// Tries the latest build and measures 1.6.0.
pub(super) fn measure(
    scratch: &Scratch,
    rounds: usize,
    wake_rounds: usize,
) -> anyhow::Result<Vec<Peer>> {
    let latest = super::guarded_peer("Agent Relay (latest)", || {
        latest(&scratch.dir("agent-relay-latest")?)
    });
    let local = super::guarded_peer(&format!("Agent Relay {LOCAL_DAEMON_VERSION}"), || {
        local_daemon(&scratch.dir("agent-relay-1")?, rounds, wake_rounds)
    });
    Ok(vec![latest, local])
}

fn not_run(name: String, why: &str) -> Peer {
    Peer {
        name,
        readable: vec![Series::not_measured("send → read", why)],
        durable: "unknown: it did not run".to_owned(),
        wake: Series::not_measured("wake-up", why),
    }
}

fn latest(dir: &Path) -> anyhow::Result<Peer> {
    let version = npm_install(dir, "agent-relay")?;
    let broker = broker_binary(dir)?;
    let state = dir.join("state");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state)?;
    let log = dir.join("broker.log");
    let mut child = ProcessGroup::spawn(
        Command::new(&broker)
            .args([
                "init",
                "--instance-name",
                "fleetd-bench",
                "--channels",
                "general",
            ])
            .arg("--persist")
            .arg("--state-dir")
            .arg(&state)
            .current_dir(dir)
            .env("HOME", dir)
            .env("AGENT_RELAY_TELEMETRY_DISABLED", "1")
            .env("DO_NOT_TRACK", "1"),
        &log,
    )?;
    let why = match child.wait_timeout(BROKER_TIMEOUT)? {
        Some(status) => format!(
            "its broker exited ({status}) at start: {}",
            broker_error(&std::fs::read_to_string(&log).unwrap_or_default())
        ),
        None => "its broker started (so the Relaycast service was reachable), but this bench \
                 drives only the self-contained 1.x daemon"
            .to_owned(),
    };
    drop(child);
    Ok(not_run(format!("Agent Relay {version} (latest)"), &why))
}

fn local_daemon(dir: &Path, rounds: usize, wake_rounds: usize) -> anyhow::Result<Peer> {
    let version = npm_install(dir, &format!("agent-relay@{LOCAL_DAEMON_VERSION}"))?;
    let package = dir.join("node_modules/agent-relay");
    let run = dir.join("run");
    let _ = std::fs::remove_dir_all(&run);
    for sub in ["project", "home", "data"] {
        std::fs::create_dir_all(run.join(sub))?;
    }
    std::fs::write(run.join("driver.mjs"), DRIVER)?;
    std::fs::write(run.join("idle_agent.py"), IDLE_AGENT)?;
    let env = Env {
        cli: dir.join("node_modules/.bin/agent-relay"),
        run,
    };
    let (_daemon, socket) = env.start_daemon()?;
    let client = package.join("dist/wrapper/client.js");
    let deliver = env.driver("deliver", &client, &socket, rounds, &[]);
    let wake = env.wake(&client, &socket, wake_rounds);
    Ok(Peer {
        name: format!("Agent Relay {version}"),
        readable: vec![Series::new(
            "its client's sendMessage → the receiver's DELIVER",
            deliver,
        )],
        durable: "no: the daemon pushes the message to the receiver first and then writes it to \
                  SQLite without waiting (WAL, no fsync on that path: none seen with strace); \
                  the sender gets no acknowledgement"
            .to_owned(),
        wake: Series::new("relay-pty types it into the idle agent's terminal", wake),
    })
}

/// How 1.6.0 is run: its CLI, and the scratch run dir holding project, HOME and data dir.
struct Env {
    cli: PathBuf,
    run: PathBuf,
}

impl Env {
    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.run.join("project"))
            .env("HOME", self.run.join("home"))
            .env("AGENT_RELAY_DATA_DIR", self.run.join("data"))
            .env("AGENT_RELAY_TELEMETRY_DISABLED", "1")
            .env("DO_NOT_TRACK", "1")
            .stdin(Stdio::null());
        cmd
    }

    /// `agent-relay up` without dashboard or agents; its socket once it listens.
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark waits for a real daemon on the wall clock"
    )]
    fn start_daemon(&self) -> anyhow::Result<(ProcessGroup, PathBuf)> {
        let log = self.run.join("daemon.log");
        let mut cmd = self.command(&self.cli);
        cmd.args(["up", "--no-dashboard", "--no-spawn"]);
        let mut daemon = ProcessGroup::spawn(&mut cmd, &log)?;
        let start = std::time::Instant::now();
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(socket) = socket_path(&text)
                && text.contains("Listening")
                && socket.exists()
            {
                return Ok((daemon, socket));
            }
            if let Some(status) = daemon.try_wait()? {
                bail!(
                    "agent-relay up exited ({status}): {}",
                    tail(text.as_bytes())
                );
            }
            if start.elapsed() > DAEMON_START_TIMEOUT {
                bail!(
                    "agent-relay up did not listen within {} s: {}",
                    DAEMON_START_TIMEOUT.as_secs(),
                    tail(text.as_bytes())
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the node driver in `mode` (`deliver`, `wake`) to its end with what every mode takes
    /// (its client module, the daemon's socket, the rounds, the warm-up and the text) and
    /// `extra`; its samples.
    fn driver(
        &self,
        mode: &str,
        client: &Path,
        socket: &Path,
        rounds: usize,
        extra: &[&str],
    ) -> anyhow::Result<super::Summary> {
        let node = PathBuf::from("node");
        let out = self
            .command(&node)
            .arg(self.run.join("driver.mjs"))
            .arg(mode)
            .args([client, socket])
            .args([rounds.to_string(), WARMUP.to_string(), TEXT.to_owned()])
            .args(extra)
            .output()
            .context("node could not run")?;
        if !out.status.success() {
            bail!(
                "the node driver failed ({}): {}",
                out.status,
                tail(&out.stderr)
            );
        }
        summary_us(&parse_samples(&String::from_utf8_lossy(&out.stdout))?)
    }

    fn wake(&self, client: &Path, socket: &Path, rounds: usize) -> anyhow::Result<super::Summary> {
        let name = format!("FleetdBenchIdle{}", std::process::id());
        let log = self.run.join("idle-agent.log");
        let mut cmd = self.command(&self.cli);
        cmd.args([
            "create-agent",
            "-n",
            &name,
            "--skip-instructions",
            "--",
            "python3",
        ])
        .arg(self.run.join("idle_agent.py"))
        .arg(&log);
        let wrapper = ProcessGroup::spawn(&mut cmd, &self.run.join("create-agent.log"))?;
        let measured = self.driver(
            "wake",
            client,
            socket,
            rounds,
            &[&name, &log.display().to_string(), &WAKE_PACE_MS.to_string()],
        );
        drop(wrapper);
        // relay-pty's fixed paths outside the scratch dir.
        let _ = std::fs::remove_file(format!("/tmp/relay-pty-{name}.sock"));
        let _ = std::fs::remove_dir_all(format!("/tmp/relay-outbox/{name}"));
        let _ = std::fs::remove_dir("/tmp/relay-outbox");
        measured.map_err(|e| {
            let wrapper_log =
                std::fs::read_to_string(self.run.join("create-agent.log")).unwrap_or_default();
            e.context(format!(
                "create-agent log: {}",
                tail(wrapper_log.as_bytes())
            ))
        })
    }
}

/// `npm install SPEC` into `dir` (once, when `dir` is kept); the installed version.
fn npm_install(dir: &Path, spec: &str) -> anyhow::Result<String> {
    if !installed(dir) {
        std::fs::write(dir.join("package.json"), r#"{"private":true}"#)?;
        let log = dir.join("npm-install.log");
        let mut npm = ProcessGroup::spawn(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--no-update-notifier"])
                .arg("--prefix")
                .arg(dir)
                .arg(spec)
                .current_dir(dir)
                .stdin(Stdio::null()),
            &log,
        )
        .context("npm could not run")?;
        match npm.wait_timeout(INSTALL_TIMEOUT)? {
            Some(status) if status.success() => mark_installed(dir)?,
            Some(status) => bail!(
                "npm install {spec} failed ({status}): {}",
                tail(&std::fs::read(&log).unwrap_or_default())
            ),
            None => bail!(
                "npm install {spec} did not finish within {} min",
                INSTALL_TIMEOUT.as_secs() / 60
            ),
        }
    }
    let manifest = std::fs::read_to_string(dir.join("node_modules/agent-relay/package.json"))
        .context("agent-relay is not installed")?;
    let manifest: Value = serde_json::from_str(&manifest)?;
    manifest["version"]
        .as_str()
        .map(str::to_owned)
        .context("agent-relay's package.json names no version")
}

/// The broker binary the latest package ships for this platform (`@agent-relay/broker-*`).
fn broker_binary(dir: &Path) -> anyhow::Result<PathBuf> {
    let scope = dir.join("node_modules/@agent-relay");
    let entries = std::fs::read_dir(&scope).with_context(|| format!("no {}", scope.display()))?;
    for entry in entries.flatten() {
        let bin = entry.path().join("bin/agent-relay-broker");
        if entry.file_name().to_string_lossy().starts_with("broker-") && bin.exists() {
            return Ok(bin);
        }
    }
    bail!("the package ships no agent-relay-broker for this platform")
}

/// The `Socket:  PATH` line `agent-relay up` prints.
fn socket_path(log: &str) -> Option<PathBuf> {
    log.lines()
        .find_map(|l| l.trim().strip_prefix("Socket:"))
        .map(|p| PathBuf::from(p.trim()))
        .filter(|p| p.is_absolute())
}

/// The broker's error without its backtrace: `Error: ...` and `Caused by:` lines.
fn broker_error(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Stack backtrace"))
        .filter(|l| !l.is_empty() && !l.starts_with("[agent-relay] API listening"))
        .collect();
    if lines.is_empty() {
        "(no output)".to_owned()
    } else {
        lines.join(" ")
    }
}

/// The driver's `{"samples_us": [...]}` line.
fn parse_samples(stdout: &str) -> anyhow::Result<Vec<f64>> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("the driver printed no result: {stdout:?}"))?;
    let value: Value = serde_json::from_str(line)?;
    value["samples_us"]
        .as_array()
        .context("no samples_us")?
        .iter()
        .map(|v| v.as_f64().context("a sample is not a number"))
        .collect()
}

/// A child in a process group of its own (its helpers too: the CLI starts relay-pty), ended as
/// a whole when dropped; its output goes to a log file.
struct ProcessGroup {
    child: Child,
    /// Whether the leader was reaped: then its id may no longer be ours to signal.
    reaped: bool,
}

impl ProcessGroup {
    fn spawn(cmd: &mut Command, log: &Path) -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let out = std::fs::File::create(log)?;
        let child = cmd
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .with_context(|| format!("{:?} could not start", cmd.get_program()))?;
        Ok(Self {
            child,
            reaped: false,
        })
    }

    fn try_wait(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let status = self.child.try_wait()?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark waits for a real process on the wall clock"
    )]
    fn wait_timeout(
        &mut self,
        limit: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let start = std::time::Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(None)
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let Ok(id) = i32::try_from(self.child.id()) else {
            return;
        };
        if let Some(pid) = rustix::process::Pid::from_raw(id) {
            let _ = rustix::process::kill_process_group(pid, signal);
        }
    }
}

impl Drop for ProcessGroup {
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark gives real processes a moment to exit cleanly"
    )]
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // TERM first (the daemon removes its pid file and socket on it), then KILL whatever is
        // left; the leader is not reaped until after both, so the group id is still ours.
        self.signal(rustix::process::Signal::TERM);
        std::thread::sleep(Duration::from_millis(500));
        self.signal(rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_socket_comes_from_its_banner() {
        let log =
            "Project: /tmp/x/proj\nSocket:  /tmp/x/data/84bad4c54166/relay.sock\n[INFO] Listening";
        assert_eq!(
            socket_path(log),
            Some(PathBuf::from("/tmp/x/data/84bad4c54166/relay.sock"))
        );
        assert_eq!(socket_path("Socket: relative.sock"), None);
        assert_eq!(socket_path("Daemon started."), None);
    }

    #[test]
    fn the_brokers_error_drops_its_backtrace() {
        let stderr = "[agent-relay] API listening on http://127.0.0.1:1\nError: failed to initialize relaycast session\n\nCaused by:\n    HTTP error: error sending request\n\nStack backtrace:\n   0: <unknown>\n";
        assert_eq!(
            broker_error(stderr),
            "Error: failed to initialize relaycast session Caused by: HTTP error: error sending request"
        );
        assert_eq!(broker_error(""), "(no output)");
    }

    #[test]
    fn the_drivers_samples_are_its_last_json_line() {
        assert_eq!(
            parse_samples("noise\n{\"samples_us\": [1.5, 20]}\n").unwrap(),
            vec![1.5, 20.0]
        );
        assert!(parse_samples("no result").is_err());
        assert!(parse_samples("{\"samples_us\": [\"x\"]}").is_err());
    }
}

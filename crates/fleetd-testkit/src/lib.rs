//! Shared helpers for fleetd's tests and demo: locating built binaries, waiting for conditions, and
//! requiring external services (tmux, RabbitMQ). Never used by the daemon itself.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// The address of the local RabbitMQ the tests use.
pub const RABBITMQ_ADDR: &str = "127.0.0.1:5672";
/// The AMQP URL of the local RabbitMQ (Debian's default guest account, loopback only).
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// True when running under CI (`CI` set to anything but `false`/`0`/empty).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Path of a binary built from this workspace (`fleetd`, `fake-herdr`, `sim-agent`, ...).
///
/// Integration tests run from `target/<profile>/deps/`; workspace binaries sit one level up
/// (the benchmark binary itself sits with them). Cargo
/// only exports `CARGO_BIN_EXE_*` for a package's own binaries, so the daemon's binary is found by
/// this path (it must be built first: `cargo build --workspace --bins`, as `.ci/run` does). Panics
/// with a build hint when the binary is missing, since nothing can be tested then.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let parent = exe.parent().expect("an executable lives in a directory");
    // Test binaries run from target/<profile>/deps; the bench and demo from target/<profile>.
    let dir = if parent.ends_with("deps") {
        parent.parent().expect("deps has a parent")
    } else {
        parent
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace --bins` first (.ci/run does)",
        path.display()
    );
    path
}

/// The environment of process `pid`, from `/proc` (what a spawned member or lead really got).
pub fn environ(pid: u32) -> std::collections::HashMap<String, String> {
    procfs::process::Process::new(i32::try_from(pid).expect("pid fits"))
        .and_then(|p| p.environ())
        .expect("environ readable")
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// Outcome of asking for an external service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// The service is there: run the test.
    Present,
    /// Not there and not under CI: the caller returns early (a reason was printed).
    Skip,
}

/// Requires an external service. Under CI a missing service fails the test with `how_to_start`;
/// locally the test is skipped with a printed reason.
pub fn require(name: &str, present: bool, how_to_start: &str) -> Service {
    if present {
        return Service::Present;
    }
    if is_ci() {
        panic!("{name} is required under CI=true but was not found. {how_to_start}");
    }
    eprintln!("SKIPPED: {name} not available ({how_to_start})");
    Service::Skip
}

/// Requires the RabbitMQ broker on 127.0.0.1:5672.
pub fn require_rabbitmq() -> Service {
    let addr: SocketAddr = RABBITMQ_ADDR.parse().expect("constant address parses");
    let up = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok();
    require(
        "RabbitMQ on 127.0.0.1:5672",
        up,
        "Start it with `rabbitmq-server -detached` (or run .ci/run, which installs and starts it).",
    )
}

/// Requires a `tmux` binary on PATH.
pub fn require_tmux() -> Service {
    let found = std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    require(
        "tmux",
        found,
        "Install it with `apt-get install -y tmux` (.ci/run does this).",
    )
}

/// A free loopback port (bound and released: the daemon takes it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; panics naming `what` on timeout.
/// Tests wait for conditions with this, never with a bare sleep.
#[expect(
    clippy::disallowed_methods,
    reason = "a test helper polling a real process on the wall clock"
)]
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub mod agents;
pub mod bench;
pub mod broker;
pub mod browser;
pub mod cluster;
pub mod demo;
pub mod proxy;

/// A minimal HTTP/1.1 client for tests: one request per connection, `Connection: close`, over
/// TCP or the daemon's operator socket.
pub mod http {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;
    use std::time::Duration;

    /// A response: status code and body text.
    #[derive(Debug, Clone)]
    pub struct Response {
        /// The HTTP status code.
        pub status: u16,
        /// The body, as text.
        pub body: String,
        /// The status line and headers, as sent.
        pub head: String,
    }

    impl Response {
        /// Every value of header `name` (case-insensitive), in order.
        pub fn headers(&self, name: &str) -> Vec<&str> {
            self.head
                .lines()
                .skip(1)
                .filter_map(|line| line.split_once(':'))
                .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
                .map(|(_, v)| v.trim())
                .collect()
        }

        /// The body parsed as JSON; panics with the body when it is not JSON.
        pub fn json(&self) -> serde_json::Value {
            serde_json::from_str(&self.body)
                .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body))
        }

        /// The JSON `error` code of a refusal (empty when there is none).
        pub fn error_code(&self) -> String {
            serde_json::from_str::<serde_json::Value>(&self.body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_default()
        }
    }

    /// Where a request goes.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Endpoint {
        /// The daemon's TCP listener: the caller is whatever this process is (in no pane: an
        /// anonymous caller, unless it presents the token).
        Tcp(SocketAddr),
        /// The daemon's operator socket (`<state dir>/api.sock`): this process is the operator.
        Unix(PathBuf),
    }

    impl From<SocketAddr> for Endpoint {
        fn from(addr: SocketAddr) -> Self {
            Self::Tcp(addr)
        }
    }

    impl From<&Endpoint> for Endpoint {
        fn from(endpoint: &Endpoint) -> Self {
            endpoint.clone()
        }
    }

    /// Sends one request and reads the whole response.
    pub fn request(
        to: impl Into<Endpoint>,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<Response> {
        request_with(to, method, path, &[], body)
    }

    /// Sends one request with extra `headers` (a `Host` among them replaces the default one:
    /// the address connected to, or `localhost` on the unix socket) and reads the response.
    pub fn request_with(
        to: impl Into<Endpoint>,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> std::io::Result<Response> {
        let to = to.into();
        let body = body.unwrap_or("");
        let default_host = match &to {
            Endpoint::Tcp(addr) => addr.to_string(),
            Endpoint::Unix(_) => "localhost".to_owned(),
        };
        let host = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map_or(default_host.as_str(), |(_, v)| *v);
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("host"))
        {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let raw = match to {
            Endpoint::Tcp(addr) => {
                let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
                stream.set_read_timeout(Some(Duration::from_secs(150)))?;
                exchange(&mut stream, &head, body)?
            }
            Endpoint::Unix(path) => {
                let mut stream = UnixStream::connect(path)?;
                stream.set_read_timeout(Some(Duration::from_secs(150)))?;
                exchange(&mut stream, &head, body)?
            }
        };
        Ok(parse(&raw))
    }

    fn exchange(
        stream: &mut (impl Read + Write),
        head: &str,
        body: &str,
    ) -> std::io::Result<Vec<u8>> {
        stream.write_all(head.as_bytes())?;
        stream.write_all(body.as_bytes())?;
        // Up to the end of the stream, or of the body its `Content-Length` announces: some
        // servers (chromedriver) say `Connection: close` and keep the socket open.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                return Ok(raw);
            }
            raw.extend_from_slice(&buf[..n]);
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n")
                && let Some(length) = content_length(&raw[..end])
                && raw.len() >= end + 4 + length
            {
                return Ok(raw);
            }
        }
    }

    /// The `Content-Length` of a response head, when it has one.
    fn content_length(head: &[u8]) -> Option<usize> {
        String::from_utf8_lossy(head)
            .lines()
            .skip(1)
            .filter_map(|line| line.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
    }

    fn parse(raw: &[u8]) -> Response {
        let text = String::from_utf8_lossy(raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        Response {
            status,
            body,
            head: head.to_owned(),
        }
    }

    /// Sends `GET path`.
    pub fn get(to: impl Into<Endpoint>, path: &str) -> std::io::Result<Response> {
        request(to, "GET", path, None)
    }

    /// Acknowledges every reply pending in `target`'s inbox (REST peek, then an ack for each),
    /// as the operator when `to` is the operator socket; returns how many.
    pub fn ack_all(to: impl Into<Endpoint>, target: &str) -> std::io::Result<usize> {
        let to = to.into();
        let replies = get(&to, &format!("/sessions/{target}/replies"))?.json();
        let mut acked = 0;
        for reply in replies["replies"].as_array().into_iter().flatten() {
            if let Some(id) = reply["msgId"].as_str() {
                request(
                    &to,
                    "POST",
                    &format!("/sessions/{target}/replies/{id}/ack"),
                    None,
                )?;
                acked += 1;
            }
        }
        Ok(acked)
    }

    /// The texts of the replies pending in `target`'s inbox, oldest first (REST peek, as the
    /// operator when `to` is the operator socket); empty when the daemon does not answer.
    pub fn reply_texts(to: impl Into<Endpoint>, target: &str) -> Vec<String> {
        get(to, &format!("/sessions/{target}/replies")).map_or_else(
            |_| Vec::new(),
            |r| {
                r.json()["replies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["text"].as_str().map(str::to_owned))
                    .collect()
            },
        )
    }

    /// Every reply pending in `target`'s inbox as `(msgId, text)`, oldest first, read a page of
    /// 100 at a time ([`reply_texts`] reads only the first page); empty when the daemon does
    /// not answer.
    pub fn all_replies(to: impl Into<Endpoint>, target: &str) -> Vec<(String, String)> {
        let to = to.into();
        let mut all = Vec::new();
        loop {
            let path = match all.last() {
                Some((after, _)) => format!("/sessions/{target}/replies?limit=100&after={after}"),
                None => format!("/sessions/{target}/replies?limit=100"),
            };
            let Ok(page) = get(to.clone(), &path).map(|r| r.json()) else {
                return all;
            };
            let before = all.len();
            all.extend(
                page["replies"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| {
                        Some((
                            m["msgId"].as_str()?.to_owned(),
                            m["text"].as_str()?.to_owned(),
                        ))
                    }),
            );
            if page["more"] != true || all.len() == before {
                return all;
            }
        }
    }

    fn dechunk(mut rest: &str) -> String {
        let mut out = String::new();
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                break;
            };
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    }
}

/// A `fleetd` process started for a test, with its own HOME, state and config directories. It is
/// killed when dropped.
pub mod daemon {
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
}
pub mod fake_herdr;
pub mod fake_model;
pub mod flood;
pub mod recovery;
pub mod rig;
pub mod rig_herdr;
pub mod sim_agent;
pub mod sse;
pub mod tls;
pub mod tmux;

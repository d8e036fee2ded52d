//! fake-herdr: a herdr server for tests and the demo, behaving as herdr 0.8.2 (protocol 20, the
//! default) or 0.9 (protocol 22; see `version` for what differs and what it is modelled on). NDJSON on a unix socket, one
//! request per connection, `params` required, herdr's result `type` tags and error codes, lifecycle
//! subscription replay, real PTY panes (so `/proc` identity works) with herdr-style agent detection
//! (see `pane`), and fault injection over a separate control socket. It is a test double: it must
//! never be used by the daemon, and it implements only the methods fleetd calls (plus a few
//! neighbours); anything else gets `invalid_request`.
//!
//! Control socket (`--control PATH`, default `<socket>.ctl`), one JSON line per connection, answered
//! with `{"ok":true}` or `{"ok":false,"error":..}`:
//! - `{"fault":"drop","count":N}` — accept and immediately close the next N API connections;
//! - `{"fault":"delay","ms":M}` — hold every API response for M ms (0 turns it off);
//! - `{"fault":"agent_not_found","count":N}` — the next N `agent.*` requests fail `agent_not_found`;
//! - `{"fault":"input_timeout","count":N,"ms":M}` — the next N `agent.prompt` / `pane.send_input`
//!   requests are carried out (their text reaches the pane) and answered only M ms later:
//!   `agent.prompt` with a `wait` with herdr's `timeout` error, as herdr answers when the status
//!   wait of a prompt it has already typed runs out (herdr v0.8.2 `src/api/wait.rs:206-213` types the prompt
//!   before any wait, `:492` and `:617-618` answer `timeout`); `pane.send_input` with its usual
//!   `ok`, as herdr answers an ordinary request whenever its app loop gets to it (v0.8.2
//!   `src/api/server.rs:379` dispatches it with no timeout, so herdr never answers `timeout`
//!   there) — a client with a shorter timeout sees no answer to a request that was applied;
//! - `{"fault":"restart","down_ms":M}` — like a herdr restart: subscriptions drop, the socket is
//!   gone for M ms, every pane comes back with the same pane id, a new terminal id and a fresh
//!   shell, and the event ring is empty;
//! - `{"fault":"enter_fails","count":N}` — the Enter of the next N `agent.prompt` requests is
//!   not written: on 0.8 silently (herdr schedules it after answering), on 0.9 answered
//!   `agent_prompt_failed` after the text was typed;
//! - `{"fault":"events_lost","ms":M,"linger_ms":L}` (0.9 only) — every subscription open now
//!   drops its events for M ms, then gets `events_lost` and is closed L ms later (default 0);
//! - `{"fault":"group","workspace_id":ID}` — puts a workspace in a (worktree) group, which a 0.9
//!   `workspace.close` refuses without `close_group: true`;
//! - `{"fault":"clear"}` — no faults.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

mod agent;
mod api;
mod detect;
mod pane;
pub mod process;
mod shapes;
mod state;
mod subscribe;
pub mod version;

use pane::{PaneHost, PaneIdentity, PaneRt, PaneSpec};
use state::{EventHub, Topology};
pub use version::HerdrVersion;

/// The protocol number `ping` reports by default.
pub const PROTOCOL: u32 = 20;
/// The version `ping` reports by default.
pub const VERSION: &str = "0.8.0";
/// Bound on the request line, as herdr's.
const MAX_REQUEST_BYTES: usize = 1024 * 1024;
/// How long a client has to send its request line, as herdr's.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How to run a fake-herdr.
#[derive(Debug, Clone)]
pub struct Options {
    /// The API socket.
    pub socket: PathBuf,
    /// The control socket; `None` means `<socket>.ctl`.
    pub control: Option<PathBuf>,
    /// The default shell of new panes.
    pub shell: String,
    /// Version reported by `ping`.
    pub version: String,
    /// Protocol reported by `ping`.
    pub protocol: u32,
    /// Which herdr's behaviour to show (see `version`).
    pub herdr: HerdrVersion,
    /// Rows of every pane's screen.
    pub rows: u16,
    /// Where to append a line for each agent status event once it is written to a
    /// subscriber (`at_us`, wall clock µs; `pane_id`; `agent_status`): the moment herdr reported
    /// a status (detection plus its subscription poll), for benchmarks that split a latency into
    /// herdr's part and fleetd's.
    pub status_log: Option<PathBuf>,
}

impl Options {
    /// Defaults for `socket`: `/bin/sh` panes, version 0.8.0, protocol 20.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            control: None,
            shell: "/bin/sh".to_owned(),
            version: VERSION.to_owned(),
            protocol: PROTOCOL,
            herdr: HerdrVersion::V0_8,
            rows: pane::ROWS,
            status_log: None,
        }
    }

    /// Behaves as `herdr`, reporting its version and protocol.
    pub fn with_herdr(mut self, herdr: HerdrVersion) -> Self {
        self.herdr = herdr;
        self.version = herdr.version().to_owned();
        self.protocol = herdr.protocol();
        self
    }

    /// The control socket path in effect.
    pub fn control_path(&self) -> PathBuf {
        self.control.clone().unwrap_or_else(|| {
            let mut name = self.socket.clone().into_os_string();
            name.push(".ctl");
            PathBuf::from(name)
        })
    }
}

#[derive(Debug, Default)]
struct Faults {
    drop: u32,
    delay_ms: u64,
    agent_not_found: u32,
    /// Input requests still to answer late, and how late.
    input_timeout: u32,
    input_timeout_ms: u64,
    /// `agent.prompt` Enters still to lose.
    enter_fails: u32,
}

/// The `events_lost` fault: subscriptions open before `epoch` was bumped drop their events until
/// `until`, then end with `events_lost`, their connection closed `linger_ms` later.
#[derive(Debug, Default)]
struct Loss {
    epoch: u64,
    until: Option<tokio::time::Instant>,
    linger_ms: u64,
}

/// A running fake-herdr server (in this process).
#[derive(Debug)]
pub struct Server {
    opts: Options,
    topo: Mutex<Topology>,
    hub: Mutex<EventHub>,
    faults: Mutex<Faults>,
    loss: Mutex<Loss>,
    /// Bumped by every restart; subscriptions of an older generation end.
    generation: AtomicU64,
    restart: tokio::sync::Notify,
    restart_down_ms: AtomicU64,
    terminal_counter: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs a fake-herdr until the process ends (or `server.stop`). `FAKE_HERDR_VERSION` (see
/// [`version::ENV`]), when set, picks the herdr to behave as (the `fake-herdr` binary's way of
/// choosing it): its version and protocol are reported unless `opts` already names others.
pub async fn serve(mut opts: Options) -> anyhow::Result<()> {
    if let Some(herdr) = std::env::var(version::ENV).ok().filter(|v| !v.is_empty()) {
        let herdr: HerdrVersion = herdr.parse().map_err(anyhow::Error::msg)?;
        let (version, protocol) = (opts.version.clone(), opts.protocol);
        opts = opts.with_herdr(herdr);
        if version != VERSION {
            opts.version = version;
        }
        if protocol != PROTOCOL {
            opts.protocol = protocol;
        }
    }
    let server = Server::new(opts);
    server.run().await
}

impl Server {
    /// A server that is not listening yet.
    pub fn new(opts: Options) -> Arc<Self> {
        Arc::new(Self {
            opts,
            topo: Mutex::new(Topology::default()),
            hub: Mutex::new(EventHub::default()),
            faults: Mutex::new(Faults::default()),
            loss: Mutex::new(Loss::default()),
            generation: AtomicU64::new(0),
            restart: tokio::sync::Notify::new(),
            restart_down_ms: AtomicU64::new(0),
            terminal_counter: AtomicU64::new(0),
        })
    }

    /// Listens on the API and control sockets and serves until `server.stop`.
    pub async fn run(self: &Arc<Self>) -> anyhow::Result<()> {
        let control_path = self.opts.control_path();
        let _ = std::fs::remove_file(&control_path);
        let control = UnixListener::bind(&control_path)?;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Ok((stream, _)) = control.accept().await {
                let me = Arc::clone(&me);
                tokio::spawn(async move { me.handle_control(stream).await });
            }
        });
        loop {
            let _ = std::fs::remove_file(&self.opts.socket);
            let listener = UnixListener::bind(&self.opts.socket)?;
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let me = Arc::clone(self);
                        tokio::spawn(async move { me.handle_connection(stream).await });
                    }
                    () = self.restart.notified() => break,
                }
            }
            drop(listener);
            let _ = std::fs::remove_file(&self.opts.socket);
            self.restart_panes().await;
        }
    }

    /// Creates a pane process; the caller records it in the topology.
    fn spawn_pane(
        self: &Arc<Self>,
        pane_id: &str,
        tab_id: &str,
        workspace_id: &str,
        spec: PaneSpec,
    ) -> anyhow::Result<Arc<PaneRt>> {
        let identity = PaneIdentity {
            pane_id: pane_id.to_owned(),
            tab_id: tab_id.to_owned(),
            workspace_id: workspace_id.to_owned(),
            terminal_id: self.new_terminal_id(),
            socket: self.opts.socket.clone(),
        };
        let host: Arc<dyn PaneHost> = Arc::new(Host(Arc::downgrade(self)));
        PaneRt::spawn(identity, spec, &self.opts.shell, self.opts.rows, host)
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "herdr makes its terminal ids from the wall clock, and so does the fake"
    )]
    fn new_terminal_id(&self) -> String {
        // herdr: `term_<hex unix micros><hex counter>`. The v7 UUID carries the wall time.
        let (secs, nanos) = uuid::Uuid::now_v7()
            .get_timestamp()
            .map(|t| t.to_unix())
            .unwrap_or((0, 0));
        let micros = secs * 1_000_000 + u64::from(nanos / 1000);
        let counter = self.terminal_counter.fetch_add(1, Ordering::Relaxed);
        format!("term_{micros:x}{counter:x}")
    }

    fn push_event(&self, kind: &str, data: Value) {
        lock(&self.hub).push(kind, data);
    }

    async fn restart_panes(self: &Arc<Self>) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        let panes: Vec<Arc<PaneRt>> = lock(&self.topo).panes.values().cloned().collect();
        for pane in &panes {
            pane.kill();
        }
        for _ in 0..100 {
            if panes.iter().all(|p| p.is_exited()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lock(&self.hub).clear();
        let down = self.restart_down_ms.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(down)).await;
        // Restored panes keep their ids and get new terminal ids and fresh shells.
        for old in panes {
            let spec = PaneSpec {
                command: None,
                env: Default::default(),
                cwd: old.spec.cwd.clone(),
                label: old.spec.label.clone(),
            };
            let id = &old.identity;
            match self.spawn_pane(&id.pane_id, &id.tab_id, &id.workspace_id, spec) {
                Ok(fresh) => {
                    lock(&self.topo).panes.insert(id.pane_id.clone(), fresh);
                }
                Err(e) => eprintln!("fake-herdr: could not restore {}: {e}", id.pane_id),
            }
        }
    }

    async fn handle_control(self: Arc<Self>, stream: UnixStream) {
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line)
            .await
            .is_err()
        {
            return;
        }
        let reply = match self.apply_fault(&line) {
            Ok(()) => json!({ "ok": true }),
            Err(e) => json!({ "ok": false, "error": e }),
        };
        let mut stream = reader.into_inner();
        let _ = stream.write_all(format!("{reply}\n").as_bytes()).await;
    }

    fn apply_fault(&self, line: &str) -> Result<(), String> {
        let v: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        let count = || {
            v.get("count")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
        };
        let mut faults = lock(&self.faults);
        match v.get("fault").and_then(Value::as_str) {
            Some("drop") => faults.drop = count(),
            Some("delay") => faults.delay_ms = v.get("ms").and_then(Value::as_u64).unwrap_or(0),
            Some("agent_not_found") => faults.agent_not_found = count(),
            Some("input_timeout") => {
                faults.input_timeout = count();
                faults.input_timeout_ms = v.get("ms").and_then(Value::as_u64).unwrap_or(0);
            }
            Some("enter_fails") => faults.enter_fails = count(),
            Some("events_lost") if self.opts.herdr.has_events_lost() => {
                let ms = v.get("ms").and_then(Value::as_u64).unwrap_or(0);
                let mut loss = lock(&self.loss);
                loss.epoch += 1;
                loss.until = Some(tokio::time::Instant::now() + Duration::from_millis(ms));
                loss.linger_ms = v.get("linger_ms").and_then(Value::as_u64).unwrap_or(0);
            }
            Some("events_lost") => return Err("herdr 0.8 has no events_lost".to_owned()),
            Some("group") => {
                let id = v.get("workspace_id").and_then(Value::as_str).unwrap_or("");
                version::group(self, id)?;
            }
            Some("clear") => *faults = Faults::default(),
            Some("restart") => {
                let down = v.get("down_ms").and_then(Value::as_u64).unwrap_or(300);
                self.restart_down_ms.store(down, Ordering::Relaxed);
                self.restart.notify_one();
            }
            other => return Err(format!("unknown fault {other:?}")),
        }
        Ok(())
    }

    async fn handle_connection(self: Arc<Self>, mut stream: UnixStream) {
        {
            let mut faults = lock(&self.faults);
            if faults.drop > 0 {
                faults.drop -= 1;
                return; // dropping the stream closes it without a response
            }
        }
        let line = match tokio::time::timeout(REQUEST_TIMEOUT, read_request_line(&mut stream)).await
        {
            Ok(Ok(Some(line))) => line,
            _ => return,
        };
        let line = line.trim();
        if line.is_empty() {
            return;
        }
        let delay = lock(&self.faults).delay_ms;
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let response = match api::parse_request(line) {
            Err(error) => error,
            Ok(mut request) => {
                if request.method == "events.subscribe" {
                    subscribe::subscribe(&self, request, stream).await;
                    return;
                }
                let injected = request.method.starts_with("agent.") && {
                    let mut faults = lock(&self.faults);
                    let hit = faults.agent_not_found > 0;
                    faults.agent_not_found = faults.agent_not_found.saturating_sub(u32::from(hit));
                    hit
                };
                if matches!(request.method.as_str(), "agent.prompt" | "pane.send_input") {
                    let mut faults = lock(&self.faults);
                    if faults.input_timeout > 0 {
                        faults.input_timeout -= 1;
                        request.late_ms = Some(faults.input_timeout_ms);
                    }
                }
                if injected {
                    api::error(
                        &request.id,
                        "agent_not_found",
                        "agent not found (injected fault)",
                    )
                } else {
                    api::dispatch(&self, request).await
                }
            }
        };
        let _ = stream.write_all(format!("{response}\n").as_bytes()).await;
        let _ = stream.flush().await;
    }

    fn server_stop(&self) {
        let panes: Vec<Arc<PaneRt>> = lock(&self.topo).panes.values().cloned().collect();
        for pane in panes {
            pane.kill();
        }
        let _ = std::fs::remove_file(&self.opts.socket);
        let _ = std::fs::remove_file(self.opts.control_path());
    }
}

/// Reads the single request line (bounded like herdr's).
async fn read_request_line(stream: &mut UnixStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok((!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned()));
        }
        if let Some(pos) = chunk[..n].iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&chunk[..pos]);
            return Ok(Some(String::from_utf8_lossy(&buf).into_owned()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST_BYTES {
            return Ok(None);
        }
    }
}

/// Appends one status report to the `--status-log` file.
#[expect(
    clippy::disallowed_methods,
    reason = "the status log is compared with the agents' wall-clock logs"
)]
pub(super) fn log_status(path: &std::path::Path, pane_id: &str, status: impl serde::Serialize) {
    use std::io::Write as _;
    let at_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let line = json!({ "at_us": at_us, "pane_id": pane_id, "agent_status": status });
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}

/// The server's side of pane callbacks (weak, so panes do not keep a stopped server alive).
struct Host(std::sync::Weak<Server>);

impl PaneHost for Host {
    fn status_changed(&self, pane: &Arc<PaneRt>) {
        let Some(server) = self.0.upgrade() else {
            return;
        };
        if !server.is_current(pane) {
            return;
        }
        let d = pane.detected();
        server.push_event(
            "pane_agent_status_changed",
            json!({
                "pane_id": pane.identity.pane_id,
                "workspace_id": pane.identity.workspace_id,
                "agent_status": d.status,
                "agent": d.agent,
                // The metadata title (`pane.report_metadata`), never the OSC one: none here.
                "title": null,
                "display_agent": d.agent,
                "state_labels": {},
            }),
        );
    }

    fn exited(&self, pane: &Arc<PaneRt>) {
        let Some(server) = self.0.upgrade() else {
            return;
        };
        if !server.is_current(pane) {
            return;
        }
        let id = &pane.identity;
        server.push_event(
            "pane_exited",
            json!({ "pane_id": id.pane_id, "workspace_id": id.workspace_id }),
        );
        let events = lock(&server.topo).remove_pane(&id.pane_id);
        for (kind, data) in events {
            server.push_event(kind, data);
        }
    }
}

impl Server {
    /// Whether `pane` is still the live runtime of its pane id (not a pre-restart one).
    fn is_current(&self, pane: &Arc<PaneRt>) -> bool {
        lock(&self.topo)
            .panes
            .get(&pane.identity.pane_id)
            .is_some_and(|p| Arc::ptr_eq(p, pane))
    }

    /// Kills every pane's session and removes the sockets (what `server.stop` does, minus the
    /// process exit), for in-process users such as the benchmark.
    pub fn stop(&self) {
        self.server_stop();
    }

    /// The API socket.
    pub fn socket(&self) -> &Path {
        &self.opts.socket
    }
}

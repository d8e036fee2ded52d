//! Processes that call fleetd's MCP tools from inside a pane, so fleetd identifies them as a lead
//! or a member the way it identifies real agents (TCP peer → pid → pane), driven over a control
//! socket by the benchmark: `fleetd-bench pane-client [CONTROL_ADDR]` (fleetd's URL in
//! `FLEETD_URL`). Each call is timed inside the pane process around its keep-alive HTTP
//! exchange, so the control hop is not counted. Without `CONTROL_ADDR` the client only opens its
//! MCP session (its presence) and then idles: an idle member. Also [`HerdrFleet`], fake-herdr
//! plus the built `fleetd` with a lead client in a lead tab. Benchmarks, and the end-to-end tests
//! that need members answering at a measured pace (the connection-flood test).

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::daemon::{Daemon, write_config};
use crate::fake_herdr::process::FakeHerdrProcess;
use crate::http::mcp::McpConn;
use crate::{bin_path, wait_until};

/// How long a pane process has to connect back after it was started.
const CONNECT_BACK: Duration = Duration::from_secs(60);

/// Pane mode: `args` are what follows `pane-client`.
pub fn serve(args: &[String]) -> anyhow::Result<()> {
    let url = std::env::var("FLEETD_URL").context("FLEETD_URL is not set")?;
    let mut first = McpConn::connect_url(&url)?;
    first.initialize()?;
    let Some(control) = args.first() else {
        // An idle member: keep the pane's process alive until the pane is closed.
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin();
        while stdin.read(&mut sink).is_ok_and(|n| n > 0) {}
        return Ok(());
    };
    let stream = TcpStream::connect(control).with_context(|| format!("connect {control}"))?;
    let writer = Arc::new(Mutex::new(stream.try_clone()?));
    let pool = Arc::new(Mutex::new(vec![first]));
    send(&writer, &json!({ "hello": std::process::id() }))?;
    for line in BufReader::new(stream).lines() {
        let request: Value = serde_json::from_str(&line?)?;
        let (writer, pool, url) = (Arc::clone(&writer), Arc::clone(&pool), url.clone());
        std::thread::spawn(move || {
            let answer = match call(&pool, &url, &request) {
                Ok((took, result)) => {
                    json!({ "id": request["id"], "us": took.as_micros() as u64, "result": result })
                }
                Err(e) => json!({ "id": request["id"], "error": format!("{e:#}") }),
            };
            let _ = send(&writer, &answer);
        });
    }
    Ok(())
}

fn send(writer: &Mutex<TcpStream>, value: &Value) -> anyhow::Result<()> {
    let mut writer = writer
        .lock()
        .map_err(|_| anyhow::anyhow!("writer poisoned"))?;
    writer.write_all(format!("{value}\n").as_bytes())?;
    Ok(())
}

/// One tool call on a pooled keep-alive connection (a new one when all are busy).
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a call on the wall clock"
)]
fn call(
    pool: &Mutex<Vec<McpConn>>,
    url: &str,
    request: &Value,
) -> anyhow::Result<(Duration, Value)> {
    let taken = pool
        .lock()
        .ok()
        .and_then(|mut p| std::iter::from_fn(|| p.pop()).find(|c| !c.is_closed()));
    let mut conn = match taken {
        Some(conn) => conn,
        None => McpConn::connect_url(url)?,
    };
    let tool = request["tool"].as_str().context("no tool")?;
    let start = std::time::Instant::now();
    let result = conn.call_tool(tool, &request["args"])?;
    let took = start.elapsed();
    if let Ok(mut p) = pool.lock() {
        p.push(conn);
    }
    Ok((took, result))
}

/// Where pane clients connect back to.
#[derive(Debug)]
pub struct Control {
    addr: SocketAddr,
    accepted: mpsc::Receiver<std::io::Result<TcpStream>>,
}

impl Control {
    /// Listens on a loopback port.
    pub fn bind() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let (tx, accepted) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if tx.send(stream).is_err() {
                    break;
                }
            }
        });
        Ok(Self { addr, accepted })
    }

    /// The address to give pane clients.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The next pane client that connected back.
    pub fn accept(&self) -> anyhow::Result<PaneClient> {
        let stream = self
            .accepted
            .recv_timeout(CONNECT_BACK)
            .context("no pane client connected back")??;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut hello = String::new();
        reader.read_line(&mut hello)?;
        let hello: Value = serde_json::from_str(&hello).context("pane client hello")?;
        Ok(PaneClient {
            pid: hello["hello"].as_u64().context("hello carries a pid")? as u32,
            writer: stream,
            reader,
            next_id: 0,
        })
    }
}

/// A pane client, seen from the benchmark.
#[derive(Debug)]
pub struct PaneClient {
    /// Its process id (the pane's session leader).
    pub pid: u32,
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    next_id: u64,
}

/// One answered call: how long the MCP exchange took in the pane process, and its result.
#[derive(Debug)]
pub struct Timed {
    /// The exchange, as timed by the pane process.
    pub took: Duration,
    /// The JSON-RPC result (a `CallToolResult`).
    pub result: Value,
}

impl PaneClient {
    /// Calls `tool` from the pane and waits for the answer.
    pub fn call(&mut self, tool: &str, args: Value) -> anyhow::Result<Timed> {
        let mut answers = self.call_many(vec![(tool.to_owned(), args)], 1)?;
        answers.pop().context("no answer")?
    }

    /// Calls every `(tool, args)` with at most `parallel` in flight; answers in call order.
    pub fn call_many(
        &mut self,
        calls: Vec<(String, Value)>,
        parallel: usize,
    ) -> anyhow::Result<Vec<anyhow::Result<Timed>>> {
        let total = calls.len();
        let first_id = self.next_id;
        let mut answers: BTreeMap<u64, anyhow::Result<Timed>> = BTreeMap::new();
        let mut pending = calls.into_iter();
        let mut in_flight = 0;
        while answers.len() < total {
            while in_flight < parallel.max(1) {
                let Some((tool, args)) = pending.next() else {
                    break;
                };
                let request = json!({ "id": self.next_id, "tool": tool, "args": args });
                self.next_id += 1;
                self.writer.write_all(format!("{request}\n").as_bytes())?;
                in_flight += 1;
            }
            let mut line = String::new();
            anyhow::ensure!(
                self.reader.read_line(&mut line)? > 0,
                "the pane client went away"
            );
            let answer: Value = serde_json::from_str(&line)?;
            let id = answer["id"].as_u64().context("answer id")?;
            let outcome = match answer.get("error") {
                Some(e) => Err(anyhow::anyhow!("{}", e.as_str().unwrap_or_default())),
                None => Ok(Timed {
                    took: Duration::from_micros(answer["us"].as_u64().unwrap_or(0)),
                    result: answer["result"].clone(),
                }),
            };
            answers.insert(id - first_id, outcome);
            in_flight -= 1;
        }
        Ok(answers.into_values().collect())
    }
}

/// fake-herdr, the built `fleetd` configured for it, and a lead: a pane client in a lead tab.
/// Member profiles: `ctl` (a pane client that connects back to [`HerdrFleet::control`]) and
/// `idle` (a pane client that only opens its MCP session). fake-herdr detects both as Claude
/// agents (`HERDR_AGENT`), at rest.
#[derive(Debug)]
pub struct HerdrFleet {
    /// The daemon (dropped before the fake: it talks to it).
    pub daemon: Daemon,
    /// The fake herdr server.
    pub herdr: FakeHerdrProcess,
    /// Where pane clients connect back.
    pub control: Control,
    /// The lead's pane client.
    pub lead: PaneClient,
    home: tempfile::TempDir,
}

impl HerdrFleet {
    /// Starts everything; `extra` is appended to fleetd's config.
    pub fn start(extra: &str) -> anyhow::Result<Self> {
        Self::start_with_profiles(extra, "")
    }

    /// Like [`HerdrFleet::start`] with more profiles (`profiles:` entries, indented by two).
    pub fn start_with_profiles(extra: &str, profiles: &str) -> anyhow::Result<Self> {
        let home = tempfile::tempdir()?;
        let socket = home.path().join("herdr.sock");
        let herdr = FakeHerdrProcess::start(&bin_path("fake-herdr"), &socket)?;
        let control = Control::bind()?;
        // The pane processes run `fleetd-bench pane-client`, also when a test drives the fleet.
        let exe = crate::bin_path("fleetd-bench").display().to_string();
        let profile = |name: &str, args: &str| {
            format!(
                "  {name}:\n    agent: custom\n    command: {exe}\n    args: [{args}]\n    env:\n      HERDR_AGENT: claude\n"
            )
        };
        let config = format!(
            "multiplexer: herdr\nherdrSocket: {}\nmembersWorkspace: fleet\n{extra}profiles:\n{}{}{profiles}",
            socket.display(),
            profile("ctl", &format!("pane-client, \"{}\"", control.addr())),
            profile("idle", "pane-client"),
        );
        write_config(home.path(), &config);
        let daemon = Daemon::start(home.path(), &[]);
        let created = herdr.call("workspace.create", &json!({ "label": "main" }))?;
        let pane = created["result"]["root_pane"]["pane_id"]
            .as_str()
            .with_context(|| format!("workspace.create: {created}"))?
            .to_owned();
        let line = format!(
            "exec env FLEETD_URL=http://{} {exe} pane-client {}",
            daemon.addr,
            control.addr()
        );
        herdr.call(
            "pane.send_input",
            &json!({ "pane_id": pane, "text": line, "keys": ["Enter"] }),
        )?;
        let lead = control.accept()?;
        Ok(Self {
            daemon,
            herdr,
            control,
            lead,
            home,
        })
    }

    /// Spawns members `{prefix}{n}` from `profile` through the lead's `fleet_spawn`, `parallel`
    /// at a time; fails on the first refusal.
    pub fn spawn(
        &mut self,
        profile: &str,
        prefix: &str,
        count: usize,
        parallel: usize,
    ) -> anyhow::Result<()> {
        let calls = (0..count)
            .map(|n| {
                (
                    "fleet_spawn".to_owned(),
                    json!({ "profile": profile, "name": format!("{prefix}{n}") }),
                )
            })
            .collect();
        for answer in self.lead.call_many(calls, parallel)? {
            crate::http::mcp::structured("fleet_spawn", &answer?.result)?;
        }
        Ok(())
    }

    /// The daemon's process id.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.child.id()
    }

    /// Waits until `/healthz` answers 200.
    pub fn wait_healthy(&self) {
        let addr = self.daemon.addr;
        wait_until("fleetd /healthz 200", Duration::from_secs(60), || {
            crate::http::get(addr, "/healthz").is_ok_and(|r| r.status == 200)
        });
    }

    /// The scratch directory (HOME of the daemon).
    pub fn dir(&self) -> &std::path::Path {
        self.home.path()
    }
}

//! MCP-bridge benchmark (issue 5): fleetd's own overhead from `fleet_send` reaching the engine to
//! the multiplexer's submit call (measured in-process against a recording multiplexer, so the
//! number excludes the multiplexer itself), and the MCP round trip of `fleet_list` over a
//! keep-alive HTTP connection to an in-process daemon. Prints p50/p99; never asserts.
//!
//! `fleetd-bench bridge [--rounds N]`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fleetd::engine::{EngineParts, NewMember};
use fleetd::mux::{
    BackendKind, Multiplexer, MuxError, MuxFuture, MuxRouter, OpenPane, PaneEvent, PaneInfo,
    ProcessInfo, ServerInfo, SubmitPath, Submitted, TabInfo,
};
use fleetd_core::{
    AgentStatus, Message, MessageKind, MsgId, MuxDaemon, PaneId, QualifiedPaneId, Target,
    TerminalId,
};
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::{Met, Row};
use crate::http::mcp::McpClient;

const DEFAULT_ROUNDS: usize = 2000;

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = super::arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let overhead = runtime.block_on(send_overhead(rounds))?;
    let rtt = runtime.block_on(list_round_trip(rounds))?;
    println!("\nMCP bridge ({rounds} rounds each)\n");
    println!("| measurement | p50 | p99 | target | met |");
    println!("|---|---|---|---|---|");
    row(
        "fleet_send → multiplexer submit, fleetd's own overhead",
        &overhead,
        "p99 ≤ 5 ms",
        overhead.p99 <= Duration::from_millis(5),
    );
    row(
        "fleet_list MCP round trip (keep-alive HTTP)",
        &rtt,
        "p50 ≤ 0.5 ms, p99 ≤ 2 ms",
        list_met(&rtt),
    );
    let cell = |s: &Stats| format!("p50 {} / p99 {}", super::ms(s.p50), super::ms(s.p99));
    Ok(vec![
        Row::new(
            "bridge",
            "fleet_send → multiplexer submit, fleetd's own overhead",
            cell(&overhead),
        )
        .target(
            "p99 ≤ 5 ms (#5)",
            Met::from_bool(overhead.p99 <= Duration::from_millis(5)),
        ),
        Row::new(
            "bridge",
            "fleet_list MCP round trip (keep-alive HTTP)",
            cell(&rtt),
        )
        .target(
            "p50 ≤ 0.5 ms, p99 ≤ 2 ms (#17)",
            Met::from_bool(list_met(&rtt)),
        ),
    ])
}

/// Issue 17's target for the `fleet_list` round trip.
fn list_met(s: &Stats) -> bool {
    s.p50 <= Duration::from_micros(500) && s.p99 <= Duration::from_millis(2)
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    Stats {
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn row(name: &str, s: &Stats, target: &str, met: bool) {
    let ms = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1000.0);
    println!(
        "| {name} | {} | {} | {target} | {} |",
        ms(s.p50),
        ms(s.p99),
        if met { "yes" } else { "no" }
    );
}

/// A multiplexer whose `submit` reports the moment it was called and does nothing else.
#[derive(Debug)]
struct Recording {
    submitted: mpsc::UnboundedSender<Instant>,
    events: broadcast::Sender<PaneEvent>,
}

fn unsupported<'a, T: Send + 'a>() -> MuxFuture<'a, T> {
    Box::pin(async { Err(MuxError::Unsupported("bench".to_owned())) })
}

impl Multiplexer for Recording {
    fn kind(&self) -> BackendKind {
        BackendKind::Tmux
    }
    fn ping(&self) -> MuxFuture<'_, ServerInfo> {
        unsupported()
    }
    fn list_panes(&self) -> MuxFuture<'_, Vec<PaneInfo>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn list_tabs(&self) -> MuxFuture<'_, Vec<TabInfo>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn pane<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, PaneInfo> {
        unsupported()
    }
    fn process_info<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ProcessInfo> {
        unsupported()
    }
    fn open_pane(&self, _: OpenPane) -> MuxFuture<'_, PaneInfo> {
        unsupported()
    }
    fn submit<'a>(&'a self, _: &'a PaneId, _: &'a str) -> MuxFuture<'a, Submitted> {
        let _ = self.submitted.send(Instant::now());
        Box::pin(async {
            Ok(Submitted {
                path: SubmitPath::TmuxPaste,
                started: None,
            })
        })
    }
    fn press_enter<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn type_keys<'a>(&'a self, _: &'a PaneId, _: &'a str) -> MuxFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn read_tail<'a>(&'a self, _: &'a PaneId, _: u32) -> MuxFuture<'a, String> {
        Box::pin(async { Ok(String::new()) })
    }
    fn close_pane<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn watch<'a>(&'a self, _: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn unwatch(&self, _: &PaneId) {}
    fn events(&self) -> broadcast::Receiver<PaneEvent> {
        self.events.subscribe()
    }
}

fn bench_config() -> anyhow::Result<fleetd::config::Config> {
    let env = fleetd::config::Environment {
        home: Some(std::env::temp_dir()),
        ..Default::default()
    };
    Ok(fleetd::config::Config::parse("", "bench", &env)?)
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark mints real ids on the wall clock"
)]
async fn send_overhead(rounds: usize) -> anyhow::Result<Stats> {
    let (tx, mut submitted) = mpsc::unbounded_channel();
    let (events, _) = broadcast::channel(16);
    let mux = MuxRouter::new(
        Arc::new(Recording {
            submitted: tx,
            events,
        }),
        None,
    );
    let store: Arc<dyn fleetd::store::InboxStore> = Arc::new(fleetd::store::MemoryStore::default());
    let engine = fleetd::engine::spawn(EngineParts {
        durable: None,
        config: fleetd::config::Live::fixed(bench_config()?),
        clock: Arc::new(fleetd::clock::SystemClock),
        store,
        mux,
        redactor: fleetd::secrets::Redactor::empty(),
        gateway: None,
    });
    let target = Target::new("bench")?;
    let pane = QualifiedPaneId::new(MuxDaemon::Lead, PaneId::new("%1")?);
    engine
        .add_member(NewMember {
            user: None,
            target: target.clone(),
            profile: "bench".to_owned(),
            agent: "custom".to_owned(),
            pane,
            terminal: TerminalId::new("%1@1")?,
            allow_delegation: false,
            idle_timeout_secs: None,
            backend: None,
            lead: None,
            worktree: None,
            model: None,
        })
        .await?;
    engine.presence(target.clone()).await?;
    engine.set_status(target.clone(), AgentStatus::Idle).await?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        let ticket = engine
            .submit(None, target.clone(), "do the thing".to_owned())
            .await??;
        let at = submitted
            .recv()
            .await
            .context("the engine never submitted")?;
        samples.push(at.duration_since(start));
        // The member "replies": that verifies delivery and frees the lane for the next task.
        let reply = Message {
            msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
            target: target.clone(),
            ticket: Some(ticket),
            kind: MessageKind::Reply,
            text: "done".to_owned(),
            from: "bench".to_owned(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
        };
        engine.reply_stored(reply).await?;
    }
    Ok(stats(samples))
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark measures wall-clock round trips"
)]
async fn list_round_trip(rounds: usize) -> anyhow::Result<Stats> {
    let home = tempfile::tempdir()?;
    let env = fleetd::config::Environment {
        home: Some(home.path().to_path_buf()),
        ..Default::default()
    };
    let yaml = format!(
        "multiplexer: tmux\ntmuxSocket: {}\n",
        home.path().join("none.sock").display()
    );
    let config = fleetd::config::Config::parse(&yaml, "bench", &env)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fleetd::serve::run(config, listener, async move {
        let _ = stopped.await;
    }));
    // The client on a thread and runtime of its own, as another process's would be: the
    // round trip is the server's, not the client's wait for a worker of the server's runtime.
    let client = std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let mut client = McpClient::at(addr, "/mcp").kept_alive();
                let mut samples = Vec::with_capacity(rounds);
                // The first call pays the caller lookup; the connection's answer is cached.
                for i in 0..=rounds {
                    let start = std::time::Instant::now();
                    let result = client
                        .call_tool("fleet_list", serde_json::json!({}))
                        .await?;
                    anyhow::ensure!(result["isError"] == false, "fleet_list failed: {result}");
                    if i > 0 {
                        samples.push(start.elapsed());
                    }
                }
                Ok(samples)
            })
    });
    let samples = tokio::task::spawn_blocking(move || client.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the bench client panicked"))??;
    let _ = stop.send(());
    server.await??;
    Ok(stats(samples))
}

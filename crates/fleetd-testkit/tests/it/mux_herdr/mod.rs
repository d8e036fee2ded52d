//! Integration tests: the herdr backend against real `fake-herdr` processes (sockets in tempdirs,
//! real PTY panes running `sim-agent`), the schema contract, fault handling, and sim-agent's MCP
//! calls against a local HTTP stub.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd::mux::herdr::{Herdr, HerdrConfig};
use fleetd::mux::{
    Launch, Multiplexer, MuxError, OpenPane, PaneEvent, PaneInfo, SplitDirection, SubmitPath,
};
use fleetd_core::{AgentStatus, PaneId, TerminalId};
use fleetd_testkit::bin_path;
use fleetd_testkit::fake_herdr::process::FakeHerdrProcess;
use fleetd_testkit::sim_agent::logged;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

use crate::mux_kit::{
    eventually, member, next_event, not_found, sim_agent, split_pane, statuses, wait_tail,
};

mod failures;

pub(crate) struct Fixture {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) fake: FakeHerdrProcess,
    pub(crate) herdr: Herdr,
}

impl Fixture {
    /// A fake-herdr that `start` runs on a socket in a fresh tempdir, and fleetd's client of it.
    pub(crate) fn with(start: impl FnOnce(&Path) -> anyhow::Result<FakeHerdrProcess>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("herdr.sock");
        let fake = start(&socket).expect("fake-herdr starts");
        let herdr = Herdr::new(HerdrConfig::new(&socket));
        Self {
            _dir: dir,
            fake,
            herdr,
        }
    }

    /// Opens a pane in workspace `fleet` running sim-agent with `args`, detected as Claude
    /// Code.
    pub(crate) async fn open_claude(&self, args: &[&str]) -> PaneInfo {
        self.herdr
            .open_pane(member(
                "fleet",
                &[("HERDR_AGENT", "claude")],
                sim_agent(args),
            ))
            .await
            .expect("open")
    }

    /// [`Fixture::open_claude`], watched from before it opened until it reported idle: the
    /// events to follow its turns on, and the pane.
    pub(crate) async fn watched_claude(
        &self,
        args: &[&str],
    ) -> (broadcast::Receiver<PaneEvent>, PaneInfo) {
        let mut events = self.herdr.events();
        let pane = self.open_claude(args).await;
        self.herdr.watch(&pane.pane).await.expect("watch");
        statuses(&mut events, &pane.pane, &[AgentStatus::Idle]).await;
        (events, pane)
    }

    /// [`Fixture::watched_claude`], its sim-agent logging what it does to file `log_name` in
    /// the fixture's directory: the events, the pane and the log's path.
    pub(crate) async fn watched_logging_claude(
        &self,
        log_name: &str,
        args: &[&str],
    ) -> (broadcast::Receiver<PaneEvent>, PaneInfo, PathBuf) {
        let log = self._dir.path().join(log_name);
        let log_arg = log.display().to_string();
        let args: Vec<&str> = args.iter().copied().chain(["--log", &log_arg]).collect();
        let (events, pane) = self.watched_claude(&args).await;
        (events, pane, log)
    }

    /// Opens a pane in workspace `fleet` running sim-agent with `args` as a custom agent
    /// (herdr detects none), once sim-agent is ready.
    async fn open_custom(&self, args: &[&str]) -> PaneInfo {
        let pane = self
            .herdr
            .open_pane(member("fleet", &[], sim_agent(args)))
            .await
            .expect("open");
        wait_tail(&self.herdr, &pane.pane, "sim-agent ready").await;
        pane
    }

    /// A client of this fake-herdr that gives up on a call after `ms`.
    fn impatient(&self, ms: u64) -> Herdr {
        let mut config = HerdrConfig::new(self.fake.socket());
        config.call_timeout = Duration::from_millis(ms);
        Herdr::new(config)
    }

    /// A client of a socket beside this fake-herdr's where nothing listens.
    fn nowhere(&self) -> Herdr {
        Herdr::new(HerdrConfig::new(
            self.fake.socket().with_extension("missing"),
        ))
    }
}

fn start_fake(args: &[&str]) -> Fixture {
    Fixture::with(|socket| FakeHerdrProcess::start_with_args(&bin_path("fake-herdr"), socket, args))
}

#[test]
fn herdr_client_methods_exist_in_published_schema() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/herdr/herdr-api.schema.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("SKIPPED: {} not present", path.display());
        return;
    };
    let schema: Value = serde_json::from_str(&text).expect("schema parses");
    assert_eq!(schema["protocol"], 20, "the schema is protocol 20");
    let schemas = &schema["schemas"];
    let consts = |list: &Value, prop: &str| -> Vec<String> {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["properties"][prop]["const"].as_str().map(str::to_owned))
            .collect()
    };
    let methods = consts(&schemas["request"]["oneOf"], "method");
    let results = consts(
        &schemas["success_response"]["$defs"]["ResponseResult"]["oneOf"],
        "type",
    );
    for (method, types) in fleetd::mux::herdr::wire::METHODS_USED {
        assert!(
            methods.iter().any(|m| m == method),
            "method {method} is not in herdr's schema"
        );
        for t in *types {
            assert!(
                results.iter().any(|r| r == t),
                "result type {t} (of {method}) is not in herdr's schema"
            );
        }
    }
    let subscriptions = consts(
        &schemas["request"]["$defs"]["Subscription"]["oneOf"],
        "type",
    );
    for sub in fleetd::mux::herdr::wire::SUBSCRIPTIONS_USED {
        assert!(
            subscriptions.iter().any(|s| s == sub),
            "subscription {sub} is not in herdr's schema"
        );
    }
    let mut events: Vec<String> = schemas["event"]["$defs"]["EventKind"]["enum"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    events.extend(
        schemas["subscription_event"]["$defs"]["SubscriptionEventKind"]["enum"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned)),
    );
    for event in fleetd::mux::herdr::wire::EVENTS_USED {
        assert!(
            events.iter().any(|e| e == event),
            "event {event} is not in herdr's schema"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_gate_refuses_older_and_accepts_newer() {
    let old = start_fake(&["--protocol", "19"]);
    let err = Herdr::connect(HerdrConfig::new(old.fake.socket()))
        .await
        .expect_err("19 is refused");
    assert!(matches!(err, MuxError::Protocol(_)), "{err}");

    let newer = start_fake(&["--protocol", "21", "--version", "0.9.0"]);
    let (_, info) = Herdr::connect(HerdrConfig::new(newer.fake.socket()))
        .await
        .expect("21 is accepted");
    assert_eq!((info.version.as_str(), info.protocol), ("0.9.0", Some(21)));

    let current = start_fake(&[]);
    let info = current
        .herdr
        .check_protocol()
        .await
        .expect("20 is accepted");
    assert_eq!(info.protocol, Some(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_kind_is_started_with_agent_start_and_a_failed_start_leaves_no_pane() {
    let fx = start_fake(&[]);
    let agent = |name: &str| OpenPane {
        launch: Launch::Agent {
            name: name.to_owned(),
            kind: "claude".to_owned(),
            args: vec!["--print".to_owned()],
        },
        ..member("fleet", &[], Vec::new())
    };
    // herdr refuses the agent's name: the tab it opened for it is closed again.
    let refused = fx.herdr.open_pane(agent("Not A Name")).await;
    assert!(
        matches!(&refused, Err(MuxError::Rejected { op, .. }) if op == "agent.start"),
        "{refused:?}"
    );
    let panes = fx.herdr.list_panes().await.expect("list panes");
    assert!(
        panes.iter().all(|p| p.label.as_deref() != Some("member")),
        "no pane is left behind: {panes:?}"
    );
    // A good name: a shell tab, then `agent.start` types the kind's executable into it.
    let pane = fx.herdr.open_pane(agent("ann")).await.expect("open agent");
    let tail = wait_tail(&fx.herdr, &pane.pane, "claude").await;
    assert!(tail.contains("'claude' '--print'"), "{tail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_pane_gets_env_command_and_herdr_identity() {
    let fx = start_fake(&[]);
    let req = member(
        "fleet",
        &[("FLEET_TEST_TOKEN", "s3cr3t"), ("HERDR_PANE_ID", "w9:p9")],
        sim_agent(&["--script", "silent"]),
    );
    let pane = fx.herdr.open_pane(req.clone()).await.expect("open member");
    let info = fx
        .herdr
        .process_info(&pane.pane)
        .await
        .expect("process info");
    let pid = info.shell_pid.expect("shell pid");
    let env = fleetd_testkit::environ(pid);
    assert_eq!(
        env.get("FLEET_TEST_TOKEN").map(String::as_str),
        Some("s3cr3t")
    );
    assert_eq!(
        env.get("HERDR_PANE_ID"),
        Some(&pane.pane.to_string()),
        "herdr's own value wins"
    );
    assert_eq!(env.get("HERDR_ENV").map(String::as_str), Some("1"));
    wait_tail(&fx.herdr, &pane.pane, "sim-agent ready").await;

    let second = fx.herdr.open_pane(req).await.expect("second member");
    assert_eq!(
        second.workspace, pane.workspace,
        "the fleet workspace is reused"
    );
    assert_ne!(second.pane, pane.pane);
    let panes = fx.herdr.list_panes().await.expect("list panes");
    assert_eq!(
        panes.len(),
        2,
        "the placeholder shell of the new workspace was replaced: {panes:?}"
    );
    let tabs = fx.herdr.list_tabs().await.expect("list tabs");
    assert_eq!(
        tabs.iter()
            .filter(|t| t.workspace == pane.workspace)
            .count(),
        2
    );

    let split = fx
        .herdr
        .open_pane(split_pane(
            &pane.pane,
            SplitDirection::Right,
            &[("SPLIT_VAR", "yes")],
            sim_agent(&["--script", "silent"]),
        ))
        .await
        .expect("split");
    assert_eq!(split.tab, pane.tab);
    wait_tail(&fx.herdr, &split.pane, "sim-agent ready").await;
    let split_pid = fx
        .herdr
        .process_info(&split.pane)
        .await
        .expect("info")
        .shell_pid
        .expect("pid");
    assert_eq!(
        fleetd_testkit::environ(split_pid)
            .get("SPLIT_VAR")
            .map(String::as_str),
        Some("yes")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_agent_turn_streams_working_then_done() {
    let fx = start_fake(&[]);
    let (mut events, pane) = fx
        .watched_claude(&["--script", "silent", "--work-ms", "1500"])
        .await;
    let submitted = fx
        .herdr
        .submit(&pane.pane, "hello \"fleet\" ✓")
        .await
        .expect("submit");
    assert_eq!(submitted.path, SubmitPath::AgentPrompt);
    assert_eq!(submitted.started, Some(true));
    statuses(
        &mut events,
        &pane.pane,
        &[AgentStatus::Working, AgentStatus::Done],
    )
    .await;
    let tail = wait_tail(&fx.herdr, &pane.pane, "turn done").await;
    assert!(tail.contains("hello \"fleet\" ✓"), "{tail}");
    assert_eq!(
        fx.herdr
            .pane(&pane.pane)
            .await
            .expect("pane")
            .agent
            .as_deref(),
        Some("claude")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_agent_is_submitted_with_pane_input() {
    let fx = start_fake(&[]);
    let pane = fx
        .open_custom(&["--script", "silent", "--work-ms", "200"])
        .await;
    assert_eq!(
        fx.herdr.pane(&pane.pane).await.expect("pane").status,
        AgentStatus::Unknown
    );
    let submitted = fx
        .herdr
        .submit(&pane.pane, "custom task")
        .await
        .expect("submit");
    assert_eq!(submitted.path, SubmitPath::PaneInput);
    assert_eq!(submitted.started, None);
    wait_tail(&fx.herdr, &pane.pane, "turn done").await;
}

/// A tiny MCP-over-HTTP stub that records every JSON-RPC body and answers like a stateless
/// streamable-HTTP server (JSON for `initialize`, an event stream for `tools/call`).
async fn mcp_stub() -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let mut raw = Vec::new();
                let mut buf = [0u8; 4096];
                let body = loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    raw.extend_from_slice(&buf[..n]);
                    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&raw[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if raw.len() >= end + 4 + len {
                        break raw[end + 4..end + 4 + len].to_vec();
                    }
                };
                let msg: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                record.lock().expect("lock").push(msg.clone());
                let reply = match msg["method"].as_str() {
                    Some("initialize") => {
                        let body = json!({"jsonrpc":"2.0","id":msg["id"],"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"stub","version":"0"}}}).to_string();
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    }
                    Some("tools/call") => {
                        let answer = if msg["params"]["name"] == "fleet_ask" {
                            json!({"answer":"42"})
                        } else {
                            json!({"msgId":"m1","delivered":"inbox"})
                        };
                        let event = format!(
                            "data: {}\n\n",
                            json!({"jsonrpc":"2.0","id":msg["id"],"result":{"structuredContent":answer,"content":[]}})
                        );
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{event}\r\n0\r\n\r\n",
                            event.len()
                        )
                    }
                    _ => "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_owned(),
                };
                let _ = stream.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_agent_replies_and_asks_over_mcp() {
    let (url, seen) = mcp_stub().await;
    let fx = start_fake(&[]);
    let mut events = fx.herdr.events();
    let pane = fx
        .herdr
        .open_pane(member(
            "fleet",
            &[("HERDR_AGENT", "claude"), ("FLEETD_URL", url.as_str())],
            sim_agent(&["--script", "reply,ask", "--work-ms", "300"]),
        ))
        .await
        .expect("open");
    fx.herdr.watch(&pane.pane).await.expect("watch");
    statuses(&mut events, &pane.pane, &[AgentStatus::Idle]).await;
    fx.herdr
        .submit(&pane.pane, "task one")
        .await
        .expect("submit");
    statuses(&mut events, &pane.pane, &[AgentStatus::Done]).await;
    fx.herdr
        .submit(&pane.pane, "task two")
        .await
        .expect("submit");
    let tool_calls = || {
        seen.lock()
            .expect("lock")
            .iter()
            .filter(|c| c["method"] == "tools/call")
            .count()
    };
    eventually("three tool calls", async || {
        (tool_calls() >= 3).then_some(())
    })
    .await;
    let calls: Vec<Value> = seen.lock().expect("lock").clone();
    let methods: Vec<&str> = calls.iter().filter_map(|c| c["method"].as_str()).collect();
    assert_eq!(
        &methods[..2],
        ["initialize", "notifications/initialized"],
        "{calls:?}"
    );
    let tools: Vec<(String, Value)> = calls
        .iter()
        .filter(|c| c["method"] == "tools/call")
        .map(|c| {
            (
                c["params"]["name"].as_str().unwrap_or("").to_owned(),
                c["params"]["arguments"].clone(),
            )
        })
        .collect();
    assert_eq!(
        tools[0],
        (
            "fleet_reply".to_owned(),
            json!({ "text": "sim-agent did: task one" })
        )
    );
    assert_eq!(
        tools[1],
        (
            "fleet_ask".to_owned(),
            json!({ "question": "sim-agent asks about: task two" })
        )
    );
    assert_eq!(tools[2].0, "fleet_reply");
    assert!(
        tools[2].1["text"]
            .as_str()
            .is_some_and(|t| t.contains("42")),
        "{tools:?}"
    );
}

//! fake-model: a scripted stand-in for a model backend, as fake-herdr is for herdr. It serves the
//! Anthropic Messages API (Claude Code) and the OpenAI Responses API (Codex) on loopback HTTP,
//! answers each request from the conversation it carries (`script`), and logs every request —
//! its headers and whole body — as one JSON line, so a test can see what an agent sent (which
//! tools its turn had, whether a secret leaked into a request, when a reply reached the lead's
//! model). A test double: it must not be used by the daemon.
//!
//! Routes: `POST …/messages` (streamed or not), `POST …/messages/count_tokens`, `POST
//! …/responses` (streamed), `GET …/models`; anything else answers 404 and is logged.

pub mod anthropic;
pub mod openai;
pub mod script;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::{Value, json};

/// How often a long answer sends a keep-alive while it "thinks".
const KEEPALIVE: Duration = Duration::from_millis(500);

/// How to run a fake model.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where every request is logged (one JSON line each); `None` logs nothing.
    pub log: Option<PathBuf>,
    /// The script's knobs.
    pub script: script::Options,
}

#[derive(Debug)]
struct Shared {
    opts: Options,
    log: Mutex<Option<std::fs::File>>,
    count: AtomicU64,
}

/// Serves on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, opts: Options) -> anyhow::Result<()> {
    let log = match &opts.log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    let shared = Arc::new(Shared {
        opts,
        log: Mutex::new(log),
        count: AtomicU64::new(0),
    });
    let app = axum::Router::new().fallback(handle).with_state(shared);
    axum::serve(listener, app).await?;
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "the log's timestamps are wall-clock milliseconds a test compares with other logs"
)]
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The key a request presented (`x-api-key`, else a bearer token), whole: the log is the test's
/// to scan for secrets.
fn key_of(headers: &HeaderMap) -> Option<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("x-api-key")
        .map(str::to_owned)
        .or_else(|| header("authorization").map(|v| v.trim_start_matches("Bearer ").to_owned()))
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let n = shared.count.fetch_add(1, Ordering::Relaxed) + 1;
    let path = uri.path().to_owned();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or("fake").to_owned();
    let api = if method == axum::http::Method::POST && path.ends_with("/messages") {
        "anthropic"
    } else if method == axum::http::Method::POST && path.ends_with("/responses") {
        "openai"
    } else {
        "other"
    };
    let conv = match api {
        "anthropic" => Some(anthropic::conversation(&body)),
        "openai" => Some(openai::conversation(&body)),
        _ => None,
    };
    let plan = conv.as_ref().map(|c| script::next(c, &shared.opts.script));
    shared.record(&json!({
        "t": unix_ms(),
        "n": n,
        "api": api,
        "method": method.as_str(),
        "path": path,
        "key": key_of(&headers),
        "userAgent": headers.get("user-agent").and_then(|v| v.to_str().ok()),
        "prompt": conv.as_ref().map(|c| c.prompt.clone()),
        "side": conv.as_ref().map(|c| c.side),
        "tools": conv.as_ref().map(|c| c.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>()),
        "steps": conv.as_ref().map(|c| c.steps.len()),
        "answer": plan.as_ref().map(|p| format!("{:?}", p.reply)),
        "headers": headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect::<std::collections::BTreeMap<_, _>>(),
        "body": body,
    }));
    match (api, plan) {
        ("anthropic", Some(plan)) => {
            if body["stream"].as_bool().unwrap_or(false) {
                stream(plan.delay, anthropic::events(&plan, &model, n), true)
            } else {
                tokio::time::sleep(plan.delay).await;
                json_response(StatusCode::OK, &anthropic::message(&plan, &model, n))
            }
        }
        ("openai", Some(plan)) => stream(plan.delay, openai::events(&plan, &model, n), false),
        _ if path.ends_with("/count_tokens") => {
            json_response(StatusCode::OK, &json!({"input_tokens": 100}))
        }
        _ if path.ends_with("/models") => json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}),
        ),
        _ => json_response(
            StatusCode::NOT_FOUND,
            &json!({"type": "error", "error": {"type": "not_found_error", "message": format!("fake-model serves no {path}")}}),
        ),
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(value.to_string()))
        .unwrap_or_default()
}

/// Streams `events` as server-sent events: the first at once, the rest after `delay` (with the
/// Messages API's `ping` every [`KEEPALIVE`] meanwhile when `pings`).
fn stream(delay: Duration, events: Vec<(String, Value)>, pings: bool) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let frame = |(name, data): &(String, Value)| {
            Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
        };
        let mut events = events.into_iter();
        if let Some(first) = events.next()
            && tx.send(frame(&first)).await.is_err()
        {
            return;
        }
        let until = tokio::time::Instant::now() + delay;
        while tokio::time::Instant::now() < until {
            let step = KEEPALIVE.min(until - tokio::time::Instant::now());
            tokio::time::sleep(step).await;
            if pings && tx.send(frame(&anthropic::ping())).await.is_err() {
                return;
            }
        }
        for event in events {
            if tx.send(frame(&event)).await.is_err() {
                return;
            }
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

impl Shared {
    fn record(&self, line: &Value) {
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(file) = log.as_mut() {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// One logged request, as a test reads it back.
pub type Logged = Value;

/// Every request logged at `path` so far (a missing log is none).
pub fn read_log(path: &Path) -> Vec<Logged> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A `fake-model` process for a test: started on a free loopback port, logging to a file in
/// `dir`, killed when dropped.
#[derive(Debug)]
pub struct FakeModel {
    child: std::process::Child,
    /// Where it listens.
    pub addr: std::net::SocketAddr,
    /// Its request log.
    pub log: PathBuf,
}

impl FakeModel {
    /// Starts one logging to `<dir>/<name>.jsonl`, answering questions with `answer`.
    pub fn start(dir: &Path, name: &str, answer: &str) -> Self {
        use std::io::BufRead as _;
        let log = dir.join(format!("{name}.jsonl"));
        let mut child = std::process::Command::new(crate::bin_path("fake-model"))
            .args(["--log", &log.display().to_string(), "--answer", answer])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("fake-model starts");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("fake-model says where it listens");
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("fake-model printed {line:?}"));
        Self { child, addr, log }
    }

    /// Its base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request it got so far.
    pub fn requests(&self) -> Vec<Logged> {
        read_log(&self.log)
    }

    /// The agent turns' requests (side requests for titles left out).
    pub fn turns(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r["api"] != "other" && r["side"] != true)
            .collect()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! fake-model: a scripted stand-in for a model backend, as fake-herdr is for herdr. It serves the
//! Anthropic Messages API (Claude Code), the OpenAI Responses API (Codex) and the OpenAI Chat
//! Completions API on loopback HTTP, answers each request from the conversation it carries
//! (`script`), and logs every request — its headers and whole body — as one JSON line, so a test
//! can see what an agent sent (which tools its turn had, whether a secret leaked into a request,
//! when a reply reached the lead's model). Each answer then logs one more line, `served` (see
//! [`served`]): the token usage it reported, once it was handed over whole, or that the client
//! cut it off — what a test compares a gateway's token counts with. A test double: it must not be
//! used by the daemon.
//!
//! Routes: `POST …/messages` (streamed or not), `POST …/messages/count_tokens`, `POST
//! …/responses` (streamed), `POST …/chat/completions` (streamed or not), `GET …/models`; anything
//! else answers 404 and is logged.

pub mod anthropic;
pub mod chat;
pub mod openai;
pub mod script;
pub mod served;

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
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where every request is logged (one JSON line each); `None` logs nothing.
    pub log: Option<PathBuf>,
    /// The script's knobs.
    pub script: script::Options,
    /// How long every stream waits between one event and the next (zero: not at all), so a test
    /// can act while a stream is under way.
    pub stream_gap: Duration,
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
    // Each event leaves as it is written, as a model API's server sends it: with Nagle on, an
    // event written while the previous one is unacknowledged waits for the client's delayed
    // ACK (40 ms on Linux), which is the fake's stall, not the client's.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
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
    let post = method == axum::http::Method::POST;
    let api = if post && path.ends_with("/messages") {
        "anthropic"
    } else if post && path.ends_with("/responses") {
        "openai"
    } else if post && path.ends_with("/chat/completions") {
        "openai-chat"
    } else {
        "other"
    };
    let conv = match api {
        "anthropic" => Some(anthropic::conversation(&body)),
        "openai" => Some(openai::conversation(&body)),
        "openai-chat" => Some(chat::conversation(&body)),
        _ => None,
    };
    let plan = conv.as_ref().map(|c| script::next(c, &shared.opts.script));
    let key = key_of(&headers);
    shared.record(&json!({
        "t": unix_ms(),
        "n": n,
        "api": api,
        "method": method.as_str(),
        "path": path,
        "key": key,
        "userAgent": headers.get("user-agent").and_then(|v| v.to_str().ok()),
        "prompt": conv.as_ref().map(|c| c.prompt.clone()),
        "side": conv.as_ref().map(|c| c.side),
        "tools": conv.as_ref().map(|c| c.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>()),
        "steps": conv.as_ref().map(|c| c.steps.len()),
        "answer": plan.as_ref().map(|p| format!("{:?}", p.reply)),
        "headers": headers.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned())).collect::<std::collections::BTreeMap<_, _>>(),
        "body": body,
    }));
    let (Some(plan), Some(conv)) = (plan, conv) else {
        return other(&path);
    };
    let usage = served::Usage::planned(n, &conv.prompt);
    let mut ledger = served::Ledger::new(Arc::clone(&shared), n, key, api);
    let streamed = body["stream"].as_bool().unwrap_or(false);
    let gap = shared.opts.stream_gap;
    let whole = match api {
        "anthropic" if streamed => {
            let events = anthropic::events(&plan, &model, n, usage);
            return stream(ledger, plan.delay, gap, events, true);
        }
        "anthropic" => anthropic::message(&plan, &model, n, usage),
        "openai" => {
            let events = openai::events(&plan, &model, n, usage);
            return stream(ledger, plan.delay, gap, events, false);
        }
        _ if streamed => {
            let include_usage = body["stream_options"]["include_usage"]
                .as_bool()
                .unwrap_or(false);
            let events = chat::chunks(&plan, &model, n, usage, include_usage);
            return stream(ledger, plan.delay, gap, events, false);
        }
        _ => chat::completion(&plan, &model, n, usage),
    };
    tokio::time::sleep(plan.delay).await;
    ledger.observe(&whole);
    ledger.served();
    json_response(StatusCode::OK, &whole)
}

/// The answer to a request no API of the script's takes.
fn other(path: &str) -> Response {
    if path.ends_with("/count_tokens") {
        json_response(StatusCode::OK, &json!({"input_tokens": 100}))
    } else if path.ends_with("/models") {
        json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [{"id": "fake", "object": "model"}]}),
        )
    } else {
        json_response(
            StatusCode::NOT_FOUND,
            &json!({"type": "error", "error": {"type": "not_found_error", "message": format!("fake-model serves no {path}")}}),
        )
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(value.to_string()))
        .unwrap_or_default()
}

/// One server-sent event on the wire: `event:` and `data:` lines, or only `data:` for an event
/// with no name (Chat Completions), whose data is written as it is when it is a string (`[DONE]`).
fn frame((name, data): &(String, Value)) -> Bytes {
    let data = match data {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if name.is_empty() {
        Bytes::from(format!("data: {data}\n\n"))
    } else {
        Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
    }
}

/// Streams `events` as server-sent events: the first at once, the rest after `delay` (with the
/// Messages API's `ping` every [`KEEPALIVE`] meanwhile when `pings`), `gap` apart. `ledger` sees
/// every event the connection takes, and logs the answer served when the connection has taken
/// the last one and asked for more, or cut when the body is dropped before (the client went away).
fn stream(
    ledger: served::Ledger,
    delay: Duration,
    gap: Duration,
    events: Vec<(String, Value)>,
    pings: bool,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<(String, Value)>(16);
    tokio::spawn(async move {
        let mut events = events.into_iter();
        if let Some(first) = events.next()
            && tx.send(first).await.is_err()
        {
            return;
        }
        let until = tokio::time::Instant::now() + delay;
        while tokio::time::Instant::now() < until {
            let step = KEEPALIVE.min(until - tokio::time::Instant::now());
            tokio::time::sleep(step).await;
            if pings && tx.send(anthropic::ping()).await.is_err() {
                return;
            }
        }
        for event in events {
            if !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    let body = futures_util::stream::unfold((rx, ledger), |(mut rx, mut ledger)| async move {
        match rx.recv().await {
            Some(event) => {
                ledger.observe(&event.1);
                Some((Ok::<_, std::io::Error>(frame(&event)), (rx, ledger)))
            }
            None => {
                ledger.served();
                None
            }
        }
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

/// The text of a message's `content` as all three APIs send it: a plain string, or an array of
/// parts (Anthropic's content blocks and tool results, OpenAI's input and output parts) whose
/// `text`s are joined a line apart; parts without text (images, tool calls) add nothing.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// One logged line (a request, or an answer's `served` line), as a test reads it back.
pub type Logged = Value;

fn read_lines(path: &Path) -> Vec<Logged> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Every request logged at `path` so far (a missing log is none); the answers' `served` lines
/// left out.
pub fn read_log(path: &Path) -> Vec<Logged> {
    read_lines(path)
        .into_iter()
        .filter(|l: &Value| l.get("served").is_none())
        .collect()
}

/// Every answer's `served` line logged at `path` so far, served or cut (see [`served`]).
pub fn read_served(path: &Path) -> Vec<Logged> {
    read_lines(path)
        .into_iter()
        .filter(|l: &Value| l.get("served").is_some())
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
        Self::start_with(dir, name, answer, &[])
    }

    /// A fake model as the fleet's backend `lab`, answering `answer`, with its credential in an
    /// owner-only file `lab-token` in `dir`: the model, and the `backends:` and `secrets:` blocks
    /// of fleetd's config that point it there (its members reach it through fleetd).
    pub fn start_lab(dir: &Path, answer: &str) -> (Self, String) {
        let model = Self::start(dir, "lab", answer);
        let token = crate::secret_file(dir, "lab-token", "sk-lab-SECRET");
        let config = format!(
            "backends:\n  lab:\n    baseUrl: {}\n    authTokenSecret: lab-token\n\
             secrets:\n  lab-token:\n    file: {}\n",
            model.url(),
            token.display()
        );
        (model, config)
    }

    /// [`FakeModel::start`] with more of the binary's options, e.g. `["--stream-gap-ms", "200"]`.
    pub fn start_with(dir: &Path, name: &str, answer: &str, extra_args: &[&str]) -> Self {
        use std::io::BufRead as _;
        let log = dir.join(format!("{name}.jsonl"));
        let mut child = std::process::Command::new(crate::bin_path("fake-model"))
            .args(["--log", &log.display().to_string(), "--answer", answer])
            .args(extra_args)
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

    /// Every answer's `served` line so far: `"served": true` for one handed over whole, `false`
    /// with `"cut": true` for one the client went away from (see [`served`]).
    pub fn served(&self) -> Vec<Logged> {
        read_served(&self.log)
    }

    /// The usage of every answer served whole to a request that presented `key`, summed: what a
    /// gateway that counted `key`'s traffic exactly must have counted.
    pub fn served_usage(&self, key: &str) -> served::Usage {
        self.served()
            .iter()
            .filter(|l| l["served"] == true && l["key"] == key)
            .filter_map(|l| serde_json::from_value::<served::Usage>(l["usage"].clone()).ok())
            .fold(served::Usage::default(), served::Usage::plus)
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

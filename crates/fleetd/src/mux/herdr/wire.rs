//! herdr's wire format (protocols 20 to 22: herdr 0.8 and 0.9): request framing, result and event shapes, error-code
//! classification, and the one-request-per-connection call. The only place that knows herdr's
//! JSON; it must not decide policy (what to retry, what "gone" means for a binding).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::mux::MuxError;

/// The oldest socket protocol this client speaks (herdr 0.8).
pub const PROTOCOL: u32 = 20;

/// The newest socket protocol this client knows (herdr 0.9). Newer ones are
/// spoken too, with a warning.
pub const NEWEST_PROTOCOL: u32 = 22;

/// The first protocol whose `agent.prompt` answers only after its Enter was sent (herdr
/// 0.9); older ones answer right after the paste, with the Enter still scheduled (herdr
/// v0.8.2 src/app/api/agents.rs:123-130).
pub const PROMPT_AFTER_ENTER: u32 = 22;

/// The event with which herdr 0.9 ends a subscription that lost events: nothing more
/// comes on that connection, and the client resubscribes and reads the state again. Not in the
/// protocol-20 schema, so not in [`EVENTS_USED`].
pub const EVENTS_LOST: &str = "events_lost";

/// Largest response line accepted. `pane.list` for hundreds of panes is ~100 KiB; `pane.read`
/// is bounded by the lines asked for. 16 MiB leaves room without letting a broken server exhaust
/// memory.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Every method this client sends, with the result `type` tags it accepts. The contract test
/// checks each against herdr's published JSON Schema.
pub const METHODS_USED: &[(&str, &[&str])] = &[
    ("ping", &["pong"]),
    ("pane.list", &["pane_list"]),
    ("pane.get", &["pane_info"]),
    ("pane.process_info", &["pane_process_info"]),
    ("tab.list", &["tab_list"]),
    ("workspace.list", &["workspace_list"]),
    ("workspace.create", &["workspace_created"]),
    ("tab.create", &["tab_created"]),
    ("layout.apply", &["layout_apply"]),
    ("pane.split", &["pane_info"]),
    ("pane.send_input", &["ok"]),
    ("agent.prompt", &["agent_prompted"]),
    ("agent.send_keys", &["ok"]),
    ("pane.read", &["pane_read"]),
    ("pane.close", &["ok"]),
    ("events.subscribe", &["subscription_started"]),
];

/// Subscription types this client asks for, and the event names it reads.
pub const SUBSCRIPTIONS_USED: &[&str] =
    &["pane.agent_status_changed", "pane.exited", "pane.closed"];

/// Event names (`event` field of a pushed line) this client understands.
pub const EVENTS_USED: &[&str] = &["pane.agent_status_changed", "pane_exited", "pane_closed"];

/// herdr error codes that affirm the thing is gone.
const NOT_FOUND_CODES: &[&str] = &[
    "pane_not_found",
    "agent_not_found",
    "agent_not_running",
    "agent_pane_not_found",
    "target_pane_not_found",
    "tab_not_found",
    "workspace_not_found",
];

/// herdr error codes that say "try again later".
const TRANSIENT_CODES: &[&str] = &["timeout", "server_unavailable", "internal_error"];

/// herdr error codes that, answered to a request that types, may come after it typed. herdr
/// answers `timeout` only from its waits, which run after the request's action: an
/// `agent.prompt` is typed before its wait starts (herdr v0.8.2 src/api/wait.rs:206-213) and the
/// wait answers `timeout` when it runs out (:492, :617-618). Ordinary requests such as
/// `pane.send_input` get no `timeout` from herdr 0.8.2 at all (src/api/server.rs:379 waits for
/// the app without one); a newer herdr that adds one would answer it for input it may still
/// apply, so it counts as uncertain there too.
const UNCERTAIN_INPUT_CODES: &[&str] = &["timeout"];

/// What else `agent.prompt` with a wait may answer after typing: the wait's probes of the agent
/// (wait.rs:445, :474, via `agent_get` :549-563) fail with `server_unavailable` when the app
/// loop does not answer within 5 s (server.rs:843-872) and with `internal_error` when an answer
/// cannot be decoded (wait.rs:567-598). Before the prompt herdr answers the same codes for the
/// same probe (wait.rs:197), so which one it was cannot be told.
const UNCERTAIN_PROMPT_CODES: &[&str] = &["server_unavailable", "internal_error"];

/// What `agent.prompt` may answer after typing on a server that answers after its Enter
/// ([`PROMPT_AFTER_ENTER`]): a failed Enter comes after the text was pasted. herdr 0.8.2 answers
/// `agent_prompt_failed` only when the text itself could not be written (agents.rs:123-125);
/// herdr 0.9 is assumed to answer the same code for the Enter.
const UNCERTAIN_AFTER_ENTER_CODES: &[&str] = &["agent_prompt_failed"];

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An error reply from herdr, before classification.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ErrorBody {
    /// Maps herdr's code, answered to a request that types into a pane (`op`), onto fleetd's
    /// split: the codes herdr may answer after typing are uncertain, the rest as for any call.
    /// `protocol`: the server's, when known (unknown counts as the newest).
    pub(crate) fn into_input_error(self, op: &str, what: &str, protocol: Option<u32>) -> MuxError {
        let code = self.code.as_str();
        let after_enter = protocol.is_none_or(|p| p >= PROMPT_AFTER_ENTER);
        let after_typing = UNCERTAIN_INPUT_CODES.contains(&code)
            || (op == "agent.prompt" && UNCERTAIN_PROMPT_CODES.contains(&code))
            || (op == "agent.prompt" && after_enter && UNCERTAIN_AFTER_ENTER_CODES.contains(&code));
        if after_typing {
            MuxError::Uncertain {
                op: op.to_owned(),
                reason: format!("herdr answered {code}: {}", self.message),
            }
        } else {
            self.into_mux_error(op, what)
        }
    }

    /// Maps herdr's code onto fleetd's not-found / transient / rejected split.
    pub(crate) fn into_mux_error(self, op: &str, what: &str) -> MuxError {
        let code = self.code;
        if NOT_FOUND_CODES.contains(&code.as_str()) {
            MuxError::NotFound {
                what: what.to_owned(),
                code,
                message: self.message,
            }
        } else if TRANSIENT_CODES.contains(&code.as_str()) {
            MuxError::Transient {
                op: op.to_owned(),
                reason: format!("{code}: {}", self.message),
            }
        } else {
            MuxError::Rejected {
                op: op.to_owned(),
                code,
                message: self.message,
            }
        }
    }
}

/// A call's outcome before classification: a result object or herdr's error body.
pub(crate) type RawOutcome = Result<Value, ErrorBody>;

/// Builds a request line (without the newline). `params` is always present, as herdr requires.
pub(crate) fn request_line(method: &str, params: &Value) -> String {
    let id = format!("fleetd-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    json!({ "id": id, "method": method, "params": params }).to_string()
}

/// Reads one `\n`-terminated line of at most `max` bytes. `Ok(None)` on a clean EOF before any
/// byte.
pub(crate) async fn read_line_limited<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
) -> std::io::Result<Option<String>> {
    let mut buf = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed mid-line",
            ));
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(pos) => (&available[..pos], Some(pos + 1)),
            None => (available, None),
        };
        if buf.len() + chunk.len() > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        buf.extend_from_slice(chunk);
        let consumed = done.unwrap_or(chunk.len());
        reader.consume(consumed);
        if done.is_some() {
            return String::from_utf8(buf)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        }
    }
}

/// Parses a response line into a result object or herdr's error body.
pub(crate) fn parse_response(line: &str) -> Result<RawOutcome, String> {
    #[derive(Deserialize)]
    struct Envelope {
        result: Option<Value>,
        error: Option<ErrorBody>,
    }
    let envelope: Envelope =
        serde_json::from_str(line).map_err(|e| format!("undecodable response: {e}"))?;
    match (envelope.result, envelope.error) {
        (Some(result), None) => Ok(Ok(result)),
        (None, Some(error)) => Ok(Err(error)),
        _ => Err("response has neither exactly one of result and error".to_owned()),
    }
}

/// Checks `result.type` is one of `accepted`.
pub(crate) fn check_type(op: &str, result: &Value, accepted: &[&str]) -> Result<(), MuxError> {
    let tag = result.get("type").and_then(Value::as_str).unwrap_or("");
    if accepted.contains(&tag) {
        Ok(())
    } else {
        Err(MuxError::transient(
            op,
            format!("unexpected result type {tag:?} (expected {accepted:?})"),
        ))
    }
}

/// Decodes a field of a result object.
pub(crate) fn field<T: serde::de::DeserializeOwned>(
    op: &str,
    result: &Value,
    name: &str,
) -> Result<T, MuxError> {
    let value = result.get(name).cloned().unwrap_or(Value::Null);
    serde_json::from_value(value)
        .map_err(|e| MuxError::transient(op, format!("undecodable field {name}: {e}")))
}

/// A call that got no usable answer, and whether herdr may have acted on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoAnswer {
    /// The operation.
    pub(crate) op: String,
    /// Why.
    pub(crate) reason: String,
    /// The whole request line went out. herdr acts on a request only once its newline has
    /// arrived: it reads up to it and drops a connection closed before (herdr v0.8.2
    /// src/api/server.rs:520-531, :173-175). From here on the request may have been carried out.
    pub(crate) sent: bool,
}

impl NoAnswer {
    /// The error for an ordinary call: transient, whatever herdr did.
    pub(crate) fn into_mux_error(self) -> MuxError {
        MuxError::transient(self.op, self.reason)
    }

    /// The error for a call that types into a pane: uncertain once the request was out.
    pub(crate) fn into_input_error(self) -> MuxError {
        if self.sent {
            MuxError::uncertain(self.op, self.reason)
        } else {
            self.into_mux_error()
        }
    }
}

/// One request on a fresh connection: connect, write one line, read one line, close. The whole
/// exchange is bounded by `timeout`. No usable answer (an I/O or decode failure, the timeout) is
/// a [`NoAnswer`] saying whether the request was out.
pub(crate) async fn call(
    socket: &Path,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<RawOutcome, NoAnswer> {
    let sent = AtomicBool::new(false);
    let exchange = async {
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("connect {}: {e}", socket.display()))?;
        let (read, mut write) = stream.into_split();
        let mut line = request_line(method, &params);
        line.push('\n');
        // A failed write_all never wrote the final newline, so herdr ignores what it got.
        write
            .write_all(line.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        sent.store(true, Ordering::Relaxed);
        let mut reader = BufReader::new(read);
        let response = read_line_limited(&mut reader, MAX_LINE_BYTES)
            .await
            .map_err(|e| format!("read: {e}"))?
            .ok_or_else(|| "connection closed before a response".to_owned())?;
        parse_response(&response)
    };
    let failed = match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(outcome)) => return Ok(outcome),
        Ok(Err(reason)) => reason,
        Err(_) => format!("no response within {} ms", timeout.as_millis()),
    };
    Err(NoAnswer {
        op: method.to_owned(),
        reason: failed,
        sent: sent.load(Ordering::Relaxed),
    })
}

/// The `capabilities` of `ping`, read loosely: herdr adds fields from release to release
/// (0.9 did), so unknown fields are ignored, and a field of another type than expected,
/// or no object at all, reads as "not offered" instead of failing the ping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// herdr can hand its sessions over to a new binary (`server.live_handoff`).
    pub live_handoff: bool,
    /// herdr ends a subscription that lost events with [`EVENTS_LOST`] (0.9).
    pub events_lost: bool,
    /// `workspace.close` takes `close_group` (0.9; fleetd closes no workspace).
    pub close_group: bool,
}

impl Capabilities {
    /// Reads `ping`'s `capabilities` value (`None`: absent).
    pub fn read(value: Option<&Value>) -> Self {
        let flag = |name: &str| {
            value
                .and_then(|v| v.get(name))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        Self {
            live_handoff: flag("live_handoff"),
            events_lost: flag("events_lost"),
            close_group: flag("close_group"),
        }
    }
}

/// `PaneInfo` as herdr sends it (fields fleetd reads; unknown fields are ignored).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WirePane {
    pub(crate) pane_id: String,
    pub(crate) terminal_id: String,
    pub(crate) workspace_id: String,
    pub(crate) tab_id: String,
    #[serde(default)]
    pub(crate) label: Option<String>,
    #[serde(default)]
    pub(crate) agent: Option<String>,
    #[serde(default)]
    pub(crate) title: Option<String>,
    #[serde(default)]
    pub(crate) terminal_title: Option<String>,
    pub(crate) agent_status: String,
}

/// `TabInfo` as herdr sends it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireTab {
    pub(crate) tab_id: String,
    pub(crate) workspace_id: String,
    #[serde(default)]
    pub(crate) label: String,
    #[serde(default)]
    pub(crate) pane_count: usize,
}

/// `WorkspaceInfo` as herdr sends it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireWorkspace {
    pub(crate) workspace_id: String,
    #[serde(default)]
    pub(crate) label: String,
}

/// `PaneProcessInfo` as herdr sends it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireProcessInfo {
    pub(crate) pane_id: String,
    #[serde(default)]
    pub(crate) shell_pid: Option<u32>,
    #[serde(default)]
    pub(crate) foreground_processes: Vec<WireProcess>,
}

/// One foreground process in `PaneProcessInfo`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireProcess {
    pub(crate) pid: u32,
    /// The process name (`comm`).
    #[serde(default)]
    pub(crate) name: String,
}

/// `PaneReadResult` as herdr sends it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireRead {
    pub(crate) text: String,
}

/// A pushed subscription line: `{"event": ..., "data": {...}}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct WireEvent {
    pub(crate) event: String,
    #[serde(default)]
    pub(crate) data: Value,
}

/// `layout.apply`'s layout root, enough to find the new pane's id.
pub(crate) fn first_layout_pane_id(layout: &Value) -> Option<String> {
    let mut node = layout.get("root")?;
    loop {
        match node.get("type").and_then(Value::as_str)? {
            "pane" => return node.get("pane_id")?.as_str().map(str::to_owned),
            "split" => node = node.get("first")?,
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_classify_not_found_transient_and_rejected() {
        let body = |code: &str| ErrorBody {
            code: code.to_owned(),
            message: "m".to_owned(),
        };
        assert!(
            body("pane_not_found")
                .into_mux_error("pane.get", "pane w1:p1")
                .is_not_found()
        );
        assert!(
            body("agent_not_found")
                .into_mux_error("agent.prompt", "agent")
                .is_not_found()
        );
        assert!(
            body("timeout")
                .into_mux_error("agent.prompt", "x")
                .is_transient()
        );
        assert!(
            body("server_unavailable")
                .into_mux_error("pane.get", "x")
                .is_transient()
        );
        let rejected = body("agent_not_ready").into_mux_error("agent.prompt", "x");
        assert!(!rejected.is_not_found() && !rejected.is_transient());
    }

    #[test]
    fn answers_to_typing_calls_that_may_come_after_typing_are_uncertain() {
        let body = |code: &str| ErrorBody {
            code: code.to_owned(),
            message: "m".to_owned(),
        };
        let input = |code: &str, op: &str| body(code).into_input_error(op, "pane w1:p1", Some(20));
        for (code, op) in [
            ("timeout", "agent.prompt"),
            ("server_unavailable", "agent.prompt"),
            ("internal_error", "agent.prompt"),
            ("timeout", "pane.send_input"),
            ("timeout", "agent.send_keys"),
        ] {
            assert!(input(code, op).is_uncertain(), "{code} to {op}");
        }
        // Answered before anything reached the pane.
        assert!(input("server_unavailable", "pane.send_input").is_transient());
        assert!(matches!(
            input("agent_not_ready", "agent.prompt"),
            MuxError::Rejected { .. }
        ));
        // herdr 0.8 answers agent_prompt_failed before typing; 0.9 (protocol 22) may answer it
        // for the Enter, after the text.
        let failed = |protocol| {
            body("agent_prompt_failed").into_input_error("agent.prompt", "pane w1:p1", protocol)
        };
        assert!(matches!(failed(Some(20)), MuxError::Rejected { .. }));
        assert!(failed(Some(22)).is_uncertain());
        assert!(failed(None).is_uncertain(), "unknown counts as newest");
        assert!(
            !body("agent_prompt_failed")
                .into_input_error("pane.send_input", "pane w1:p1", Some(22))
                .is_uncertain()
        );
        // Gone stays gone; uncertain is never not-found.
        assert!(input("agent_not_found", "agent.prompt").is_not_found());
        assert!(input("pane_not_found", "pane.send_input").is_not_found());

        let no_answer = |sent: bool| NoAnswer {
            op: "agent.prompt".to_owned(),
            reason: "no response within 8000 ms".to_owned(),
            sent,
        };
        assert!(no_answer(true).into_input_error().is_uncertain());
        assert!(no_answer(false).into_input_error().is_transient());
        assert!(no_answer(true).into_mux_error().is_transient());
    }

    #[test]
    fn responses_parse_and_requests_always_carry_params() {
        let line = request_line("ping", &json!({}));
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["method"], "ping");
        assert!(v["params"].is_object());
        assert!(v["id"].as_str().is_some_and(|id| id.starts_with("fleetd-")));

        let ok = parse_response(
            r#"{"id":"1","result":{"type":"pong","version":"0.8.0","protocol":20}}"#,
        );
        assert!(matches!(ok, Ok(Ok(_))));
        let err = parse_response(r#"{"id":"","error":{"code":"invalid_request","message":"x"}}"#);
        assert!(matches!(err, Ok(Err(ErrorBody { .. }))));
        assert!(parse_response("not json").is_err());
        assert!(parse_response(r#"{"id":"1"}"#).is_err());
    }

    #[tokio::test]
    async fn line_reader_enforces_its_limit() {
        let mut input: &[u8] = b"hello\nworld";
        let mut reader = BufReader::new(&mut input);
        assert_eq!(
            read_line_limited(&mut reader, 100)
                .await
                .expect("line")
                .as_deref(),
            Some("hello")
        );
        assert!(
            read_line_limited(&mut reader, 100).await.is_err(),
            "EOF mid-line"
        );
        let mut long: &[u8] = b"0123456789\n";
        let mut reader = BufReader::new(&mut long);
        assert!(read_line_limited(&mut reader, 5).await.is_err());
    }

    #[test]
    fn capabilities_are_read_loosely() {
        let v08 = json!({ "live_handoff": true, "detached_server_daemon": true });
        assert_eq!(
            Capabilities::read(Some(&v08)),
            Capabilities {
                live_handoff: true,
                ..Capabilities::default()
            }
        );
        let v09 = json!({ "live_handoff": false, "events_lost": true, "close_group": true,
                          "something_new": { "nested": [1, 2] } });
        let caps = Capabilities::read(Some(&v09));
        assert!(caps.events_lost && caps.close_group && !caps.live_handoff);
        let odd = json!({ "events_lost": "yes", "close_group": { "v": 1 } });
        assert_eq!(Capabilities::read(Some(&odd)), Capabilities::default());
        assert_eq!(
            Capabilities::read(Some(&json!([1]))),
            Capabilities::default()
        );
        assert_eq!(Capabilities::read(None), Capabilities::default());
    }

    #[test]
    fn layout_pane_id_is_found_in_nested_roots() {
        let layout = json!({"root": {"type": "split", "first": {"type": "pane", "pane_id": "w1:p4"}, "second": {"type": "pane"}}});
        assert_eq!(first_layout_pane_id(&layout).as_deref(), Some("w1:p4"));
    }
}

//! A test-side reader of fleetd's `GET /events` (server-sent events), on the operator's unix
//! socket or TCP, over the kit's client; blocking, with a quiet-time bound. Also the parser of
//! one event block, which the MCP client shares for answers that come as an event stream.

use std::path::Path;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use serde_json::Value;

use super::Endpoint;
use super::client::{self, Conn, Request};

/// How long [`SseReader::next_event`] waits for the stream to say something.
const QUIET_LIMIT: Duration = Duration::from_secs(20);

/// One event as the stream framed it.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The `id:` field (empty when the event has none).
    pub id: String,
    /// The `data:` field, parsed as JSON (a string when it is not JSON).
    pub data: Value,
}

/// The fields of one event block (the text between blank lines); `None` for a block with
/// neither an event name nor data (a keep-alive comment). Data lines join with `\n`.
pub fn parse_block(block: &str) -> Option<(String, String, String)> {
    let (mut event, mut id, mut data) = (String::new(), String::new(), Vec::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    (!event.is_empty() || !data.is_empty()).then(|| (event, id, data.join("\n")))
}

/// An open event stream.
pub struct SseReader {
    /// Kept so the connection lives as long as the stream is read.
    _conn: Conn,
    body: Option<Incoming>,
    /// The HTTP status of the answer.
    pub status: u16,
    /// The body of a refusal (empty for a stream).
    pub refusal: String,
    /// Every body byte read so far (to check what never appears in the stream).
    pub raw: String,
    pending: String,
}

impl SseReader {
    /// `GET /events` on the unix socket at `path`, resuming after `last_event_id`.
    pub fn unix(path: &Path, last_event_id: Option<&str>) -> std::io::Result<Self> {
        Self::open(&Endpoint::Unix(path.to_path_buf()), &[], last_event_id)
    }

    /// `GET /events` over TCP to `addr` with extra `headers`.
    pub fn tcp(
        addr: std::net::SocketAddr,
        headers: &[(&str, &str)],
        last_event_id: Option<&str>,
    ) -> std::io::Result<Self> {
        Self::open(&Endpoint::Tcp(addr), headers, last_event_id)
    }

    fn open(
        to: &Endpoint,
        headers: &[(&str, &str)],
        last_event_id: Option<&str>,
    ) -> std::io::Result<Self> {
        let mut all = vec![("accept", "text/event-stream")];
        all.extend(last_event_id.map(|id| ("last-event-id", id)));
        all.extend_from_slice(headers);
        let request = Request {
            method: "GET",
            path: "/events",
            headers: &all,
            body: None,
        };
        client::block(async {
            let mut conn = Conn::open(to).await?;
            let answer = conn.send(request).await?;
            let status = answer.status().as_u16();
            let (body, refusal) = if status == 200 {
                (Some(answer.into_body()), String::new())
            } else {
                (None, client::collect(answer).await?.body)
            };
            Ok(Self {
                _conn: conn,
                body,
                status,
                refusal,
                raw: String::new(),
                pending: String::new(),
            })
        })
    }

    /// Reads the next piece of the body into `pending`; false at the end of the stream or
    /// after [`QUIET_LIMIT`] without a byte.
    fn read_more(&mut self) -> bool {
        let Some(body) = self.body.as_mut() else {
            return false;
        };
        let frame = client::block(async { tokio::time::timeout(QUIET_LIMIT, body.frame()).await });
        let Ok(Some(Ok(frame))) = frame else {
            return false;
        };
        if let Ok(data) = frame.into_data() {
            let text = String::from_utf8_lossy(&data);
            self.raw.push_str(&text);
            self.pending.push_str(&text);
        }
        true
    }

    /// The next event (comments skipped); `None` when the stream ended or nothing came within
    /// the quiet limit.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let Some((event, id, data)) = parse_block(&block) else {
                    continue;
                };
                return Some(SseEvent {
                    event,
                    id,
                    data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
                });
            }
            if !self.read_more() {
                return None;
            }
        }
    }

    /// Reads events until one matches `pred`; returns every event read, the match last.
    pub fn until(&mut self, what: &str, pred: impl Fn(&SseEvent) -> bool) -> Vec<SseEvent> {
        let mut seen = Vec::new();
        loop {
            let Some(event) = self.next_event() else {
                panic!("the event stream ended or went quiet before {what}; seen: {seen:#?}");
            };
            let done = pred(&event);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

//! One streamed model request, as an agent's CLI makes it, for the model gateway's tests: run in
//! a pane by the `model-call` binary (so fleetd locates it there), or by a test process itself.
//! It sends an Anthropic Messages, OpenAI Responses or Chat Completions request with
//! `stream: true` to a backend URL (fleetd's `/model/<backend>`, or a backend's own) with a key
//! in `x-api-key` or `Authorization: Bearer`, reads the answer frame by frame, and says what came
//! back: the status, the error body, how many server-sent events, the bytes, whether the API's
//! last event arrived and whether the stream ended cleanly, broke, or stalled past a deadline.
//! It speaks HTTP through the kit's one client (`http::client`); it never judges the answer.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::BodyExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::http::{Conn, Endpoint, Request};

/// The API a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// Anthropic Messages: `POST {url}/v1/messages`, ends with `message_stop`.
    Anthropic,
    /// OpenAI Responses: `POST {url}/responses`, ends with `response.completed`.
    Responses,
    /// OpenAI Chat Completions: `POST {url}/chat/completions`, ends with `data: [DONE]`.
    Chat,
}

impl Api {
    /// The name `--api` takes.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "anthropic" => Some(Self::Anthropic),
            "responses" => Some(Self::Responses),
            "chat" => Some(Self::Chat),
            _ => None,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Self::Anthropic => "/v1/messages",
            Self::Responses => "/responses",
            Self::Chat => "/chat/completions",
        }
    }

    fn body(self, prompt: &str) -> Value {
        match self {
            Self::Anthropic => json!({
                "model": "fake", "max_tokens": 256, "stream": true,
                "messages": [{"role": "user", "content": prompt}],
            }),
            Self::Responses => json!({
                "model": "fake", "stream": true,
                "input": [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": prompt}]}],
            }),
            Self::Chat => json!({
                "model": "fake", "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": prompt}],
            }),
        }
    }

    /// Whether `event` (its `event:` name, else its data's `type`, else the data) is this API's
    /// last.
    fn is_last(self, event: &str) -> bool {
        match self {
            Self::Anthropic => event == "message_stop",
            Self::Responses => event == "response.completed",
            Self::Chat => event == "[DONE]",
        }
    }
}

/// Which header carries the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyHeader {
    /// `x-api-key: KEY` (Anthropic's).
    XApiKey,
    /// `Authorization: Bearer KEY`.
    Bearer,
}

/// One request to make.
#[derive(Debug, Clone)]
pub struct Call {
    /// The backend's base URL (`http://HOST:PORT[/prefix]`).
    pub url: String,
    /// The key presented.
    pub key: String,
    /// Where it is presented.
    pub header: KeyHeader,
    /// The API spoken.
    pub api: Api,
    /// The user's prompt.
    pub prompt: String,
    /// More headers (`Origin`, ...), as given.
    pub extra_headers: Vec<(String, String)>,
    /// How long the whole exchange may take before it counts as stalled.
    pub timeout: Duration,
    /// A file that gets one line per event as it arrives, so a test can act mid-stream.
    pub progress: Option<PathBuf>,
}

impl Call {
    /// A request to `url` with `key` in `x-api-key`, Anthropic's API, a 30 s deadline.
    pub fn new(url: &str, key: &str) -> Self {
        Self {
            url: url.to_owned(),
            key: key.to_owned(),
            header: KeyHeader::XApiKey,
            api: Api::Anthropic,
            prompt: "@text model-call says hello".to_owned(),
            extra_headers: Vec::new(),
            timeout: Duration::from_secs(30),
            progress: None,
        }
    }
}

/// How the answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ended {
    /// The body ended as HTTP says it should.
    Clean,
    /// The connection broke (or could not be made) before the body ended.
    Broken,
    /// Nothing ended it within the deadline.
    Stalled,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    /// The HTTP status (0: no answer at all).
    pub status: u16,
    /// The body of an answer that is not a success (JSON when it is JSON, else its text).
    pub error: Option<Value>,
    /// Server-sent events received whole.
    pub events: u64,
    /// Bytes of body received.
    pub bytes: u64,
    /// The body received, as text.
    pub body: String,
    /// Whether the API's last event arrived.
    pub finished: bool,
    /// How the answer ended.
    pub ended: Ended,
    /// Why it broke or stalled.
    pub trouble: Option<String>,
}

impl Outcome {
    fn none(ended: Ended, trouble: String) -> Self {
        Self {
            status: 0,
            error: None,
            events: 0,
            bytes: 0,
            body: String::new(),
            finished: false,
            ended,
            trouble: Some(trouble),
        }
    }

    /// The error code of a refusal: `error.code` in the APIs' shapes, or fleetd's own `error`
    /// (its request guard's refusals); empty without one.
    pub fn error_code(&self) -> String {
        self.error
            .as_ref()
            .and_then(|e| e["error"]["code"].as_str().or_else(|| e["error"].as_str()))
            .unwrap_or_default()
            .to_owned()
    }

    /// The refusal's words (`error.message`), empty without one.
    pub fn error_message(&self) -> String {
        self.error
            .as_ref()
            .and_then(|e| {
                e["error"]["message"]
                    .as_str()
                    .or_else(|| e["message"].as_str())
            })
            .unwrap_or_default()
            .to_owned()
    }
}

/// The address and path prefix of `url` (`http://IP:PORT[/prefix]`).
fn split(url: &str) -> Option<(std::net::SocketAddr, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, prefix) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let addr = authority.replace("localhost", "127.0.0.1").parse().ok()?;
    Some((addr, prefix.trim_end_matches('/').to_owned()))
}

/// Makes `call` and says what came back; never fails (a refusal, a broken stream and a stall
/// are outcomes).
pub async fn run(call: &Call) -> Outcome {
    match tokio::time::timeout(call.timeout, exchange(call)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::none(
            Ended::Stalled,
            format!("no end within {} s", call.timeout.as_secs()),
        ),
    }
}

/// [`run`] for a blocking caller (a test process).
pub fn run_blocking(call: &Call) -> Outcome {
    crate::http::client::block(run(call))
}

async fn exchange(call: &Call) -> Outcome {
    let Some((addr, prefix)) = split(&call.url) else {
        return Outcome::none(
            Ended::Broken,
            format!("{:?} is not an http://IP:PORT URL", call.url),
        );
    };
    let path = format!("{prefix}{}", call.api.path());
    let bearer = format!("Bearer {}", call.key);
    let mut headers: Vec<(&str, &str)> = match call.header {
        KeyHeader::XApiKey => vec![("x-api-key", call.key.as_str())],
        KeyHeader::Bearer => vec![("authorization", bearer.as_str())],
    };
    if call.api == Api::Anthropic {
        headers.push(("anthropic-version", "2023-06-01"));
    }
    headers.extend(
        call.extra_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    let body = call.api.body(&call.prompt).to_string();
    let request = Request {
        method: "POST",
        path: &path,
        headers: &headers,
        body: Some(&body),
    };
    let response = match Conn::open(&Endpoint::Tcp(addr)).await {
        Ok(mut conn) => conn.send(request).await,
        Err(e) => Err(e),
    };
    let response = match response {
        Ok(r) => r,
        Err(e) => return Outcome::none(Ended::Broken, e.to_string()),
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut read = Reader::new(call.api, call.progress.as_deref());
    let mut outcome = Outcome::none(Ended::Clean, String::new());
    outcome.status = status;
    outcome.trouble = None;
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.feed(&data);
                }
            }
            Some(Err(e)) => {
                outcome.ended = Ended::Broken;
                outcome.trouble = Some(e.to_string());
                break;
            }
        }
    }
    outcome.bytes = read.bytes;
    outcome.events = read.events;
    outcome.finished = read.finished;
    outcome.body = String::from_utf8_lossy(&read.all).into_owned();
    if !(200..300).contains(&status) {
        outcome.error = Some(
            serde_json::from_str(&outcome.body).unwrap_or_else(|_| json!(outcome.body.clone())),
        );
    }
    outcome
}

/// Reads server-sent events off the body as it arrives, a block between blank lines at a time
/// (`http::events::parse_block`).
struct Reader<'a> {
    api: Api,
    progress: Option<&'a Path>,
    all: Vec<u8>,
    /// Text after the last blank line: the event still arriving.
    pending: String,
    events: u64,
    bytes: u64,
    finished: bool,
}

impl<'a> Reader<'a> {
    fn new(api: Api, progress: Option<&'a Path>) -> Self {
        Self {
            api,
            progress,
            all: Vec::new(),
            pending: String::new(),
            events: 0,
            bytes: 0,
            finished: false,
        }
    }

    fn feed(&mut self, data: &[u8]) {
        self.bytes += u64::try_from(data.len()).unwrap_or(u64::MAX);
        self.all.extend_from_slice(data);
        self.pending
            .push_str(&String::from_utf8_lossy(data).replace("\r\n", "\n"));
        while let Some(end) = self.pending.find("\n\n") {
            let block: String = self.pending.drain(..end + 2).collect();
            if let Some((name, _, data)) = crate::http::events::parse_block(&block) {
                self.dispatch(name, &data);
            }
        }
    }

    /// One whole event: counted, judged by its name (else its data's `type`, else its data),
    /// told to the progress file.
    fn dispatch(&mut self, name: String, data: &str) {
        let name = if name.is_empty() {
            serde_json::from_str::<Value>(data)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_owned))
                .unwrap_or_else(|| data.to_owned())
        } else {
            name
        };
        self.events += 1;
        self.finished |= self.api.is_last(&name);
        if let Some(path) = self.progress
            && let Ok(mut file) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(file, "{}", json!({ "n": self.events, "event": name }));
        }
    }
}

/// Writes `outcome` to `path` whole: a temp file renamed, so a reader never sees half of it.
pub fn write(path: &Path, outcome: &Outcome) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec(outcome).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path)
}

/// The outcome a `model-call` wrote to `path`, once it is there.
pub fn read(path: &Path) -> Option<Outcome> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_counted_across_frames_and_the_last_one_is_known() {
        let mut r = Reader::new(Api::Anthropic, None);
        r.feed(b"event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: pi");
        assert_eq!((r.events, r.finished), (1, false));
        r.feed(b"ng\ndata: {}\n\nevent: message_stop\r\ndata: {}\r\n\r\n");
        assert_eq!((r.events, r.finished), (3, true));
        let mut r = Reader::new(Api::Chat, None);
        r.feed(b"data: {\"object\":\"chat.completion.chunk\"}\n\ndata: [DONE]\n\n");
        assert_eq!((r.events, r.finished), (2, true));
    }

    #[test]
    fn urls_split_into_address_and_prefix() {
        let (addr, prefix) = split("http://127.0.0.1:7797/model/lab/").expect("a URL");
        assert_eq!((addr.port(), prefix.as_str()), (7797, "/model/lab"));
        assert!(split("https://example.com").is_none());
    }
}

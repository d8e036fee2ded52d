//! A minimal HTTP/1.1 client for tests: one request per connection, `Connection: close`, over
//! TCP or the daemon's operator socket.

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

fn exchange(stream: &mut (impl Read + Write), head: &str, body: &str) -> std::io::Result<Vec<u8>> {
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

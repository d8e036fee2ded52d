//! HTTP for tests, benchmarks and sim-agent, over TCP or the daemon's operator socket: one
//! client ([`client::Conn`], on hyper), the blocking one-request helpers most tests use, the
//! `/events` reader ([`events`]) and the MCP client ([`mcp`]). A test that must send bytes no
//! client would (a flood of unfinished heads) uses [`crate::malformed`], never this.

pub mod client;
pub mod events;
pub mod mcp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use client::{Conn, Request};

/// Bound on one blocking request: long enough for a `fleet_ask` that waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(150);

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

    /// Asserts that this answer refused with `status` and the error code `code`; a failure
    /// names the attempt, `what`, and shows the body.
    #[track_caller]
    pub fn assert_refused(&self, status: u16, code: &str, what: &str) {
        assert_eq!(
            (self.status, self.error_code().as_str()),
            (status, code),
            "{what}: {}",
            self.body
        );
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

/// Sends one request on a connection of its own and reads the whole response.
pub fn request(
    to: impl Into<Endpoint>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Response> {
    request_with(to, method, path, &[], body)
}

/// Sends one request with extra `headers` on a connection of its own (`Connection: close`)
/// and reads the response. A header named in `headers` replaces the default of that name: `Host`
/// (the address connected to, or `localhost` on the unix socket), `Content-Type` (JSON) and
/// `Accept` (JSON and event streams).
pub fn request_with(
    to: impl Into<Endpoint>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> std::io::Result<Response> {
    let to = to.into();
    let mut all = vec![("connection", "close")];
    all.extend_from_slice(headers);
    let request = Request {
        method,
        path,
        headers: &all,
        body,
    };
    client::block(async {
        let exchange = async { Conn::open(&to).await?.exchange(request).await };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
    })
}

/// Sends `GET path`.
pub fn get(to: impl Into<Endpoint>, path: &str) -> std::io::Result<Response> {
    request(to, "GET", path, None)
}

/// Sends `GET path` with extra `headers` (a token, a cookie, a web page's `Origin`), as
/// [`request_with`] sends them.
pub fn get_with(
    to: impl Into<Endpoint>,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    request_with(to, "GET", path, headers, None)
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

//! sim-agent's minimal MCP client: JSON-RPC over HTTP/1.1 POST to fleetd's streamable-HTTP
//! endpoint (stateless JSON mode), accepting either an `application/json` body or a
//! `text/event-stream` with `data:` lines, plain or chunked. Lean on purpose: no HTTP crate, no
//! TLS, loopback only. Must not be used by the daemon.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The MCP protocol version sim-agent announces.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Bound on one HTTP exchange (a `fleet_ask` may block for a while).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);

/// A client for one MCP endpoint, e.g. `http://127.0.0.1:7797/mcp`.
#[derive(Debug, Clone)]
pub struct McpClient {
    host_port: String,
    path: String,
    session: Option<String>,
    next_id: u64,
}

/// An HTTP response, decoded.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl McpClient {
    /// Parses `base` (`http://host:port[/path]`); an empty path becomes `/mcp`.
    pub fn new(base: &str) -> anyhow::Result<Self> {
        let rest = base
            .strip_prefix("http://")
            .with_context(|| format!("FLEETD_URL {base:?} must start with http://"))?;
        let (host_port, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let path = match path.trim_end_matches('/') {
            "" => "/mcp".to_owned(),
            p => p.to_owned(),
        };
        Ok(Self {
            host_port: host_port.to_owned(),
            path,
            session: None,
            next_id: 1,
        })
    }

    /// `initialize` + `notifications/initialized` + `tools/list`, as every real agent connects
    /// (fleetd counts a member ready for its task once it has listed the tools).
    pub async fn initialize(&mut self) -> anyhow::Result<Value> {
        let result = self
            .request(
                "initialize",
                json!({
                    "protocolVersion": PROTOCOL_VERSION,
                    "capabilities": {},
                    "clientInfo": { "name": "sim-agent", "version": env!("CARGO_PKG_VERSION") },
                }),
            )
            .await?;
        self.notify("notifications/initialized").await?;
        self.request("tools/list", json!({})).await?;
        Ok(result)
    }

    /// `tools/call` of `name` with `arguments`; returns the JSON-RPC `result`.
    pub async fn call_tool(&mut self, name: &str, arguments: Value) -> anyhow::Result<Value> {
        self.request(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
        .await
    }

    async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = self.post(&body).await?;
        if let Some(session) = response.header("mcp-session-id") {
            self.session = Some(session.to_owned());
        }
        if !(200..300).contains(&response.status) {
            bail!(
                "{method}: HTTP {} {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            );
        }
        let message = decode_message(&response, id)?;
        if let Some(error) = message.get("error") {
            bail!("{method}: JSON-RPC error {error}");
        }
        Ok(message.get("result").cloned().unwrap_or(Value::Null))
    }

    async fn notify(&mut self, method: &str) -> anyhow::Result<()> {
        let body = json!({ "jsonrpc": "2.0", "method": method });
        let response = self.post(&body).await?;
        if !(200..300).contains(&response.status) {
            bail!("{method}: HTTP {}", response.status);
        }
        Ok(())
    }

    async fn post(&self, body: &Value) -> anyhow::Result<Response> {
        let payload = body.to_string();
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n\
             Content-Length: {}\r\nConnection: close\r\n",
            self.path,
            self.host_port,
            payload.len()
        );
        if let Some(session) = &self.session {
            head.push_str(&format!("Mcp-Session-Id: {session}\r\n"));
        }
        head.push_str("\r\n");
        let exchange = async {
            let mut stream = TcpStream::connect(&self.host_port)
                .await
                .with_context(|| format!("connect {}", self.host_port))?;
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(payload.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            parse_response(&raw)
        };
        tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
            .await
            .context("MCP exchange timed out")?
    }
}

fn parse_response(raw: &[u8]) -> anyhow::Result<Response> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of HTTP headers")?;
    let head = std::str::from_utf8(&raw[..split]).context("headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    });
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk header")?;
        let size_text = std::str::from_utf8(&body[..line_end])?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).context("bad chunk size")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        anyhow::ensure!(body.len() >= size, "truncated chunk");
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
}

/// Finds the JSON-RPC response with `id` in a JSON body or an SSE stream.
fn decode_message(response: &Response, id: u64) -> anyhow::Result<Value> {
    let text = String::from_utf8_lossy(&response.body);
    let is_sse = response
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !is_sse {
        return serde_json::from_str(&text).context("undecodable JSON-RPC body");
    }
    // Events are separated by blank lines; an event's data lines join with '\n'.
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        if let Ok(message) = serde_json::from_str::<Value>(&data.join("\n"))
            && message.get("id").and_then(Value::as_u64) == Some(id)
        {
            return Ok(message);
        }
    }
    bail!("no JSON-RPC response with id {id} in the event stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_decode_from_json_sse_and_chunks() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nmcp-session-id: s1\r\n\r\n";
        let event = "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"ok\":1}}\n\n";
        let body = format!("{:x}\r\n{event}\r\n0\r\n\r\n", event.len());
        let response = parse_response(&[raw.as_slice(), body.as_bytes()].concat()).expect("parse");
        assert_eq!(response.header("Mcp-Session-Id"), Some("s1"));
        assert_eq!(
            decode_message(&response, 3).expect("decode")["result"]["ok"],
            1
        );
        assert!(decode_message(&response, 4).is_err());

        let plain =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"id\":1,\"result\":{}}";
        let response = parse_response(plain).expect("parse");
        assert!(decode_message(&response, 1).expect("decode")["result"].is_object());
    }

    #[test]
    fn base_urls_default_to_the_mcp_path() {
        let c = McpClient::new("http://127.0.0.1:7797").expect("url");
        assert_eq!(
            (c.host_port.as_str(), c.path.as_str()),
            ("127.0.0.1:7797", "/mcp")
        );
        let c = McpClient::new("http://127.0.0.1:1/x/").expect("url");
        assert_eq!(c.path, "/x");
        assert!(McpClient::new("https://h").is_err());
    }
}

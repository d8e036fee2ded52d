//! A keep-alive HTTP/1.1 MCP client for the benchmarks: one TCP connection reused for every
//! `tools/call`, as real MCP clients pool theirs, so a round trip measures the server and not a
//! TCP handshake (and, for fleetd, not the first-contact caller lookup). Answers may be plain JSON
//! or a `text/event-stream`, with `Content-Length` or chunked. Std only, loopback only, no TLS.
//! Used by the benchmarks; never by the daemon.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// The MCP protocol version the benchmarks announce.
const PROTOCOL_VERSION: &str = "2025-06-18";
/// Bound on one exchange (a `fleet_spawn` waits for its member to be ready).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(180);

/// One keep-alive connection to an MCP endpoint.
#[derive(Debug)]
pub struct McpConn {
    addr: SocketAddr,
    path: String,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    session: Option<String>,
    next_id: u64,
}

impl McpConn {
    /// Connects to `addr` and posts to `path` (e.g. `/mcp`).
    pub fn connect(addr: SocketAddr, path: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
        Ok(Self {
            addr,
            path: path.to_owned(),
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            session: None,
            next_id: 1,
        })
    }

    /// Parses `http://host:port[/path]` (default path `/mcp`) and connects.
    pub fn connect_url(url: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("{url:?} must start with http://"))?;
        let (host_port, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = match path.trim_end_matches('/') {
            "" => "/mcp",
            p => p,
        };
        let addr = host_port
            .parse()
            .with_context(|| format!("{host_port:?} is not an IP address and port"))?;
        Self::connect(addr, path)
    }

    /// Whether the server has closed this kept-alive connection (or sent something unasked),
    /// so it must not be reused: what an HTTP client checks before it reuses a pooled
    /// connection, since a server closes idle ones (fleetd's `connections.idleTimeoutMs`, or to
    /// make room under `connections.max`).
    pub fn is_closed(&self) -> bool {
        if !self.reader.buffer().is_empty() || self.writer.set_nonblocking(true).is_err() {
            return true;
        }
        let mut byte = [0u8; 1];
        let closed = !matches!(
            self.writer.peek(&mut byte),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        closed || self.writer.set_nonblocking(false).is_err()
    }

    /// The client-side port of the connection (the same for every call on it).
    pub fn local_port(&self) -> anyhow::Result<u16> {
        Ok(self.writer.local_addr()?.port())
    }

    /// `initialize` + `notifications/initialized` + `tools/list`, as an agent connects.
    pub fn initialize(&mut self) -> anyhow::Result<Value> {
        let result = self.request(
            "initialize",
            &json!({
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "fleetd-bench", "version": env!("CARGO_PKG_VERSION") },
            }),
        )?;
        let body = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let (status, _) = self.exchange(&body)?;
        anyhow::ensure!(
            (200..300).contains(&status),
            "notifications/initialized: HTTP {status}"
        );
        self.request("tools/list", &json!({}))?;
        Ok(result)
    }

    /// `tools/call` of `name`; returns the JSON-RPC `result` (a `CallToolResult`).
    pub fn call_tool(&mut self, name: &str, arguments: &Value) -> anyhow::Result<Value> {
        self.request(
            "tools/call",
            &json!({ "name": name, "arguments": arguments }),
        )
    }

    fn request(&mut self, method: &str, params: &Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let (status, text) = self.exchange(&body)?;
        if !(200..300).contains(&status) {
            bail!("{method}: HTTP {status} {text}");
        }
        let message = decode(&text, id)?;
        if let Some(error) = message.get("error") {
            bail!("{method}: JSON-RPC error {error}");
        }
        Ok(message.get("result").cloned().unwrap_or(Value::Null))
    }

    /// One POST on the kept-alive connection; returns status and body text.
    fn exchange(&mut self, body: &Value) -> anyhow::Result<(u16, String)> {
        let payload = body.to_string();
        let mut head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n\
             Content-Length: {}\r\n",
            self.path,
            self.addr,
            payload.len()
        );
        if let Some(session) = &self.session {
            head.push_str(&format!("Mcp-Session-Id: {session}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&payload);
        self.writer.write_all(head.as_bytes())?;

        let mut status_line = String::new();
        self.reader.read_line(&mut status_line)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let (mut length, mut chunked) = (None, false);
        loop {
            let mut line = String::new();
            anyhow::ensure!(
                self.reader.read_line(&mut line)? > 0,
                "connection closed in the headers"
            );
            if line == "\r\n" {
                break;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
            match key.as_str() {
                "content-length" => length = Some(value.parse::<usize>()?),
                "transfer-encoding" => chunked = value.to_ascii_lowercase().contains("chunked"),
                "mcp-session-id" => self.session = Some(value.to_owned()),
                _ => {}
            }
        }
        let body = if chunked {
            self.read_chunked()?
        } else {
            let mut buf = vec![0; length.unwrap_or(0)];
            self.reader.read_exact(&mut buf)?;
            buf
        };
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }

    fn read_chunked(&mut self) -> anyhow::Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let mut size = String::new();
            self.reader.read_line(&mut size)?;
            let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
                .with_context(|| format!("bad chunk size {size:?}"))?;
            if size == 0 {
                // Trailers (none expected) end with an empty line.
                let mut end = String::new();
                while self.reader.read_line(&mut end)? > 2 {
                    end.clear();
                }
                return Ok(out);
            }
            let mut chunk = vec![0; size + 2];
            self.reader.read_exact(&mut chunk)?;
            chunk.truncate(size);
            out.extend_from_slice(&chunk);
        }
    }
}

/// Finds the JSON-RPC response with `id` in a JSON body or an event stream.
fn decode(text: &str, id: u64) -> anyhow::Result<Value> {
    if let Ok(message) = serde_json::from_str::<Value>(text) {
        return Ok(message);
    }
    for event in text.replace("\r\n", "\n").split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if let Ok(message) = serde_json::from_str::<Value>(&data.join("\n"))
            && message.get("id").and_then(Value::as_u64) == Some(id)
        {
            return Ok(message);
        }
    }
    bail!("no JSON-RPC response with id {id} in {text:?}")
}

/// The `structuredContent` of a successful tool result, or an error naming the tool.
pub fn structured(tool: &str, result: &Value) -> anyhow::Result<Value> {
    anyhow::ensure!(result["isError"] != true, "{tool} failed: {result}");
    Ok(result["structuredContent"].clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode_from_json_and_event_streams() {
        assert_eq!(decode(r#"{"id":1,"result":{}}"#, 1).expect("json")["id"], 1);
        let sse = "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\r\n\r\n";
        assert_eq!(decode(sse, 7).expect("sse")["result"]["ok"], true);
        assert!(decode(sse, 8).is_err());
    }
}

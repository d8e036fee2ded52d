//! The kit's MCP client: JSON-RPC over HTTP POST to fleetd's streamable-HTTP endpoint, on the
//! kit's one HTTP client. Answers may be plain JSON or an event stream. Either a connection per
//! call (as sim-agent connects, so every call is a first contact) or one kept alive (as real
//! MCP clients pool theirs). [`McpClient`] is async; [`McpConn`] is the same client for
//! blocking callers (the benchmarks, `mcp-call`).

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::client::{self, Conn, Request};
use super::events::parse_block;
use super::{Endpoint, Response};

/// The MCP protocol version the kit announces.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Bound on one exchange (a `fleet_ask` may block for a while, a `fleet_spawn` waits for its
/// member to be ready).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(300);

/// A client of one MCP endpoint, e.g. `http://127.0.0.1:7797/mcp`.
#[derive(Debug)]
pub struct McpClient {
    to: Endpoint,
    path: String,
    name: &'static str,
    keep_alive: bool,
    conn: Option<Conn>,
    session: Option<String>,
    next_id: u64,
}

impl McpClient {
    /// Parses `http://host:port[/path]` (an empty path becomes `/mcp`); a connection per call.
    pub fn new(url: &str) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("the MCP URL {url:?} must start with http://"))?;
        let (host_port, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let addr = host_port
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .with_context(|| {
                format!("{host_port:?} in {url:?} is not a reachable host and port")
            })?;
        Ok(Self::at(addr, path))
    }

    /// A client posting to `path` at `addr` (an empty path becomes `/mcp`); a connection per
    /// call.
    pub fn at(addr: SocketAddr, path: &str) -> Self {
        Self::on(Endpoint::Tcp(addr), path)
    }

    /// A client posting to `path` at `to` (the TCP listener or the operator socket); a
    /// connection per call.
    pub fn on(to: Endpoint, path: &str) -> Self {
        let path = match path.trim_end_matches('/') {
            "" => "/mcp".to_owned(),
            p => p.to_owned(),
        };
        Self {
            to,
            path,
            name: "fleetd-testkit",
            keep_alive: false,
            conn: None,
            session: None,
            next_id: 1,
        }
    }

    /// Keeps one connection for every call (reopened once the server has closed it).
    #[must_use]
    pub fn kept_alive(mut self) -> Self {
        self.keep_alive = true;
        self
    }

    /// Names the client in `initialize`'s `clientInfo`.
    #[must_use]
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// Whether the kept-alive connection is gone (the server closed it), so a pool must not
    /// hand this client out again; true before the first call.
    pub fn is_closed(&self) -> bool {
        self.conn.as_ref().is_none_or(Conn::is_closed)
    }

    /// The client-side port of the kept-alive connection.
    pub fn local_port(&self) -> Option<u16> {
        self.conn.as_ref().and_then(Conn::local_port)
    }

    /// `initialize` + `notifications/initialized` + `tools/list`, as every real agent connects
    /// (fleetd counts a member ready for its task once it has listed the tools).
    pub async fn initialize(&mut self) -> anyhow::Result<Value> {
        let info = json!({ "name": self.name, "version": env!("CARGO_PKG_VERSION") });
        let result = self
            .request(
                "initialize",
                json!({ "protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": info }),
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

    /// One JSON-RPC request; returns its `result`, or its `error` as an error.
    pub async fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let response = self.post(&body).await?;
        if !(200..300).contains(&response.status) {
            bail!("{method}: HTTP {} {}", response.status, response.body);
        }
        let message = decode(&response, id)?;
        if let Some(error) = message.get("error") {
            bail!("{method}: JSON-RPC error {error}");
        }
        Ok(message.get("result").cloned().unwrap_or(Value::Null))
    }

    /// One JSON-RPC notification.
    pub async fn notify(&mut self, method: &str) -> anyhow::Result<()> {
        let response = self
            .post(&json!({ "jsonrpc": "2.0", "method": method }))
            .await?;
        anyhow::ensure!(
            (200..300).contains(&response.status),
            "{method}: HTTP {}",
            response.status
        );
        Ok(())
    }

    async fn post(&mut self, body: &Value) -> anyhow::Result<Response> {
        let payload = body.to_string();
        let session = self.session.clone();
        let mut headers = vec![("mcp-protocol-version", PROTOCOL_VERSION)];
        headers.extend(session.as_deref().map(|s| ("mcp-session-id", s)));
        if !self.keep_alive {
            headers.push(("connection", "close"));
        }
        let request = Request {
            method: "POST",
            path: &self.path,
            headers: &headers,
            body: Some(&payload),
        };
        let conn = match self.conn.take() {
            Some(conn) if self.keep_alive && !conn.is_closed() => conn,
            _ => Conn::open(&self.to)
                .await
                .with_context(|| format!("connect {:?}", self.to))?,
        };
        let conn = self.conn.insert(conn);
        let response = tokio::time::timeout(EXCHANGE_TIMEOUT, conn.exchange(request))
            .await
            .context("MCP exchange timed out")??;
        if let Some(session) = response.headers("mcp-session-id").first() {
            self.session = Some((*session).to_owned());
        }
        Ok(response)
    }
}

/// Finds the JSON-RPC response with `id` in a JSON body or an event stream.
fn decode(response: &Response, id: u64) -> anyhow::Result<Value> {
    let is_stream = response
        .headers("content-type")
        .first()
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !is_stream {
        return serde_json::from_str(&response.body)
            .with_context(|| format!("undecodable JSON-RPC body {:?}", response.body));
    }
    response
        .body
        .replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(parse_block)
        .filter_map(|(_, _, data)| serde_json::from_str::<Value>(&data).ok())
        .find(|message| message.get("id").and_then(Value::as_u64) == Some(id))
        .with_context(|| format!("no JSON-RPC response with id {id} in {:?}", response.body))
}

/// The `structuredContent` of a successful tool result, or an error naming the tool.
pub fn structured(tool: &str, result: &Value) -> anyhow::Result<Value> {
    anyhow::ensure!(result["isError"] != true, "{tool} failed: {result}");
    Ok(result["structuredContent"].clone())
}

/// A kept-alive [`McpClient`] for blocking callers.
#[derive(Debug)]
pub struct McpConn {
    client: McpClient,
}

impl McpConn {
    /// Connects to `addr` and posts to `path` (e.g. `/mcp`).
    pub fn connect(addr: SocketAddr, path: &str) -> anyhow::Result<Self> {
        Self::open(McpClient::at(addr, path))
    }

    /// Connects to `to` (the TCP listener or the operator socket) and posts to `path`.
    pub fn connect_to(to: Endpoint, path: &str) -> anyhow::Result<Self> {
        Self::open(McpClient::on(to, path))
    }

    /// Parses `http://host:port[/path]` (default path `/mcp`) and connects.
    pub fn connect_url(url: &str) -> anyhow::Result<Self> {
        Self::open(McpClient::new(url)?)
    }

    fn open(client: McpClient) -> anyhow::Result<Self> {
        let mut client = client.kept_alive().named("fleetd-bench");
        client::block(async {
            client.conn = Some(Conn::open(&client.to).await?);
            anyhow::Ok(())
        })
        .with_context(|| format!("connect {:?}", client.to))?;
        Ok(Self { client })
    }

    /// Whether the server has closed this kept-alive connection, so it must not be reused.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The client-side port of the connection (the same for every call on it).
    pub fn local_port(&self) -> anyhow::Result<u16> {
        self.client
            .local_port()
            .context("the connection is not over TCP")
    }

    /// `initialize` + `notifications/initialized` + `tools/list`, as an agent connects.
    pub fn initialize(&mut self) -> anyhow::Result<Value> {
        client::block(self.client.initialize())
    }

    /// `tools/call` of `name`; returns the JSON-RPC `result` (a `CallToolResult`).
    pub fn call_tool(&mut self, name: &str, arguments: &Value) -> anyhow::Result<Value> {
        client::block(self.client.call_tool(name, arguments.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(content_type: &str, body: &str) -> Response {
        Response {
            status: 200,
            body: body.to_owned(),
            head: format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}"),
        }
    }

    #[test]
    fn answers_decode_from_json_and_event_streams() {
        let json = answer("application/json", r#"{"id":1,"result":{}}"#);
        assert!(decode(&json, 1).expect("json")["result"].is_object());
        let sse = answer(
            "text/event-stream",
            "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":true}}\r\n\r\n",
        );
        assert_eq!(decode(&sse, 7).expect("sse")["result"]["ok"], true);
        assert!(decode(&sse, 8).is_err());
    }

    #[test]
    fn urls_default_to_the_mcp_path_and_must_be_plain_http() {
        let c = McpClient::new("http://127.0.0.1:7797").expect("url");
        assert_eq!(c.path, "/mcp");
        assert_eq!(c.to, Endpoint::Tcp("127.0.0.1:7797".parse().expect("addr")));
        assert_eq!(
            McpClient::new("http://127.0.0.1:1/x/").expect("url").path,
            "/x"
        );
        assert!(McpClient::new("https://h").is_err());
    }
}

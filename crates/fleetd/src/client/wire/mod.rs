//! The CLI's HTTP client: one HTTP/1.1 request per TCP connection to the daemon's REST API, over
//! hyper's connection API (no pool, no TLS), answers parsed as JSON. Owns the daemon URL's shape
//! and the "no daemon answers" error; knows nothing about what the endpoints mean.

pub(crate) mod probe;

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How long connecting may take before the daemon counts as not answering. A daemon on this
/// machine accepts in microseconds; a remote one in well under this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A daemon to talk to and the token to present.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Where it is.
    pub url: DaemonUrl,
    /// The API token, when one is known.
    pub token: Option<String>,
}

/// Where the daemon is: `http://HOST:PORT` plus an optional path prefix, or the operator's
/// unix socket (`unix:/path/to/api.sock`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonUrl {
    /// Over TCP.
    Tcp {
        /// The host name or address.
        host: String,
        /// The port.
        port: u16,
        /// A path prefix (a reverse proxy's), without the trailing `/`.
        prefix: String,
    },
    /// Over the daemon's unix socket.
    Unix {
        /// The socket's path.
        path: std::path::PathBuf,
    },
}

impl DaemonUrl {
    /// Parses `http://HOST[:PORT][/PREFIX]`, a bare `HOST:PORT`, or `unix:PATH`.
    pub fn parse(given: &str) -> Result<Self, WireError> {
        let bad = |why: &str| WireError::BadUrl {
            given: given.to_owned(),
            why: why.to_owned(),
        };
        if let Some(path) = given.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("it names no socket path (unix:/path/to/api.sock)"));
            }
            return Ok(Self::unix(path));
        }
        let text = if given.contains("://") {
            given.to_owned()
        } else {
            format!("http://{given}")
        };
        let uri: http::Uri = text.parse().map_err(|_| bad("it is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "fleetd's API is plain http (put a TLS proxy in front for https)",
            ));
        }
        let host = uri.host().ok_or_else(|| bad("it names no host"))?;
        Ok(Self::Tcp {
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: uri.port_u16().unwrap_or(80),
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }

    /// The daemon's unix socket at `path`.
    pub fn unix(path: impl Into<std::path::PathBuf>) -> Self {
        Self::Unix { path: path.into() }
    }

    /// The URL of a daemon listening on `listen`; an unspecified address (`0.0.0.0`, `::`) is
    /// reached on this machine's loopback.
    pub fn from_listen(listen: SocketAddr) -> Self {
        let ip = match listen.ip() {
            ip if !ip.is_unspecified() => ip,
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        };
        Self::Tcp {
            host: ip.to_string(),
            port: listen.port(),
            prefix: String::new(),
        }
    }

    /// Whether requests go over TCP (where the API token matters).
    pub fn is_tcp(&self) -> bool {
        matches!(self, Self::Tcp { .. })
    }

    /// The `Host` header: the address for TCP; `localhost` on the unix socket, where it means
    /// nothing but HTTP/1.1 requires one.
    fn authority(&self) -> String {
        match self {
            Self::Tcp { host, port, .. } if host.contains(':') => format!("[{host}]:{port}"),
            Self::Tcp { host, port, .. } => format!("{host}:{port}"),
            Self::Unix { .. } => "localhost".to_owned(),
        }
    }

    fn prefix(&self) -> &str {
        match self {
            Self::Tcp { prefix, .. } => prefix,
            Self::Unix { .. } => "",
        }
    }
}

impl fmt::Display for DaemonUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { prefix, .. } => write!(f, "http://{}{prefix}", self.authority()),
            Self::Unix { path } => write!(f, "unix:{}", path.display()),
        }
    }
}

/// Why a request got no usable answer. Each message is a whole sentence saying what to do.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The URL given cannot be used.
    #[error("cannot use {given:?} as the daemon's URL: {why}")]
    BadUrl {
        /// What was given.
        given: String,
        /// What is wrong with it.
        why: String,
    },
    /// Nothing accepted the connection.
    #[error(
        "no fleetd daemon answers at {url} ({reason}). Start one with `fleetd serve` (or \
         `systemctl --user start fleetd`), or point --daemon / FLEETD_URL at a running daemon"
    )]
    NoDaemon {
        /// The URL tried.
        url: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// The daemon accepted but did not answer in time.
    #[error(
        "no answer from {url} within {secs} s: the daemon may be overloaded; `fleetd status` shows whether it answers at all"
    )]
    Timeout {
        /// The URL tried.
        url: String,
        /// The limit.
        secs: u64,
    },
    /// The HTTP exchange broke.
    #[error("failed to talk HTTP with {url}")]
    Http {
        /// The URL tried.
        url: String,
        /// hyper's error.
        source: hyper::Error,
    },
    /// The answer is not JSON, so whatever answered is not fleetd.
    #[error(
        "the answer from {url} (HTTP {status}) is not fleetd's JSON: is fleetd listening there? It said: {snippet}"
    )]
    NotJson {
        /// The URL tried.
        url: String,
        /// The status it answered with.
        status: u16,
        /// The start of the body.
        snippet: String,
    },
}

/// A daemon's answer: the status code and the JSON body.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    /// The HTTP status code.
    pub(super) status: u16,
    /// The body.
    pub(super) body: Value,
}

/// One request to `conn`: `method path` (below the URL's prefix) with an optional JSON body,
/// presenting its token; the whole exchange must finish within `timeout`.
pub(super) async fn call(
    conn: &Connection,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Result<Answer, WireError> {
    let shown = format!("{}{path}", conn.url);
    let exchange = exchange(conn, method, path, body);
    match tokio::time::timeout(timeout, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(WireError::Timeout {
            url: shown,
            secs: timeout.as_secs(),
        }),
    }
}

async fn exchange(
    conn: &Connection,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<Answer, WireError> {
    let (status, bytes) = exchange_raw(conn, method, path, body).await?;
    let body = serde_json::from_slice(&bytes).map_err(|_| WireError::NotJson {
        url: format!("{}{path}", conn.url),
        status,
        snippet: String::from_utf8_lossy(&bytes).chars().take(200).collect(),
    })?;
    Ok(Answer { status, body })
}

async fn exchange_raw(
    conn: &Connection,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Bytes), WireError> {
    let response = open(conn, method, path, body, &[]).await?;
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|source| WireError::Http {
            url: conn.url.to_string(),
            source,
        })?
        .to_bytes();
    Ok((status, bytes))
}

/// Sends one request to `conn` and returns the answer with its body still to be read (a stream
/// such as `/events` is read frame by frame). `headers` are added as given.
pub(super) async fn open(
    conn: &Connection,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<http::Response<hyper::body::Incoming>, WireError> {
    let (url, token) = (&conn.url, conn.token.as_deref());
    let no_daemon = |reason: String| WireError::NoDaemon {
        url: url.to_string(),
        reason,
    };
    let connected = match url {
        DaemonUrl::Tcp { host, port, .. } => {
            let connect = tokio::net::TcpStream::connect((host.as_str(), *port));
            tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .map(|r| r.map(Stream::Tcp))
        }
        DaemonUrl::Unix { path } => {
            let connect = tokio::net::UnixStream::connect(path);
            tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .map(|r| r.map(Stream::Unix))
        }
    };
    let stream = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(no_daemon(e.to_string())),
        Err(_) => return Err(no_daemon(format!("no answer within {CONNECT_TIMEOUT:?}"))),
    };
    match stream {
        Stream::Tcp(s) => send(url, TokioIo::new(s), token, method, path, body, headers).await,
        Stream::Unix(s) => send(url, TokioIo::new(s), token, method, path, body, headers).await,
    }
}

/// A connected socket to the daemon.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// One HTTP/1.1 exchange on a connected socket.
async fn send<I>(
    url: &DaemonUrl,
    io: I,
    token: Option<&str>,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<http::Response<hyper::body::Incoming>, WireError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let http_error = |source| WireError::Http {
        url: url.to_string(),
        source,
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http_error)?;
    // The connection task drives the socket; it ends when the exchange is done.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "HTTP connection to the daemon ended with an error");
        }
    });
    let payload = body.map(Value::to_string).unwrap_or_default();
    let mut request = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", url.prefix()))
        .header(http::header::HOST, url.authority())
        .header(http::header::ACCEPT, "application/json");
    if body.is_some() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| WireError::BadUrl {
            given: format!("{url}{path}"),
            why: e.to_string(),
        })?;
    sender.send_request(request).await.map_err(http_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_and_without_scheme() {
        let url = DaemonUrl::parse("http://127.0.0.1:7797").expect("parses");
        assert_eq!(url.to_string(), "http://127.0.0.1:7797");
        let url = DaemonUrl::parse("localhost:9000/").expect("parses");
        assert_eq!(url.to_string(), "http://localhost:9000");
        let url = DaemonUrl::parse("http://[::1]:7797/fleet/").expect("parses");
        assert_eq!(url.to_string(), "http://[::1]:7797/fleet");
        assert_eq!(url.authority(), "[::1]:7797");
    }

    #[test]
    fn unix_socket_urls_parse() {
        let url = DaemonUrl::parse("unix:/run/fleetd/api.sock").expect("parses");
        assert_eq!(url, DaemonUrl::unix("/run/fleetd/api.sock"));
        assert_eq!(url.to_string(), "unix:/run/fleetd/api.sock");
        assert!(!url.is_tcp());
        assert!(DaemonUrl::parse("unix:").is_err());
    }

    #[test]
    fn https_and_junk_are_refused_with_the_reason() {
        let err = DaemonUrl::parse("https://fleet.example:7797").expect_err("refused");
        assert!(err.to_string().contains("plain http"), "{err}");
        assert!(DaemonUrl::parse("http://").is_err());
    }

    #[test]
    fn an_unspecified_listen_address_is_reached_on_loopback() {
        let url = DaemonUrl::from_listen("0.0.0.0:7797".parse().expect("addr"));
        assert_eq!(url.to_string(), "http://127.0.0.1:7797");
        let url = DaemonUrl::from_listen("[::]:7797".parse().expect("addr"));
        assert_eq!(url.to_string(), "http://[::1]:7797");
    }

    #[tokio::test]
    async fn a_closed_port_names_the_url_and_how_to_start_a_daemon() {
        // Bind and drop a listener: nothing listens on that port afterwards.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let url = DaemonUrl::parse(&format!("127.0.0.1:{port}")).expect("parses");
        let err = call(
            &Connection { url, token: None },
            http::Method::GET,
            "/sessions",
            None,
            Duration::from_secs(10),
        )
        .await
        .expect_err("nothing listens");
        let text = err.to_string();
        assert!(text.contains(&format!("http://127.0.0.1:{port}")), "{text}");
        assert!(text.contains("fleetd serve"), "{text}");
    }
}

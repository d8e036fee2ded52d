//! The model gateway's side towards the backends: HTTP/1.1 connections (TLS for `https://`,
//! rustls with the system's roots) kept open between requests, a few per backend host, since a
//! member's agent sends a request per turn and a new TLS handshake would cost more than the
//! gateway's whole budget. A connection goes back to the pool only once its response was read
//! to the end; one dropped mid-answer (the member went away) is closed, which tells the backend
//! to stop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// How long connecting to a backend (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections kept per backend host.
const IDLE_PER_HOST: usize = 16;

/// Where a backend is: scheme, host and port of its base URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Origin {
    tls: bool,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of `url` and the path prefix after it (without a trailing `/`).
    pub(super) fn parse(url: &str) -> Option<(Self, String)> {
        let (tls, rest) = match url.split_once("://")? {
            ("http", rest) => (false, rest),
            ("https", rest) => (true, rest),
            _ => return None,
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let default = if tls { 443 } else { 80 };
        let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
            let (host, after) = rest.split_once(']')?;
            match after.strip_prefix(':') {
                Some(port) => (host, port.parse().ok()?),
                None if after.is_empty() => (host, default),
                None => return None,
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, port.parse().ok()?),
                None => (authority, default),
            }
        };
        if host.is_empty() {
            return None;
        }
        Some((
            Self {
                tls,
                host: host.to_owned(),
                port,
            },
            path.trim_end_matches('/').to_owned(),
        ))
    }

    /// The value of the `Host` header for it.
    pub(super) fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.tls { 443 } else { 80 };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

/// Why a backend could not be reached.
#[derive(Debug, thiserror::Error)]
pub(super) enum UpstreamError {
    #[error("could not connect to {0}: {1}")]
    Connect(String, String),
    #[error("the TLS handshake with {0} failed: {1}")]
    Tls(String, String),
    #[error("the connection to {0} failed: {1}")]
    Http(String, String),
}

/// A connection to an origin, lent out for one request.
pub(super) struct Lent {
    sender: SendRequest<Body>,
    origin: Origin,
}

impl Lent {
    /// Sends `request` on it.
    pub(super) async fn send(
        &mut self,
        request: http::Request<Body>,
    ) -> Result<http::Response<hyper::body::Incoming>, UpstreamError> {
        self.sender
            .send_request(request)
            .await
            .map_err(|e| UpstreamError::Http(self.origin.authority(), e.to_string()))
    }

    /// The response was read to its end: the connection may serve another request.
    pub(super) fn give_back(self) {
        let Lent { mut sender, origin } = self;
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                pool().put(origin, sender);
            }
        });
    }
}

/// The idle connections, by origin.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<Origin, Vec<SendRequest<Body>>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

impl Pool {
    fn take(&self, origin: &Origin) -> Option<SendRequest<Body>> {
        let mut idle = crate::sync::lock(&self.idle);
        let list = idle.get_mut(origin)?;
        while let Some(sender) = list.pop() {
            if sender.is_ready() && !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, origin: Origin, sender: SendRequest<Body>) {
        let mut idle = crate::sync::lock(&self.idle);
        let list = idle.entry(origin).or_default();
        list.retain(|s| !s.is_closed());
        if list.len() < IDLE_PER_HOST {
            list.push(sender);
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

/// A connection to `origin`: an idle one, else a new one.
pub(super) async fn lend(origin: &Origin) -> Result<Lent, UpstreamError> {
    if let Some(sender) = pool().take(origin) {
        return Ok(Lent {
            sender,
            origin: origin.clone(),
        });
    }
    let sender = tokio::time::timeout(CONNECT_TIMEOUT, dial(origin))
        .await
        .map_err(|_| {
            UpstreamError::Connect(
                origin.authority(),
                format!("no answer in {} s", CONNECT_TIMEOUT.as_secs()),
            )
        })??;
    Ok(Lent {
        sender,
        origin: origin.clone(),
    })
}

async fn dial(origin: &Origin) -> Result<SendRequest<Body>, UpstreamError> {
    let name = origin.authority();
    let tcp = TcpStream::connect((origin.host.as_str(), origin.port))
        .await
        .map_err(|e| UpstreamError::Connect(name.clone(), e.to_string()))?;
    // Streamed answers are many small writes: each should leave at once.
    let _ = tcp.set_nodelay(true);
    if origin.tls {
        let server = rustls_pki_types::ServerName::try_from(origin.host.clone())
            .map_err(|e| UpstreamError::Tls(name.clone(), e.to_string()))?;
        let tls = tokio_rustls::TlsConnector::from(tls_config()?)
            .connect(server, tcp)
            .await
            .map_err(|e| UpstreamError::Tls(name.clone(), e.to_string()))?;
        handshake(TokioIo::new(tls), name).await
    } else {
        handshake(TokioIo::new(tcp), name).await
    }
}

async fn handshake<T>(io: TokioIo<T>, name: String) -> Result<SendRequest<Body>, UpstreamError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| UpstreamError::Http(name.clone(), e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(backend = %name, error = %e, "a backend connection ended");
        }
    });
    Ok(sender)
}

/// The TLS client: the system's roots, ring, built once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, UpstreamError> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let mut roots = rustls::RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(format!(
                    "no trusted CA certificates were found on this system ({} errors reading them)",
                    found.errors.len()
                ));
            }
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map(|b| b.with_root_certificates(roots).with_no_client_auth())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| UpstreamError::Tls("any backend".to_owned(), e))
}

/// POSTs `body` to `url` with `headers` over a pooled connection and reads the answer to its
/// end (for fleetd's own notices: webhooks, ntfy); the answer's status. The connection goes
/// back to the pool after.
pub(crate) async fn post(
    url: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> Result<u16, String> {
    use http_body_util::BodyExt as _;
    let (origin, path) =
        Origin::parse(url).ok_or_else(|| format!("{url} is not an http(s) URL"))?;
    let path = if path.is_empty() {
        "/".to_owned()
    } else {
        path
    };
    let mut request = http::Request::post(path).header(http::header::HOST, origin.authority());
    for (name, value) in headers {
        request = request.header(*name, value.as_str());
    }
    let request = request
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))
        .map_err(|e| e.to_string())?;
    let mut lent = lend(&origin).await.map_err(|e| e.to_string())?;
    let response = lent.send(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the answer from {}: {e}", origin.authority()))?;
    lent.give_back();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_split_into_origin_and_prefix() {
        let (o, p) = Origin::parse("https://api.anthropic.com").expect("parses");
        assert_eq!(
            (o.tls, o.host.as_str(), o.port, p.as_str()),
            (true, "api.anthropic.com", 443, "")
        );
        assert_eq!(o.authority(), "api.anthropic.com");
        let (o, p) = Origin::parse("http://127.0.0.1:8080/v1/").expect("parses");
        assert_eq!((o.tls, o.port, p.as_str()), (false, 8080, "/v1"));
        assert_eq!(o.authority(), "127.0.0.1:8080");
        let (o, _) = Origin::parse("http://[::1]:9000").expect("parses");
        assert_eq!((o.host.as_str(), o.port), ("::1", 9000));
        assert_eq!(o.authority(), "[::1]:9000");
        assert!(Origin::parse("ftp://x").is_none());
        assert!(Origin::parse("http://:80").is_none());
    }
}

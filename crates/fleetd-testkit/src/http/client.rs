//! The test kit's one HTTP client: hyper's HTTP/1.1 connection API over TCP or a unix socket,
//! one connection per [`Conn`], kept alive for as long as its owner reuses it. Async at its core
//! (sim-agent and the benchmarks await it); [`block`] runs it for the blocking tests on a
//! runtime of the kit's own, so a test need not be async to make a request. Whole bodies are
//! collected; a stream (`/events`) is read frame by frame by [`super::events`].

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::{Endpoint, Response};

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One HTTP/1.1 connection. The socket is driven by a task on the runtime that opened it; the
/// connection ends when the server closes it or the `Conn` is dropped.
#[derive(Debug)]
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    local_port: Option<u16>,
}

/// What one request sends: the defaults (`Host` of the endpoint, JSON `Content-Type`, an
/// `Accept` for JSON and event streams) replaced by any header of the same name in `headers`.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The method, e.g. `POST`.
    pub method: &'a str,
    /// The path and query.
    pub path: &'a str,
    /// Headers added to (or replacing) the defaults.
    pub headers: &'a [(&'a str, &'a str)],
    /// The body (none: empty).
    pub body: Option<&'a str>,
}

impl Conn {
    /// Connects to `to` and performs the HTTP/1.1 handshake (which sends nothing).
    pub async fn open(to: &Endpoint) -> std::io::Result<Self> {
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
        match to {
            Endpoint::Tcp(addr) => {
                let stream =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
                        .await
                        .map_err(|_| timed_out())??;
                stream.set_nodelay(true)?;
                let local_port = Some(stream.local_addr()?.port());
                Self::handshake(TokioIo::new(stream), addr.to_string(), local_port).await
            }
            Endpoint::Unix(path) => {
                let stream =
                    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::UnixStream::connect(path))
                        .await
                        .map_err(|_| timed_out())??;
                Self::handshake(TokioIo::new(stream), "localhost".to_owned(), None).await
            }
        }
    }

    async fn handshake<I>(io: I, host: String, local_port: Option<u16>) -> std::io::Result<Self>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let (sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a test HTTP connection ended with an error");
            }
        });
        Ok(Self {
            sender,
            host,
            local_port,
        })
    }

    /// Whether the server has closed the connection, so it must not be reused (what a client
    /// checks before it reuses a pooled connection).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// The client-side TCP port (`None` on a unix socket).
    pub fn local_port(&self) -> Option<u16> {
        self.local_port
    }

    /// Sends `request` and returns the answer with its body still to be read.
    pub async fn send(
        &mut self,
        request: Request<'_>,
    ) -> std::io::Result<http::Response<Incoming>> {
        let invalid = |e: http::Error| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let mut builder = http::Request::builder()
            .method(request.method)
            .uri(request.path);
        let headers = builder.headers_mut().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("bad method {:?} or path {:?}", request.method, request.path),
            )
        })?;
        for (name, value) in [
            ("host", self.host.as_str()),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ]
        .into_iter()
        .chain(request.headers.iter().copied())
        {
            let name = http::HeaderName::try_from(name).map_err(|e| invalid(e.into()))?;
            let value = http::HeaderValue::try_from(value).map_err(|e| invalid(e.into()))?;
            headers.insert(name, value);
        }
        let body = Full::new(Bytes::from(request.body.unwrap_or("").to_owned()));
        let request = builder.body(body).map_err(invalid)?;
        self.sender.ready().await.map_err(std::io::Error::other)?;
        self.sender
            .send_request(request)
            .await
            .map_err(std::io::Error::other)
    }

    /// Sends `request` and reads the whole answer.
    pub async fn exchange(&mut self, request: Request<'_>) -> std::io::Result<Response> {
        collect(self.send(request).await?).await
    }
}

/// Reads an answer's whole body.
pub async fn collect(response: http::Response<Incoming>) -> std::io::Result<Response> {
    let (parts, body) = response.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok(Response {
        status: parts.status.as_u16(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
        head: head_text(&parts),
    })
}

/// The status line and headers as text, one per line.
pub(super) fn head_text(parts: &http::response::Parts) -> String {
    let mut head = format!("HTTP/1.1 {}", parts.status);
    for (name, value) in &parts.headers {
        head.push_str(&format!(
            "\r\n{name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    head
}

/// The kit's runtime for blocking callers: two workers, made on first use.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("testkit-http")
            .enable_all()
            .build()
            .expect("the test kit's HTTP runtime starts")
    })
}

/// Runs `work` to completion for a blocking caller on the kit's runtime. A caller that is
/// itself inside a runtime (an async test calling a blocking helper) is served from a scoped
/// thread, since a runtime cannot be blocked on from within one.
pub fn block<F>(work: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_err() {
        return runtime().block_on(work);
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| runtime().block_on(work))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

//! Serving the router on the daemon's HTTP doors — the TCP listener, the operator's unix
//! socket and the boxed members' `door/http.sock` — with the connection limits (`conn`): each accepted connection's user is found
//! (the socket's owner, one exact kernel lookup), the gate admits it or it gets a clear `503`
//! naming the cap and its key before it is closed, and an admitted one is served by hyper's
//! HTTP/1 with its idle and header-read timers running. Graceful shutdown: stop accepting, let
//! every connection finish its request in flight, and return when all have closed.
//!
//! Each connection task is bounded before it is admitted: at most [`LOOKUPS_AT_ONCE`]
//! connections wait for their user to be found (the accept loop waits beyond that, and the
//! kernel's listen backlog holds the rest), and at most [`REFUSALS_AT_ONCE`] refused ones linger
//! after their `503` for the client to read it (beyond that a refused connection is closed right
//! after its answer), so a flood can never take the daemon's file descriptors past the gate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use fleetd_core::access::Door;
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::Live;
use crate::conn::{Activity, Admission, Caps, Gate, Peer, Refusal, Timeouts, Tracked};
use crate::identity::{ConnInfo, Endpoint};

/// Connections whose user is being looked up at once, per door: each is one short kernel query
/// on the blocking pool; more would only queue there while holding a file descriptor.
pub const LOOKUPS_AT_ONCE: usize = 128;
/// Refused connections kept open at once, per door, after their answer was written: each
/// holds its socket for at most [`REFUSAL_LINGER`] while the client reads the answer.
pub const REFUSALS_AT_ONCE: usize = 128;
/// How long a refused connection is kept open for the client to read its `503` (closing at
/// once, with its request unread, would reset the connection and lose the answer).
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// After a failed accept for want of file descriptors, wait this long before the next (the
/// error would otherwise repeat at once, in a busy loop).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// hyper's read buffer per connection (its default is ~400 KiB): a request head must fit in it,
/// so this bounds what a connection sending a huge head can make the daemon hold. Bodies are
/// streamed through it in pieces, so a 1 MiB reply still goes through.
const READ_BUFFER: usize = 64 * 1024;

/// One HTTP door's listener.
#[derive(Debug)]
pub enum Listener {
    /// The TCP listener (MCP, REST, `/healthz`).
    Tcp(TcpListener),
    /// The operator's unix socket.
    Operator(UnixListener),
    /// `<state>/door/http.sock`: the TCP listener's twin for sandboxed members with no network
    /// (their in-box relay forwards to it). Callers are placed as on TCP — a process in no pane
    /// is anonymous, never the operator as on `api.sock`.
    Boxed(UnixListener),
}

/// What every connection of a door is served with.
#[derive(Debug, Clone)]
pub struct DoorParts {
    /// The routes.
    pub router: Router,
    /// The admission gate, shared by every door of the daemon.
    pub gate: Arc<Gate>,
    /// The running configuration (`connections:` is read as each connection arrives).
    pub config: Live,
}

/// Serves `listener` until `stop`, then waits for every connection to finish.
pub async fn serve(listener: Listener, parts: DoorParts, stop: CancellationToken) {
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let lookups = Arc::new(Semaphore::new(LOOKUPS_AT_ONCE));
    let refusals = Arc::new(Refusals {
        slots: Arc::new(Semaphore::new(REFUSALS_AT_ONCE)),
        count: AtomicU64::new(0),
    });
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&lookups).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = stop.cancelled() => break,
        };
        let accepted = tokio::select! {
            accepted = accept(&listener) => accepted,
            () = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                if e.raw_os_error() == Some(rustix::io::Errno::MFILE.raw_os_error())
                    || e.raw_os_error() == Some(rustix::io::Errno::NFILE.raw_os_error())
                {
                    tracing::warn!(error = %e, "out of file descriptors: accepting again shortly");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                } else {
                    tracing::debug!(error = %e, "accept failed");
                }
                continue;
            }
        };
        let task = Connection {
            parts: parts.clone(),
            refusals: Arc::clone(&refusals),
            stop: stop.clone(),
            _done: done_tx.clone(),
        };
        tokio::spawn(task.run(stream, permit));
    }
    // New connects are refused from here on, not left waiting in the backlog.
    drop(listener);
    drop(done_tx);
    // Every connection task holds a sender: this ends when the last one has closed.
    let _ = done_rx.recv().await;
}

enum Stream {
    Tcp(tokio::net::TcpStream, ConnInfo),
    Unix(tokio::net::UnixStream, ConnInfo),
}

async fn accept(listener: &Listener) -> std::io::Result<Stream> {
    match listener {
        Listener::Tcp(l) => {
            let (stream, peer) = l.accept().await?;
            let local = stream.local_addr().unwrap_or(peer);
            let _ = stream.set_nodelay(true);
            Ok(Stream::Tcp(
                stream,
                ConnInfo::new(Door::Tcp, Endpoint::Tcp { peer, local }),
            ))
        }
        Listener::Operator(l) => {
            let (stream, _) = l.accept().await?;
            let info = ConnInfo::unix(Door::Operator, stream.peer_cred().ok());
            Ok(Stream::Unix(stream, info))
        }
        Listener::Boxed(l) => {
            let (stream, _) = l.accept().await?;
            let info = ConnInfo::unix(Door::Tcp, stream.peer_cred().ok());
            Ok(Stream::Unix(stream, info))
        }
    }
}

#[derive(Debug)]
struct Refusals {
    slots: Arc<Semaphore>,
    count: AtomicU64,
}

struct Connection {
    parts: DoorParts,
    refusals: Arc<Refusals>,
    stop: CancellationToken,
    _done: mpsc::Sender<()>,
}

impl Connection {
    async fn run(self, stream: Stream, lookup: OwnedSemaphorePermit) {
        let peer = match &stream {
            Stream::Tcp(_, info) => match info.endpoint {
                Endpoint::Tcp { peer, local } => crate::conn::tcp_peer(peer, local).await,
                Endpoint::Unix { .. } => Peer::Other(None),
            },
            Stream::Unix(_, info) => match info.endpoint {
                Endpoint::Unix { uid, .. } => crate::conn::unix_peer(uid),
                Endpoint::Tcp { .. } => Peer::Other(None),
            },
        };
        let limits = self.parts.config.current().connections;
        let admitted = self.parts.gate.admit(peer, Caps::of(&limits));
        drop(lookup);
        crate::ops::telemetry::connections_open(self.parts.gate.open());
        let gate = Arc::clone(&self.parts.gate);
        match (admitted, stream) {
            (Err(refusal), Stream::Tcp(s, _)) => self.refuse(s, refusal, peer).await,
            (Err(refusal), Stream::Unix(s, _)) => self.refuse(s, refusal, peer).await,
            (Ok(admission), Stream::Tcp(s, info)) => {
                self.serve(s, info, admission, Timeouts::of(&limits)).await;
            }
            (Ok(admission), Stream::Unix(s, info)) => {
                self.serve(s, info, admission, Timeouts::of(&limits)).await;
            }
        }
        crate::ops::telemetry::connections_open(gate.open());
    }

    /// Answers a refused connection with a `503` naming the cap, then closes it.
    async fn refuse<IO>(&self, mut io: IO, refusal: Refusal, peer: Peer)
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        crate::ops::telemetry::connection_closed(refusal.code());
        let n = self.refusals.count.fetch_add(1, Ordering::Relaxed) + 1;
        if n == 1 || n.is_multiple_of(1000) {
            tracing::warn!(
                refused_so_far = n,
                ?peer,
                reason = refusal.code(),
                "refusing connections: {}",
                refusal.message()
            );
        }
        let body = serde_json::json!({ "error": refusal.code(), "message": refusal.message() })
            .to_string();
        let answer = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        // A fresh socket's send buffer takes the answer at once.
        let written = tokio::time::timeout(REFUSAL_LINGER, async {
            io.write_all(answer.as_bytes()).await?;
            io.shutdown().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            return;
        }
        // Read what the client sends until it closes (or the linger ends), so closing never
        // resets the connection while its request is unread, which could cost it the answer.
        // Without a free slot the connection is closed at once: a flood's idle sockets have
        // sent nothing, so they still read the answer.
        let Ok(_slot) = Arc::clone(&self.refusals.slots).try_acquire_owned() else {
            return;
        };
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            let mut sink = [0u8; 4096];
            while io.read(&mut sink).await? > 0 {}
            std::io::Result::Ok(())
        })
        .await;
    }

    /// Serves an admitted connection until it closes, a timer runs out, the gate closes it to
    /// make room, or the daemon stops (then its request in flight finishes first).
    async fn serve<IO>(&self, io: IO, info: ConnInfo, admission: Admission, timeouts: Timeouts)
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let activity = Activity::new();
        let admission = Arc::new(admission);
        let service = {
            let tower = TowerToHyperService::new(self.parts.router.clone());
            let (admission, activity) = (Arc::clone(&admission), Arc::clone(&activity));
            hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(info.clone()));
                // A request is in flight once it has fully arrived, head and body: until then
                // the header timer runs and the gate may close the connection to make room, so
                // a head with a large Content-Length and no body holds nothing (attack C2).
                let in_flight = InFlight::new(&admission, &activity);
                let arrived = !request.body().is_end_stream() || in_flight.start();
                let request = request.map(|body| {
                    axum::body::Body::new(Arriving {
                        body,
                        in_flight: Arc::clone(&in_flight),
                    })
                });
                let response = arrived.then(|| hyper::service::Service::call(&tower, request));
                async move {
                    let Some(response) = response else {
                        return Ok(closing());
                    };
                    let response = response.await?;
                    // Answered (perhaps before reading the body): in flight while it is written.
                    if !in_flight.start() {
                        return Ok(closing());
                    }
                    Ok::<_, std::convert::Infallible>(response.map(|body| {
                        // The request counts as in flight until its body is written or
                        // dropped, so a long or streamed answer is never timed out.
                        axum::body::Body::new(body.map_frame(move |frame| {
                            let _held = &in_flight;
                            frame
                        }))
                    }))
                }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .keep_alive(true)
            .header_read_timeout(None)
            .max_buf_size(READ_BUFFER);
        let io = TokioIo::new(Tracked::new(io, Arc::clone(&activity)));
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        tokio::select! {
            served = connection.as_mut() => {
                if let Err(e) = served {
                    tracing::debug!(error = %e, "an HTTP connection ended with an error");
                }
            }
            expired = activity.expired(timeouts) => {
                tracing::debug!(reason = expired.as_str(), "closing an HTTP connection");
                crate::ops::telemetry::connection_closed(expired.as_str());
            }
            () = admission.evicted() => {
                tracing::debug!("closing the longest-idle HTTP connection to make room");
                crate::ops::telemetry::connection_closed("evicted");
            }
            () = self.stop.cancelled() => {
                // An idle connection closes at once; a request in flight is finished. The
                // timers still run, so a request head that never ends cannot hold the shutdown.
                connection.as_mut().graceful_shutdown();
                tokio::select! {
                    served = connection => {
                        if let Err(e) = served {
                            tracing::debug!(error = %e, "an HTTP connection ended with an error");
                        }
                    }
                    expired = activity.expired(timeouts) => {
                        tracing::debug!(reason = expired.as_str(), "closing an HTTP connection while stopping");
                    }
                }
            }
        }
    }
}

/// A request on a connection, in flight once it has fully arrived: from then on neither its gate
/// slot nor its timers count the connection idle, until its answer is written or dropped.
struct InFlight {
    admission: Arc<Admission>,
    activity: Arc<Activity>,
    started: std::sync::atomic::AtomicBool,
}

impl InFlight {
    fn new(admission: &Arc<Admission>, activity: &Arc<Activity>) -> Arc<Self> {
        Arc::new(Self {
            admission: Arc::clone(admission),
            activity: Arc::clone(activity),
            started: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Marks it in flight (once); false when the gate has already closed the connection to make
    /// room: its request must not run (the connection is about to be dropped, and a reply could
    /// be lost with it).
    fn start(&self) -> bool {
        if self.started.load(Ordering::Acquire) {
            return true;
        }
        if !self.admission.request_started() {
            return false;
        }
        self.activity.request_started();
        self.started.store(true, Ordering::Release);
        true
    }
}

/// A request body on its way: its end puts the request in flight.
struct Arriving {
    body: Incoming,
    in_flight: Arc<InFlight>,
}

impl hyper::body::Body for Arriving {
    type Data = hyper::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        let ended = match &polled {
            std::task::Poll::Ready(None) => true,
            std::task::Poll::Ready(Some(Ok(_))) => self.body.is_end_stream(),
            _ => false,
        };
        if ended && !self.in_flight.start() {
            return std::task::Poll::Ready(Some(Err(
                "the connection was closed to make room".into()
            )));
        }
        polled.map(|frame| frame.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a request that arrived on a connection the gate had just closed to make room.
fn closing() -> hyper::Response<axum::body::Body> {
    let body = serde_json::json!({
        "error": "connection_closed",
        "message": "this connection was closed to make room for another (connections.max) and the request was not run: send it again on a new connection",
    });
    let mut response = hyper::Response::new(axum::body::Body::from(body.to_string()));
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.started.load(Ordering::Acquire) {
            self.admission.request_finished();
            self.activity.request_finished();
        }
    }
}

#[cfg(test)]
mod tests;

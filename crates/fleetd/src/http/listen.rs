//! Serving the router on the daemon's HTTP doors — the TCP listener and the operator's unix
//! socket — with the connection limits (`conn`): each accepted connection's user is found
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
mod tests {
    use std::net::SocketAddr;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    use super::*;
    use crate::config::{Config, Environment};

    /// A door on `127.0.0.1:0` running on `yaml`; see [`door_on`].
    async fn door(
        yaml: &str,
        slow_ms: u64,
        started: Arc<tokio::sync::Notify>,
    ) -> (SocketAddr, CancellationToken) {
        let config = Config::parse(yaml, "test.yaml", &Environment::default()).expect("valid");
        door_on(Live::fixed(config), slow_ms, started).await
    }

    /// A door on `127.0.0.1:0` reading `config`, with `/slow`, which answers after `slow_ms`
    /// (notifying `started` when it begins), and `/fast`; it serves until the returned token is
    /// cancelled.
    async fn door_on(
        config: Live,
        slow_ms: u64,
        started: Arc<tokio::sync::Notify>,
    ) -> (SocketAddr, CancellationToken) {
        let router = Router::new()
            .route(
                "/slow",
                get(move || async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(slow_ms)).await;
                    "done"
                }),
            )
            .route("/fast", get(|| async { "fast" }))
            .route(
                "/upload",
                axum::routing::post(|body: String| async move { body.len().to_string() }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let parts = DoorParts {
            router,
            gate: Gate::new(1_000),
            config,
        };
        tokio::spawn(serve(Listener::Tcp(listener), parts, stop.clone()));
        (addr, stop)
    }

    /// Everything the server sends until it closes the connection.
    async fn read_to_close(stream: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out));
        read.await
            .expect("the server closes the connection")
            .expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_request_in_flight_outlives_the_idle_timeout_and_idle_follows_it() {
        let (addr, stop) = door(
            "connections: {idleTimeoutMs: 100, headerReadTimeoutMs: 100}\n",
            600,
            Arc::default(),
        )
        .await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .expect("send");
        // Answered after 600 ms, six idle timeouts later; then closed as idle.
        let text = read_to_close(&mut stream).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("done"), "{text}");
        stop.cancel();
    }

    #[tokio::test]
    async fn an_unfinished_request_head_is_closed_without_an_answer() {
        let (addr, stop) = door(
            "connections: {idleTimeoutMs: 60000, headerReadTimeoutMs: 100}\n",
            0,
            Arc::default(),
        )
        .await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .expect("send");
        assert_eq!(read_to_close(&mut stream).await, "");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_request_head_over_the_read_buffer_is_refused() {
        let (addr, stop) = door("", 0, Arc::default()).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let mut head = b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', 4 * READ_BUFFER));
        head.extend_from_slice(b"\r\n\r\n");
        // The server may stop reading (and answer) before the whole head is written.
        let _ = stream.write_all(&head).await;
        let text = read_to_close(&mut stream).await;
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
        stop.cancel();
    }

    #[tokio::test]
    async fn a_full_gate_refuses_with_a_503_and_a_reloaded_cap_applies_to_the_next_connection() {
        let config =
            |yaml: &str| Config::parse(yaml, "test.yaml", &Environment::default()).expect("valid");
        let (publisher, live) = crate::config::channel(config("connections: {max: 1}\n"));
        let started = Arc::new(tokio::sync::Notify::new());
        let (addr, stop) = door_on(live, 5_000, Arc::clone(&started)).await;
        // A request in flight holds the only slot: nothing idle can be closed for a newcomer.
        let mut busy = TcpStream::connect(addr).await.expect("connect");
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .expect("send");
        started.notified().await;
        let fast = b"GET /fast HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let mut refused = TcpStream::connect(addr).await.expect("connect");
        let _ = refused.write_all(fast).await;
        let text = read_to_close(&mut refused).await;
        assert!(text.starts_with("HTTP/1.1 503"), "{text}");
        assert!(text.contains("too_many_connections"), "{text}");
        assert!(text.contains("connections.max"), "{text}");
        publisher.publish(config("connections: {max: 2}\n"));
        let mut admitted = TcpStream::connect(addr).await.expect("connect");
        admitted.write_all(fast).await.expect("send");
        let text = read_to_close(&mut admitted).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        stop.cancel();
        drop(busy);
    }

    #[tokio::test]
    async fn a_request_whose_body_never_comes_holds_no_slot_and_times_out_like_a_head() {
        // Attack C2: a complete head with a large Content-Length and no body.
        const STALLED: &[u8] =
            b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nabc";
        let (addr, stop) = door(
            "connections: {max: 1, idleTimeoutMs: 60000, headerReadTimeoutMs: 300}\n",
            0,
            Arc::default(),
        )
        .await;
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        stalled.write_all(STALLED).await.expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // It holds the only slot, but it is still arriving: a newcomer closes it and gets in.
        let mut fast = TcpStream::connect(addr).await.expect("connect");
        fast.write_all(b"GET /fast HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .expect("send");
        let text = read_to_close(&mut fast).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        let closed = read_to_close(&mut stalled).await;
        assert!(!closed.contains("200 OK"), "never answered: {closed}");
        // Alone, it is closed by the header timer; a body that does come is served.
        let mut stalled = TcpStream::connect(addr).await.expect("connect");
        stalled.write_all(STALLED).await.expect("send");
        let started = tokio::time::Instant::now();
        let closed = read_to_close(&mut stalled).await;
        assert!(!closed.contains("200 OK"), "{closed}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "closed by the timer"
        );
        let mut whole = TcpStream::connect(addr).await.expect("connect");
        whole
            .write_all(b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")
            .await
            .expect("send");
        let text = read_to_close(&mut whole).await;
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with('5'),
            "{text}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_stopping_door_finishes_the_request_in_flight() {
        let started = Arc::new(tokio::sync::Notify::new());
        let (addr, stop) = door("", 300, Arc::clone(&started)).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .expect("send");
        started.notified().await;
        stop.cancel();
        let text = read_to_close(&mut stream).await;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("done"), "{text}");
    }
}

//! Tests of the accept loop's timers and limits.

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

/// Sends `request` on a new connection to `addr`; everything the server sends until it closes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("send");
    read_to_close(&mut stream).await
}

#[tokio::test]
async fn a_request_in_flight_outlives_the_idle_timeout_and_idle_follows_it() {
    let (addr, stop) = door(
        "connections: {idleTimeoutMs: 100, headerReadTimeoutMs: 100}\n",
        600,
        Arc::default(),
    )
    .await;
    // Answered after 600 ms, six idle timeouts later; then closed as idle.
    let text = exchange(addr, b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
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
    let unfinished = exchange(addr, b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n").await;
    assert_eq!(unfinished, "");
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
    let text = exchange(addr, fast).await;
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
    let text = exchange(
        addr,
        b"GET /fast HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
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
    let text = exchange(
        addr,
        b"POST /upload HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
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

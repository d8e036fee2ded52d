//! Shared helpers for fleetd's tests and demo: locating built binaries, waiting for conditions, and
//! requiring external services (tmux, RabbitMQ). Never used by the daemon itself.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

/// The address of the local RabbitMQ the tests use.
pub const RABBITMQ_ADDR: &str = "127.0.0.1:5672";
/// The AMQP URL of the local RabbitMQ (Debian's default guest account, loopback only).
pub const RABBITMQ_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// True when running under CI (`CI` set to anything but `false`/`0`/empty).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Path of a binary built from this workspace (`fleetd`, `fake-herdr`, `sim-agent`, ...).
///
/// Integration tests run from `target/<profile>/deps/`; workspace binaries sit one level up. Cargo
/// only exports `CARGO_BIN_EXE_*` for a package's own binaries, so the daemon's binary is found by
/// this path. Panics with a build hint when the binary is missing, since nothing can be tested then.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binaries live in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace` (nextest --workspace builds it)",
        path.display()
    );
    path
}

/// Outcome of asking for an external service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// The service is there: run the test.
    Present,
    /// Not there and not under CI: the caller returns early (a reason was printed).
    Skip,
}

/// Requires an external service. Under CI a missing service fails the test with `how_to_start`;
/// locally the test is skipped with a printed reason.
pub fn require(name: &str, present: bool, how_to_start: &str) -> Service {
    if present {
        return Service::Present;
    }
    if is_ci() {
        panic!("{name} is required under CI=true but was not found. {how_to_start}");
    }
    eprintln!("SKIPPED: {name} not available ({how_to_start})");
    Service::Skip
}

/// Requires the RabbitMQ broker on 127.0.0.1:5672.
pub fn require_rabbitmq() -> Service {
    let addr: SocketAddr = RABBITMQ_ADDR.parse().expect("constant address parses");
    let up = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok();
    require(
        "RabbitMQ on 127.0.0.1:5672",
        up,
        "Start it with `rabbitmq-server -detached` (or run .ci/run, which installs and starts it).",
    )
}

/// Requires a `tmux` binary on PATH.
pub fn require_tmux() -> Service {
    let found = std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    require(
        "tmux",
        found,
        "Install it with `apt-get install -y tmux` (.ci/run does this).",
    )
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; panics naming `what` on timeout.
/// Tests wait for conditions with this, never with a bare sleep.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub mod bench;

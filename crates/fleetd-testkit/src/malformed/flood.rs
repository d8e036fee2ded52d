//! A connection flood, as a hostile or careless local user would make one (issue 15): many TCP
//! connections that send nothing (idle) and many that begin a request head and never finish it
//! (slow headers, a byte line every so often), held open for a while, watching what the server
//! does with each — answers it (a `503` refusal, kept as a sample), closes it (and when, counted
//! from its connect), or leaves it open. Run by the `conn-flood` binary (so a test can run it as
//! another user) and reported as one JSON line. Std only, blocking sockets switched to
//! non-blocking after connect, one thread: a flood, not a load generator.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What to open.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// The daemon's listen address.
    pub addr: SocketAddr,
    /// Connections that send nothing.
    pub idle: usize,
    /// Connections that send a request head slowly and never end it.
    pub slow: usize,
    /// How long to hold them, from the last connect.
    pub hold: Duration,
}

/// What happened to one kind of connection.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    /// Connections made.
    pub opened: usize,
    /// Connects that failed.
    pub connect_failed: usize,
    /// Connections the server answered `503`.
    pub refused_503: usize,
    /// Connections the server answered with anything else.
    pub answered_other: usize,
    /// Connections the server closed without an answer.
    pub closed_silently: usize,
    /// Connections still open when the hold ended.
    pub open_at_end: usize,
    /// For each connection closed without an answer: milliseconds from its connect.
    pub closed_after_ms: Vec<u64>,
}

/// The flood's report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// The idle connections.
    pub idle: Outcome,
    /// The slow-header connections.
    pub slow: Outcome,
    /// The first `503` answer seen, whole.
    pub refusal_sample: Option<String>,
    /// The open-file limit the flood raised itself to.
    pub nofile: u64,
}

struct Conn {
    stream: TcpStream,
    opened: std::time::Instant,
    slow: bool,
    answer: Vec<u8>,
    done: bool,
}

/// How often the flood looks at its connections (and sends a slow one its next header line).
const TICK: Duration = Duration::from_millis(250);

/// Raises this process's open-file soft limit to its hard limit; returns the limit now.
pub fn raise_nofile() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Runs the flood and reports.
#[expect(
    clippy::disallowed_methods,
    reason = "a flood measures when the server closed each connection on the wall clock"
)]
pub fn run(plan: Plan) -> Report {
    let mut report = Report {
        nofile: raise_nofile(),
        ..Report::default()
    };
    let mut conns = Vec::with_capacity(plan.idle + plan.slow);
    for slow in std::iter::repeat_n(false, plan.idle).chain(std::iter::repeat_n(true, plan.slow)) {
        let outcome = if slow {
            &mut report.slow
        } else {
            &mut report.idle
        };
        let Ok(mut stream) = TcpStream::connect_timeout(&plan.addr, Duration::from_secs(10)) else {
            outcome.connect_failed += 1;
            continue;
        };
        if slow {
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        }
        if stream.set_nonblocking(true).is_err() {
            outcome.connect_failed += 1;
            continue;
        }
        outcome.opened += 1;
        conns.push(Conn {
            stream,
            opened: std::time::Instant::now(),
            slow,
            answer: Vec::new(),
            done: false,
        });
    }
    let until = std::time::Instant::now() + plan.hold;
    let mut line = 0u64;
    loop {
        line += 1;
        for conn in conns.iter_mut().filter(|c| !c.done) {
            watch(conn, line, &mut report);
        }
        if std::time::Instant::now() >= until || conns.iter().all(|c| c.done) {
            break;
        }
        std::thread::sleep(TICK);
    }
    for conn in conns.iter().filter(|c| !c.done) {
        let outcome = if conn.slow {
            &mut report.slow
        } else {
            &mut report.idle
        };
        outcome.open_at_end += 1;
    }
    report
}

/// Reads what the server sent `conn` and notes its end; a slow one gets its next header line.
fn watch(conn: &mut Conn, line: u64, report: &mut Report) {
    if conn.slow && conn.answer.is_empty() {
        let _ = conn
            .stream
            .write_all(format!("X-Slow-{line}: still coming\r\n").as_bytes());
    }
    let mut buf = [0u8; 4096];
    let closed = loop {
        match conn.stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => conn.answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break true,
        }
    };
    if !closed {
        return;
    }
    conn.done = true;
    let outcome = if conn.slow {
        &mut report.slow
    } else {
        &mut report.idle
    };
    let text = String::from_utf8_lossy(&conn.answer).into_owned();
    if text.starts_with("HTTP/1.1 503") {
        outcome.refused_503 += 1;
        report.refusal_sample.get_or_insert(text);
    } else if !text.is_empty() {
        outcome.answered_other += 1;
    } else {
        outcome.closed_silently += 1;
        outcome
            .closed_after_ms
            .push(u64::try_from(conn.opened.elapsed().as_millis()).unwrap_or(u64::MAX));
    }
}

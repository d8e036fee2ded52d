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
/// Integration tests run from `target/<profile>/deps/`; workspace binaries sit one level up
/// (the benchmark binary itself sits with them). Cargo
/// only exports `CARGO_BIN_EXE_*` for a package's own binaries, so the daemon's binary is found by
/// this path (it must be built first: `cargo build --workspace --bins`, as `.ci/run` does). Panics
/// with a build hint when the binary is missing, since nothing can be tested then.
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let parent = exe.parent().expect("an executable lives in a directory");
    // Test binaries run from target/<profile>/deps; the bench and demo from target/<profile>.
    let dir = if parent.ends_with("deps") {
        parent.parent().expect("deps has a parent")
    } else {
        parent
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --workspace --bins` first (.ci/run does)",
        path.display()
    );
    path
}

/// The environment of process `pid`, from `/proc` (what a spawned member or lead really got).
pub fn environ(pid: u32) -> std::collections::HashMap<String, String> {
    procfs::process::Process::new(i32::try_from(pid).expect("pid fits"))
        .and_then(|p| p.environ())
        .expect("environ readable")
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect()
}

/// The environment of process `pid` and of every process under it, one string per process
/// (`/proc/PID/environ`, NULs as newlines): what a pane's whole process tree holds.
pub fn tree_environments(pid: u32) -> Vec<String> {
    tree_pids(pid)
        .iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/environ")).ok())
        .map(|e| String::from_utf8_lossy(&e).replace('\0', "\n"))
        .collect()
}

/// Process `pid` and every process under it.
pub fn tree_pids(pid: u32) -> Vec<u32> {
    // Every process's parent, from /proc/PID/stat (field 4, after the parenthesised name).
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((pid, ppid.parse().ok()?))
        })
        .collect();
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    pids
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

/// Requires that this process be root, which a test needs to run a process as another uid
/// (`setpriv`): CI runs the suite as root; elsewhere the test skips, saying why.
pub fn require_root() -> Service {
    require(
        "root (to run a process as another uid with setpriv)",
        rustix::process::geteuid().is_root(),
        "Run the suite as root, as CI does (.ci/run).",
    )
}

/// `n` with its thousands grouped by commas ("12,345"), as fleetd words a budget and the
/// benchmark tables word a rate.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

/// `then()` where tmux is there (a test that needs tmux and something more, such as an installed
/// agent CLI); `None` where it is not, having said why (under CI a missing tmux fails the test).
pub fn if_tmux<T>(then: impl FnOnce() -> Option<T>) -> Option<T> {
    (require_tmux() == Service::Present).then(then).flatten()
}

/// Writes `value` to the file `name` in `dir`, readable by its owner only (0600), as fleetd
/// wants a file a secret is read from; the file's path.
pub fn secret_file(dir: &std::path::Path, name: &str, value: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    std::fs::write(&path, value).expect("write the secret's file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .expect("make the secret's file owner-only");
    path
}

/// Runs `cmd` to its end; panics naming `what`, with what it printed, unless it ran and exited
/// 0. Returns its output.
pub fn run_ok(cmd: &mut std::process::Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} did not run: {e}"));
    succeeded(out, what)
}

/// `git -C dir ARGS` as a test's committer (`t <t@example.com>`); panics unless it succeeds.
/// Its output, trimmed.
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = run_ok(
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args),
        &format!("git {args:?}"),
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A git repository in a directory of its own (kept for the test's life) on `main` with one
/// commit: a README saying "hello".
pub fn git_repository() -> std::path::PathBuf {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    git(&dir, &["init", "--quiet", "-b", "main"]);
    std::fs::write(dir.join("README"), "hello\n").expect("write");
    git(&dir, &["add", "README"]);
    git(&dir, &["commit", "--quiet", "-m", "first"]);
    dir
}

/// `out`, when its command exited 0; panics naming `what`, with what it printed, otherwise.
pub fn succeeded(out: std::process::Output, what: &str) -> std::process::Output {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A free loopback port (bound and released: the daemon takes it a moment later).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; panics naming `what` on timeout.
/// Tests wait for conditions with this, never with a bare sleep.
#[expect(
    clippy::disallowed_methods,
    reason = "a test helper polling a real process on the wall clock"
)]
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

pub mod agents;
pub mod bench;
pub mod broker;
pub mod browser;
pub mod cluster;
pub mod daemon;
pub mod demo;
pub mod proxy;

pub mod fake_herdr;
pub mod fake_model;
pub mod http;
pub mod malformed;
pub mod model_call;
pub mod recovery;
pub mod rig;
pub mod rig_herdr;
pub mod sim_agent;
pub mod tls;
pub mod tmux;
pub mod webhook;

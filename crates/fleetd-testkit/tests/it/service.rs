//! Integration tests: running fleetd as a service — the shipped units in `deploy/` have the
//! documented shape, and the built binary started the way the systemd unit's `ExecStart` starts
//! it sends `READY=1` to `$NOTIFY_SOCKET` (path or abstract) only once it answers HTTP, and
//! `STOPPING=1` when SIGTERM begins the shutdown.

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fleetd_testkit::daemon::{command, isolated_config, write_config};
use fleetd_testkit::http;

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn unit() -> String {
    std::fs::read_to_string(repo_file("deploy/fleetd.service")).expect("deploy/fleetd.service")
}

/// The unit's `ExecStart` program and arguments.
fn exec_start() -> (String, Vec<String>) {
    let unit = unit();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart line");
    let mut words = line.split_whitespace().map(str::to_owned);
    let program = words.next().expect("ExecStart names a program");
    (program, words.collect())
}

#[test]
fn the_systemd_unit_and_launchd_plist_have_the_documented_shape() {
    let unit = unit();
    for line in [
        "After=herdr.service",
        "Type=notify",
        "Restart=on-failure",
        "WantedBy=default.target",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "the unit lacks {line:?}:\n{unit}"
        );
    }
    let (program, args) = exec_start();
    assert_eq!(program, "%h/.cargo/bin/fleetd");
    assert_eq!(args, ["serve"]);
    let plist = std::fs::read_to_string(repo_file("deploy/dev.fleetd.plist")).expect("plist");
    assert!(plist.contains("<string>dev.fleetd</string>"), "{plist}");
    assert!(
        plist.contains(r#"exec "$HOME/.cargo/bin/fleetd" serve"#),
        "{plist}"
    );
    // XML forbids `--` inside comments; launchd would refuse the whole file.
    for comment in plist.split("<!--").skip(1) {
        let body = comment.split("-->").next().unwrap_or_default();
        assert!(!body.contains("--"), "`--` inside an XML comment: {body}");
    }
}

/// Receives one notification, failing after `timeout`.
fn recv(socket: &UnixDatagram, timeout: Duration) -> String {
    socket.set_read_timeout(Some(timeout)).expect("timeout");
    let mut buf = [0u8; 256];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification within {timeout:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Starts the binary as the unit does (its ExecStart arguments, configured through the default
/// config path under an isolated HOME) with `NOTIFY_SOCKET=notify_var`, and checks READY=1
/// arrives only once HTTP answers, then STOPPING=1 on SIGTERM and a clean exit.
fn notifies_through(socket: &UnixDatagram, notify_var: &str) {
    let home = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    write_config(
        home.path(),
        &format!("{}listen: 127.0.0.1:{port}\n", isolated_config(home.path())),
    );
    let (_, args) = exec_start();
    let mut child = command(home.path())
        .args(&args)
        .env("NOTIFY_SOCKET", notify_var)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fleetd starts");
    let stderr = child.stderr.take().expect("piped");
    let log = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let ready = recv(socket, Duration::from_secs(60));
    assert_eq!(ready, "READY=1");
    // Ready means ready: the very first request after the notification is answered.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let health = http::get(addr, "/healthz").expect("/healthz answers once READY=1 was sent");
    assert!(health.status == 200 || health.status == 503, "{health:?}");
    assert!(
        health.json()["store"]["ok"] == true,
        "the store is open: {}",
        health.body
    );
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    assert_eq!(recv(socket, Duration::from_secs(30)), "STOPPING=1");
    let status = child.wait().expect("fleetd exits");
    let lines = log.join().expect("log reader");
    assert!(status.success(), "exit {status:?}; log: {lines:#?}");
}

#[test]
fn serve_notifies_ready_on_a_path_socket_once_it_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
    notifies_through(&socket, path.to_str().expect("utf-8 path"));
}

#[test]
fn serve_notifies_ready_on_an_abstract_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("fleetd-it-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .expect("abstract address");
    let socket = UnixDatagram::bind_addr(&addr).expect("bind the abstract socket");
    notifies_through(&socket, &format!("@{name}"));
}

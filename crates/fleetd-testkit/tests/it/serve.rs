//! Integration tests: `fleetd serve` — the built binary answers `/healthz` and stops cleanly on
//! SIGTERM/SIGINT; `run()` works in-process on `127.0.0.1:0`.

use std::time::Duration;

use fleetd_testkit::daemon::Daemon;
use fleetd_testkit::http;

#[test]
fn healthz_answers_json_with_the_documented_shape() {
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(home.path(), &[]);
    let resp = http::get(daemon.addr, "/healthz").expect("healthz answers");
    let body = resp.json();
    assert!(matches!(resp.status, 200 | 503), "status {}", resp.status);
    assert_eq!(body["status"] == "ok", resp.status == 200, "{body}");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["store"]["kind"], "embedded");
    assert!(body["protocolMismatch"].is_boolean(), "{body}");
    assert!(body.get("member").is_none(), "{body}");
    let missing = http::get(daemon.addr, "/nope").expect("answers");
    assert_eq!(missing.status, 404);
}

#[test]
fn sigterm_stops_the_daemon_with_exit_0() {
    for signal in ["TERM", "INT"] {
        let home = tempfile::tempdir().expect("tempdir");
        let mut daemon = Daemon::start(home.path(), &[]);
        http::get(daemon.addr, "/healthz").expect("up before the signal");
        daemon.signal(signal);
        assert_eq!(
            daemon.wait_exit(Duration::from_secs(20)),
            Some(0),
            "SIG{signal}"
        );
        assert!(
            std::net::TcpStream::connect(daemon.addr).is_err(),
            "listener closed after SIG{signal}"
        );
    }
}

#[test]
fn non_loopback_listen_without_token_is_refused() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = fleetd_testkit::daemon::command(home.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .expect("fleetd runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("apiToken"));
}

#[tokio::test]
async fn run_serves_in_process_until_shutdown() {
    let home = tempfile::tempdir().expect("tempdir");
    let env = fleetd::config::Environment {
        home: Some(home.path().to_path_buf()),
        ..Default::default()
    };
    let config = fleetd::config::Config::parse("", "test", &env).expect("defaults");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(fleetd::serve::run(config, listener, async move {
        let _ = stopped.await;
    }));
    let resp = tokio::task::spawn_blocking(move || http::get(addr, "/healthz"))
        .await
        .expect("join")
        .expect("healthz");
    assert_eq!(resp.json()["store"]["kind"], "embedded");
    stop.send(()).expect("server still running");
    tokio::time::timeout(Duration::from_secs(20), server)
        .await
        .expect("server stops after shutdown")
        .expect("join")
        .expect("run returns Ok");
}

//! Integration tests: `fleetd serve` — the built binary answers `/healthz` for its store and every
//! multiplexer daemon, stops cleanly on SIGTERM/SIGINT, refuses a second daemon on the same
//! store, and `run()` works in-process on `127.0.0.1:0`.

use std::time::Duration;

use fleetd_testkit::daemon::{Daemon, command, write_config};
use fleetd_testkit::fake_herdr::process::FakeHerdrProcess;
use fleetd_testkit::tmux::TmuxServer;
use fleetd_testkit::{Service, bin_path, http, require_tmux};
use serde_json::json;

/// What `daemon`'s `/healthz` answers: its status code and its JSON body.
fn healthz(daemon: &Daemon) -> (u16, serde_json::Value) {
    let resp = http::get(daemon.addr, "/healthz").expect("healthz answers");
    (resp.status, resp.json())
}

#[test]
fn healthz_answers_json_with_the_documented_shape() {
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start(home.path(), &[]);
    let (status, body) = healthz(&daemon);
    // No tmux server listens on the isolated socket: degraded, and it says which part.
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["store"]["kind"], "embedded");
    assert_eq!(body["store"]["ok"], true);
    assert_eq!(body["lead"]["kind"], "tmux");
    assert_eq!(body["lead"]["ok"], false);
    assert!(
        body["lead"]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    assert_eq!(body["protocolMismatch"], false);
    assert!(body.get("member").is_none(), "{body}");
    let missing = http::get(daemon.addr, "/nope").expect("answers");
    assert_eq!(missing.status, 404);
}

#[test]
fn healthz_is_ok_with_a_running_tmux_server() {
    if require_tmux() == Service::Skip {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let tmux = TmuxServer::start().expect("private tmux server");
    write_config(
        home.path(),
        &format!(
            "multiplexer: tmux\ntmuxSocket: {}\n",
            tmux.socket().display()
        ),
    );
    let daemon = Daemon::start(home.path(), &[]);
    let (status, body) = healthz(&daemon);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ok");
    assert!(
        body["lead"]["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("tmux ")),
        "{body}"
    );
}

fn herdr_config(lead: &std::path::Path, member: Option<&std::path::Path>) -> String {
    let mut yaml = format!("multiplexer: herdr\nherdrSocket: {}\n", lead.display());
    if let Some(member) = member {
        yaml.push_str(&format!("memberHerdrSocket: {}\n", member.display()));
    }
    yaml
}

/// A daemon on two fake herdrs: one for the lead, one (started with `member_args`) for members.
/// The fields drop in order: the daemon before the herdrs it reads, the home last.
struct TwoHerdrs {
    daemon: Daemon,
    member: FakeHerdrProcess,
    lead: FakeHerdrProcess,
    _home: tempfile::TempDir,
}

fn two_herdrs(member_args: &[&str]) -> TwoHerdrs {
    let home = tempfile::tempdir().expect("tempdir");
    let lead_sock = home.path().join("lead.sock");
    let member_sock = home.path().join("member.sock");
    let lead = FakeHerdrProcess::start(&bin_path("fake-herdr"), &lead_sock).expect("lead herdr");
    let member =
        FakeHerdrProcess::start_with_args(&bin_path("fake-herdr"), &member_sock, member_args)
            .expect("member herdr");
    write_config(home.path(), &herdr_config(&lead_sock, Some(&member_sock)));
    let daemon = Daemon::start(home.path(), &[]);
    TwoHerdrs {
        daemon,
        member,
        lead,
        _home: home,
    }
}

#[test]
fn healthz_covers_both_herdr_daemons() {
    let fx = two_herdrs(&["--version", "0.8.1"]);
    let (status, body) = healthz(&fx.daemon);
    assert_eq!((status, &body["status"]), (200, &json!("ok")), "{body}");
    assert_eq!(body["lead"]["kind"], "herdr");
    assert_eq!(body["lead"]["protocol"], 20);
    assert_eq!(body["member"]["version"], "0.8.1");
    assert_eq!(body["protocolMismatch"], false);
    drop(fx.member);
    let (status, body) = healthz(&fx.daemon);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["lead"]["ok"], true);
    assert_eq!(body["member"]["ok"], false, "{body}");
    drop(fx.lead);
}

#[test]
fn healthz_flags_different_protocols() {
    let fx = two_herdrs(&["--protocol", "21"]);
    let (_, body) = healthz(&fx.daemon);
    assert_eq!(body["protocolMismatch"], true, "{body}");
    assert_eq!(body["member"]["protocol"], 21);
}

#[test]
fn second_daemon_on_the_same_store_exits_naming_the_first() {
    let home = tempfile::tempdir().expect("tempdir");
    let first = Daemon::start(home.path(), &[]);
    let out = command(home.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("fleetd runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("pid {}", first.child.id())),
        "{stderr}"
    );
    assert!(stderr.contains("in use by another fleetd"), "{stderr}");
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
        // The store's lock was released: a new daemon opens the same state.
        let again = Daemon::start(home.path(), &[]);
        assert_eq!(
            http::get(again.addr, "/healthz").expect("up").json()["store"]["ok"],
            true
        );
    }
}

#[test]
fn non_loopback_listen_without_token_is_refused() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = command(home.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .expect("fleetd runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("apiToken"));
}

/// Listening on one outside address, members (whose `FLEETD_URL` is that address) could never
/// be identified: fleetd says so at start and names the fix.
#[test]
fn one_outside_listen_address_is_warned_about_for_members() {
    let Some(ip) = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
                .find(|a| a.is_ipv4() && !a.is_loopback())
        })
    else {
        assert!(
            fleetd_testkit::require(
                "a non-loopback address",
                false,
                "give the machine a network interface with an IPv4 address (hostname -I lists none)",
            ) == fleetd_testkit::Service::Skip
        );
        return;
    };
    let home = tempfile::tempdir().expect("tempdir");
    let token = home.path().join("token");
    std::fs::write(&token, "outside-token").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("owner-only");
    fleetd_testkit::daemon::write_config(
        home.path(),
        &format!(
            "{}apiToken: api\nsecrets:\n  api:\n    file: {}\n",
            fleetd_testkit::daemon::isolated_config(home.path()),
            token.display()
        ),
    );
    let mut daemon = Daemon::start_on(home.path(), &format!("{ip}:0"), &[]);
    fleetd_testkit::wait_until("the warning", Duration::from_secs(20), || {
        daemon
            .logs_so_far()
            .iter()
            .any(|l| l.contains("listening on one outside address only") && l.contains("0.0.0.0"))
    });
}

#[tokio::test]
async fn run_serves_in_process_until_shutdown() {
    let home = tempfile::tempdir().expect("tempdir");
    let env = fleetd::config::Environment {
        home: Some(home.path().to_path_buf()),
        ..Default::default()
    };
    let yaml = fleetd_testkit::daemon::isolated_config(home.path());
    let config = fleetd::config::Config::parse(&yaml, "test", &env).expect("valid");
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

#[test]
fn an_engine_panic_makes_the_daemon_exit_non_zero() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut daemon = Daemon::start(home.path(), &["--test-engine-panic-after-ms", "500"]);
    let code = daemon.wait_exit(Duration::from_secs(30));
    assert!(
        code.is_some_and(|c| c != 0),
        "a supervised engine's panic ends the daemon with a failure status: {code:?}"
    );
    let said = |needle: &str| {
        daemon.seen_logs().iter().any(|l| l.contains(needle))
            || std::iter::from_fn(|| daemon.logs.try_recv().ok()).any(|l| l.contains(needle))
    };
    assert!(
        said("the fleet engine panicked"),
        "{:#?}",
        daemon.seen_logs()
    );
}

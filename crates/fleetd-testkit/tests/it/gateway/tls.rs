//! Gateways over TLS: a round trip through a TLS broker, a broker its CA did not sign refused
//! with the reason, and an unreadable CA file that stops the daemon naming the key.

use super::*;

/// Gateway a reaches the broker over TLS (`amqps://`, trusting the CA of its `caFile`), b in
/// plain TCP: a lead on a sends to a member on b and gets her reply.
#[test]
fn e2e_gateway_over_tls_a_lead_sends_across_and_gets_the_reply() {
    let Some((ca, proxy)) = tls_broker() else {
        return;
    };
    let Some(mut hosts) = a_over_tls(&proxy, &ca.cert()) else {
        return;
    };
    hosts.wait_linked();
    assert!(proxy.handshakes() >= 1, "a linked through the TLS proxy");
    assert_eq!(healthz_gateway(&hosts.a)["linked"], true);
    let alice = hosts.alice_on_b();
    let sent = fleetd_testkit::rig::structured_ok(&hosts.a.lead(
        "fleet_send",
        &serde_json::json!({ "target": alice, "task": "count the shells over TLS" }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"], "did on b: count the shells over TLS");
}

/// Gateway a told to trust another CA than the one that signed the broker's certificate (a
/// broker it cannot authenticate, as a man in the middle would be): it does not link, says
/// why in its log and `/healthz` (the certificate, and the key to check), keeps trying, and
/// what its lead sends waits in its outbox. With its `caFile` fixed and a restart it links and
/// delivers: the task is answered once.
#[test]
fn e2e_gateway_over_tls_does_not_link_to_a_broker_its_ca_did_not_sign_and_says_why() {
    let Some((ca, proxy)) = tls_broker() else {
        return;
    };
    let stranger = TestCa::new("another CA").expect("a second CA");
    let Some(mut hosts) = a_over_tls(&proxy, &stranger.cert()) else {
        return;
    };
    wait_linked(&mut hosts.b);
    let patience = std::time::Duration::from_secs(60);
    // Refused, and tried again.
    for attempt in ["a's first refusal", "a's retry"] {
        hosts.a.daemon.wait_for_log(attempt, patience, |l| {
            l.contains("gateway cannot reach the broker") && l.contains("UnknownIssuer")
        });
    }
    let health = healthz_gateway(&hosts.a);
    assert_eq!(health["linked"], false, "{health}");
    let error = health["error"].as_str().unwrap_or_default();
    for words in [
        "TLS handshake",
        "certificate",
        "gateway.broker.tls.caFile",
        &stranger.cert().display().to_string(),
    ] {
        assert!(
            error.contains(words),
            "/healthz error lacks {words:?}: {error}"
        );
    }
    assert_eq!(proxy.handshakes(), 0, "no TLS session was completed");

    // What a's lead sends meanwhile is kept, not lost.
    let alice = hosts.alice_on_b();
    let task = "task sent while unlinked";
    let ticket = send_nowait(&hosts.a, &alice, task);
    hold(std::time::Duration::from_secs(2));
    assert!(
        !hosts.b.history("fleet:").contains(task),
        "the task reached b over a link that should not exist"
    );

    // The fix: a trusts the CA that signed the broker's certificate.
    hosts.a.daemon.signal("TERM");
    hosts.a.daemon.wait_exit(patience);
    let config = hosts.a.dir().join("config/fleetd/fleetd.yaml");
    let text = std::fs::read_to_string(&config).expect("a's config");
    let fixed = text.replace(
        &stranger.cert().display().to_string(),
        &ca.cert().display().to_string(),
    );
    assert_ne!(text, fixed, "the caFile was in a's config");
    std::fs::write(&config, fixed).expect("write a's config");
    a_restarts_and_gets_the_reply_once(&mut hosts, [&ticket, task], &alice, patience);
    assert_eq!(healthz_gateway(&hosts.a)["linked"], true);
}

/// A `caFile` that cannot be read stops `fleetd serve` at start, naming the key and the file
/// (the config itself is valid: the file is read once, when the link is set up).
#[test]
fn e2e_gateway_with_an_unreadable_ca_file_does_not_start_and_names_the_key() {
    let home = tempfile::tempdir().expect("tempdir");
    let password = fleetd_testkit::secret_file(home.path(), "gw-password", "pw");
    let missing = home.path().join("no-such-ca.pem");
    fleetd_testkit::daemon::write_config(
        home.path(),
        &format!(
            "{}gateway:\n  name: a\n  broker:\n    urls: [amqps://localhost:5671/fleet]\n    passwordSecret: gw\n    tls:\n      caFile: {}\nsecrets:\n  gw:\n    file: {}\n",
            fleetd_testkit::daemon::isolated_config(home.path()),
            missing.display(),
            password.display(),
        ),
    );
    let mut child = fleetd_testkit::daemon::command(home.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fleetd runs");
    let mut status = None;
    fleetd_testkit::wait_until(
        "fleetd to give up",
        std::time::Duration::from_secs(30),
        || {
            status = child.try_wait().expect("wait");
            status.is_some()
        },
    );
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{stderr}");
    for words in [
        "failed to load gateway.broker.tls.caFile",
        "cannot read",
        &missing.display().to_string(),
    ] {
        assert!(stderr.contains(words), "{words:?} not in: {stderr}");
    }
}

//! Notices to where people are (issue 39, SPEC §20), end to end with the built daemon on real
//! tmux: a blocked member's notice reaches a signed webhook (its HMAC checked here), an ntfy
//! topic (title, click link, plain text) and the desktop (`notify-send`, a stand-in on fleetd's
//! `PATH`), once per episode and never with a task's text; a webhook that hangs and one that
//! answers 500 (retried, then given up) hold nothing else up.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use fleetd_testkit::http;
use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::webhook::{Answer, Webhook};
use fleetd_testkit::{require_tmux, wait_until};
use serde_json::json;

const PATIENCE: Duration = Duration::from_secs(60);
const SECRET: &str = "hook-signing-secret-51f0";

fn blocker() -> String {
    sim_profile(
        "blocker",
        &[
            ("SIM_AGENT_SCRIPT", "permission"),
            ("SIM_AGENT_WORK_MS", "200"),
        ],
    )
}

/// Waits until the operator's `/blocked` lists `target`; its dialog's fingerprint.
fn blocked(rig: &Rig, target: &str) -> String {
    let mut dialog = String::new();
    wait_until(&format!("{target} blocked"), PATIENCE, || {
        let all = http::get(rig.daemon.operator(), "/blocked")
            .map(|r| r.json())
            .unwrap_or_default();
        dialog = all["blocked"]
            .as_array()
            .and_then(|b| b.iter().find(|e| e["target"] == target))
            .and_then(|e| e["dialog"].as_str())
            .unwrap_or_default()
            .to_owned();
        !dialog.is_empty()
    });
    dialog
}

/// The operator types choice 1 into bea's dialog `dialog`.
fn approve_bea(rig: &Rig, dialog: &str) {
    let answered = http::request(
        rig.daemon.operator(),
        "POST",
        "/sessions/bea/approve",
        Some(&json!({ "choice": "1", "dialog": dialog }).to_string()),
    )
    .expect("answer");
    assert_eq!(answered.status, 200, "{}", answered.body);
}

#[test]
fn e2e_notify_a_signed_webhook_ntfy_and_the_desktop_each_hear_once() {
    if require_tmux() == fleetd_testkit::Service::Skip {
        return;
    }
    let files = tempfile::tempdir().expect("tempdir");
    let secret = files.path().join("hook-secret");
    std::fs::write(&secret, SECRET).expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // notify-send, as fleetd finds it on its PATH: records its arguments.
    let bin = files.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let said = files.path().join("notify-send.log");
    let stand_in = bin.join("notify-send");
    std::fs::write(
        &stand_in,
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" >> {}\n", said.display()),
    )
    .expect("write");
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let hook = Webhook::start(Answer::Ok);
    let ntfy = Webhook::start(Answer::Ok);
    let rig = Rig::start_with_env(
        &format!(
            "primary:\n  tab: base:lead\n  pushReminders: 0\nsecrets:\n  hook:\n    file: {}\n\
             notify:\n  dashboardUrl: https://fleet.example.org\n  sinks:\n\
             \x20   - kind: webhook\n      url: {}\n      secret: hook\n      events: [blocked]\n\
             \x20   - kind: ntfy\n      url: {}\n\
             \x20   - kind: desktop\n      events: [blocked]\n\
             profiles:\n{}",
            secret.display(),
            hook.url(),
            ntfy.url(),
            blocker(),
        ),
        "127.0.0.1:0",
        &[("PATH".to_owned(), path)],
    );
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "rotate the keys");
    let dialog = blocked(&rig, "bea");
    wait_until("every sink told", PATIENCE, || {
        !hook.received().is_empty() && !ntfy.received().is_empty() && said.exists()
    });

    // The webhook: JSON, signed over its exact bytes with the secret.
    let got = hook.received().remove(0);
    let mac = fleetd::human::notify::hmac_sha256(SECRET.as_bytes(), &got.raw);
    let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        got.header("x-fleetd-signature"),
        Some(format!("sha256={hex}").as_str())
    );
    assert_eq!(got.header("x-fleetd-event"), Some("member.blocked"));
    assert_eq!(got.body["kind"], "blocked");
    assert_eq!(got.body["dialog"], dialog.as_str());
    assert_eq!(got.body["link"], "https://fleet.example.org/#member=bea");
    assert_eq!(
        got.body["choices"],
        json!(["1 Yes", "2 No"]),
        "{}",
        got.body
    );
    // ntfy: a title, the link to click, fleetd's sentence.
    let topic = ntfy.received().remove(0);
    assert_eq!(topic.header("title"), Some("fleetd: bea"));
    assert_eq!(
        topic.header("click"),
        Some("https://fleet.example.org/#member=bea")
    );
    let text = String::from_utf8_lossy(&topic.raw).into_owned();
    assert!(text.starts_with("bea waits on a dialog"), "{text}");
    // The desktop: the same, through notify-send.
    let desktop = std::fs::read_to_string(&said).expect("read");
    assert!(
        desktop.contains("fleetd: bea") && desktop.contains("#member=bea"),
        "{desktop}"
    );
    for told in [got.raw.as_slice(), topic.raw.as_slice(), desktop.as_bytes()] {
        let told = String::from_utf8_lossy(told);
        assert!(
            !told.contains("rotate the keys"),
            "a task's text in a notice: {told}"
        );
    }

    // Answered, then the episode is over: nothing more is sent for it.
    approve_bea(&rig, &dialog);
    assert!(rig.reply_of(&ticket).contains("rotate the keys"));
    fleetd_testkit::agents::rig::pause(Duration::from_secs(1));
    assert_eq!(hook.received().len(), 1);
    assert_eq!(ntfy.received().len(), 1);
}

#[test]
fn e2e_notify_a_hung_webhook_and_a_failing_one_hold_nothing_up() {
    if require_tmux() == fleetd_testkit::Service::Skip {
        return;
    }
    let hung = Webhook::start(Answer::Hang);
    let failing = Webhook::start(Answer::Fail);
    let mut rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nnotify:\n  sinks:\n\
         \x20   - kind: webhook\n      url: {}\n\
         \x20   - kind: webhook\n      url: {}\n\
         profiles:\n{}{}",
        hung.url(),
        failing.url(),
        blocker(),
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")]),
    ));
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "ship it");
    let dialog = blocked(&rig, "bea");
    wait_until("both webhooks called", PATIENCE, || {
        !hung.received().is_empty() && !failing.received().is_empty()
    });
    // While the hung webhook still holds its request, the fleet goes on: bea is answered and
    // replies, another member is spawned, given a task and replies.
    approve_bea(&rig, &dialog);
    assert!(rig.reply_of(&ticket).contains("ship it"));
    rig.spawn("sim", "cal");
    let other = rig.send_task("cal", "count");
    assert!(rig.reply_of(&other).contains("count"));
    assert_eq!(
        hung.received().len(),
        1,
        "the hung request is still the only one"
    );
    // The failing webhook is tried three times (1 s, then 4 s apart), then given up on.
    wait_until("three attempts", PATIENCE, || failing.received().len() == 3);
    fleetd_testkit::agents::rig::pause(Duration::from_secs(5));
    assert_eq!(failing.received().len(), 3, "then no more");
    let log = rig.daemon.logs_so_far().join("\n");
    assert!(
        log.contains("a notice could not be sent"),
        "the give-up is logged"
    );
}

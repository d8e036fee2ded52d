//! End-to-end tests of members (issue 7) with real tmux: backend credentials reach the member's
//! process and never the lead's, never a log line and never a tool result; `fleet_stop` and a
//! member's process dying both go through the one release path with their cause; names.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use fleetd_testkit::rig::{LEAD, Rig, error_code, structured_ok};
use fleetd_testkit::{Service, bin_path, require_tmux, wait_until};
use serde_json::{Value, json};

const SECRET: &str = "sk-fleetd-test-9f8e7d6c5b4a";

/// A rig with backend `lab` whose token is a file secret, handed to its members themselves
/// (`throughFleetd: false`: what these tests check is that path; the model gateway's, where a
/// member holds only a key of its own, is `model_gateway`'s), and profiles `sim` (claude kind, on
/// `lab`), `hang` (a member whose turns never end) and `slow` (an agent that starts after 2 s).
fn rig() -> Option<Rig> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let secrets = tempfile::tempdir().expect("tempdir").keep();
    let token = secrets.join("lab-token");
    std::fs::write(&token, format!("{SECRET}\n")).expect("write secret");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let sim = bin_path("sim-agent").display().to_string();
    Some(Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n\
         backends:\n  lab:\n    baseUrl: http://127.0.0.1:9/v1\n    authTokenSecret: lab-token\n    throughFleetd: false\n\
         secrets:\n  lab-token:\n    file: {}\n\
         profiles:\n  sim:\n    agent: claude\n    command: {sim}\n    backend: lab\n    env:\n      SIM_AGENT_WORK_MS: \"300\"\n\
         \x20 hang:\n    agent: custom\n    command: {sim}\n    env:\n      SIM_AGENT_SCRIPT: hang\n\
         \x20 slow:\n    agent: custom\n    command: /bin/sh\n    args: [-c, \"sleep 2; exec {sim}\"]\n",
        token.display()
    )))
}

fn window_exists(rig: &Rig, target: &str) -> bool {
    rig.tmux
        .run(&["list-panes", "-t", target])
        .is_ok_and(|o| o.status.success())
}

fn poll_ticket(rig: &Rig, ticket: &Value, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_until(what, Duration::from_secs(60), || {
        last = structured_ok(&rig.lead("fleet_poll", &json!({ "ticket": ticket })));
        cond(&last)
    });
    last
}

/// Spawns a `hang` member named `name` and hands it a task that never ends; the task's ticket,
/// once the member is at work on it.
fn hang_at_work(rig: &Rig, name: &str) -> Value {
    rig.spawn("hang", name);
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": name, "task": "never ends", "wait": false }),
    ));
    poll_ticket(rig, &sent["ticket"], "the task to be working", |v| {
        v["state"] == "delivered" || v["state"] == "working"
    });
    sent["ticket"].clone()
}

/// Kills process `pid` with SIGKILL, the way a crash would end it.
fn kill_9(pid: u32) {
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
}

#[test]
fn e2e_backend_credentials_reach_the_member_only_and_are_never_shown() {
    let Some(rig) = rig() else {
        return;
    };
    let mut results = Vec::new();
    results.push(rig.lead("fleet_profiles", &json!({})));
    let spawned = rig.spawn("sim", "ann");
    results.push(spawned);
    let member = fleetd_testkit::environ(rig.pane_pid("fleet:ann"));
    assert_eq!(
        member.get("ANTHROPIC_AUTH_TOKEN").map(String::as_str),
        Some(SECRET)
    );
    assert_eq!(
        member.get("ANTHROPIC_BASE_URL").map(String::as_str),
        Some("http://127.0.0.1:9/v1")
    );
    assert_eq!(member.get("FLEETD_TARGET").map(String::as_str), Some("ann"));
    assert!(
        member
            .get("FLEETD_URL")
            .is_some_and(|u| u.starts_with("http://127.0.0.1:"))
    );
    let lead = fleetd_testkit::environ(rig.pane_pid(LEAD));
    assert!(
        lead.keys().all(|k| !k.starts_with("ANTHROPIC_")) && lead.values().all(|v| v != SECRET),
        "the lead never gets backend variables"
    );
    // It works, and nothing any tool returns carries the secret.
    let sent = rig.lead(
        "fleet_send",
        &json!({ "target": "ann", "task": "say hi", "timeoutSecs": 60 }),
    );
    assert_eq!(structured_ok(&sent)["status"], "replied", "{sent}");
    results.push(sent);
    results.push(rig.lead("fleet_list", &json!({})));
    results.push(rig.lead("fleet_status", &json!({ "target": "ann", "detail": true })));
    for result in &results {
        assert!(
            !result.to_string().contains(SECRET),
            "a tool result carries the secret: {result}"
        );
    }
    let stop = rig.lead("fleet_stop", &json!({ "target": "ann" }));
    assert!(!stop.to_string().contains(SECRET));
    // The whole log of the run, at debug level, holds no secret value; it names the secret.
    let mut log = rig.daemon.seen_logs().join("\n");
    while let Ok(line) = rig.daemon.logs.recv_timeout(Duration::from_millis(200)) {
        log.push('\n');
        log.push_str(&line);
    }
    assert!(!log.contains(SECRET), "the log leaked the secret");
    assert!(
        log.contains("profile secret resolved") && log.contains("lab-token"),
        "start-up names the resolved secret: {log}"
    );
}

#[test]
fn e2e_fleet_stop_closes_the_pane_and_fails_the_open_ticket_as_stopped() {
    let Some(rig) = rig() else {
        return;
    };
    let ticket = hang_at_work(&rig, "bo");
    let stopped = structured_ok(&rig.lead("fleet_stop", &json!({ "target": "bo" })));
    assert!(stopped.to_string().contains("bo"), "{stopped}");
    wait_until("bo's window to close", Duration::from_secs(30), || {
        !window_exists(&rig, "fleet:bo")
    });
    let ticket = poll_ticket(&rig, &ticket, "the ticket to fail", |v| {
        v["state"] == "failed"
    });
    assert_eq!(ticket["cause"], "stopped", "{ticket}");
    let list = structured_ok(&rig.lead("fleet_list", &json!({})));
    assert!(!list.to_string().contains("\"bo\""), "{list}");
}

#[test]
fn e2e_a_member_whose_process_dies_is_released_as_exited() {
    let Some(rig) = rig() else {
        return;
    };
    let ticket = hang_at_work(&rig, "cy");
    kill_9(rig.pane_pid("fleet:cy"));
    let ticket = poll_ticket(&rig, &ticket, "the ticket to fail", |v| {
        v["state"] == "failed"
    });
    assert_eq!(ticket["cause"], "exited", "{ticket}");
    wait_until("cy to leave the list", Duration::from_secs(30), || {
        let list = structured_ok(&rig.lead("fleet_list", &json!({})));
        !list.to_string().contains("\"cy\"")
    });
}

/// The process the shell in tmux target `pane` runs in the foreground now (its one child).
fn foreground_child(rig: &Rig, pane: &str) -> Option<u32> {
    let shell = rig.pane_pid(pane);
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn e2e_a_spawn_whose_caller_is_killed_midway_still_finishes() {
    let Some(rig) = rig() else {
        return;
    };
    let out = rig.lead_async("fleet_spawn", &json!({ "profile": "slow", "name": "eve" }));
    // The pane is open and its agent not started yet (it sleeps 2 s): the lead's call goes away.
    wait_until("eve's window to open", Duration::from_secs(30), || {
        window_exists(&rig, "fleet:eve")
    });
    let caller = foreground_child(&rig, LEAD).expect("the lead's mcp-call is still running");
    kill_9(caller);
    wait_until(
        "eve to be ready all the same",
        Duration::from_secs(60),
        || {
            let list = structured_ok(&rig.lead("fleet_list", &json!({})));
            list["members"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["target"] == "eve" && m["connected"] == true && m["status"] == "idle")
        },
    );
    assert!(!out.exists(), "the killed call never answered");
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "eve", "task": "still there?", "timeoutSecs": 60 }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
}

#[test]
fn e2e_spawn_picks_a_free_name_and_refuses_a_taken_one() {
    let Some(rig) = rig() else {
        return;
    };
    let first = structured_ok(&rig.lead("fleet_spawn", &json!({ "profile": "hang" })));
    let name = first["target"].as_str().expect("a name").to_owned();
    assert!(name.chars().all(|c| c.is_ascii_lowercase()), "{name}");
    let taken = rig.lead("fleet_spawn", &json!({ "profile": "hang", "name": name }));
    assert_eq!(error_code(&taken), "name_taken");
    let second = structured_ok(&rig.lead("fleet_spawn", &json!({ "profile": "hang" })));
    assert_ne!(second["target"], first["target"]);
}

/// A health endpoint the test controls: 200 while `up`, else 503.
fn health_server(up: std::sync::Arc<std::sync::atomic::AtomicBool>) -> String {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let status = if up.load(std::sync::atomic::Ordering::SeqCst) {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            );
        }
    });
    format!("http://{addr}/health")
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that a steady state raises no second incident means letting probes run"
)]
fn e2e_a_backend_going_down_and_up_is_exactly_one_nudge_each() {
    if require_tmux() == Service::Skip {
        return;
    }
    let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let health = health_server(std::sync::Arc::clone(&up));
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:boss\n  pushReminders: 1\n\
         backends:\n  lab:\n    baseUrl: http://127.0.0.1:9/v1\n    healthUrl: {health}\n    healthIntervalSecs: 1\n\
         profiles:\n  sim:\n    agent: custom\n    command: {}\n    backend: lab\n",
        bin_path("sim-agent").display()
    ));
    let lead = rig.agent_lead("boss");
    let done = rig.history(&lead).matches("turn done").count();
    rig.type_line(&lead, r#"fleet_spawn {"profile":"sim","name":"ann"}"#);
    wait_until("the spawn turn to end", Duration::from_secs(60), || {
        rig.history(&lead).matches("turn done").count() > done
    });
    let nudges = |rig: &Rig| {
        rig.history(&lead)
            .matches("[fleet] 1 message from ann")
            .count()
    };
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(nudges(&rig), 0, "a healthy backend is no news");
    up.store(false, std::sync::atomic::Ordering::SeqCst);
    wait_until("the down incident's nudge", Duration::from_secs(30), || {
        nudges(&rig) == 1
    });
    std::thread::sleep(Duration::from_secs(4)); // several more failing probes
    assert_eq!(nudges(&rig), 1, "exactly one nudge while it stays down");
    let texts = fleetd_testkit::http::reply_texts(rig.daemon.operator(), "ann");
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("backend lab is down"), "{texts:?}");
    // Read it, then the backend recovers: one more incident, one more nudge.
    let drained = fleetd_testkit::http::request(
        rig.daemon.operator(),
        "POST",
        "/sessions/ann/replies/drain",
        None,
    )
    .expect("drain");
    assert_eq!(drained.status, 200, "{}", drained.body);
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_until("the recovery nudge", Duration::from_secs(30), || {
        nudges(&rig) == 2
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(nudges(&rig), 2);
    let texts = fleetd_testkit::http::reply_texts(rig.daemon.operator(), "ann");
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("backend lab is up again"), "{texts:?}");
}

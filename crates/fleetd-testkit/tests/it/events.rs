//! `GET /events` end to end (SPEC §14): the built daemon on real tmux with sim-agents. The
//! operator follows the stream while a member is spawned, works a task and replies; a client
//! that reconnects with `Last-Event-ID` gets exactly what it missed, in order; the stream never
//! carries a task's or a reply's text. (The refusals to members, anonymous processes, other
//! users and web pages are in the security suite with every other door.)

use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::events::{SseEvent, SseReader};
use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use serde_json::json;

const TASK: &str = "count the pebbles in the north garden";
const REPLY: &str = "there were forty-two pebbles";

fn target_is(e: &SseEvent, kind: &str, target: &str) -> bool {
    e.event == kind && e.data["target"] == target
}

#[test]
fn e2e_events_follow_the_fleet_and_resume_after_the_last_event_id() {
    let Some(rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile(
            "sim",
            &[("SIM_AGENT_WORK_MS", "1200"), ("SIM_AGENT_REPLY", REPLY)]
        ),
    )) else {
        return;
    };
    let socket = state_dir(rig.dir()).join("api.sock");
    let mut first = SseReader::unix(&socket, None).expect("open /events");
    assert_eq!(first.status, 200, "{}", first.refusal);

    rig.spawn("sim", "nia");
    let spawned = first.until("nia's member.spawned", |e| {
        target_is(e, "member.spawned", "nia")
    });
    let spawned = spawned.last().expect("an event").clone();
    assert_eq!(spawned.data["profile"], "sim");
    assert_eq!(spawned.data["type"], "member.spawned");
    assert_eq!(
        spawned.data["id"],
        spawned.id.as_str(),
        "the id is in the data too"
    );
    assert!(spawned.data["at"].is_string());

    // A task, worked and answered: what the stream says of it, in order.
    let ticket = rig.send_task("nia", TASK);
    let seen = first.until("nia's reply stored", |e| {
        target_is(e, "reply.stored", "nia")
    });
    let states: Vec<String> = seen
        .iter()
        .filter(|e| e.event == "ticket.state" && e.data["ticket"] == ticket.as_str())
        .map(|e| e.data["state"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        states.first().map(String::as_str),
        Some("queued"),
        "{seen:#?}"
    );
    assert!(states.contains(&"delivered".to_owned()), "{states:?}");
    // The delivery says how long the task waited, and the latency record (the dashboard's
    // last hour) has it.
    let delivered = seen
        .iter()
        .find(|e| {
            e.event == "ticket.state"
                && e.data["ticket"] == ticket.as_str()
                && e.data["state"] == "delivered"
        })
        .expect("delivered");
    let waited = delivered.data["waited_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("waited_ms: {:?}", delivered.data));
    let record = fleetd_testkit::http::get(rig.daemon.operator(), "/events/latency")
        .expect("/events/latency")
        .json();
    assert!(
        record["delivery"]
            .as_array()
            .is_some_and(|d| d.iter().any(|s| s[1] == waited)),
        "{record}"
    );
    assert!(
        seen.iter()
            .any(|e| target_is(e, "member.status", "nia") && e.data["status"] == "working"),
        "nia was seen working: {seen:#?}"
    );
    let stored = seen.last().expect("the reply");
    assert_eq!(stored.data["ticket"], ticket.as_str());
    assert_eq!(stored.data["bytes"], REPLY.len());
    let after = first.until("the ticket replied", |e| {
        e.event == "ticket.state"
            && e.data["ticket"] == ticket.as_str()
            && e.data["state"] == "replied"
    });
    let last_seen = after.last().expect("an event").id.clone();

    // A second client that had read up to the spawn gets everything after it, in order, and
    // nothing before it.
    let mut resumed = SseReader::unix(&socket, Some(&spawned.id)).expect("reopen");
    assert_eq!(resumed.status, 200, "{}", resumed.refusal);
    let replayed = resumed.until("the same last event", |e| e.id == last_seen);
    let ids = |events: &[SseEvent]| events.iter().map(|e| e.id.clone()).collect::<Vec<_>>();
    let mut live: Vec<SseEvent> = seen.clone();
    live.extend(after.iter().cloned());
    assert_eq!(
        ids(&replayed),
        ids(&live),
        "the replay is what the first client saw after the spawn"
    );
    assert!(replayed.iter().all(|e| e.event != "stream.gap"));

    // An id of another run: told to re-read the state, then given what the ring holds.
    let mut stale = SseReader::unix(&socket, Some("0-5")).expect("reopen");
    let gap = stale.next_event().expect("a gap notice");
    assert_eq!(gap.event, "stream.gap", "{gap:?}");
    assert!(
        gap.id.is_empty(),
        "a gap carries no id, so the client's last id stands"
    );

    // Live events still reach the first client after the others joined.
    structured_ok(&rig.lead("fleet_stop", &json!({ "target": "nia" })));
    first.until("nia released", |e| target_is(e, "member.released", "nia"));

    for (name, stream) in [("first", &first), ("resumed", &resumed)] {
        assert!(
            !stream.raw.contains(TASK),
            "{name}: no task text in the stream"
        );
        assert!(
            !stream.raw.contains(REPLY),
            "{name}: no reply text in the stream"
        );
    }
}

/// `fleetd watch` on a pipe: the table, then one line per event; it rides out a daemon restart
/// (kill -9) and goes on with the new daemon's events.
#[test]
fn e2e_events_fleetd_watch_follows_on_a_pipe_and_reconnects() {
    use std::io::{BufRead as _, BufReader};
    use std::sync::mpsc;
    use std::time::Duration;

    let Some(mut rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")]),
    )) else {
        return;
    };
    rig.spawn("sim", "ada");
    let mut child = fleetd_testkit::daemon::command(rig.dir())
        .arg("watch")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("fleetd watch starts");
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let mut wait_for = |what: &str, pred: &dyn Fn(&str) -> bool| {
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| {
                    panic!("fleetd watch printed no line for {what}; so far: {seen:#?}")
                });
            let done = pred(&line);
            seen.push(line);
            if done {
                return;
            }
        }
    };
    wait_for("the table header", &|l| l.starts_with("TARGET"));
    wait_for("ada's row", &|l| l.starts_with("ada ") && l.contains("sim"));
    rig.spawn("sim", "bo");
    wait_for("bo joining", &|l| {
        l.contains("member.spawned") && l.contains("bo joined")
    });
    rig.send_task("bo", "a task");
    wait_for("bo's reply", &|l| {
        l.contains("reply.stored") && l.contains("bo replied")
    });

    rig.kill_daemon();
    wait_for("the lost connection", &|l| l.contains("not connected"));
    rig.restart_daemon();
    // A new daemon: the watcher shows the table again, and is told its last id is from
    // another run.
    wait_for("the table again", &|l| l.starts_with("TARGET"));
    wait_for("the gap after the restart", &|l| {
        l.contains("stream.gap") && l.contains("re-read the fleet's state")
    });
    rig.spawn("sim", "cy");
    wait_for("cy joining the new daemon", &|l| {
        l.contains("member.spawned") && l.contains("cy joined")
    });
    assert!(
        seen.iter().all(|l| !l.contains("a task")),
        "no task text on the watcher's lines: {seen:#?}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

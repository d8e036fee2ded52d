//! Integration tests: fleetd's herdr backend against fake-herdr behaving as herdr 0.8.2 and as
//! herdr 0.9 (issue 34; what the fake models for 0.9 and what it assumes is in its `version`
//! module): the protocol gate and loosely read capabilities, `events_lost` ending a status
//! subscription (fleetd resubscribes and resyncs), lifecycle subscriptions at the live edge,
//! `agent.prompt` answering after its Enter, `recent` reads with on-screen output, and
//! `workspace.close` with `close_group`.

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use fleetd::mux::herdr::{Herdr, HerdrConfig};
use fleetd::mux::{Multiplexer, PaneEvent};
use fleetd_core::AgentStatus;
use fleetd_testkit::fake_herdr::HerdrVersion;
use fleetd_testkit::fake_herdr::process::FakeHerdrProcess;
use fleetd_testkit::rig_herdr::{HerdrRig, sim_profile};
use fleetd_testkit::sim_agent::log_turns;
use fleetd_testkit::{bin_path, http, wait_until};
use serde_json::{Value, json};

use crate::mux_herdr::Fixture;
use crate::mux_kit::{next_event, statuses, wait_tail};

fn start(version: HerdrVersion, args: &[&str]) -> Fixture {
    Fixture::with(|socket| {
        FakeHerdrProcess::start_as(&bin_path("fake-herdr"), socket, version, args)
    })
}

/// A raw call's `result`, or its error object.
fn raw(fake: &FakeHerdrProcess, method: &str, params: &Value) -> Result<Value, Value> {
    let reply = fake.call(method, params).expect("fake-herdr answers");
    match reply.get("result") {
        Some(result) => Ok(result.clone()),
        None => Err(reply["error"].clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herdr_0_9_protocol_22_with_new_capabilities_is_accepted() {
    let fx = start(HerdrVersion::V0_9, &[]);
    let pong = raw(&fx.fake, "ping", &json!({})).expect("pong");
    assert_eq!(pong["protocol"], 22, "{pong}");
    assert!(pong["capabilities"]["something_new"].is_object(), "{pong}");
    let (_, info) = Herdr::connect(HerdrConfig::new(fx.fake.socket()))
        .await
        .expect("protocol 22 is accepted");
    assert_eq!((info.version.as_str(), info.protocol), ("0.9.0", Some(22)));
    let old = start(HerdrVersion::V0_8, &[]);
    let (_, info) = Herdr::connect(HerdrConfig::new(old.fake.socket()))
        .await
        .expect("protocol 20 is accepted");
    assert_eq!(info.protocol, Some(20));
}

/// herdr 0.9 drops events it could not deliver, then ends the subscription with `events_lost`.
/// The fake holds the connection open a minute after the event, so only a client that takes the
/// event itself as the end resubscribes in time; the status that changed meanwhile, and then a
/// pane closed meanwhile, are seen afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herdr_0_9_events_lost_ends_the_subscription_and_the_watch_resyncs() {
    let fx = start(HerdrVersion::V0_9, &[]);
    let (mut events, pane) = fx
        .watched_claude(&["--script", "silent", "--work-ms", "20000"])
        .await;

    // The agent starts working while the subscription loses its events.
    fx.fake
        .fault(&json!({ "fault": "events_lost", "ms": 1500, "linger_ms": 60000 }))
        .expect("fault");
    raw(
        &fx.fake,
        "agent.prompt",
        &json!({ "target": pane.pane.as_str(), "text": "work while events are lost" }),
    )
    .expect("prompted");
    statuses(&mut events, &pane.pane, &[AgentStatus::Working]).await;

    // The pane closes while the next subscription loses its events.
    fx.fake
        .fault(&json!({ "fault": "events_lost", "ms": 1000, "linger_ms": 60000 }))
        .expect("fault");
    raw(
        &fx.fake,
        "pane.close",
        &json!({ "pane_id": pane.pane.as_str() }),
    )
    .expect("closed");
    next_event(&mut events, "the closed pane gone", |e| {
        matches!(e, PaneEvent::Gone { pane: p, terminal: Some(t) } if *p == pane.pane && *t == pane.terminal)
    })
    .await;
}

#[test]
fn herdr_events_lost_is_a_0_9_fault_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("herdr.sock");
    let fake =
        FakeHerdrProcess::start_as(&bin_path("fake-herdr"), &socket, HerdrVersion::V0_8, &[])
            .expect("fake-herdr starts");
    assert!(
        fake.fault(&json!({ "fault": "events_lost", "ms": 10 }))
            .is_err()
    );
}

/// Subscribes to `pane.created` on a raw connection and returns the pushed lines that arrive
/// within a second.
fn pane_created_lines(fake: &FakeHerdrProcess) -> Vec<Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(fake.socket()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    let request = json!({ "id": "s", "method": "events.subscribe",
        "params": { "subscriptions": [{ "type": "pane.created" }] } });
    stream
        .write_all(format!("{request}\n").as_bytes())
        .expect("write");
    let mut reader = BufReader::new(stream);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(n) if n > 0 => lines.push(serde_json::from_str(&line).expect("json")),
            _ => return lines,
        }
    }
}

#[test]
fn herdr_lifecycle_subscriptions_replay_on_0_8_and_start_at_the_live_edge_on_0_9() {
    for version in HerdrVersion::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("herdr.sock");
        let fake = FakeHerdrProcess::start_as(&bin_path("fake-herdr"), &socket, version, &[])
            .expect("fake-herdr starts");
        fake.open_tab("one").expect("a tab");
        let lines = pane_created_lines(&fake);
        assert_eq!(lines[0]["result"]["type"], "subscription_started");
        let replayed = lines
            .iter()
            .filter(|l| l["event"] == "pane_created")
            .count();
        let expected = usize::from(version == HerdrVersion::V0_8);
        assert_eq!(replayed, expected, "{version:?}: {lines:?}");
    }
}

/// On 0.9 `agent.prompt` answers after its Enter, so an Enter that fails is answered after the
/// text was typed: fleetd must count that prompt as maybe typed, never type it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herdr_0_9_a_prompt_whose_enter_failed_is_uncertain() {
    let fx = start(HerdrVersion::V0_9, &[]);
    let (_events, pane) = fx
        .watched_claude(&["--script", "silent", "--work-ms", "300"])
        .await;
    fx.fake
        .fault(&json!({ "fault": "enter_fails", "count": 1 }))
        .expect("fault");
    let err = fx
        .herdr
        .submit(&pane.pane, "typed without its enter")
        .await
        .expect_err("herdr answered agent_prompt_failed");
    assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    let tail = wait_tail(&fx.herdr, &pane.pane, "typed without its enter").await;
    assert_eq!(tail.matches("typed without its enter").count(), 1, "{tail}");
}

/// Both versions: a task's prompt (waited on) and a nudge (not waited on) each start one turn —
/// the Enter herdr sends (on 0.8 after its answer, on 0.9 before it) is the only one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herdr_a_prompt_and_a_nudge_run_one_turn_each_on_both_versions() {
    for version in HerdrVersion::ALL {
        let fx = start(version, &[]);
        let (mut events, pane, log) = fx
            .watched_logging_claude("agent.jsonl", &["--script", "silent", "--work-ms", "800"])
            .await;
        let submitted = fx.herdr.submit(&pane.pane, "first task").await;
        assert_eq!(
            submitted.expect("submit").started,
            Some(true),
            "{version:?}"
        );
        statuses(&mut events, &pane.pane, &[AgentStatus::Done]).await;
        fx.herdr
            .nudge(&pane.pane, "then a nudge")
            .await
            .expect("nudge");
        statuses(
            &mut events,
            &pane.pane,
            &[AgentStatus::Working, AgentStatus::Done],
        )
        .await;
        assert_eq!(
            log_turns(&log),
            ["first task", "then a nudge"],
            "{version:?}: one turn each"
        );
    }
}

/// A 120-row pane with a few lines of output: a small `recent` read is empty on 0.8.2 (it counts
/// the blank rows below the output) and holds the output on 0.9; fleetd's tail is right on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herdr_recent_reads_of_a_tall_pane_give_fleetd_the_output_on_both_versions() {
    for version in HerdrVersion::ALL {
        let fx = start(version, &["--rows", "120"]);
        let pane = fx.open_claude(&["--script", "silent"]).await;
        wait_tail(&fx.herdr, &pane.pane, "sim-agent ready").await;
        let small = raw(
            &fx.fake,
            "pane.read",
            &json!({ "pane_id": pane.pane.as_str(), "source": "recent", "lines": 5 }),
        )
        .expect("read");
        let text = small["read"]["text"].as_str().unwrap_or_default();
        assert_eq!(
            text.contains("sim-agent ready"),
            version == HerdrVersion::V0_9,
            "{version:?}: {text:?}"
        );
        let tail = fx.herdr.read_tail(&pane.pane, 3).await.expect("tail");
        assert!(tail.contains("sim-agent ready"), "{version:?}: {tail:?}");
        assert!(tail.lines().count() <= 3, "{version:?}: {tail:?}");
    }
}

/// herdr 0.9 refuses to close a workspace that belongs to a group without `close_group`. fleetd
/// never closes a workspace (it closes member panes; herdr drops an emptied tab and workspace
/// itself), so it has nothing to pass; this pins both facts.
#[test]
fn herdr_workspace_close_needs_close_group_on_0_9_only_and_fleetd_never_sends_it() {
    assert!(
        !fleetd::mux::herdr::wire::METHODS_USED
            .iter()
            .any(|(method, _)| method.starts_with("workspace.close")),
        "fleetd closes workspaces now: pass close_group on protocol 22"
    );
    for version in HerdrVersion::ALL {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("herdr.sock");
        let fake = FakeHerdrProcess::start_as(&bin_path("fake-herdr"), &socket, version, &[])
            .expect("fake-herdr starts");
        let root = fake.open_tab("one").expect("a tab");
        let workspace = root["workspace_id"].as_str().expect("workspace").to_owned();
        fake.fault(&json!({ "fault": "group", "workspace_id": workspace }))
            .expect("grouped");
        let plain = raw(
            &fake,
            "workspace.close",
            &json!({ "workspace_id": workspace }),
        );
        if version == HerdrVersion::V0_9 {
            let err = plain.expect_err("refused without close_group");
            assert_eq!(err["code"], "confirmation_required", "{err}");
            raw(
                &fake,
                "workspace.close",
                &json!({ "workspace_id": workspace, "close_group": true }),
            )
            .expect("closed with close_group");
        } else {
            plain.expect("0.8 closes any workspace");
        }
        let left = raw(&fake, "workspace.list", &json!({})).expect("list");
        assert_eq!(left["workspaces"], json!([]), "{version:?}");
        let err = raw(&fake, "pane.get", &json!({ "pane_id": root["pane_id"] }))
            .expect_err("its pane is gone");
        assert_eq!(err["code"], "pane_not_found");
    }
}

/// End to end on herdr 0.9: a member's pane closes while herdr loses the events of fleetd's
/// subscription (and holds it open a minute after `events_lost`); fleetd resubscribes, finds the
/// pane gone and releases the member.
#[test]
fn e2e_herdr_0_9_a_member_closed_while_events_were_lost_is_released() {
    let rig = HerdrRig::start_as(
        &format!(
            "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n{}",
            sim_profile("slow", 2500)
        ),
        HerdrVersion::V0_9,
    );
    let (_, lead) = rig.agent_lead("boss");
    let pane = rig.spawned(&lead, "slow", "nia");
    rig.herdr
        .fault(&json!({ "fault": "events_lost", "ms": 1500, "linger_ms": 60000 }))
        .expect("fault");
    rig.call("pane.close", &json!({ "pane_id": pane }));
    wait_until("nia released", Duration::from_secs(30), || {
        http::get(rig.daemon.operator(), "/sessions/nia").is_ok_and(|r| r.status == 404)
    });
}

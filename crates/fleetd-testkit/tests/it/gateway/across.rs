//! Work across hosts: a lead sends to a member on another host and gets its reply and nudge,
//! spawns there, delegates and answers a question across, and a gateway back after a long
//! absence still delivers both ways.

use super::*;

#[test]
fn e2e_gateway_a_lead_on_one_host_sends_to_a_member_on_another_and_gets_its_reply_and_nudge() {
    let Some(hosts) = two_hosts() else {
        return;
    };
    let (a, b) = (&hosts.a, &hosts.b);
    let alice = hosts.alice_on_b();

    // With wait: the reply comes back to the waiting fleet_send on host a.
    let sent = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_send",
        &serde_json::json!({ "target": alice, "task": "count the shells" }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"], "did on b: count the shells");

    // Without: the ticket moves as b reports, the reply lands in a's inbox under alice@b,
    // and a's lead is nudged by a.
    let sent = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_send",
        &serde_json::json!({ "target": alice, "task": "weigh the sand", "wait": false }),
    ));
    let ticket = sent["ticket"].as_str().expect("ticket").to_owned();
    let mut polled = serde_json::Value::Null;
    fleetd_testkit::wait_until(
        "the remote ticket replied",
        std::time::Duration::from_secs(60),
        || {
            polled = fleetd_testkit::rig::structured_ok(
                &a.lead("fleet_poll", &serde_json::json!({ "ticket": ticket })),
            );
            polled["state"] == "replied"
        },
    );
    assert_eq!(
        polled["reply"]["text"], "did on b: weigh the sand",
        "{polled}"
    );
    let inbox = fleetd_testkit::rig::structured_ok(
        &a.lead("fleet_poll", &serde_json::json!({ "target": alice })),
    );
    let replies = inbox["replies"].as_array().cloned().unwrap_or_default();
    assert!(
        replies
            .iter()
            .any(|r| r["text"] == "did on b: weigh the sand"),
        "{inbox}"
    );
    fleetd_testkit::wait_until(
        "a's lead nudged about alice@b",
        std::time::Duration::from_secs(60),
        || {
            a.lead("fleet_list", &serde_json::json!({}));
            a.history(fleetd_testkit::rig::LEAD)
                .contains(&format!("from {alice}"))
        },
    );
    // Each hop's time is in /metrics: the broker's word on what each gateway sent, and how long
    // each took what came to it (a's two replies, b's two tasks).
    let count = |rig: &fleetd_testkit::rig::Rig, metric: &str, kind: &str| -> f64 {
        samples(&scrape(rig), metric, "kind")
            .into_iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, n)| n)
            .sum()
    };
    // (Recorded once taken, which may come a moment after the lead has the reply.)
    fleetd_testkit::wait_until(
        "a's two replies timed",
        std::time::Duration::from_secs(30),
        || count(a, "fleetd_gateway_taken_seconds", "reply") >= 2.0,
    );
    assert_eq!(count(a, "fleetd_gateway_taken_seconds", "reply"), 2.0);
    assert_eq!(count(b, "fleetd_gateway_taken_seconds", "task"), 2.0);
    for rig in [a, b] {
        // That family has no `kind` label: every sample reads as "".
        assert!(count(rig, "fleetd_gateway_confirm_seconds", "") >= 2.0);
    }
    // Her replies left b's own inbox once they were on their way to a.
    let b_operator = b.daemon.operator();
    fleetd_testkit::wait_until(
        "b's inbox for alice empty",
        std::time::Duration::from_secs(30),
        || fleetd_testkit::http::reply_texts(&b_operator, "alice").is_empty(),
    );
    // b typed nothing into its own lead about alice: her replies are a's.
    assert!(
        !b.history(fleetd_testkit::rig::LEAD).contains("[fleet]"),
        "b nudged its own lead:\n{}",
        b.history(fleetd_testkit::rig::LEAD)
    );
    // Acknowledged on a, where the replies are.
    for r in &replies {
        fleetd_testkit::rig::structured_ok(&a.lead(
            "fleet_ack",
            &serde_json::json!({ "target": alice, "msgId": r["msgId"] }),
        ));
    }

    // A stop across: b releases alice.
    let stopped = fleetd_testkit::rig::structured_ok(
        &a.lead("fleet_stop", &serde_json::json!({ "target": alice })),
    );
    assert_eq!(stopped["stop"], "sent", "{stopped}");
    fleetd_testkit::wait_until(
        "alice released on b",
        std::time::Duration::from_secs(60),
        || b.members().is_empty(),
    );
}

/// A lead on a spawns a member on b and delegates to it; the member appears in a's fleet_list
/// and its profiles in a's fleet_profiles (b's presence); a member spawned on b with a first task
/// asks a question, which a's lead is nudged about and answers from a, and the member (waiting
/// in fleet_ask on b) gets the answer. b, which a does not let spawn, is refused with the reason.
#[test]
fn e2e_gateway_a_lead_spawns_on_another_host_delegates_and_answers_a_question_across() {
    let Some(hosts) = two_hosts() else {
        return;
    };
    let (a, b) = (&hosts.a, &hosts.b);
    let b_name = hosts.fleet.gateways[1].clone();
    let patience = std::time::Duration::from_secs(90);
    // a's event stream (the dashboard's, `fleetd watch`'s) hears of b's members from presence.
    let mut events = fleetd_testkit::http::events::SseReader::unix(
        &fleetd_testkit::daemon::state_dir(a.dir()).join("api.sock"),
        None,
    )
    .expect("a's event stream");

    // Spawned on b from a: a pane on b's tmux server, named `rem@b` here.
    let spawned = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_spawn",
        &serde_json::json!({ "profile": "sim", "gateway": b_name, "name": "rem" }),
    ));
    let rem = format!("rem@{b_name}");
    assert_eq!(spawned["target"], rem.as_str(), "{spawned}");
    assert!(
        spawned["paneId"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{b_name}/"))),
        "{spawned}"
    );
    let on_b = b.members();
    assert!(
        on_b.iter().any(|m| m["target"] == "rem"),
        "b runs rem: {on_b:?}"
    );
    // Read your own writes: the member a just spawned is in a's fleet_list at once, not after
    // b's next presence broadcast.
    let list = a.members();
    assert!(
        list.iter()
            .any(|m| m["target"] == rem.as_str() && m["gateway"] == b_name.as_str()),
        "rem@b in a's fleet_list at once: {list:?}"
    );
    // A gateway nobody runs (a typo) is refused naming the known ones; nothing is queued.
    for (tool, args) in [
        (
            "fleet_send",
            serde_json::json!({ "target": "rem@zed", "task": "x", "wait": false }),
        ),
        (
            "fleet_spawn",
            serde_json::json!({ "profile": "sim", "gateway": "zed" }),
        ),
    ] {
        let refused = a.lead(tool, &args);
        assert_eq!(
            fleetd_testkit::rig::error_code(&refused),
            "unknown_gateway",
            "{tool}: {refused}"
        );
        assert!(
            refused.to_string().contains(&format!("known: {b_name}")),
            "{tool}: {refused}"
        );
    }
    let joined = events.until("rem@b's member.spawned on a's stream", |e| {
        e.event == "member.spawned" && e.data["target"] == rem.as_str()
    });
    let joined = &joined.last().expect("the match").data;
    assert!(
        joined["pane"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{b_name}/"))),
        "{joined}"
    );
    // The operator's CLI on a shows it too, with its gateway's pane.
    let status = fleetd_testkit::daemon::command(a.dir())
        .arg("status")
        .output()
        .expect("fleetd status");
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.contains(&rem) && l.contains(&format!("{b_name}/"))),
        "{table}"
    );
    let profiles =
        fleetd_testkit::rig::structured_ok(&a.lead("fleet_profiles", &serde_json::json!({})));
    assert!(
        profiles["profiles"].as_array().is_some_and(|p| p
            .iter()
            .any(|p| p["name"] == format!("asker@{b_name}").as_str() && p["ready"] == true)),
        "{profiles}"
    );

    // Delegated to: the task goes to b, the reply comes back to the waiting call on a.
    let sent = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_send",
        &serde_json::json!({ "target": rem, "task": "sift the gravel" }),
    ));
    assert_eq!(sent["reply"], "did on b: sift the gravel", "{sent}");

    // A question across: the asker's first task makes it ask; a's lead is nudged and answers.
    let asker = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_spawn",
        &serde_json::json!({ "profile": "asker", "gateway": b_name, "name": "ask", "task": "ship it" }),
    ));
    let asker_target = format!("ask@{b_name}");
    assert_eq!(asker["target"], asker_target.as_str(), "{asker}");
    assert!(
        asker["ticket"].is_string(),
        "the first task's ticket: {asker}"
    );
    let mut question = serde_json::Value::Null;
    fleetd_testkit::wait_until("the question on a", patience, || {
        let polled = fleetd_testkit::rig::structured_ok(
            &a.lead("fleet_poll", &serde_json::json!({ "target": asker_target })),
        );
        question = polled["questions"][0].clone();
        !question.is_null()
    });
    // a's lead pane is a shell, which reads as no agent at rest (not receptive) at its prompt
    // and as an idle agent while a call runs: a call each round gives fleetd its moment.
    fleetd_testkit::wait_until("a's lead nudged about the question", patience, || {
        a.lead("fleet_list", &serde_json::json!({}));
        let history = a.history(fleetd_testkit::rig::LEAD);
        history.contains("[fleet] question") && history.contains(&format!("from {asker_target}"))
    });
    assert!(
        !b.history(fleetd_testkit::rig::LEAD).contains("[fleet]"),
        "b nudged its own lead:\n{}",
        b.history(fleetd_testkit::rig::LEAD)
    );
    let answered = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_answer",
        &serde_json::json!({ "questionId": question["questionId"], "answer": "use staging" }),
    ));
    assert_eq!(answered["deliveredTo"], "gateway", "{answered}");
    let mut answer_reply = None;
    fleetd_testkit::wait_until("the asker's reply with the answer, on a", patience, || {
        answer_reply = fleetd_testkit::http::all_replies(a.daemon.operator(), &asker_target)
            .into_iter()
            .find(|(_, text)| text.contains("use staging"));
        answer_reply.is_some()
    });
    // Read, so acknowledged (by the operator, typing nothing into a's lead pane): the reminders
    // about it would otherwise be typed into the calls below.
    let (msg_id, _) = answer_reply.expect("found above");
    let acked = fleetd_testkit::http::request(
        a.daemon.operator(),
        "POST",
        &format!("/sessions/{asker_target}/replies/{msg_id}/ack"),
        None,
    )
    .expect("ack");
    assert_eq!(acked.status, 200, "{}", acked.body);

    // b may not spawn on a (a's peers give it nothing): refused, with the reason.
    let refused = b.lead(
        "fleet_spawn",
        &serde_json::json!({ "profile": "sim", "gateway": hosts.fleet.gateways[0] }),
    );
    assert_eq!(
        fleetd_testkit::rig::error_code(&refused),
        "remote_spawn_failed",
        "{refused}"
    );
    assert!(refused.to_string().contains("may not spawn"), "{refused}");

    // b goes quiet (killed): a shows its members unreachable after three silent seconds.
    let mut hosts = hosts;
    hosts.b.kill_daemon();
    events.until("rem@b unreachable on a's stream", |e| {
        e.event == "member.status"
            && e.data["target"] == rem.as_str()
            && e.data["status"] == "unreachable"
    });
    fleetd_testkit::wait_until("rem@b unreachable on a", patience, || {
        hosts.a.members().iter().any(|m| {
            m["target"] == rem.as_str() && m["status"] == "unreachable" && m["stale"] == true
        })
    });
}

/// Gateways away for long (issue 20: "a gateway that comes back after days still delivers"),
/// both ways: b is down when a's lead sends (the task waits in b's queue on the broker, a shows
/// alice@b unreachable), then a goes down too; b comes back and alice answers while a is away
/// (the reply waits in a's queue); both stay down past every clock a fleet keeps — presence,
/// the heartbeat, the broker's consumer bookkeeping — and a comes back last and gets the reply
/// once, its ticket replied. Days cannot be waited for here: nothing on the path counts them
/// (the inbound queues have no TTL, the outbox and open tickets are durable and never expire),
/// and this is the same path with every timer run out.
#[test]
fn e2e_gateway_back_after_a_long_absence_still_delivers_both_ways() {
    let Some(mut hosts) = two_hosts() else {
        return;
    };
    let patience = std::time::Duration::from_secs(90);
    let b_name = hosts.fleet.gateways[1].clone();
    let alice = format!("alice@{b_name}");
    hosts.b.spawn("sim", "alice");
    fleetd_testkit::wait_until("alice@b known on a", patience, || {
        hosts
            .a
            .members()
            .iter()
            .any(|m| m["target"] == alice.as_str())
    });

    // b goes away; a's lead sends anyway.
    hosts.b.kill_daemon();
    fleetd_testkit::wait_until("alice@b unreachable on a", patience, || {
        hosts
            .a
            .members()
            .iter()
            .any(|m| m["target"] == alice.as_str() && m["stale"] == true)
    });
    let task = "while you were away";
    let ticket = send_nowait(&hosts.a, &alice, task);
    let b_queue = format!("fleet.gw.{b_name}.in");
    fleetd_testkit::wait_until("the task on the broker, in b's queue", patience, || {
        queue_messages(&hosts.fleet, &b_queue).is_some_and(|n| n >= 1)
    });
    // a goes away too; b comes back first and alice answers into a's queue.
    hosts.a.kill_daemon();
    restart_linked(&mut hosts.b, patience);
    let a_queue = format!("fleet.gw.{}.in", hosts.fleet.gateways[0]);
    fleetd_testkit::wait_until(
        "alice's reply on the broker, in a's queue",
        patience,
        || queue_messages(&hosts.fleet, &a_queue).is_some_and(|n| n >= 1),
    );
    // Both sides' clocks run out: presence (b saw no word from a), heartbeats, retries.
    hold(std::time::Duration::from_secs(15));
    a_restarts_and_gets_the_reply_once(&mut hosts, [&ticket, task], &alice, patience);
    each_typed_once(&hosts.b, &[task]);
}

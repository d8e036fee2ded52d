//! The outbox and de-duplication under faults: a dead broker URL and a queue deleted under the
//! link, link cuts on either side (also mid-question), an outbox over its alarm, a peer that
//! falls behind, and kill -9 of either gateway mid-flight — nothing lost, nothing repeated.

use super::*;

/// The broker's side failing under a linked gateway: a's first broker URL is dead (it links
/// through the next one), and a's inbound queue is deleted under it (the broker cancels its
/// consumer). a says so on /healthz, keeps trying, and takes deliveries again once the queue is
/// provisioned back; a reply b sent meanwhile waits in b's outbox (the broker could not route it)
/// and arrives.
#[test]
fn e2e_gateway_rides_out_a_dead_broker_url_and_its_queue_deleted_under_it() {
    // Alice takes 5 s a task: rabbitmqctl alone takes a second to delete the queue.
    let Some(mut hosts) = two_hosts_with_urls(Some("127.0.0.1:9"), 5000) else {
        return;
    };
    let patience = std::time::Duration::from_secs(90);
    // Linked (two_hosts waited for it) through the second URL after the first refused.
    assert!(
        hosts.a.daemon.logs_so_far().iter().any(|l| {
            l.contains("gateway cannot reach the broker") && l.contains("127.0.0.1:9")
        }),
        "the dead URL was tried first"
    );
    let (a, b) = (&hosts.a, &hosts.b);
    let (a_name, b_name) = (&hosts.fleet.gateways[0], &hosts.fleet.gateways[1]);
    let alice = format!("alice@{b_name}");
    b.spawn("sim", "alice");
    let sent = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_send",
        &serde_json::json!({ "target": alice, "task": "first" }),
    ));
    assert_eq!(sent["reply"], "did on b: first", "{sent}");

    // a's queue goes while alice works on a's next task: a's consumer is cancelled, a cannot
    // link until the queue is back, and alice's reply has nowhere to go meanwhile.
    let ticket = send_nowait(a, &alice, "second");
    fleetd_testkit::wait_until("alice at work on b", patience, || {
        ticket_state(b, &ticket) == "working"
    });
    let queue = format!("fleet.gw.{a_name}.in");
    fleetd_testkit::broker::rabbitmqctl(&["delete_queue", "-p", &hosts.fleet.vhost, &queue])
        .expect("delete the queue");
    let health = |rig: &fleetd_testkit::rig::Rig| {
        fleetd_testkit::http::get(rig.daemon.addr, "/healthz")
            .map(|r| r.json())
            .unwrap_or_default()
    };
    fleetd_testkit::wait_until("a's /healthz to name the missing queue", patience, || {
        let h = health(a);
        h["status"] == "degraded"
            && h["gateway"]["error"]
                .as_str()
                .is_some_and(|e| e.contains(&queue) && e.contains("provision"))
    });
    fleetd_testkit::wait_until("alice's reply, on b", patience, || {
        ticket_state(b, &ticket) == "replied"
    });
    hosts.fleet.import_again().expect("provision again");
    fleetd_testkit::wait_until("the reply on a", patience, || {
        ticket_state(a, &ticket) == "replied"
    });
    let counts = reply_counts(a, &alice);
    assert_eq!(
        counts.get("did on b: second").copied(),
        Some(1),
        "{counts:?}"
    );
    fleetd_testkit::wait_until("a linked again", patience, || {
        health(a)["gateway"]["linked"] == true
    });
    // The reply really had nowhere to go for a while: b kept it and tried again.
    hosts
        .b
        .daemon
        .wait_for_log("b parked the reply", patience, |l| {
            l.contains("the broker has no queue for that gateway now")
        });
}

/// The link cut on either side in the middle of the work: a's while it sends (the tasks wait in
/// its outbox), b's while its member works (her reply waits in b's outbox, and the tasks sent
/// meanwhile wait in b's queue on the broker), and a stalled link (a black hole the heartbeat
/// finds). Every task reaches b once and every reply reaches a once.
#[test]
fn e2e_gateway_link_cuts_on_either_side_lose_and_duplicate_nothing() {
    let pa = broker_proxy();
    let pb = broker_proxy();
    // Each task takes alice 1.5 s: long enough that b's link is surely cut while she works on
    // one, whatever the machine's load.
    let Some(mut hosts) = two_hosts_with(Some([pa.addr, pb.addr]), 1500) else {
        return;
    };
    let (a, b) = (&hosts.a, &hosts.b);
    let alice = hosts.alice_on_b();
    let patience = std::time::Duration::from_secs(90);
    let mut tickets = Vec::new();
    let mut tasks = Vec::new();

    // a's link cut while it sends: the sends answer at once (their tickets are durable), the
    // tasks wait in a's outbox.
    for n in 0..4 {
        if n == 2 {
            pa.cut();
        }
        let task = format!("task {n}");
        tickets.push(send_nowait(a, &alice, &task));
        tasks.push(task);
    }
    let linked = |rig: &fleetd_testkit::rig::Rig| {
        fleetd_testkit::http::get(rig.daemon.addr, "/healthz")
            .map(|r| r.json()["gateway"]["linked"].clone())
            .unwrap_or_default()
    };
    fleetd_testkit::wait_until("a's /healthz to say its link is down", patience, || {
        linked(a) == false
    });
    hold(std::time::Duration::from_secs(2));
    pa.restore();
    fleetd_testkit::wait_until("a's /healthz to say it is linked again", patience, || {
        linked(a) == true
    });
    // b's link cut while alice works on the last of those tasks (b's own view of the ticket,
    // which has the same id): her reply waits in b's outbox.
    fleetd_testkit::wait_until("alice at work on task 3", patience, || {
        ticket_state(b, &tickets[3]) == "working"
    });
    pb.cut();
    for n in 4..6 {
        let task = format!("task {n}");
        tickets.push(send_nowait(a, &alice, &task));
        tasks.push(task);
    }
    fleetd_testkit::wait_until("alice's reply to task 3, on b", patience, || {
        ticket_state(b, &tickets[3]) == "replied"
    });
    hold(std::time::Duration::from_secs(1));
    pb.restore();
    // A stalled link on a's side: bytes held, connections open, until the heartbeat finds it.
    pa.stall();
    let task = "task 6".to_owned();
    tickets.push(send_nowait(a, &alice, &task));
    tasks.push(task);
    hold(std::time::Duration::from_secs(3));
    pa.restore();

    fleetd_testkit::wait_until("every ticket replied", patience, || {
        tickets.iter().all(|t| ticket_state(a, t) == "replied")
    });
    let counts = each_answered_once(a, &alice, &tasks);
    assert_eq!(counts.len(), tasks.len(), "nothing else: {counts:?}");
    // A spawn asked while a's link is cut waits in a's outbox and completes once it is back;
    // a stop sent while b's is cut reaches b once it is back.
    pa.cut();
    let b_name = hosts.fleet.gateways[1].clone();
    let out = a.lead_async(
        "fleet_spawn",
        &serde_json::json!({ "profile": "sim", "gateway": b_name, "name": "late" }),
    );
    hold(std::time::Duration::from_secs(2));
    pa.restore();
    fleetd_testkit::wait_until("the spawn's answer", patience, || out.exists());
    let answer: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("read")).expect("json");
    let spawned = fleetd_testkit::rig::structured_ok(&answer["result"]);
    assert_eq!(
        spawned["target"],
        format!("late@{b_name}").as_str(),
        "{spawned}"
    );
    pb.cut();
    let stopped = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_stop",
        &serde_json::json!({ "target": format!("late@{b_name}") }),
    ));
    assert_eq!(stopped["stop"], "sent", "{stopped}");
    hold(std::time::Duration::from_secs(2));
    pb.restore();
    fleetd_testkit::wait_until("late released on b", patience, || {
        !b.members().iter().any(|m| m["target"] == "late")
    });
    // The cuts were real: each gateway lost its link and came back.
    for rig in [&mut hosts.a, &mut hosts.b] {
        rig.daemon
            .wait_for_log("a lost link", patience, |l| l.contains("gateway link lost"));
    }
}

/// A question and its answer across hosts with a link cut under each: in round one a's link is
/// cut while the member asks (the question waits in a's queue on the broker) and b's while a's
/// lead answers (the answer waits in b's queue); in round two b's while she asks (the question
/// waits in b's outbox) and a's while the lead answers (the answer waits in a's outbox). Each
/// round a has exactly one question, and the member, still waiting in `fleet_ask`, gets the
/// answer once: her one reply carries it, and it never comes again as a task.
#[test]
fn e2e_gateway_link_cuts_during_a_question_and_its_answer_lose_and_duplicate_nothing() {
    let (pa, pb) = (broker_proxy(), broker_proxy());
    // Alice works 3 s on a task before she asks: the cut is in place by then, whatever the
    // load. a's lead is not nudged: its pane is a shell the test types calls into.
    let Some(mut hosts) = start_two_hosts_env(
        &[
            BrokerAt::plain(&[pa.addr.to_string()]),
            BrokerAt::plain(&[pb.addr.to_string()]),
        ],
        &[
            ("SIM_AGENT_WORK_MS", "3000"),
            ("SIM_AGENT_SCRIPT", "ask"),
            ("SIM_AGENT_QUESTION", "which environment for {prompt}?"),
        ],
        false,
    ) else {
        return;
    };
    hosts.wait_linked();
    let (a, b) = (&hosts.a, &hosts.b);
    let alice = hosts.alice_on_b();
    let patience = std::time::Duration::from_secs(90);
    let linked = |rig: &fleetd_testkit::rig::Rig| healthz_gateway(rig)["linked"].clone();
    for (round, (at_ask, at_answer)) in [(&pa, &pb), (&pb, &pa)].into_iter().enumerate() {
        let (asker_side, answer_side) = if round == 0 { (a, b) } else { (b, a) };
        let task = format!("round {round}");
        let ticket = send_nowait(a, &alice, &task);
        fleetd_testkit::wait_until("alice at work on b", patience, || {
            ticket_state(b, &ticket) == "working"
        });
        at_ask.cut();
        fleetd_testkit::wait_until("the cut seen", patience, || linked(asker_side) == false);
        // She asks while the link is cut: the question is open on b, and not on a yet.
        fleetd_testkit::wait_until("alice's question open on b", patience, || {
            questions(b, "alice").len() == 1
        });
        assert!(
            questions(a, &alice).is_empty(),
            "a has it across a cut link"
        );
        hold(std::time::Duration::from_secs(1));
        at_ask.restore();
        let mut asked = Vec::new();
        fleetd_testkit::wait_until("the question on a", patience, || {
            asked = questions(a, &alice);
            !asked.is_empty()
        });
        assert_eq!(asked.len(), 1, "one question on a: {asked:?}");
        let question_id = asked[0]["questionId"].clone();
        assert!(
            asked[0]["question"]
                .as_str()
                .is_some_and(|q| q.contains(&task)),
            "{asked:?}"
        );
        // The lead answers while a link is cut: the answer waits, and alice keeps waiting.
        at_answer.cut();
        fleetd_testkit::wait_until("the cut seen", patience, || linked(answer_side) == false);
        let answer = format!("use staging {round}");
        let answered = fleetd_testkit::rig::structured_ok(&a.lead(
            "fleet_answer",
            &serde_json::json!({ "questionId": question_id, "answer": answer }),
        ));
        assert_eq!(answered["deliveredTo"], "gateway", "{answered}");
        hold(std::time::Duration::from_secs(2));
        assert_eq!(
            questions(b, "alice").len(),
            1,
            "alice has her answer across a cut link"
        );
        at_answer.restore();
        fleetd_testkit::wait_until("alice's reply on a", patience, || {
            ticket_state(a, &ticket) == "replied"
        });
        let with_answer: Vec<String> = reply_counts(a, &alice)
            .into_iter()
            .filter(|(text, _)| text.contains(&answer))
            .flat_map(|(text, n)| std::iter::repeat_n(text, n))
            .collect();
        assert_eq!(
            with_answer.len(),
            1,
            "one reply with the answer: {with_answer:?}"
        );
        // She had it in her fleet_ask, not as a later task.
        assert!(
            with_answer[0].contains(&format!("\"answer\":\"{answer}\"")),
            "{with_answer:?}"
        );
        assert!(questions(a, &alice).is_empty(), "answered on a");
        fleetd_testkit::wait_until("answered on b", patience, || {
            questions(b, "alice").is_empty()
        });
    }
    // Two tasks, two questions, two answers, two replies; no answer came again as a task.
    assert_eq!(
        fleetd_testkit::http::all_replies(a.daemon.operator(), &alice).len(),
        2
    );
    let pane = b.history("fleet:");
    assert!(!pane.contains("Answer to your question"), "{pane}");
    for round in 0..2 {
        assert_eq!(
            pane.matches(&format!("❯ round {round}")).count(),
            1,
            "round {round} typed once:\n{pane}"
        );
    }
}

/// More than `gateway.outboxAlarm` messages wait in a's outbox while its link is cut: a's
/// `/healthz` is degraded and names the outbox and its alarm, the gauge `fleetd_gateway_outbox`
/// is over it, and the log warns. Once the link is back the outbox drains, every task is
/// answered once, and `/healthz` is ok again.
#[test]
fn e2e_gateway_outbox_over_its_alarm_degrades_healthz_and_drains_once_the_link_is_back() {
    let pa = broker_proxy();
    let Some(mut hosts) = linked_hosts(
        &[
            BrokerAt::plain(&[pa.addr.to_string()]).and_gateway("  outboxAlarm: 2\n"),
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()]),
        ],
        "200",
    ) else {
        return;
    };
    let patience = std::time::Duration::from_secs(90);
    let a = &hosts.a;
    let alice = hosts.alice_on_b();
    let outbox_gauge = |rig: &fleetd_testkit::rig::Rig| {
        samples(&scrape(rig), "fleetd_gateway_outbox", "")
            .first()
            .map(|(_, v)| *v)
    };
    let health = |rig: &fleetd_testkit::rig::Rig| {
        fleetd_testkit::http::get(rig.daemon.addr, "/healthz")
            .map(|r| r.json())
            .unwrap_or_default()
    };
    assert_eq!(health(a)["gateway"]["outboxAlarm"], 2);

    pa.cut();
    fleetd_testkit::wait_until("a unlinked", patience, || {
        health(a)["gateway"]["linked"] == false
    });
    let tasks: Vec<String> = (0..4).map(|n| format!("task {n}")).collect();
    let tickets: Vec<String> = tasks.iter().map(|t| send_nowait(a, &alice, t)).collect();
    let mut seen = serde_json::Value::Null;
    fleetd_testkit::wait_until("a degraded by its outbox", patience, || {
        seen = health(a);
        seen["status"] == "degraded" && seen["gateway"]["outbox"] == 4
    });
    let warning = seen["gateway"]["outboxWarning"]
        .as_str()
        .unwrap_or_default();
    assert!(
        warning.contains("4 messages wait in the outbox, over gateway.outboxAlarm (2)"),
        "{seen}"
    );
    fleetd_testkit::wait_until("the gauge over the alarm", patience, || {
        outbox_gauge(a) == Some(4.0)
    });
    hosts
        .a
        .daemon
        .wait_for_log("the alarm's warning", patience, |l| {
            l.contains("WARN") && l.contains("the gateway outbox is over its alarm")
        });
    assert!(
        !hosts.b.history("fleet:").contains("task 0"),
        "a task crossed a cut link"
    );

    pa.restore();
    let (a, b) = (&hosts.a, &hosts.b);
    fleetd_testkit::wait_until("every task answered", patience, || {
        tickets.iter().all(|t| ticket_state(a, t) == "replied")
    });
    fleetd_testkit::wait_until("a ok again, its outbox empty", patience, || {
        seen = health(a);
        seen["status"] == "ok" && seen["gateway"]["outbox"] == 0
    });
    assert!(seen["gateway"].get("outboxWarning").is_none(), "{seen}");
    fleetd_testkit::wait_until("the gauge at 0", patience, || outbox_gauge(a) == Some(0.0));
    each_answered_once(a, &alice, &tasks);
    each_typed_once(b, &tasks);
    hosts.a.daemon.wait_for_log("back under", patience, |l| {
        l.contains("the gateway outbox is back under its alarm")
    });
}

/// Gateway b falls behind (its link cut, so its queue on the broker only grows): once
/// `gateway.peerBacklogMax` (3) messages wait for b, a's probe has read b's queue and a refuses
/// new tasks for b with `gateway_busy`, naming b and the bound, where before a took every task
/// for minutes. Once b is back and has taken its
/// queue, a takes tasks for b again; every task a took is answered once.
#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "paced sends: the probe reads b's queue four times a second"
)]
fn e2e_gateway_a_peer_behind_gets_no_new_tasks_until_it_catches_up_and_loses_none() {
    let pb = broker_proxy();
    let Some(hosts) = linked_hosts(
        &[
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()])
                .and_gateway("  peerBacklogMax: 3\n"),
            BrokerAt::plain(&[pb.addr.to_string()]),
        ],
        "100",
    ) else {
        return;
    };
    let patience = std::time::Duration::from_secs(90);
    let alice = hosts.alice_on_b();
    pb.cut();
    let a = &hosts.a;
    let mut taken = Vec::new();
    let mut refused = serde_json::Value::Null;
    fleetd_testkit::wait_until("a refuses a task for b", patience, || {
        let task = format!("task {}", taken.len());
        let sent = a.lead(
            "fleet_send",
            &serde_json::json!({ "target": alice, "task": task, "wait": false }),
        );
        if sent["isError"] == true {
            refused = sent;
            return true;
        }
        taken.push(task);
        std::thread::sleep(std::time::Duration::from_millis(100));
        false
    });
    assert_eq!(fleetd_testkit::rig::error_code(&refused), "gateway_busy");
    let says = refused["structuredContent"]["message"].to_string();
    assert!(
        says.contains(&format!("gateway {} is behind", hosts.fleet.gateways[1]))
            && says.contains("gateway.peerBacklogMax = 3"),
        "{refused}"
    );
    // At the bound, plus what went while the probe had not read b's queue yet (it reads every
    // 250 ms; a send goes every 120 ms or so): a few, with room for a loaded machine.
    assert!(
        (3..=30).contains(&taken.len()),
        "a took {} tasks for b before it refused",
        taken.len()
    );
    let queued = samples(&scrape(a), "fleetd_gateway_peer_queued", "gateway");
    assert!(
        queued
            .iter()
            .any(|(gw, v)| *gw == hosts.fleet.gateways[1] && *v >= 3.0),
        "a's gauge of b's queue: {queued:?}"
    );
    pb.restore();
    let (a, b) = (&hosts.a, &hosts.b);
    let mut after = String::new();
    fleetd_testkit::wait_until("a takes a task for b again", patience, || {
        let sent = a.lead(
            "fleet_send",
            &serde_json::json!({ "target": alice, "task": "after", "wait": false }),
        );
        if sent["isError"] == true {
            return false;
        }
        after = fleetd_testkit::rig::structured_ok(&sent)["ticket"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        true
    });
    taken.push("after".to_owned());
    fleetd_testkit::wait_until("the task after answered", patience, || {
        ticket_state(a, &after) == "replied"
    });
    each_answered_once(a, &alice, &taken);
    each_typed_once(b, &taken);
}

/// kill -9 of either gateway in the middle: b while its member works on a's task (the ticket b
/// holds for a, and its owner, survive; the reply goes to a after b's restart), then a right
/// after it sent tasks (its outbox is sent again, b takes each task once; b's replies wait in
/// a's queue until a is back). Every task is typed once and answered once.
#[test]
fn e2e_gateway_kill_9_of_either_gateway_mid_flight_loses_and_repeats_nothing() {
    let Some(mut hosts) = two_hosts_with(None, 2500) else {
        return;
    };
    let patience = std::time::Duration::from_secs(90);
    let alice = hosts.alice_on_b();

    // b dies while alice works on a's first task.
    let first = send_nowait(&hosts.a, &alice, "task b-kill");
    fleetd_testkit::wait_until("alice at work", patience, || {
        ticket_state(&hosts.a, &first) == "working"
    });
    hosts.b.kill_daemon();
    restart_linked(&mut hosts.b, patience);
    fleetd_testkit::wait_until("the first ticket replied", patience, || {
        ticket_state(&hosts.a, &first) == "replied"
    });

    // a dies right after sending three more.
    let mut tickets = vec![first];
    let mut tasks = vec!["task b-kill".to_owned()];
    for n in 0..3 {
        let task = format!("task a-kill {n}");
        tickets.push(send_nowait(&hosts.a, &alice, &task));
        tasks.push(task);
    }
    hosts.a.kill_daemon();
    hold(std::time::Duration::from_secs(2));
    restart_linked(&mut hosts.a, patience);
    fleetd_testkit::wait_until("every ticket replied", patience, || {
        tickets
            .iter()
            .all(|t| ticket_state(&hosts.a, t) == "replied")
    });
    each_answered_once(&hosts.a, &alice, &tasks);
    // And typed once: alice's pane shows each task once.
    each_typed_once(&hosts.b, &tasks);
}

/// Two hosts reaching the broker as `brokers` say, linked, b's members answering
/// `did on b: <task>` after `work_ms`.
fn linked_hosts(brokers: &[BrokerAt; 2], work_ms: &str) -> Option<TwoHosts> {
    let mut hosts = start_two_hosts_env(
        brokers,
        &[
            ("SIM_AGENT_WORK_MS", work_ms),
            ("SIM_AGENT_REPLY", "did on b: {prompt}"),
        ],
        false,
    )?;
    hosts.wait_linked();
    Some(hosts)
}

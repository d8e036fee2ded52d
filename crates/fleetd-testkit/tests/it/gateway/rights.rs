//! What a gateway lets its peers do: broker users with their own rights and no more, what it
//! never asked for or a peer may not ask refused, a reply too large to store here refused for
//! good, and a peer claiming another gateway's name refused and told to the lead.

use super::*;

#[test]
fn e2e_gateway_users_have_their_own_rights_and_no_more() {
    if require_rabbitmq() == Service::Skip || require_rabbitmqctl() == Service::Skip {
        return;
    }
    let fleet = FleetVhost::provision(&["a", "b"]).expect("provision");
    let (a, b) = (&fleet.gateways[0], &fleet.gateways[1]);
    runtime().block_on(async {
        let props = || ConnectionProperties::default();
        let conn_a = Connection::connect(&fleet.url(0, None), props())
            .await
            .expect("a connects with its password");
        let conn_b = Connection::connect(&fleet.url(1, None), props())
            .await
            .expect("b connects");

        // a → b under its own name: confirmed, and b reads it from its queue.
        let key = format!("to.{b}.from.{a}.task");
        publish(&conn_a, &key, a)
            .await
            .expect("a publishes as itself");
        let channel = conn_b.create_channel().await.expect("channel");
        let mut consumer = channel
            .basic_consume(
                format!("fleet.gw.{b}.in").as_str().into(),
                "t".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("b consumes its own queue");
        let delivery = tokio::time::timeout(std::time::Duration::from_secs(10), consumer.next())
            .await
            .expect("a delivery in time")
            .expect("a delivery")
            .expect("no error");
        assert_eq!(
            delivery.properties.user_id().as_ref().map(|u| u.as_str()),
            Some(a.as_str()),
            "the broker vouches for a"
        );

        // a claiming to be b (on a key a may publish): the channel is closed (406).
        let spoof = publish(&conn_a, &key, b).await;
        assert!(
            spoof
                .as_ref()
                .is_err_and(|e| e.contains("PRECONDITION_FAILED")),
            "user_id spoof: {spoof:?}"
        );
        // a's own user_id, a key naming another sender: the topic permission refuses (403).
        let forged_key = publish(&conn_a, &format!("to.{b}.from.c{a}.task"), a).await;
        assert_access_refused(&forged_key, "forged routing key");
        // a reading b's queue, binding its own queue to b's keys, declaring a queue: refused.
        // A refusal closes its channel, so each attempt opens one of its own.
        let fresh_channel = async || conn_a.create_channel().await.expect("channel");
        let read = fresh_channel()
            .await
            .basic_consume(
                format!("fleet.gw.{b}.in").as_str().into(),
                "spy".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert_access_refused(&read, "a read b's queue");
        let bind = fresh_channel()
            .await
            .queue_bind(
                format!("fleet.gw.{a}.in").as_str().into(),
                "fleet.x".into(),
                format!("to.{b}.#").as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert_access_refused(&bind, "a bound to b's keys");
        let declare = fresh_channel()
            .await
            .queue_declare(
                "anything".into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert_access_refused(&declare, "a declared a queue");
        // What a may learn of b's queue is how many messages wait in it: a passive declare,
        // which RabbitMQ checks no permission for, and which the backlog bound
        // (`gateway.peerBacklogMax`) reads. It reads nothing from it (above).
        let queue = format!("fleet.gw.{b}.in");
        let depth = fresh_channel()
            .await
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("a counts b's queue");
        assert_eq!(depth.name().as_str(), queue);
        // A wrong password: no connection at all.
        let wrong = fleet.url(0, None).replace(&fleet.password(0), "guess");
        assert!(Connection::connect(&wrong, props()).await.is_err());
    });
}

/// The broker refused `attempt` for want of the right (`ACCESS_REFUSED`, 403).
fn assert_access_refused<T, E: std::fmt::Display>(attempt: &Result<T, E>, what: &str) {
    let refusal = attempt.as_ref().err().map(ToString::to_string);
    let refused = refusal
        .as_deref()
        .unwrap_or_default()
        .contains("ACCESS_REFUSED");
    assert!(refused, "{what}: {refusal:?}");
}

/// What another gateway may not do, shown on the broker: b's user publishes (as itself, on its
/// own keys) a reply for a ticket a never sent it, and a task a does not let b send: a refuses
/// both to its dead-letter queue, counts each under its own reason, tells its lead of each (in
/// its own inbox, with no body), and its inbox and fleet do not change otherwise.
#[test]
fn e2e_gateway_refuses_what_it_never_asked_for_and_what_its_peers_may_not_ask() {
    let Some(mut hosts) = two_hosts() else {
        return;
    };
    let (a_name, b_name) = (&hosts.fleet.gateways[0], &hosts.fleet.gateways[1]);
    let forged_ticket = "01a23300-0000-7000-8000-00000000beef";
    let reply = envelope(
        b_name,
        a_name,
        "reply",
        &serde_json::json!({ "message": {
            "msgId": "01a23300-0000-7000-8000-000000000002", "target": format!("alice@{b_name}"),
            "ticket": forged_ticket, "kind": "reply", "text": "forged", "from": "alice",
            "createdAt": "2026-12-01T00:00:00Z",
        }}),
    );
    let task = envelope(
        b_name,
        a_name,
        "task",
        &serde_json::json!({
            "ticket": "01a23300-0000-7000-8000-00000000cafe", "member": "anyone", "task": "rm -rf /", "by": "x",
        }),
    );
    for (kind, body) in [("reply", &reply), ("task", &task)] {
        publish_as(
            &hosts.fleet,
            1,
            &format!("to.{a_name}.from.{b_name}.{kind}"),
            body,
        );
    }
    let dead = format!("fleet.gw.{a_name}.dead");
    fleetd_testkit::wait_until(
        "both in a's dead-letter queue",
        std::time::Duration::from_secs(30),
        || queue_messages(&hosts.fleet, &dead) == Some(2),
    );
    let a_operator = hosts.a.daemon.operator();
    assert!(
        fleetd_testkit::http::reply_texts(&a_operator, &format!("alice@{b_name}")).is_empty(),
        "the forged reply reached a's inbox"
    );
    // Each refusal is logged with its reason (never the body).
    for reason in ["never sent to gateway", "may not send tasks here"] {
        hosts
            .a
            .daemon
            .wait_for_log(reason, std::time::Duration::from_secs(30), |l| {
                l.contains("a delivery was refused") && l.contains(reason) && !l.contains("rm -rf")
            });
    }
    // Counted each under its own reason: a reply for a ticket never sent there is not a
    // request b may not make.
    fleetd_testkit::wait_until("both counted", std::time::Duration::from_secs(30), || {
        ["never_sent", "not_allowed"].map(|r| refused_total(&hosts.a, r)) == [1.0, 1.0]
    });
    // a's lead is told of each, in a's own inbox, without the bodies.
    let mut incidents = Vec::new();
    fleetd_testkit::wait_until(
        "two incidents for a's lead",
        std::time::Duration::from_secs(30),
        || {
            incidents = gateway_incidents(&hosts.a, a_name);
            incidents.len() == 2
        },
    );
    for (reason, words) in [
        ("never_sent", forged_ticket),
        ("not_allowed", "may not send tasks here"),
    ] {
        assert!(
            incidents.iter().any(|i| i.contains(&format!("({reason}: "))
                && i.contains(words)
                && i.contains(&format!("from gateway {b_name}"))
                && i.contains(&dead)),
            "{reason}: {incidents:#?}"
        );
    }
    assert!(
        incidents
            .iter()
            .all(|i| !i.contains("forged") && !i.contains("rm -rf")),
        "{incidents:#?}"
    );
}

/// Attack G11: a peer's reply for a real ticket that a's inbox can never store (over
/// `inbox.maxMessageBytes`) is refused for good — dead-lettered once, counted, told to a's lead —
/// not given back to the broker again and again; the next round trip goes through at once.
#[test]
fn e2e_gateway_a_reply_too_large_to_store_here_is_refused_for_good() {
    let Some(hosts) = two_hosts() else {
        return;
    };
    let (a_name, b_name) = (&hosts.fleet.gateways[0], &hosts.fleet.gateways[1]);
    hosts.b.spawn("sim", "alice");
    let alice = format!("alice@{b_name}");
    let ticket = send_nowait(&hosts.a, &alice, "a job");
    let huge = "x".repeat(fleetd_core::MessageLimits::DEFAULT_MAX_MESSAGE_BYTES + 1);
    let reply = envelope(
        b_name,
        a_name,
        "reply",
        &serde_json::json!({ "message": {
            "msgId": "01a23300-0000-7000-8000-00000000f00d", "target": alice,
            "ticket": ticket, "kind": "reply", "text": huge, "from": "alice",
            "createdAt": "2026-12-01T00:00:00Z",
        }}),
    );
    publish_as(
        &hosts.fleet,
        1,
        &format!("to.{a_name}.from.{b_name}.reply"),
        &reply,
    );
    let dead = format!("fleet.gw.{a_name}.dead");
    fleetd_testkit::wait_until(
        "the reply in a's dead-letter queue",
        std::time::Duration::from_secs(30),
        || queue_messages(&hosts.fleet, &dead) == Some(1),
    );
    fleetd_testkit::wait_until("counted", std::time::Duration::from_secs(30), || {
        refused_total(&hosts.a, "unstorable") == 1.0
    });
    let mut incidents = Vec::new();
    fleetd_testkit::wait_until(
        "an incident for a's lead",
        std::time::Duration::from_secs(30),
        || {
            incidents = gateway_incidents(&hosts.a, a_name);
            incidents.iter().any(|i| i.contains(&ticket))
        },
    );
    assert!(
        incidents.iter().all(|i| !i.contains("xxxxxxxx")),
        "no body: {incidents:#?}"
    );
    // Refused once, not redelivered: a round trip right after is not stuck behind it.
    let sent = fleetd_testkit::rig::structured_ok(&hosts.a.lead(
        "fleet_send",
        &serde_json::json!({ "target": alice, "task": "the next one", "timeoutSecs": 60 }),
    ));
    assert_eq!(sent["reply"], "did on b: the next one", "{sent}");
    assert_eq!(
        queue_messages(&hosts.fleet, &dead),
        Some(1),
        "dead-lettered once"
    );
}

/// Impersonation at the receiver: b's own broker user, on its own routing key (both of which
/// the broker lets through), publishes an envelope that claims to come from another gateway.
/// a refuses it: the dead-letter queue has it, a's log says why (never the body), a's
/// `/metrics` counts it as impersonation, a's lead is told (and nudged), and a's inbox has
/// nothing else.
#[test]
fn e2e_gateway_refuses_a_peer_that_claims_another_gateways_name_and_tells_its_lead() {
    let Some(mut hosts) = two_hosts() else {
        return;
    };
    let (a_name, b_name) = (
        hosts.fleet.gateways[0].clone(),
        hosts.fleet.gateways[1].clone(),
    );
    // a's lead calls once: the primary lead, the one a's own incidents are nudged to.
    fleetd_testkit::rig::structured_ok(&hosts.a.lead("fleet_list", &serde_json::json!({})));
    let before = refused_total(&hosts.a, "impersonation");
    // "mallory" is no gateway of this fleet; b claims to relay her member's reply.
    let forged = envelope(
        "mallory",
        &a_name,
        "reply",
        &serde_json::json!({ "message": {
            "msgId": "01a23300-0000-7000-8000-000000000003", "target": "alice@mallory",
            "ticket": "01a23300-0000-7000-8000-00000000f00d", "kind": "reply",
            "text": "a forged body", "from": "alice", "createdAt": "2026-12-01T00:00:00Z",
        }}),
    );
    publish_as(
        &hosts.fleet,
        1,
        &format!("to.{a_name}.from.{b_name}.reply"),
        &forged,
    );
    let dead = format!("fleet.gw.{a_name}.dead");
    let patience = std::time::Duration::from_secs(60);
    fleetd_testkit::wait_until("the forgery in a's dead-letter queue", patience, || {
        queue_messages(&hosts.fleet, &dead) == Some(1)
    });
    hosts.a.daemon.wait_for_log("the refusal", patience, |l| {
        l.contains("a delivery was refused")
            && l.contains("sender mismatch")
            && l.contains("envelope from mallory")
            && !l.contains("a forged body")
    });
    fleetd_testkit::wait_until("the refusal counted", patience, || {
        refused_total(&hosts.a, "impersonation") == before + 1.0
    });
    let mut incidents = Vec::new();
    fleetd_testkit::wait_until("the incident in a's inbox", patience, || {
        incidents = gateway_incidents(&hosts.a, &a_name);
        !incidents.is_empty()
    });
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    for words in [
        format!("gateway {a_name} refused a message from gateway {b_name}"),
        "(impersonation: sender mismatch".to_owned(),
        "envelope from mallory".to_owned(),
        dead,
    ] {
        assert!(incidents[0].contains(&words), "{words:?}: {}", incidents[0]);
    }
    assert!(!incidents[0].contains("a forged body"), "{}", incidents[0]);
    // a's lead is nudged about it (its pane is a shell, receptive while a call runs: a call
    // each round gives fleetd its moment).
    let inbox = format!("gateway@{a_name}");
    fleetd_testkit::wait_until("a's lead nudged about the incident", patience, || {
        hosts.a.lead("fleet_list", &serde_json::json!({}));
        hosts
            .a
            .history(fleetd_testkit::rig::LEAD)
            .contains(&format!("from {inbox}"))
    });
    // Nothing else reached a's inbox: the only inbox with mail is a's own incidents'.
    let depths = inbox_depths(&hosts.a);
    assert_eq!(
        depths.iter().filter(|(_, n)| *n > 0.0).collect::<Vec<_>>(),
        vec![&(inbox.clone(), 1.0)],
        "{depths:?}"
    );
    for target in ["alice@mallory".to_owned(), format!("alice@{b_name}")] {
        assert!(
            fleetd_testkit::http::reply_texts(hosts.a.daemon.operator(), &target).is_empty(),
            "{target}"
        );
    }
    // Read: acknowledged, so its reminders stop.
    let (msg_id, _) = fleetd_testkit::http::all_replies(hosts.a.daemon.operator(), &inbox)
        .pop()
        .expect("the incident");
    fleetd_testkit::rig::structured_ok(&hosts.a.lead(
        "fleet_ack",
        &serde_json::json!({ "target": inbox, "msgId": msg_id }),
    ));
}

//! Several hosts (issue 20), the broker's side: `fleetd gateway provision` loaded into a vhost
//! of its own on the real RabbitMQ gives each gateway exactly its own rights. Gateway `a`'s user,
//! connected with raw lapin as an attacker would, publishes to `b` under its own name; it cannot
//! claim to be `b` (the broker checks `user_id`), publish a key naming another sender (topic
//! permission), read `b`'s queue, bind a queue to `b`'s keys or declare anything.

use fleetd_testkit::Service;
use fleetd_testkit::broker::{FleetVhost, require_rabbitmqctl};
use fleetd_testkit::require_rabbitmq;
use fleetd_testkit::tls::{TestCa, TlsProxy};
use futures_util::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Publishes `key` as the connection's user claiming `user_id`; `Ok(())` when the broker
/// confirmed it, else the broker's refusal.
async fn publish(conn: &Connection, key: &str, user_id: &str) -> Result<(), String> {
    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let confirm = channel
        .basic_publish(
            "fleet.x".into(),
            key.into(),
            BasicPublishOptions::default(),
            br#"{"probe":true}"#,
            BasicProperties::default()
                .with_user_id(user_id.into())
                .with_delivery_mode(2),
        )
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    if confirm.is_ack() {
        Ok(())
    } else {
        Err(format!("not acked: {confirm:?}"))
    }
}

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
        assert!(
            forged_key
                .as_ref()
                .is_err_and(|e| e.contains("ACCESS_REFUSED")),
            "forged routing key: {forged_key:?}"
        );
        // a reading b's queue, binding its own queue to b's keys, declaring a queue: refused.
        let channel = conn_a.create_channel().await.expect("channel");
        let read = channel
            .basic_consume(
                format!("fleet.gw.{b}.in").as_str().into(),
                "spy".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert!(
            read.as_ref()
                .is_err_and(|e| e.to_string().contains("ACCESS_REFUSED")),
            "a read b's queue"
        );
        let channel = conn_a.create_channel().await.expect("channel");
        let bind = channel
            .queue_bind(
                format!("fleet.gw.{a}.in").as_str().into(),
                "fleet.x".into(),
                format!("to.{b}.#").as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert!(
            bind.as_ref()
                .is_err_and(|e| e.to_string().contains("ACCESS_REFUSED")),
            "a bound to b's keys"
        );
        let channel = conn_a.create_channel().await.expect("channel");
        let declare = channel
            .queue_declare(
                "anything".into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await;
        assert!(
            declare
                .as_ref()
                .is_err_and(|e| e.to_string().contains("ACCESS_REFUSED")),
            "a declared a queue"
        );
        // A wrong password: no connection at all.
        let wrong = fleet.url(0, None).replace(&fleet.password(0), "guess");
        assert!(Connection::connect(&wrong, props()).await.is_err());
    });
}

/// Two gateways on one machine: each its own HOME, state, port and tmux server, both on one
/// provisioned vhost of the local RabbitMQ (or of a test cluster: `gateway_cluster`).
pub(crate) struct TwoHosts {
    // Dropped in this order: the daemons stop before their vhost goes.
    pub(crate) a: fleetd_testkit::rig::Rig,
    pub(crate) b: fleetd_testkit::rig::Rig,
    pub(crate) fleet: FleetVhost,
}

/// How a gateway reaches the broker: its URLs up to the vhost (`host:port`, or a whole
/// `amqps://` prefix), tried in turn, and its `tls:` block (YAML, indented by four) followed by
/// any other keys of its `gateway:` block (indented by two).
struct BrokerAt {
    urls: Vec<String>,
    tls: String,
}

impl BrokerAt {
    /// Plain AMQP to `addrs` (the broker, a proxy in front of it, a dead address), in turn.
    fn plain(addrs: &[String]) -> Self {
        Self {
            urls: addrs.to_vec(),
            tls: String::new(),
        }
    }

    /// With `lines` (YAML indented by two, such as `  outboxAlarm: 2\n`) in the gateway block.
    fn and_gateway(mut self, lines: &str) -> Self {
        self.tls.push_str(lines);
        self
    }

    /// AMQP over TLS to `localhost:port` (a [`TlsProxy`]), trusting the CA in `ca_file`.
    fn tls(port: u16, ca_file: &std::path::Path) -> Self {
        Self {
            urls: vec![format!("amqps://localhost:{port}")],
            tls: format!("    tls:\n      caFile: {}\n", ca_file.display()),
        }
    }
}

fn two_hosts() -> Option<TwoHosts> {
    two_hosts_with(None, 200)
}

/// Two gateways, each reaching the broker through `brokers[i]` when given (a proxy); b's
/// members work `work_ms` per turn.
fn two_hosts_with(brokers: Option<[std::net::SocketAddr; 2]>, work_ms: u64) -> Option<TwoHosts> {
    two_hosts_at(brokers, None, work_ms)
}

/// Two gateways, a's broker URLs led by `dead_first` (an address nothing answers on).
fn two_hosts_with_urls(dead_first: Option<&str>, work_ms: u64) -> Option<TwoHosts> {
    two_hosts_at(None, dead_first, work_ms)
}

fn two_hosts_at(
    brokers: Option<[std::net::SocketAddr; 2]>,
    dead_first: Option<&str>,
    work_ms: u64,
) -> Option<TwoHosts> {
    let broker = |i: usize| {
        brokers.map_or_else(
            || fleetd_testkit::RABBITMQ_ADDR.to_owned(),
            |b| b[i].to_string(),
        )
    };
    let a_brokers: Vec<String> = dead_first
        .map(str::to_owned)
        .into_iter()
        .chain([broker(0)])
        .collect();
    let mut hosts = start_two_hosts(
        &[BrokerAt::plain(&a_brokers), BrokerAt::plain(&[broker(1)])],
        work_ms,
    )?;
    for rig in [&mut hosts.a, &mut hosts.b] {
        wait_linked(rig);
    }
    Some(hosts)
}

fn wait_linked(rig: &mut fleetd_testkit::rig::Rig) {
    rig.daemon.wait_for_log(
        "the gateway's broker link",
        std::time::Duration::from_secs(30),
        |l| l.contains("gateway linked to the broker"),
    );
}

/// Two gateways on the local broker reaching it as `brokers` say, started (not waited for: a
/// link may be meant to fail).
fn start_two_hosts(brokers: &[BrokerAt; 2], work_ms: u64) -> Option<TwoHosts> {
    let work_ms = work_ms.to_string();
    start_two_hosts_env(
        brokers,
        &[
            ("SIM_AGENT_WORK_MS", &work_ms),
            ("SIM_AGENT_REPLY", "did on b: {prompt}"),
        ],
        true,
    )
}

/// Like [`start_two_hosts`], b's `sim` members with `member_env`, a's lead nudged when
/// `nudge_a`.
fn start_two_hosts_env(
    brokers: &[BrokerAt; 2],
    member_env: &[(&str, &str)],
    nudge_a: bool,
) -> Option<TwoHosts> {
    if require_rabbitmq() == Service::Skip
        || require_rabbitmqctl() == Service::Skip
        || fleetd_testkit::require_tmux() == Service::Skip
    {
        return None;
    }
    let fleet = FleetVhost::provision(&["a", "b"]).expect("provision");
    Some(start(fleet, brokers, member_env, nudge_a))
}

/// Gateway a (a lead, no members; nudged about its mail when `nudge_a`) and gateway b (which
/// lets a send, stop and spawn, and has a `sim` profile with `member_env` and an `asker` one)
/// on `fleet`, each trying `brokers[i]` in turn; returns once both are linked.
pub(crate) fn start_hosts(
    fleet: FleetVhost,
    brokers: [&[String]; 2],
    member_env: &[(&str, &str)],
    nudge_a: bool,
) -> TwoHosts {
    let mut hosts = start(
        fleet,
        &[BrokerAt::plain(brokers[0]), BrokerAt::plain(brokers[1])],
        member_env,
        nudge_a,
    );
    for rig in [&mut hosts.a, &mut hosts.b] {
        wait_linked(rig);
    }
    hosts
}

fn start(
    fleet: FleetVhost,
    brokers: &[BrokerAt; 2],
    member_env: &[(&str, &str)],
    nudge_a: bool,
) -> TwoHosts {
    // a's lead pane is a shell typing mcp-call lines: a nudge typed into it while the test
    // types a call corrupts that call (bridge.rs), so only a test that sends a few tasks and
    // waits for the nudge turns it on.
    let push = if nudge_a {
        "pushReminders: 3\n  pushBackoffMs: 500"
    } else {
        "pushReminders: 0"
    };
    let a = fleetd_testkit::rig::Rig::start(&format!(
        "primary:\n  tab: base:lead\n  {push}\n{}",
        fleet.gateway_block_with(0, "", &brokers[0].urls, &brokers[0].tls)
    ));
    let b = fleetd_testkit::rig::Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n{}profiles:\n{}{}",
        fleet.gateway_block_with(1, "send, stop, spawn", &brokers[1].urls, &brokers[1].tls),
        fleetd_testkit::rig::sim_profile("sim", member_env),
        fleetd_testkit::rig::sim_profile(
            "asker",
            &[("SIM_AGENT_WORK_MS", "100"), ("SIM_AGENT_SCRIPT", "ask")]
        ),
    ));
    TwoHosts { a, b, fleet }
}

#[test]
fn e2e_gateway_a_lead_on_one_host_sends_to_a_member_on_another_and_gets_its_reply_and_nudge() {
    let Some(hosts) = two_hosts() else {
        return;
    };
    let (a, b) = (&hosts.a, &hosts.b);
    b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);

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
        || {
            let list =
                fleetd_testkit::rig::structured_ok(&b.lead("fleet_list", &serde_json::json!({})));
            list["members"].as_array().is_some_and(Vec::is_empty)
        },
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
    let mut events = fleetd_testkit::sse::SseReader::unix(
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
    let on_b = fleetd_testkit::rig::structured_ok(&b.lead("fleet_list", &serde_json::json!({})));
    assert!(
        on_b["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["target"] == "rem")),
        "b runs rem: {on_b}"
    );
    // Read your own writes: the member a just spawned is in a's fleet_list at once, not after
    // b's next presence broadcast.
    let list = fleetd_testkit::rig::structured_ok(&a.lead("fleet_list", &serde_json::json!({})));
    assert!(
        list["members"].as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m["target"] == rem.as_str() && m["gateway"] == b_name.as_str())
        }),
        "rem@b in a's fleet_list at once: {list}"
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
        let list =
            fleetd_testkit::rig::structured_ok(&hosts.a.lead("fleet_list", &serde_json::json!({})));
        list["members"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["target"] == rem.as_str() && m["status"] == "unreachable" && m["stale"] == true
            })
        })
    });
}

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

/// An envelope of the protocol from `src` to `dst`.
fn envelope(src: &str, dst: &str, kind: &str, body: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "v": 1, "kind": kind, "src": src, "dst": dst,
        "msgId": "01a23300-0000-7000-8000-000000000001", "body": body,
    })
}

/// Publishes `body` on `key` to `fleet.x` as gateway `i`'s own broker user, with its own
/// `user_id` (what the broker lets it do), and waits for the broker's confirm.
fn publish_as(fleet: &FleetVhost, i: usize, key: &str, body: &serde_json::Value) {
    let user = fleet.gateways[i].clone();
    runtime().block_on(async {
        let conn = Connection::connect(&fleet.url(i, None), ConnectionProperties::default())
            .await
            .expect("the gateway's user connects");
        let channel = conn.create_channel().await.expect("channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirms");
        let confirm = channel
            .basic_publish(
                "fleet.x".into(),
                key.into(),
                BasicPublishOptions::default(),
                body.to_string().as_bytes(),
                BasicProperties::default().with_user_id(user.as_str().into()),
            )
            .await
            .expect("publish")
            .await
            .expect("confirmed");
        assert!(confirm.is_ack(), "{confirm:?}");
        let _ = conn.close(200, "done".into()).await;
    });
}

/// Messages in `queue` of the fleet's vhost, as `rabbitmqctl` counts them (`None`: not listed).
fn queue_messages(fleet: &FleetVhost, queue: &str) -> Option<u64> {
    let out = fleet
        .ctl
        .run(&["list_queues", "-p", &fleet.vhost, "name", "messages"])
        .ok()?;
    out.lines().find_map(|l| {
        let mut cols = l.split_whitespace();
        (cols.next() == Some(queue))
            .then(|| cols.next()?.parse().ok())
            .flatten()
    })
}

/// `rig`'s `/metrics`, parsed.
fn scrape(rig: &fleetd_testkit::rig::Rig) -> prometheus_parse::Scrape {
    let body = fleetd_testkit::http::get(rig.daemon.addr, "/metrics")
        .expect("GET /metrics")
        .body;
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("parses")
}

/// Each sample of `metric` in `scrape`, with the value of its label `label`.
fn samples(scrape: &prometheus_parse::Scrape, metric: &str, label: &str) -> Vec<(String, f64)> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter_map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => return None,
            };
            Some((s.labels.get(label).unwrap_or_default().to_owned(), value))
        })
        .collect()
}

/// `fleetd_gateway_refused_total{reason}` on `rig` (0 before its first).
fn refused_total(rig: &fleetd_testkit::rig::Rig, reason: &str) -> f64 {
    samples(&scrape(rig), "fleetd_gateway_refused_total", "reason")
        .into_iter()
        .filter(|(r, _)| r == reason)
        .map(|(_, v)| v)
        .sum()
}

/// `fleetd_inbox_depth` on `rig`, by target.
fn inbox_depths(rig: &fleetd_testkit::rig::Rig) -> Vec<(String, f64)> {
    samples(&scrape(rig), "fleetd_inbox_depth", "target")
}

/// The incidents in gateway `me`'s own inbox (`gateway@me`, nudged to its primary lead).
fn gateway_incidents(rig: &fleetd_testkit::rig::Rig, me: &str) -> Vec<String> {
    fleetd_testkit::http::all_replies(rig.daemon.operator(), &format!("gateway@{me}"))
        .into_iter()
        .map(|(_, text)| text)
        .collect()
}

/// Each reply text `did on b: <task>` in `a`'s inbox for `alice`, with how often it is there.
pub(crate) fn reply_counts(
    a: &fleetd_testkit::rig::Rig,
    alice: &str,
) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for (_, text) in fleetd_testkit::http::all_replies(a.daemon.operator(), alice) {
        *counts.entry(text).or_insert(0) += 1;
    }
    counts
}

pub(crate) fn send_nowait(a: &fleetd_testkit::rig::Rig, target: &str, task: &str) -> String {
    let sent = fleetd_testkit::rig::structured_ok(&a.lead(
        "fleet_send",
        &serde_json::json!({ "target": target, "task": task, "wait": false }),
    ));
    sent["ticket"].as_str().expect("ticket").to_owned()
}

pub(crate) fn ticket_state(a: &fleetd_testkit::rig::Rig, ticket: &str) -> String {
    let polled = fleetd_testkit::http::request(
        a.daemon.operator(),
        "POST",
        "/mcp",
        Some(
            &serde_json::json!({
                "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": "fleet_poll", "arguments": { "ticket": ticket } },
            })
            .to_string(),
        ),
    );
    polled
        .ok()
        .and_then(|r| {
            let body = r
                .body
                .lines()
                .find(|l| l.starts_with("data:"))
                .map_or(r.body.clone(), |l| l[5..].to_owned());
            serde_json::from_str::<serde_json::Value>(&body).ok()
        })
        .and_then(|v| {
            v["result"]["structuredContent"]["state"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

/// The link cut on either side in the middle of the work: a's while it sends (the tasks wait in
/// its outbox), b's while its member works (her reply waits in b's outbox, and the tasks sent
/// meanwhile wait in b's queue on the broker), and a stalled link (a black hole the heartbeat
/// finds). Every task reaches b once and every reply reaches a once.
#[test]
fn e2e_gateway_link_cuts_on_either_side_lose_and_duplicate_nothing() {
    let pa =
        fleetd_testkit::proxy::Proxy::start(fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"))
            .expect("proxy a");
    let pb =
        fleetd_testkit::proxy::Proxy::start(fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"))
            .expect("proxy b");
    // Each task takes alice 1.5 s: long enough that b's link is surely cut while she works on
    // one, whatever the machine's load.
    let Some(mut hosts) = two_hosts_with(Some([pa.addr, pb.addr]), 1500) else {
        return;
    };
    let (a, b) = (&hosts.a, &hosts.b);
    b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
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
    let counts = reply_counts(a, &alice);
    for task in &tasks {
        assert_eq!(
            counts.get(&format!("did on b: {task}")).copied(),
            Some(1),
            "{task} answered once: {counts:?}"
        );
    }
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
        let list =
            fleetd_testkit::rig::structured_ok(&b.lead("fleet_list", &serde_json::json!({})));
        list["members"]
            .as_array()
            .is_some_and(|m| !m.iter().any(|m| m["target"] == "late"))
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
    let proxy = || {
        fleetd_testkit::proxy::Proxy::start(fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"))
            .expect("proxy")
    };
    let (pa, pb) = (proxy(), proxy());
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
    for rig in [&mut hosts.a, &mut hosts.b] {
        wait_linked(rig);
    }
    let (a, b) = (&hosts.a, &hosts.b);
    b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
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
    let pa =
        fleetd_testkit::proxy::Proxy::start(fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"))
            .expect("proxy a");
    let Some(mut hosts) = start_two_hosts_env(
        &[
            BrokerAt::plain(&[pa.addr.to_string()]).and_gateway("  outboxAlarm: 2\n"),
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()]),
        ],
        &[
            ("SIM_AGENT_WORK_MS", "200"),
            ("SIM_AGENT_REPLY", "did on b: {prompt}"),
        ],
        false,
    ) else {
        return;
    };
    for rig in [&mut hosts.a, &mut hosts.b] {
        wait_linked(rig);
    }
    let patience = std::time::Duration::from_secs(90);
    let (a, b) = (&hosts.a, &hosts.b);
    b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
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
    let counts = reply_counts(a, &alice);
    for task in &tasks {
        assert_eq!(
            counts.get(&format!("did on b: {task}")).copied(),
            Some(1),
            "{task} answered once: {counts:?}"
        );
    }
    let pane = b.history("fleet:");
    for task in &tasks {
        assert_eq!(pane.matches(&format!("❯ {task}")).count(), 1, "{pane}");
    }
    hosts.a.daemon.wait_for_log("back under", patience, |l| {
        l.contains("the gateway outbox is back under its alarm")
    });
}

/// The open questions `fleet_poll` shows for `target` on `rig` (asked as its operator).
fn questions(rig: &fleetd_testkit::rig::Rig, target: &str) -> Vec<serde_json::Value> {
    fleetd_testkit::http::get(
        rig.daemon.operator(),
        &format!("/sessions/{target}/replies"),
    )
    .ok()
    .and_then(|r| r.json()["questions"].as_array().cloned())
    .unwrap_or_default()
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
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
    hosts.b.spawn("sim", "alice");

    // b dies while alice works on a's first task.
    let first = send_nowait(&hosts.a, &alice, "task b-kill");
    fleetd_testkit::wait_until("alice at work", patience, || {
        ticket_state(&hosts.a, &first) == "working"
    });
    hosts.b.kill_daemon();
    hosts.b.restart_daemon();
    hosts
        .b
        .daemon
        .wait_for_log("b linked again", patience, |l| {
            l.contains("gateway linked to the broker")
        });
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
    hosts.a.restart_daemon();
    hosts
        .a
        .daemon
        .wait_for_log("a linked again", patience, |l| {
            l.contains("gateway linked to the broker")
        });
    fleetd_testkit::wait_until("every ticket replied", patience, || {
        tickets
            .iter()
            .all(|t| ticket_state(&hosts.a, t) == "replied")
    });
    let counts = reply_counts(&hosts.a, &alice);
    for task in &tasks {
        assert_eq!(
            counts.get(&format!("did on b: {task}")).copied(),
            Some(1),
            "{task} answered once: {counts:?}"
        );
    }
    // And typed once: alice's pane shows each task once.
    let pane = hosts.b.history("fleet:");
    for task in &tasks {
        assert_eq!(
            pane.matches(&format!("❯ {task}")).count(),
            1,
            "{task} typed once:\n{pane}"
        );
    }
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
        fleetd_testkit::rig::structured_ok(&hosts.a.lead("fleet_list", &serde_json::json!({})))
            ["members"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["target"] == alice.as_str()))
    });

    // b goes away; a's lead sends anyway.
    hosts.b.kill_daemon();
    fleetd_testkit::wait_until("alice@b unreachable on a", patience, || {
        fleetd_testkit::rig::structured_ok(&hosts.a.lead("fleet_list", &serde_json::json!({})))
            ["members"]
            .as_array()
            .is_some_and(|m| {
                m.iter()
                    .any(|m| m["target"] == alice.as_str() && m["stale"] == true)
            })
    });
    let ticket = send_nowait(&hosts.a, &alice, "while you were away");
    let b_queue = format!("fleet.gw.{b_name}.in");
    fleetd_testkit::wait_until("the task on the broker, in b's queue", patience, || {
        queue_messages(&hosts.fleet, &b_queue).is_some_and(|n| n >= 1)
    });
    // a goes away too; b comes back first and alice answers into a's queue.
    hosts.a.kill_daemon();
    hosts.b.restart_daemon();
    wait_linked(&mut hosts.b);
    let a_queue = format!("fleet.gw.{}.in", hosts.fleet.gateways[0]);
    fleetd_testkit::wait_until(
        "alice's reply on the broker, in a's queue",
        patience,
        || queue_messages(&hosts.fleet, &a_queue).is_some_and(|n| n >= 1),
    );
    // Both sides' clocks run out: presence (b saw no word from a), heartbeats, retries.
    hold(std::time::Duration::from_secs(15));
    hosts.a.restart_daemon();
    wait_linked(&mut hosts.a);
    fleetd_testkit::wait_until("the ticket replied on a", patience, || {
        ticket_state(&hosts.a, &ticket) == "replied"
    });
    let counts = reply_counts(&hosts.a, &alice);
    assert_eq!(
        counts.get("did on b: while you were away").copied(),
        Some(1),
        "the reply, once: {counts:?}"
    );
    let pane = hosts.b.history("fleet:");
    assert_eq!(
        pane.matches("❯ while you were away").count(),
        1,
        "typed once:\n{pane}"
    );
}

/// Keeps a fault in place for `d` (a cut or stalled link, a daemon down): not a wait for a
/// condition, the length of the outage itself.
#[expect(
    clippy::disallowed_methods,
    reason = "a fault is held for a while on the wall clock: the outage lasts that long"
)]
fn hold(d: std::time::Duration) {
    std::thread::sleep(d);
}

/// A throwaway CA, and a TLS proxy in front of the local RabbitMQ serving a `localhost`
/// certificate that CA signed; `None` (skipped) without the `openssl` CLI outside CI.
fn tls_broker() -> Option<(TestCa, TlsProxy)> {
    if fleetd_testkit::tls::require_openssl() == Service::Skip {
        return None;
    }
    let ca = TestCa::new("fleetd test CA").expect("a CA");
    let proxy = TlsProxy::start(
        fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"),
        &ca.issue_localhost().expect("a server certificate"),
    )
    .expect("TLS proxy");
    Some((ca, proxy))
}

fn healthz_gateway(rig: &fleetd_testkit::rig::Rig) -> serde_json::Value {
    fleetd_testkit::http::get(rig.daemon.addr, "/healthz")
        .map(|r| r.json()["gateway"].clone())
        .unwrap_or_default()
}

/// Gateway a reaches the broker over TLS (`amqps://`, trusting the CA of its `caFile`), b in
/// plain TCP: a lead on a sends to a member on b and gets her reply.
#[test]
fn e2e_gateway_over_tls_a_lead_sends_across_and_gets_the_reply() {
    let Some((ca, proxy)) = tls_broker() else {
        return;
    };
    let Some(mut hosts) = start_two_hosts(
        &[
            BrokerAt::tls(proxy.addr.port(), &ca.cert()),
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()]),
        ],
        200,
    ) else {
        return;
    };
    for rig in [&mut hosts.a, &mut hosts.b] {
        wait_linked(rig);
    }
    assert!(proxy.handshakes() >= 1, "a linked through the TLS proxy");
    assert_eq!(healthz_gateway(&hosts.a)["linked"], true);
    hosts.b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
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
    let Some(mut hosts) = start_two_hosts(
        &[
            BrokerAt::tls(proxy.addr.port(), &stranger.cert()),
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()]),
        ],
        200,
    ) else {
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
    hosts.b.spawn("sim", "alice");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
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
    hosts.a.restart_daemon();
    wait_linked(&mut hosts.a);
    fleetd_testkit::wait_until("the task answered", patience, || {
        ticket_state(&hosts.a, &ticket) == "replied"
    });
    let counts = reply_counts(&hosts.a, &alice);
    assert_eq!(
        counts.get(&format!("did on b: {task}")).copied(),
        Some(1),
        "answered once: {counts:?}"
    );
    assert_eq!(healthz_gateway(&hosts.a)["linked"], true);
}

/// A `caFile` that cannot be read stops `fleetd serve` at start, naming the key and the file
/// (the config itself is valid: the file is read once, when the link is set up).
#[test]
fn e2e_gateway_with_an_unreadable_ca_file_does_not_start_and_names_the_key() {
    let home = tempfile::tempdir().expect("tempdir");
    let password = home.path().join("gw-password");
    std::fs::write(&password, "pw").expect("password file");
    std::fs::set_permissions(
        &password,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("owner-only");
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

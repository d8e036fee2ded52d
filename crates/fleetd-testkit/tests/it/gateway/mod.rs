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

mod across;
mod outbox;
mod rights;
mod tls;

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

/// Two gateways on one machine: each its own HOME, state, port and tmux server, both on one
/// provisioned vhost of the local RabbitMQ (or of a test cluster: `gateway_cluster`).
pub(crate) struct TwoHosts {
    // Dropped in this order: the daemons stop before their vhost goes.
    pub(crate) a: fleetd_testkit::rig::Rig,
    pub(crate) b: fleetd_testkit::rig::Rig,
    pub(crate) fleet: FleetVhost,
}

impl TwoHosts {
    /// Spawns member `alice` from b's `sim` profile; her address as a's lead names her.
    fn alice_on_b(&self) -> String {
        self.b.spawn("sim", "alice");
        format!("alice@{}", self.fleet.gateways[1])
    }

    /// Waits until both gateways have linked to the broker.
    fn wait_linked(&mut self) {
        for rig in [&mut self.a, &mut self.b] {
            wait_linked(rig);
        }
    }
}

/// A proxy in front of the local RabbitMQ, for a test to cut one gateway's link.
fn broker_proxy() -> fleetd_testkit::proxy::Proxy {
    fleetd_testkit::proxy::Proxy::start(fleetd_testkit::RABBITMQ_ADDR.parse().expect("addr"))
        .expect("a proxy to the broker")
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
    hosts.wait_linked();
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
    hosts.wait_linked();
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

/// Each sample of `metric` in `scrape`, with the value of its label `label` (a histogram's value
/// is its count).
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
                prometheus_parse::Value::Histogram(ref buckets) => buckets.last()?.count,
                prometheus_parse::Value::Summary(_) => return None,
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

/// Two gateways, a reaching the broker over TLS through `proxy` and trusting the CA in
/// `ca_file`, b over plain TCP; started, not waited for (a's link may be meant to fail).
fn a_over_tls(proxy: &TlsProxy, ca_file: &std::path::Path) -> Option<TwoHosts> {
    start_two_hosts(
        &[
            BrokerAt::tls(proxy.addr.port(), ca_file),
            BrokerAt::plain(&[fleetd_testkit::RABBITMQ_ADDR.to_owned()]),
        ],
        200,
    )
}

/// a, down while its task `task` (ticket `ticket`) to `member` was answered, starts again on its
/// state and links: the task is replied within `patience`, and answered once.
fn a_restarts_and_gets_the_reply_once(
    hosts: &mut TwoHosts,
    [ticket, task]: [&str; 2],
    member: &str,
    patience: std::time::Duration,
) {
    restart_linked(&mut hosts.a, patience);
    fleetd_testkit::wait_until("the ticket replied on a", patience, || {
        ticket_state(&hosts.a, ticket) == "replied"
    });
    each_answered_once(&hosts.a, member, &[task]);
}

/// Starts `rig`'s daemon again on its state (after a kill) and waits up to `patience` until it
/// has linked to the broker again.
fn restart_linked(rig: &mut fleetd_testkit::rig::Rig, patience: std::time::Duration) {
    rig.restart_daemon();
    rig.daemon
        .wait_for_log("the gateway linked again", patience, |l| {
            l.contains("gateway linked to the broker")
        });
}

/// Each of `tasks` a sent `member` on b (whose members answer `did on b: <task>`) was answered
/// once: its reply is in a's inbox exactly once. Every reply's count, for the caller's other
/// checks.
fn each_answered_once(
    a: &fleetd_testkit::rig::Rig,
    member: &str,
    tasks: &[impl AsRef<str>],
) -> std::collections::BTreeMap<String, usize> {
    let counts = reply_counts(a, member);
    for task in tasks.iter().map(AsRef::as_ref) {
        assert_eq!(
            counts.get(&format!("did on b: {task}")).copied(),
            Some(1),
            "{task} answered once: {counts:?}"
        );
    }
    counts
}

/// Each of `tasks` was typed into b's member panes exactly once.
fn each_typed_once(b: &fleetd_testkit::rig::Rig, tasks: &[impl AsRef<str>]) {
    let pane = b.history("fleet:");
    for task in tasks.iter().map(AsRef::as_ref) {
        assert_eq!(
            pane.matches(&format!("❯ {task}")).count(),
            1,
            "{task} typed once:\n{pane}"
        );
    }
}

fn healthz_gateway(rig: &fleetd_testkit::rig::Rig) -> serde_json::Value {
    fleetd_testkit::http::get(rig.daemon.addr, "/healthz")
        .map(|r| r.json()["gateway"].clone())
        .unwrap_or_default()
}

//! Several hosts (issue 20) on a three-node RabbitMQ cluster of the test's own, and the node
//! leading gateway a's inbound queue (where the replies flow) killed with SIGKILL while they
//! flow. Opt-in, about two minutes: `FLEETD_TEST_CLUSTER=1` (`scripts/cluster-failover`);
//! without it the test returns at once. It counts what was sent, typed, published and received,
//! and prints the failover's timings; nothing may be lost or come twice.
//!
//! A third gateway, c, linked to a surviving node before the kill, publishes to its own inbound
//! queue (led by the dead node too) right after it: its channel's first publish to a quorum
//! queue whose leader is being elected, which RabbitMQ 3.10 nacks on that channel for as long as
//! the channel lives (gateway a met it when the kill cut off a publish and it sent it again on its
//! new connection: it was nacked for minutes). The link tries again on a new channel; the publish
//! must be confirmed within seconds.
//!
//! `FLEETD_CLUSTER_TASKS` (default 200) sets how many tasks flow; `FLEETD_CLUSTER_VICTIM=b`
//! puts gateway b (which publishes the replies) on the node that dies instead of gateway a
//! (which consumes them and publishes the tasks).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd::store::gateway_link::{Deliver, Disposition, Link, LinkConfig, LinkError, settled};
use fleetd_core::gateway::{Envelope, GatewayName, Kind};
use fleetd_testkit::Service;
use fleetd_testkit::broker::FleetVhost;
use fleetd_testkit::cluster::{Cluster, require_rabbitmq_server};
use fleetd_testkit::http::events::SseReader;
use fleetd_testkit::rig::Rig;
use jiff::{SignedDuration, Timestamp};

use super::gateway::{reply_counts, send_nowait, start_hosts, ticket_state};

/// Tasks sent but not answered yet at any moment: a steady stream, never a pile in alice's
/// queue (whose cap is 64).
const WINDOW: usize = 12;

#[test]
fn e2e_gateway_cluster_kill_9_of_the_queue_leader_while_replies_flow_loses_and_repeats_nothing() {
    if !std::env::var("FLEETD_TEST_CLUSTER").is_ok_and(|v| v == "1") {
        eprintln!(
            "SKIPPED: the three-node cluster failover run is opt-in: FLEETD_TEST_CLUSTER=1 \
             (scripts/cluster-failover)"
        );
        return;
    }
    if fleetd_testkit::require_tmux() == Service::Skip || require_rabbitmq_server() == Service::Skip
    {
        return;
    }
    let total: usize = std::env::var("FLEETD_CLUSTER_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let victim_is_b = std::env::var("FLEETD_CLUSTER_VICTIM").is_ok_and(|v| v == "b");
    let patience = Duration::from_secs(300);

    let started = wall_now();
    // Declared before the hosts, so dropped after them: the daemons stop, then the nodes.
    let mut cluster = Cluster::boot(3, 5681, 25681).unwrap_or_else(|e| panic!("{e:#}"));
    let booted = wall_now();
    let fleet = FleetVhost::provision_with(&cluster.ctl(0), &["a", "b", "c"]).expect("provision");
    let inbound = format!("fleet.gw.{}.in", fleet.gateways[0]);
    let leader_name = cluster
        .leader(0, &fleet.vhost, &inbound)
        .expect("the queue's leader");
    let leader = cluster.index_of(&leader_name).expect("a node of ours");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let probe_queue = format!("fleet.gw.{}.in", fleet.gateways[2]);
    let probe_applies =
        cluster.leader(0, &fleet.vhost, &probe_queue).ok() == Some(leader_name.clone());
    let probe_link = LinkConfig {
        me: GatewayName::new(fleet.gateways[2].clone()).expect("a gateway name"),
        urls: vec![format!(
            "amqp://{}/{}",
            cluster.nodes()[survivors[0]].amqp(),
            fleet.vhost
        )],
        user: fleet.gateways[2].clone(),
        password: fleet.password(2),
        heartbeat_secs: 5,
        outbox_alarm: 1000,
        tls: fleetd::store::gateway_link::LinkTls::system(),
    };
    let addr = |i: usize| cluster.nodes()[i].amqp();
    // The victim's first URL is the leader's node; the other gateway's are the survivors'.
    let on_leader = vec![addr(leader), addr(survivors[0]), addr(survivors[1])];
    let elsewhere = vec![addr(survivors[0]), addr(survivors[1]), addr(leader)];
    let (urls_a, urls_b) = if victim_is_b {
        (&elsewhere, &on_leader)
    } else {
        (&on_leader, &elsewhere)
    };
    let scratch = tempfile::tempdir().expect("tempdir");
    let alice_log = scratch.path().join("alice.jsonl");
    let alice_log_env = alice_log.display().to_string();
    let probe = first_publish_after_the_kill(probe_link);
    let mut hosts = start_hosts(
        fleet,
        [urls_a, urls_b],
        &[
            ("SIM_AGENT_WORK_MS", "100"),
            ("SIM_AGENT_REPLY", "did on b: {prompt}"),
            ("SIM_AGENT_LOG", &alice_log_env),
        ],
        // No nudges into a's lead pane: it is a shell typing 200 calls (see start_hosts).
        false,
    );
    hosts.b.spawn("sim", "alice");
    probe
        .linked
        .recv_timeout(Duration::from_secs(60))
        .expect("gateway c linked");
    let alice = format!("alice@{}", hosts.fleet.gateways[1]);
    let at_a = Arrivals::follow(&hosts.a, &alice);
    let at_b = Arrivals::follow(&hosts.b, "alice");

    // The stream: at most WINDOW tasks open; the leader dies once a third are answered.
    let mut tickets = Vec::new();
    let mut killed = None;
    let mut lines_before_kill = [0, 0];
    for n in 0..total {
        fleetd_testkit::wait_until("room in the window", patience, || {
            n.saturating_sub(at_a.count()) < WINDOW
        });
        if killed.is_none() && at_a.count() >= total / 3 {
            lines_before_kill = [
                hosts.a.daemon.logs_so_far().len(),
                hosts.b.daemon.logs_so_far().len(),
            ];
            cluster.kill_9(leader).expect("kill -9 the leader");
            killed = Some(wall_now());
            let _ = probe.go.send(());
        }
        tickets.push(send_nowait(&hosts.a, &alice, &format!("task {n}")));
    }
    let sent_all = wall_now();
    let killed = killed.expect("the leader was killed mid-stream");
    fleetd_testkit::wait_until("every reply received on a", patience, || {
        at_a.count() >= total
    });
    let received_all = wall_now();
    let probe = probe.done.join().expect("the probe thread");

    // What each side saw.
    let tasks: Vec<String> = (0..total).map(|n| format!("task {n}")).collect();
    let counts = reply_counts(&hosts.a, &alice);
    let lost: Vec<&String> = tasks
        .iter()
        .filter(|t| !counts.contains_key(&format!("did on b: {t}")))
        .collect();
    let doubled: Vec<(&String, &usize)> = counts.iter().filter(|(_, n)| **n > 1).collect();
    let foreign: Vec<&String> = counts
        .keys()
        .filter(|text| {
            !text
                .strip_prefix("did on b: ")
                .is_some_and(|t| tasks.contains(&t.to_owned()))
        })
        .collect();
    let alice_saw = AliceLog::read(&alice_log);
    let typed_twice: Vec<(&String, &usize)> =
        alice_saw.typed.iter().filter(|(_, n)| **n > 1).collect();
    let open: Vec<&String> = tickets
        .iter()
        .filter(|t| ticket_state(&hosts.a, t) != "replied")
        .collect();
    let published = forwarded_replies(&hosts.b);
    let new_leader = cluster
        .leader(survivors[0], &hosts.fleet.vhost, &inbound)
        .unwrap_or_else(|e| format!("unknown ({e:#})"));
    let logs_a = hosts.a.daemon.logs_so_far()[lines_before_kill[0]..].to_vec();
    let logs_b = hosts.b.daemon.logs_so_far()[lines_before_kill[1]..].to_vec();
    let (victim_logs, victim) = if victim_is_b {
        (&logs_b, "b")
    } else {
        (&logs_a, "a")
    };
    let relinked = victim_logs
        .iter()
        .find(|l| l.contains("gateway linked to the broker"))
        .cloned()
        .unwrap_or_default();
    let a_arrivals = at_a.times();
    let first_after = a_arrivals.iter().find(|t| **t > killed).copied();
    let gaps = |from: Timestamp, to: Timestamp| -> Option<SignedDuration> {
        a_arrivals
            .windows(2)
            .filter(|w| w[0] >= from && w[1] <= to)
            .map(|w| w[1].duration_since(w[0]))
            .max()
    };

    println!("---- three-node cluster failover: gateway {victim} on the dead node ----");
    println!(
        "cluster booted and joined in {:.1}s; queue {inbound} led by {leader_name}, killed (kill -9) \
         once {} replies were in; leader afterwards: {new_leader}",
        secs(booted.duration_since(started)),
        total / 3,
    );
    println!("gateway a urls: {urls_a:?}; gateway b urls: {urls_b:?}");
    println!(
        "tasks sent {total}; typed by alice {} ({} distinct); her fleet_reply calls {} ok, {} failed",
        alice_saw.typed.values().sum::<usize>(),
        alice_saw.typed.len(),
        alice_saw.replied,
        alice_saw.reply_errors,
    );
    println!(
        "replies: stored on b {}, published by b (broker confirmed) {published}, received in a's \
         inbox {} ({} distinct); lost {}, duplicated {}, unexpected {}; tickets not replied {}",
        at_b.count(),
        counts.values().sum::<usize>(),
        counts.len(),
        lost.len(),
        doubled.len(),
        foreign.len(),
        open.len(),
    );
    println!(
        "timings: first reply received on a {} after the kill; longest gap between replies on a \
         {} around the kill, {} before it; every task sent {:.1}s and every reply in {:.1}s after \
         the kill; slowest reply b → a {}",
        first_after.map_or("never".to_owned(), |t| ms(t.duration_since(killed))),
        gaps(
            killed - SignedDuration::from_secs(5),
            first_after.unwrap_or(killed)
        )
        .map_or("-".to_owned(), ms),
        gaps(Timestamp::MIN, killed).map_or("-".to_owned(), ms),
        secs(sent_all.duration_since(killed)),
        secs(received_all.duration_since(killed)),
        at_a.slowest_from(&at_b)
            .map_or("-".to_owned(), |(d, _)| ms(d)),
    );
    if let Some(first_after) = first_after {
        println!(
            "replies that crossed the failover (stored on b by the first arrival after the kill, \
             received on a after the kill): {}",
            at_a.crossed(&at_b, killed, first_after)
        );
    }
    for (name, logs) in [("a", &logs_a), ("b", &logs_b)] {
        let count = |needle: &str| logs.iter().filter(|l| l.contains(needle)).count();
        let retried: BTreeSet<String> = logs
            .iter()
            .filter(|l| {
                l.contains("gateway forward waits for the link")
                    || l.contains("the broker nacked a gateway message")
            })
            .filter_map(|l| field(l, "seq"))
            .collect();
        println!(
            "gateway {name} after the kill: link lost {}, relinked {}, cannot reach {}, nacks {}, \
             outbox records retried {}, deliveries refused {}",
            count("gateway link lost; reconnecting"),
            count("gateway linked to the broker"),
            count("gateway cannot reach the broker"),
            count("the broker nacked a gateway message"),
            retried.len(),
            count("a delivery was refused"),
        );
        // The link's story, and each outbox record's first failed publish (a record waiting
        // for the link is logged every 50 ms).
        let mut retry_shown = BTreeSet::new();
        for line in logs.iter().filter(|l| {
            l.contains("gateway link lost")
                || l.contains("gateway linked")
                || l.contains("nacked")
                || l.contains("cannot reach the broker")
                || (l.contains("gateway forward waits for the link")
                    && retry_shown.insert(field(l, "seq")))
        }) {
            println!("  {name}| {}", brief(line));
        }
    }
    println!(
        "gateway c's first publish to {probe_queue} ({}led by the dead node), {} after the kill: \
         {} nack(s), confirmed {} after the kill",
        if probe_applies { "" } else { "NOT " },
        probe
            .published
            .map_or("never".to_owned(), |t| ms(t.duration_since(killed))),
        probe.nacks,
        probe
            .confirmed
            .map_or("never".to_owned(), |t| ms(t.duration_since(killed))),
    );
    if let Some(at) = log_time(&relinked) {
        println!(
            "gateway {victim} relinked {} after the kill",
            ms(at.duration_since(killed))
        );
    }

    assert!(lost.is_empty(), "replies lost: {lost:?}");
    assert!(doubled.is_empty(), "replies received twice: {doubled:?}");
    assert!(foreign.is_empty(), "replies nobody asked for: {foreign:?}");
    assert!(open.is_empty(), "tickets not replied: {open:?}");
    assert!(typed_twice.is_empty(), "tasks typed twice: {typed_twice:?}");
    assert_eq!(alice_saw.typed.len(), total, "every task typed");
    assert_eq!(published, total, "b published each reply once");
    assert!(
        probe.confirmed.is_some(),
        "gateway c's publish was never confirmed: {} nacks",
        probe.nacks
    );
    let dead_url = cluster.nodes()[leader].amqp();
    assert!(
        !relinked.is_empty() && !relinked.contains(&dead_url),
        "gateway {victim} relinked to a surviving node: {relinked:?}"
    );
}

/// What became of gateway c's first publish after the kill.
struct Probe {
    published: Option<Timestamp>,
    nacks: usize,
    confirmed: Option<Timestamp>,
}

/// Gateway c on a thread of its own: says when it is linked, publishes when told to go.
struct ProbeHandle {
    linked: std::sync::mpsc::Receiver<()>,
    go: tokio::sync::mpsc::UnboundedSender<()>,
    done: std::thread::JoinHandle<Probe>,
}

/// Links gateway c (`config`) to the broker; once told to go, publishes one envelope to its own
/// inbound queue and tries again every second after a nack, as the gateway's forwarder does, for
/// up to 60 s.
fn first_publish_after_the_kill(config: LinkConfig) -> ProbeHandle {
    let (linked_tx, linked) = std::sync::mpsc::channel();
    let (go, mut go_rx) = tokio::sync::mpsc::unbounded_channel();
    let done = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let link = Link::new(config.clone());
            let stop = tokio_util::sync::CancellationToken::new();
            let take: Deliver =
                Arc::new(|_| Box::pin(std::future::ready(settled(Disposition::Taken))));
            link.run(take, Arc::new(|_, _| {}), stop.clone());
            link.until_up().await;
            let _ = linked_tx.send(());
            let mut probe = Probe {
                published: None,
                nacks: 0,
                confirmed: None,
            };
            if go_rx.recv().await.is_none() {
                return probe;
            }
            let envelope = Envelope {
                v: 1,
                kind: Kind::Task,
                src: config.me.clone(),
                dst: config.me.clone(),
                msg_id: "01a23300-0000-7000-8000-0000000c1a57".to_owned(),
                body: serde_json::json!({ "probe": true }),
            };
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while tokio::time::Instant::now() < deadline {
                link.until_up().await;
                probe.published.get_or_insert_with(wall_now);
                match link.publish(&envelope).await {
                    Ok(_) => {
                        probe.confirmed = Some(wall_now());
                        break;
                    }
                    Err(LinkError::Nacked(_)) => {
                        probe.nacks += 1;
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(LinkError::Down(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            stop.cancel();
            probe
        })
    });
    ProbeHandle { linked, go, done }
}

/// When each reply for one member was stored on one daemon (its `reply.stored` events, read
/// from `GET /events` on the operator socket by a thread of its own).
struct Arrivals {
    seen: Arc<Mutex<BTreeMap<String, Timestamp>>>,
}

impl Arrivals {
    fn follow(rig: &Rig, target: &str) -> Self {
        let socket = fleetd_testkit::daemon::state_dir(rig.dir()).join("api.sock");
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (into, target) = (Arc::clone(&seen), target.to_owned());
        let mut reader = SseReader::unix(&socket, None).expect("GET /events");
        assert_eq!(reader.status, 200, "{}", reader.refusal);
        std::thread::spawn(move || {
            // The stream ends when the daemon does; the thread with it.
            while let Some(event) = reader.next_event() {
                if event.event != "reply.stored" || event.data["target"] != target.as_str() {
                    continue;
                }
                let at = event.data["at"].as_str().and_then(|a| a.parse().ok());
                if let (Some(id), Some(at)) = (event.data["msg_id"].as_str(), at) {
                    lock(&into).entry(id.to_owned()).or_insert(at);
                }
            }
        });
        Self { seen }
    }

    /// Replies seen so far (each message once).
    fn count(&self) -> usize {
        lock(&self.seen).len()
    }

    /// Their arrival times, in order.
    fn times(&self) -> Vec<Timestamp> {
        let mut times: Vec<Timestamp> = lock(&self.seen).values().copied().collect();
        times.sort();
        times
    }

    /// The longest a reply took from `earlier`'s daemon to this one, and its id.
    fn slowest_from(&self, earlier: &Self) -> Option<(SignedDuration, String)> {
        let here = lock(&self.seen);
        let there = lock(&earlier.seen);
        here.iter()
            .filter_map(|(id, at)| Some((at.duration_since(*there.get(id)?), id.clone())))
            .max()
    }

    /// Replies that arrived here after `killed` and were stored by `earlier`'s daemon no later
    /// than `resumed`: in flight while the link or the queue was failing over.
    fn crossed(&self, earlier: &Self, killed: Timestamp, resumed: Timestamp) -> usize {
        let here = lock(&self.seen);
        let there = lock(&earlier.seen);
        here.iter()
            .filter(|(id, at)| **at > killed && there.get(*id).is_some_and(|t| *t <= resumed))
            .count()
    }
}

/// What alice's sim-agent log says she did.
struct AliceLog {
    /// Each prompt typed into her pane, with how often.
    typed: BTreeMap<String, usize>,
    /// Her `fleet_reply` calls that succeeded, and that failed.
    replied: usize,
    reply_errors: usize,
}

impl AliceLog {
    fn read(path: &std::path::Path) -> Self {
        let mut this = Self {
            typed: BTreeMap::new(),
            replied: 0,
            reply_errors: 0,
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for event in text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        {
            match (event["event"].as_str(), event["name"].as_str()) {
                (Some("turn"), _) => {
                    let prompt = event["prompt"].as_str().unwrap_or_default().to_owned();
                    *this.typed.entry(prompt).or_insert(0) += 1;
                }
                (Some("tool"), Some("fleet_reply")) if event["result"]["isError"] != true => {
                    this.replied += 1;
                }
                (Some("tool" | "tool_error"), Some("fleet_reply")) => this.reply_errors += 1,
                _ => {}
            }
        }
        this
    }
}

/// Replies b's broker confirmed (`fleetd_gateway_forwarded_total{kind="reply",outcome="confirmed"}`).
fn forwarded_replies(b: &Rig) -> usize {
    let metrics = fleetd_testkit::http::get(b.daemon.operator(), "/metrics")
        .map(|r| r.body)
        .unwrap_or_default();
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("fleetd_gateway_forwarded_total{")
                && l.contains("kind=\"reply\"")
                && l.contains("outcome=\"confirmed\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as usize)
        .sum()
}

/// Field `name` of a log line (the daemons log JSON), as text.
fn field(line: &str, name: &str) -> Option<String> {
    let value = serde_json::from_str::<serde_json::Value>(line).ok()?;
    match &value[name] {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// A log line's time.
fn log_time(line: &str) -> Option<Timestamp> {
    field(line, "timestamp")?.parse().ok()
}

/// A log line in short: its time, message and the fields that say where and why.
fn brief(line: &str) -> String {
    let mut out = String::new();
    for name in ["timestamp", "message", "gateway", "broker", "reason", "seq"] {
        if let Some(v) = field(line, name) {
            out.push_str(&format!("{v}  "));
        }
    }
    out
}

fn secs(d: SignedDuration) -> f64 {
    d.as_secs_f64()
}

fn ms(d: SignedDuration) -> String {
    format!("{} ms", d.as_millis())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The wall clock: the daemons stamp their events with it, and the kill is timed against them.
#[expect(
    clippy::disallowed_methods,
    reason = "the failover's timings compare the daemons' event times with the moment of the kill"
)]
fn wall_now() -> Timestamp {
    Timestamp::now()
}

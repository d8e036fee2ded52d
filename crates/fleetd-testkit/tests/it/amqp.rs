//! Integration tests: the AMQP inbox's promises to the broker, against the real RabbitMQ. Every
//! inbox queue has a delivery limit and a dead-letter queue; queues an older fleetd declared are
//! migrated without losing or doubling a message; what fleetd cannot decode is dead-lettered,
//! not destroyed; and no delivery is held on the broker across calls, shown against a short
//! consumer timeout on a vhost of the test's own.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fleetd::store::{self, AmqpStore, InboxStore, PublishOutcome, StoreOptions, StoreSpec};
use fleetd_core::{Message, MessageKind, MsgId, Target};
use fleetd_testkit::{RABBITMQ_URL, Service, require, require_rabbitmq};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::store::QueueCleanup;

#[expect(
    clippy::disallowed_methods,
    reason = "test messages need fresh, ordered ids; no daemon clock here"
)]
fn message(target: &Target, text: &str) -> Message {
    Message {
        msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
        target: target.clone(),
        ticket: None,
        kind: MessageKind::Reply,
        text: text.to_owned(),
        from: "member".to_owned(),
        created_at: jiff::Timestamp::from_second(1_700_000_000).expect("valid timestamp"),
    }
}

fn ids(messages: &[Message]) -> Vec<MsgId> {
    messages.iter().map(|m| m.msg_id).collect()
}

/// The arguments an inbox queue must have (the contract, restated here rather than taken from
/// fleetd): quorum, delivery limit 20, dead-lettered through the default exchange to
/// `agent.<target>.dead`, at least once.
fn inbox_arguments(target: &Target) -> FieldTable {
    let mut args = old_arguments();
    let text = |value: &str| AMQPValue::LongString(value.into());
    args.insert("x-delivery-limit".into(), AMQPValue::LongInt(20));
    args.insert("x-dead-letter-exchange".into(), text(""));
    args.insert(
        "x-dead-letter-routing-key".into(),
        text(&AmqpStore::dead_letter_queue_name(target)),
    );
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    args.insert("x-overflow".into(), text("reject-publish"));
    args
}

/// The arguments fleetd declared its inbox queues with before issue 15.
fn old_arguments() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args
}

async fn connect(url: &str) -> Connection {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .expect("connect to the broker")
}

/// Declares `queue` with `args` on a channel of its own: the broker's answer.
async fn declare(conn: &Connection, queue: &str, args: FieldTable) -> Result<u32, lapin::Error> {
    let channel = conn.create_channel().await.expect("channel");
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    let declared = channel.queue_declare(queue.into(), options, args).await;
    if declared.is_ok() {
        channel.close(200, "done".into()).await.expect("close");
    }
    declared.map(|queue| queue.message_count())
}

/// Ready messages in `queue` (a passive declare).
async fn ready(conn: &Connection, queue: &str) -> u32 {
    let channel = conn.create_channel().await.expect("channel");
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let count = channel
        .queue_declare(queue.into(), options, FieldTable::default())
        .await
        .expect("the queue exists")
        .message_count();
    channel.close(200, "done".into()).await.expect("close");
    count
}

/// A confirm-mode channel that publishes raw bodies the way any AMQP client would.
async fn raw_publisher(conn: &Connection) -> Channel {
    let channel = conn.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm mode");
    channel
}

async fn publish_raw(channel: &Channel, queue: &str, body: &[u8]) {
    publish_typed(channel, queue, body, BasicProperties::default()).await;
}

/// One fleetd message as a single untyped JSON body, the way an older fleetd published each.
async fn publish_one(channel: &Channel, queue: &str, message: &Message) {
    publish_raw(channel, queue, &serde_json::to_vec(message).expect("json")).await;
}

/// A fleetd batch as another daemon's publish lane sends it: a JSON array typed `batch`.
async fn publish_batch(channel: &Channel, queue: &str, messages: &[Message]) {
    let body = serde_json::to_vec(messages).expect("json");
    let typed = BasicProperties::default().with_type("batch".into());
    publish_typed(channel, queue, &body, typed).await;
}

async fn publish_typed(channel: &Channel, queue: &str, body: &[u8], properties: BasicProperties) {
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body,
            properties.with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(confirm.is_ack(), "the broker took {queue}'s message");
}

fn is_precondition_failed(err: &lapin::Error) -> bool {
    err.to_string().contains("PRECONDITION_FAILED")
}

/// Opens the AMQP store on `url`, ingesting into `dir`.
async fn open(url: &str, dir: &std::path::Path) -> Arc<dyn InboxStore> {
    let spec = StoreSpec::Amqp {
        url: url.to_owned(),
        path: dir.join("inbox.db"),
    };
    store::open(&spec, &StoreOptions::default())
        .await
        .expect("open the AMQP store")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_store_migrates_queues_an_older_fleetd_declared_without_loss() {
    if require_rabbitmq() == Service::Skip {
        return;
    }
    let run = format!("m{:08x}", fastrand::u32(..));
    let reader = Target::new(format!("{run}-reader")).expect("valid");
    let writer = Target::new(format!("{run}-writer")).expect("valid");
    let _cleanup = QueueCleanup(vec![reader.clone(), writer.clone()]);
    let conn = connect(RABBITMQ_URL).await;
    let publisher = raw_publisher(&conn).await;
    // What an older fleetd left: quorum queues without a limit, with replies waiting, one of
    // them published twice (a retry after a lost confirm), and something that is no reply.
    let mut waiting = Vec::new();
    for target in [&reader, &writer] {
        let queue = AmqpStore::queue_name(target);
        declare(&conn, &queue, old_arguments())
            .await
            .expect("an old-style queue");
        let replies: Vec<Message> = (0..30)
            .map(|n| message(target, &format!("old reply {n}")))
            .collect();
        for reply in &replies {
            publish_one(&publisher, &queue, reply).await;
        }
        publish_one(&publisher, &queue, &replies[0]).await;
        publish_raw(&publisher, &queue, b"not a reply").await;
        waiting.push(replies);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(RABBITMQ_URL, dir.path()).await;
    // First use by a read migrates the reader's queue; by a publish, the writer's.
    assert_eq!(
        ids(&store.peek(&reader, 1000).await.expect("peek")),
        ids(&waiting[0]),
        "every old message once, in order"
    );
    let fresh = message(&writer, "new reply");
    assert_eq!(
        store.publish(fresh.clone()).await.expect("publish"),
        PublishOutcome::Stored
    );
    let mut expected_writer = waiting[1].clone();
    expected_writer.push(fresh);
    assert_eq!(
        ids(&store.peek(&writer, 1000).await.expect("peek")),
        ids(&expected_writer)
    );
    for target in [&reader, &writer] {
        let queue = AmqpStore::queue_name(target);
        assert_eq!(ready(&conn, &queue).await, 0, "{queue} was emptied");
        declare(&conn, &queue, inbox_arguments(target))
            .await
            .unwrap_or_else(|err| panic!("{queue} has the new arguments: {err}"));
        let old = declare(&conn, &queue, old_arguments())
            .await
            .expect_err("the old arguments no longer match");
        assert!(is_precondition_failed(&old), "{old}");
        // The old queue had no dead-letter exchange: the poison was parked, not destroyed.
        let dead = AmqpStore::dead_letter_queue_name(target);
        assert_eq!(ready(&conn, &dead).await, 1, "{dead}");
    }
    // A restarted daemon declares the migrated queues without migrating again or doubling.
    store.close().await.expect("close");
    let store = open(RABBITMQ_URL, dir.path()).await;
    assert_eq!(store.depth(&reader).await.expect("depth"), 30);
    assert_eq!(store.depth(&writer).await.expect("depth"), 31);
    store.close().await.expect("close");
    conn.close(200, "done".into()).await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_store_dead_letters_what_it_cannot_decode() {
    if require_rabbitmq() == Service::Skip {
        return;
    }
    fleetd::ops::telemetry::describe();
    let run = format!("d{:08x}", fastrand::u32(..));
    let target = Target::new(format!("{run}-poisoned")).expect("valid");
    let other = Target::new(format!("{run}-other")).expect("valid");
    let _cleanup = QueueCleanup(vec![target.clone()]);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(RABBITMQ_URL, dir.path()).await;
    let good = message(&target, "a real reply");
    store.publish(good.clone()).await.expect("publish");
    let conn = connect(RABBITMQ_URL).await;
    let publisher = raw_publisher(&conn).await;
    let queue = AmqpStore::queue_name(&target);
    publish_raw(&publisher, &queue, b"\xff\xfe not a fleetd message").await;
    let misrouted = message(&other, "meant for someone else");
    publish_one(&publisher, &queue, &misrouted).await;
    let second = message(&target, "a reply after the poison");
    publish_one(&publisher, &queue, &second).await;
    // Batches, as publishes that wait together go out: one is taken whole; one that holds a
    // message for another target is poison whole.
    let batched = [message(&target, "batched 1"), message(&target, "batched 2")];
    publish_batch(&publisher, &queue, &batched).await;
    let mixed = [
        message(&target, "mixed"),
        message(&other, "mixed, misrouted"),
    ];
    publish_batch(&publisher, &queue, &mixed).await;
    // Another publisher's messages reach the local inbox through the queue's consumer, as the
    // broker pushes them: a read does not wait for them.
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = ids(&store.peek(&target, 10).await.expect("peek"));
        if seen.len() >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        ids(&[good, second, batched[0].clone(), batched[1].clone()]),
        "the good ones pass, the poison does not block them"
    );
    assert_eq!(ready(&conn, &queue).await, 0);
    let dead = AmqpStore::dead_letter_queue_name(&target);
    let mut parked = 0;
    for _ in 0..100 {
        parked = ready(&conn, &dead).await;
        if parked == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(parked, 3, "the three poison messages wait in {dead}");
    let scrape = fleetd::ops::telemetry::handle().render();
    for (reason, count) in [("undecodable", 1), ("wrong_target", 2)] {
        let line = format!("fleetd_amqp_dead_lettered_total{{reason=\"{reason}\"}} {count}");
        assert!(scrape.contains(&line), "{line} in:\n{scrape}");
    }
    store.close().await.expect("close");
    conn.close(200, "done".into()).await.expect("close");
}

/// `rabbitmqctl` with `args`; its stdout, or why it failed.
fn rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let output = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .map_err(|err| format!("cannot run rabbitmqctl: {err}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "rabbitmqctl {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn ctl(args: &[&str]) -> String {
    rabbitmqctl(args).unwrap_or_else(|err| panic!("{err}"))
}

/// A vhost of the test's own, deleted (with its queues) when dropped.
struct Vhost(String);

impl Vhost {
    fn create() -> Self {
        let name = format!("{VHOST_PREFIX}{:08x}", fastrand::u32(..));
        ctl(&["add_vhost", &name]);
        let vhost = Self(name);
        ctl(&["set_permissions", "-p", &vhost.0, "guest", ".*", ".*", ".*"]);
        vhost
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:5672/{}", self.0)
    }

    /// `(queue, ready, unacknowledged)` for every queue of the vhost, as the broker last
    /// sampled them (quorum queues report every 5 s).
    fn queues(&self) -> Vec<(String, u64, u64)> {
        let listed = ctl(&[
            "list_queues",
            "-p",
            &self.0,
            "name",
            "messages_ready",
            "messages_unacknowledged",
            "--no-table-headers",
            "-q",
        ]);
        listed
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('\t');
                let name = fields.next()?.to_owned();
                let ready = fields.next()?.trim().parse().ok()?;
                let unacked = fields.next()?.trim().parse().ok()?;
                Some((name, ready, unacked))
            })
            .collect()
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Err(err) = rabbitmqctl(&["delete_vhost", &self.0]) {
            eprintln!("could not delete the test vhost {}: {err}", self.0);
        }
    }
}

/// The broker-wide consumer timeout (RabbitMQ 3.10 has no per-vhost one) set for the test and
/// restored when dropped, pass or fail. Runs on one machine are serialised by a file lock, and
/// the file keeps the original value while it is changed: a run killed before it could restore
/// (nextest's timeout, a SIGKILL) leaves it there, and the next run restores that, never the
/// test's own value.
struct ConsumerTimeout {
    previous: String,
    record: std::fs::File,
}

/// Vhosts this test creates are named so; while holding the lock, any left by a killed run are
/// deleted.
const VHOST_PREFIX: &str = "fleetd-test-";

impl ConsumerTimeout {
    fn set(millis: u64) -> Self {
        use std::io::{Read as _, Seek as _, Write as _};
        let mut record = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(std::env::temp_dir().join("fleetd-consumer-timeout.lock"))
            .expect("open the lock file");
        record.lock().expect("lock the consumer-timeout setting");
        let mut left = String::new();
        record
            .read_to_string(&mut left)
            .expect("read the lock file");
        let previous = if left.trim().is_empty() {
            ctl(&["eval", "application:get_env(rabbit, consumer_timeout)."])
                .trim()
                .to_owned()
        } else {
            eprintln!("a killed run left the consumer timeout changed; its original: {left}");
            left.trim().to_owned()
        };
        record.set_len(0).expect("truncate the lock file");
        record.rewind().expect("rewind the lock file");
        record
            .write_all(previous.as_bytes())
            .and_then(|()| record.sync_all())
            .expect("record the original consumer timeout");
        for vhost in ctl(&["list_vhosts", "-q"]).lines() {
            if vhost.starts_with(VHOST_PREFIX) {
                let _ = rabbitmqctl(&["delete_vhost", vhost]);
            }
        }
        ctl(&[
            "eval",
            &format!("application:set_env(rabbit, consumer_timeout, {millis})."),
        ]);
        Self { previous, record }
    }
}

impl Drop for ConsumerTimeout {
    fn drop(&mut self) {
        // `{ok,1800000}` or `undefined`.
        let restore = match self
            .previous
            .strip_prefix("{ok,")
            .and_then(|rest| rest.strip_suffix('}'))
        {
            Some(value) => format!("application:set_env(rabbit, consumer_timeout, {value})."),
            None => "application:unset_env(rabbit, consumer_timeout).".to_owned(),
        };
        match rabbitmqctl(&["eval", &restore]) {
            // Restored: nothing left for a later run to repair.
            Ok(_) => {
                let _ = self.record.set_len(0);
            }
            Err(err) => eprintln!(
                "could not restore the consumer timeout ({}): {err}",
                self.previous
            ),
        }
    }
}

/// A raw channel holding one delivery unacknowledged, as fleetd's old held window did: the
/// control that shows the consumer timeout really fires during the test.
struct Control {
    conn: Connection,
    channel: Channel,
}

impl Control {
    async fn hold(url: &str) -> Self {
        let conn = connect(url).await;
        let queue = "control";
        declare(&conn, queue, old_arguments())
            .await
            .expect("control queue");
        if ready(&conn, queue).await == 0 {
            publish_raw(&raw_publisher(&conn).await, queue, b"held").await;
        }
        let channel = conn.create_channel().await.expect("channel");
        let got = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .expect("get");
        assert!(got.is_some(), "the control message is there to hold");
        Self { conn, channel }
    }

    fn timed_out(&self) -> bool {
        !self.channel.status().connected()
    }
}

/// Checks `store` holds exactly `expected` for each target (order, no duplicate).
async fn check(store: &dyn InboxStore, expected: &[(Target, Vec<Message>)], when: &str) {
    for (target, pending) in expected {
        let seen = store.peek(target, 10_000).await.expect("peek");
        let unique: BTreeSet<MsgId> = ids(&seen).into_iter().collect();
        assert_eq!(unique.len(), seen.len(), "{when}: a reply shown twice");
        assert_eq!(ids(&seen), ids(pending), "{when}: {target}'s inbox");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::disallowed_methods,
    reason = "the test reports how long the broker took to time the control out"
)]
async fn amqp_inbox_holds_nothing_on_the_broker_across_consumer_timeouts_and_restarts() {
    const PER_TARGET: usize = 40;
    if require_rabbitmq() == Service::Skip {
        return;
    }
    if require(
        "rabbitmqctl",
        rabbitmqctl(&["list_vhosts", "-q"]).is_ok(),
        "Run the tests as a user that may run rabbitmqctl (root under .ci/run).",
    ) == Service::Skip
    {
        return;
    }
    // FLEETD_AMQP_LONG=1: wait for five timeouts (each takes up to a minute on 3.10), about six
    // minutes; nextest stops a test at five, so run that with `cargo test` (README, Tests).
    let timeouts_wanted = if std::env::var("FLEETD_AMQP_LONG").is_ok_and(|v| v == "1") {
        5
    } else {
        1
    };
    // The timeout (and its lock) first: the vhost is dropped before it, while the lock is held.
    let _timeout = ConsumerTimeout::set(5_000);
    let vhost = Vhost::create();
    let url = vhost.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&url, dir.path()).await;
    let mut expected: Vec<(Target, Vec<Message>)> = ["alpha", "beta", "gamma"]
        .into_iter()
        .map(|name| (Target::new(name).expect("valid"), Vec::new()))
        .collect();
    let (mut published, mut acked, mut restarts, mut rounds) = (0, 0, 0, 0);
    for (target, pending) in &mut expected {
        for n in 0..PER_TARGET {
            let reply = message(target, &format!("reply {n}"));
            store.publish(reply.clone()).await.expect("publish");
            pending.push(reply);
            published += 1;
        }
    }
    let mut control = Control::hold(&url).await;
    let mut held_since = std::time::Instant::now();
    let mut timeouts = Vec::new();
    while timeouts.len() < timeouts_wanted {
        rounds += 1;
        let when = format!("round {rounds}");
        // Activity: a reply more per target, two acknowledged, the rest read and kept.
        for (target, pending) in &mut expected {
            let reply = message(target, &format!("late reply {rounds}"));
            store.publish(reply.clone()).await.expect("publish");
            pending.push(reply);
            published += 1;
            for _ in 0..2 {
                let oldest = pending.remove(0);
                assert!(
                    store.ack(target, oldest.msg_id).await.expect("ack"),
                    "{when}"
                );
                acked += 1;
            }
        }
        check(&*store, &expected, &when).await;
        if rounds % 2 == 0 {
            store.close().await.expect("close");
            store = open(&url, dir.path()).await;
            restarts += 1;
            check(&*store, &expected, &format!("{when}, after a restart")).await;
        }
        // Quiet: only reads for longer than the broker's 5 s sampling, then what it sampled
        // must show nothing held by fleetd — while the control's delivery shows as held.
        for _ in 0..7 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            check(&*store, &expected, &when).await;
        }
        for (queue, ready, unacked) in vhost.queues() {
            if queue.starts_with("agent.") {
                assert_eq!((ready, unacked), (0, 0), "{when}: {queue} on the broker");
            } else if queue == "control" && !control.timed_out() {
                assert_eq!(unacked, 1, "{when}: the sampling sees a held delivery");
            }
        }
        if control.timed_out() {
            timeouts.push(held_since.elapsed());
            eprintln!(
                "{when}: the broker timed the control's delivery out after {:.1} s",
                held_since.elapsed().as_secs_f64()
            );
            let _ = control.conn.close(200, "done".into()).await;
            control = Control::hold(&url).await;
            held_since = std::time::Instant::now();
        } else {
            assert!(
                held_since.elapsed() < Duration::from_secs(180),
                "the consumer timeout never fired: the test proved nothing"
            );
        }
    }
    // Every reply once, then all acknowledged, and a restarted store finds nothing to redo.
    check(&*store, &expected, "at the end").await;
    for (target, pending) in &expected {
        let drained = store.drain(target).await.expect("drain");
        assert_eq!(ids(&drained), ids(pending), "{target} drained");
        acked += drained.len();
    }
    store.close().await.expect("close");
    let store = open(&url, dir.path()).await;
    for (target, _) in &expected {
        assert_eq!(store.depth(target).await.expect("depth"), 0, "{target}");
    }
    store.close().await.expect("close");
    let _ = control.conn.close(200, "done".into()).await;
    let waits: Vec<String> = timeouts
        .iter()
        .map(|d| format!("{:.1} s", d.as_secs_f64()))
        .collect();
    eprintln!(
        "consumer timeout 5 s: {} timeouts of a held control delivery (after {}), {rounds} rounds, {restarts} restarts; {published} replies published, {acked} acknowledged, 0 lost, 0 duplicated, 0 held on the broker at any check",
        timeouts.len(),
        waits.join(", ")
    );
}

//! Integration tests: the inbox store. One conformance story runs against every backend (memory,
//! embedded SQLite in a tempdir, AMQP on the local RabbitMQ), plus the backend-specific promises:
//! the embedded store's single-owner lock across processes and AMQP reconnects.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd::store::{
    self, AmqpStore, InboxStore, LockHolder, MemoryStore, Page, PageRequest, PublishOutcome,
    StoreError, StoreOptions, StoreSpec,
};
use fleetd_core::{Message, MessageError, MessageKind, MessageLimits, MsgId, Target, Ticket};
use fleetd_testkit::{RABBITMQ_ADDR, RABBITMQ_URL, Service, require_rabbitmq};
use tokio::io::AsyncBufReadExt;

/// A backend under test: how to (re)open it and how to name targets so runs never collide.
trait Backend {
    /// Opens the store; the second call must see everything the first left behind.
    async fn open(&self) -> Arc<dyn InboxStore>;
    /// A target for `base`, unique to this run where the backend is shared (a broker).
    fn target(&self, base: &str) -> Target;
}

struct Memory(MemoryStore);

impl Backend for Memory {
    async fn open(&self) -> Arc<dyn InboxStore> {
        // Clones share contents: "reopening" is a new handle on the same state.
        Arc::new(self.0.clone())
    }
    fn target(&self, base: &str) -> Target {
        Target::new(base).expect("valid target")
    }
}

struct Embedded(tempfile::TempDir);

impl Backend for Embedded {
    async fn open(&self) -> Arc<dyn InboxStore> {
        let spec = StoreSpec::Embedded {
            path: self.0.path().join("inbox.db"),
        };
        store::open(&spec, &StoreOptions::default())
            .await
            .expect("open the embedded store")
    }
    fn target(&self, base: &str) -> Target {
        Target::new(base).expect("valid target")
    }
}

/// The AMQP backend on a broker, ingesting into a local file in its own tempdir. Targets get a
/// per-run prefix; their queues are deleted from the local broker when the fixture is dropped,
/// pass or fail.
pub(crate) struct Amqp {
    url: String,
    dir: tempfile::TempDir,
    run: String,
    used: Mutex<Vec<Target>>,
}

impl Amqp {
    pub(crate) fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            dir: tempfile::tempdir().expect("tempdir"),
            run: format!("t{:08x}", fastrand::u32(..)),
            used: Mutex::new(Vec::new()),
        }
    }

    /// Opens the store on the fixture's local file through the broker at `url`.
    async fn open_with(&self, url: &str) -> Arc<dyn InboxStore> {
        let spec = StoreSpec::Amqp {
            url: url.to_owned(),
            path: self.dir.path().join("inbox.db"),
        };
        store::open(&spec, &StoreOptions::default())
            .await
            .expect("open the AMQP store")
    }
}

impl Drop for Amqp {
    fn drop(&mut self) {
        let targets: Vec<Target> = self
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        if !targets.is_empty() {
            delete_queues_blocking(targets);
        }
    }
}

impl Backend for Amqp {
    async fn open(&self) -> Arc<dyn InboxStore> {
        self.open_with(&self.url).await
    }
    fn target(&self, base: &str) -> Target {
        let target = Target::new(format!("{}-{base}", self.run)).expect("valid target");
        self.used.lock().expect("not poisoned").push(target.clone());
        target
    }
}

/// Deletes the inbox and dead-letter queues of its targets on the local broker when dropped,
/// pass or fail.
pub(crate) struct QueueCleanup(pub(crate) Vec<Target>);

impl Drop for QueueCleanup {
    fn drop(&mut self) {
        delete_queues_blocking(std::mem::take(&mut self.0));
    }
}

/// Deletes the inbox and dead-letter queues of `targets` on the local broker from a thread with its own runtime,
/// so it also works while a failed test unwinds.
fn delete_queues_blocking(targets: Vec<Target>) {
    let cleanup = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("cleanup runtime")
            .block_on(delete_queues(&targets));
    });
    if cleanup.join().is_err() && !std::thread::panicking() {
        panic!("deleting the test queues failed");
    }
}

/// Deletes the inbox and dead-letter queues of `targets` on the local broker.
async fn delete_queues(targets: &[Target]) {
    use lapin::options::QueueDeleteOptions;
    let conn = lapin::Connection::connect(RABBITMQ_URL, lapin::ConnectionProperties::default())
        .await
        .expect("connect for cleanup");
    let channel = conn.create_channel().await.expect("cleanup channel");
    for target in targets {
        for queue in [
            AmqpStore::queue_name(target),
            AmqpStore::dead_letter_queue_name(target),
        ] {
            channel
                .queue_delete(queue.into(), QueueDeleteOptions::default())
                .await
                .expect("delete a test queue");
        }
    }
    conn.close(200, "cleanup done".into())
        .await
        .expect("close cleanup connection");
}

#[expect(
    clippy::disallowed_methods,
    reason = "test messages need fresh, ordered ids; no daemon clock here"
)]
fn message(target: &Target, n: u64, text: &str) -> Message {
    Message {
        msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
        target: target.clone(),
        ticket: n
            .is_multiple_of(2)
            .then(|| Ticket::from_uuid(uuid::Uuid::now_v7())),
        kind: MessageKind::ALL[usize::try_from(n).expect("small") % MessageKind::ALL.len()],
        text: text.to_owned(),
        from: "member-one".to_owned(),
        created_at: jiff::Timestamp::from_second(1_700_000_000 + i64::try_from(n).expect("small"))
            .expect("valid timestamp"),
    }
}

async fn publish_all(store: &dyn InboxStore, messages: &[Message]) {
    for m in messages {
        let outcome = store.publish(m.clone()).await.expect("publish");
        assert_eq!(
            outcome,
            PublishOutcome::Stored,
            "fresh message {}",
            m.msg_id
        );
    }
}

async fn peek_all(store: &dyn InboxStore, target: &Target) -> Vec<Message> {
    store.peek(target, 1000).await.expect("peek")
}

/// The targets `store` lists (those with anything pending).
async fn listed_targets(store: &dyn InboxStore) -> BTreeSet<Target> {
    store
        .targets()
        .await
        .expect("targets")
        .into_iter()
        .collect()
}

fn ids(messages: &[Message]) -> Vec<MsgId> {
    messages.iter().map(|m| m.msg_id).collect()
}

async fn page(
    store: &dyn InboxStore,
    target: &Target,
    after: Option<MsgId>,
    limit: usize,
    max_bytes: usize,
) -> Page {
    store
        .page(
            target,
            PageRequest {
                after,
                limit,
                max_bytes,
            },
        )
        .await
        .expect("page")
}

/// Paging (SPEC §3 `limit`, `after`, `more` and the byte budget) told the same way by every
/// backend, on a fresh target that it leaves empty.
async fn paging_story(store: &dyn InboxStore, pager: &Target, other: &Message) {
    let unlimited = usize::MAX;
    let empty = page(store, pager, None, 5, unlimited).await;
    assert_eq!(
        (empty.messages.len(), empty.more, empty.after_not_pending),
        (0, false, false),
        "an empty inbox is one empty last page"
    );
    // Texts of 10, 10, 30, 5, 5, 5 and 10 bytes.
    let sizes = [10, 10, 30, 5, 5, 5, 10];
    let pagers: Vec<Message> = sizes
        .iter()
        .enumerate()
        .map(|(n, len)| message(pager, n as u64, &"p".repeat(*len)))
        .collect();
    publish_all(store, &pagers).await;

    // Each page asked for — `after` (an index into `pagers`), the count limit and the byte
    // budget — and what it must hold (a range of `pagers`) and whether it says more wait.
    // First the count limit, with `after` continuing exactly where the last page ended; then
    // the byte budget: a page stops before the message that would take it over, but the first
    // message of a page is always there, however large.
    let pages = [
        (None, 3, unlimited, 0..3, true, "the first page"),
        (Some(2), 3, unlimited, 3..6, true, "the page after it"),
        (Some(5), 3, unlimited, 6..7, false, "the last page says so"),
        (Some(6), 3, unlimited, 7..7, false, "nothing after the last"),
        (
            Some(3),
            3,
            unlimited,
            4..7,
            false,
            "a page of exactly the rest has no more",
        ),
        (
            None,
            10,
            25,
            0..2,
            true,
            "10 + 10 fit in 25; 30 more does not",
        ),
        (
            Some(1),
            10,
            25,
            2..3,
            true,
            "30 bytes alone, over the budget",
        ),
        (
            Some(2),
            10,
            25,
            3..7,
            false,
            "5 + 5 + 5 + 10 = 25 fits exactly",
        ),
        (None, 10, 0, 0..1, true, "a zero budget still shows one"),
        (
            None,
            0,
            unlimited,
            0..0,
            true,
            "limit 0 only says more wait",
        ),
    ];
    for (after, limit, max_bytes, holds, more, why) in pages {
        let after = after.map(|n: usize| pagers[n].msg_id);
        let got = page(store, pager, after, limit, max_bytes).await;
        assert_eq!(got.messages, pagers[holds], "{why}");
        assert_eq!(
            (got.more, got.after_not_pending),
            (more, false),
            "{why}: more, after not pending"
        );
    }

    // Paging through by `more` sees every message exactly once, in order.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let next = page(store, pager, after, 2, unlimited).await;
        assert!(!next.after_not_pending);
        seen.extend(next.messages.iter().cloned());
        after = next.messages.last().map(|m| m.msg_id);
        if !next.more {
            break;
        }
    }
    assert_eq!(seen, pagers);

    // An `after` that is not pending here starts from the oldest and says so: an id never
    // seen, another target's message, and one acknowledged between two pages.
    let stranger = MsgId::from_uuid(uuid::Uuid::from_u128(
        0x0123_4567_89ab_7def_8123_4567_89ab_cdee,
    ));
    for (why, after) in [("unknown", stranger), ("another target's", other.msg_id)] {
        let restarted = page(store, pager, Some(after), 2, unlimited).await;
        assert_eq!(restarted.messages, pagers[..2], "{why}");
        assert!(restarted.after_not_pending && restarted.more, "{why}");
    }
    let read = page(store, pager, None, 3, unlimited).await;
    assert!(store.ack(pager, pagers[2].msg_id).await.expect("ack"));
    let next = page(
        store,
        pager,
        read.messages.last().map(|m| m.msg_id),
        3,
        unlimited,
    )
    .await;
    assert!(next.after_not_pending, "the cursor was acknowledged");
    assert_eq!(
        ids(&next.messages),
        ids(&[&pagers[..2], &pagers[3..4]].concat()),
        "from the oldest still pending: seen again, never missed"
    );
    // The usual way to read: acknowledge a page, then read the next from the oldest.
    let mut left = vec![pagers[0].clone(), pagers[1].clone()];
    left.extend_from_slice(&pagers[3..]);
    let mut read = Vec::new();
    loop {
        let next = page(store, pager, None, 2, unlimited).await;
        for m in &next.messages {
            assert!(store.ack(pager, m.msg_id).await.expect("ack"));
        }
        read.extend(next.messages);
        if !next.more {
            break;
        }
    }
    assert_eq!(read, left);
    assert_eq!(store.depth(pager).await.expect("depth"), 0);
}

/// The one story every backend must tell the same way.
async fn conformance_story(backend: &impl Backend) {
    let store = backend.open().await;
    let alice = backend.target("alice");
    let bob = backend.target("bob");
    let carol = backend.target("carol");
    store.health().await.expect("a fresh store is healthy");

    // An empty inbox: nothing to see, and acking an unknown id is an answer, not an error.
    assert!(peek_all(&*store, &alice).await.is_empty());
    assert_eq!(store.depth(&alice).await.expect("depth"), 0);
    let stranger = MsgId::from_uuid(uuid::Uuid::from_u128(
        0x0123_4567_89ab_7def_8123_4567_89ab_cdef,
    ));
    assert!(
        !store
            .ack(&alice, stranger)
            .await
            .expect("ack of unknown id is not an error")
    );
    assert!(store.drain(&alice).await.expect("drain").is_empty());

    // Ordering per target, with two targets interleaved.
    let alices: Vec<Message> = (0..10)
        .map(|n| message(&alice, n, &format!("alice {n}")))
        .collect();
    let bobs: Vec<Message> = (0..5)
        .map(|n| message(&bob, n, &format!("bob {n}")))
        .collect();
    for (n, m) in alices.iter().enumerate() {
        publish_all(&*store, std::slice::from_ref(m)).await;
        if let Some(b) = bobs.get(n) {
            publish_all(&*store, std::slice::from_ref(b)).await;
        }
    }
    assert_eq!(
        peek_all(&*store, &alice).await,
        alices,
        "alice in publish order"
    );
    assert_eq!(peek_all(&*store, &bob).await, bobs, "bob in publish order");
    // Peek is non-destructive and honours its limit.
    assert_eq!(store.peek(&alice, 3).await.expect("peek"), alices[..3]);
    assert_eq!(store.peek(&alice, 3).await.expect("peek"), alices[..3]);
    assert_eq!(store.depth(&alice).await.expect("depth"), 10);
    assert_eq!(store.depth(&bob).await.expect("depth"), 5);

    // Idempotent publish: the same id again is a duplicate, even with different content.
    assert_eq!(
        store.publish(alices[0].clone()).await.expect("publish"),
        PublishOutcome::Duplicate
    );
    let mut altered = alices[3].clone();
    altered.text = "a different body under the same id".to_owned();
    assert_eq!(
        store.publish(altered).await.expect("publish"),
        PublishOutcome::Duplicate
    );
    assert_eq!(
        peek_all(&*store, &alice).await,
        alices,
        "duplicates changed nothing"
    );
    assert_eq!(store.depth(&alice).await.expect("depth"), 10);

    // Ack removes exactly one message of exactly that target.
    assert!(store.ack(&alice, alices[0].msg_id).await.expect("ack"));
    assert!(
        !store
            .ack(&alice, alices[0].msg_id)
            .await
            .expect("second ack")
    );
    assert!(
        !store
            .ack(&bob, alices[1].msg_id)
            .await
            .expect("ack on the wrong target")
    );
    assert!(
        store
            .ack(&alice, alices[5].msg_id)
            .await
            .expect("ack out of order")
    );
    let expected: Vec<Message> = alices
        .iter()
        .enumerate()
        .filter(|(n, _)| ![0, 5].contains(n))
        .map(|(_, m)| m.clone())
        .collect();
    assert_eq!(peek_all(&*store, &alice).await, expected);
    assert_eq!(store.depth(&alice).await.expect("depth"), 8);
    // A late duplicate of an acknowledged message does not bring it back.
    assert_eq!(
        store.publish(alices[0].clone()).await.expect("publish"),
        PublishOutcome::Duplicate
    );
    assert_eq!(store.depth(&alice).await.expect("depth"), 8);

    // Large and unicode bodies come back byte for byte; one byte over the limit is refused.
    let limit = MessageLimits::DEFAULT_MAX_MESSAGE_BYTES;
    let largest = "é".repeat(limit / 2);
    assert_eq!(largest.len(), limit);
    let unicode = "héllo wörld 🌍🚀 — 日本語 العربية\nline two\ttab \u{0} nul \u{200d} zwj \"quotes\" \\ '; DROP TABLE messages; --";
    let carols = vec![message(&carol, 0, &largest), message(&carol, 1, unicode)];
    publish_all(&*store, &carols).await;
    assert_eq!(peek_all(&*store, &carol).await, carols);
    let too_big = message(&carol, 2, &"x".repeat(limit + 1));
    match store.publish(too_big).await {
        Err(StoreError::Refused(MessageError::TooLarge { size, limit: named })) => {
            assert_eq!((size, named), (limit + 1, limit));
        }
        other => panic!("an oversized message must be refused, got {other:?}"),
    }
    let refusal = store
        .publish(message(&carol, 3, &"y".repeat(limit + 10)))
        .await
        .expect_err("refused");
    assert!(
        refusal
            .to_string()
            .contains("inbox.maxMessageBytes = 1048576"),
        "{refusal}"
    );
    assert_eq!(
        store.depth(&carol).await.expect("depth"),
        2,
        "refusals stored nothing"
    );

    // Many targets at once, each keeping its own order.
    let many: Vec<Target> = (0..20)
        .map(|n| backend.target(&format!("many{n}")))
        .collect();
    let mut expected_many = BTreeMap::new();
    let mut writers = tokio::task::JoinSet::new();
    for target in &many {
        let batch: Vec<Message> = (0..3)
            .map(|n| message(target, n, &format!("{target} {n}")))
            .collect();
        expected_many.insert(target.clone(), batch.clone());
        let store = Arc::clone(&store);
        writers.spawn(async move { publish_all(&*store, &batch).await });
    }
    while let Some(done) = writers.join_next().await {
        done.expect("publisher task");
    }
    for (target, batch) in &expected_many {
        assert_eq!(&peek_all(&*store, target).await, batch, "{target}");
    }

    // Many concurrent publishers on one target: every message lands exactly once.
    let crowd = backend.target("crowd");
    let crowd_messages: Vec<Message> = (0..64)
        .map(|n| message(&crowd, n, &format!("crowd {n}")))
        .collect();
    let mut writers = tokio::task::JoinSet::new();
    for m in crowd_messages.clone() {
        let store = Arc::clone(&store);
        writers.spawn(async move { store.publish(m).await.expect("publish") });
    }
    while let Some(outcome) = writers.join_next().await {
        assert_eq!(outcome.expect("publisher task"), PublishOutcome::Stored);
    }
    let landed: BTreeSet<MsgId> = ids(&peek_all(&*store, &crowd).await).into_iter().collect();
    assert_eq!(
        landed,
        ids(&crowd_messages).into_iter().collect::<BTreeSet<_>>()
    );
    assert_eq!(store.depth(&crowd).await.expect("depth"), 64);

    paging_story(&*store, &backend.target("pager"), &bobs[0]).await;

    let mut all_targets: BTreeSet<Target> = [&alice, &bob, &carol, &crowd]
        .into_iter()
        .cloned()
        .collect();
    all_targets.extend(many.iter().cloned());
    assert_eq!(listed_targets(&*store).await, all_targets);

    // Drain = peek + ack, in order, leaving the target empty.
    assert_eq!(store.drain(&bob).await.expect("drain"), bobs);
    assert_eq!(store.depth(&bob).await.expect("depth"), 0);
    assert!(peek_all(&*store, &bob).await.is_empty());
    assert!(store.drain(&bob).await.expect("second drain").is_empty());
    all_targets.remove(&bob);

    // Reopen keeps everything: same messages, same order, nothing doubled.
    let mut snapshot = BTreeMap::new();
    for target in &all_targets {
        snapshot.insert(target.clone(), peek_all(&*store, target).await);
    }
    store.close().await.expect("close");
    drop(store);
    let store = backend.open().await;
    for (target, before) in &snapshot {
        assert_eq!(
            &peek_all(&*store, target).await,
            before,
            "{target} after reopen"
        );
        assert_eq!(
            store.depth(target).await.expect("depth"),
            before.len() as u64,
            "{target}"
        );
    }
    assert_eq!(
        listed_targets(&*store).await,
        all_targets,
        "targets after reopen"
    );
    // A pending message published again after the reopen is still a duplicate.
    assert_eq!(
        store.publish(alices[2].clone()).await.expect("publish"),
        PublishOutcome::Duplicate
    );
    assert_eq!(store.depth(&alice).await.expect("depth"), 8);

    // Leave nothing behind, and check drain agrees with the snapshot.
    for (target, before) in &snapshot {
        assert_eq!(
            &store.drain(target).await.expect("drain"),
            before,
            "{target}"
        );
    }
    assert!(store.targets().await.expect("targets").is_empty());
    store.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conformance() {
    conformance_story(&Memory(MemoryStore::new(MessageLimits::default()))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_conformance() {
    conformance_story(&Embedded(tempfile::tempdir().expect("tempdir"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_store_conformance() {
    if require_rabbitmq() == Service::Skip {
        return;
    }
    conformance_story(&Amqp::new(RABBITMQ_URL)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_refuses_a_second_owner_naming_its_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let mut owner = tokio::process::Command::new(env!("CARGO_BIN_EXE_inbox-crash-writer"))
        .args(["embedded", path.to_str().expect("utf-8 path"), "1", "owner"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the owner");
    let pid = owner.id().expect("running");
    let stdout = owner.stdout.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the owner starts within 30 s")
        .expect("read stdout");
    assert_eq!(first.as_deref(), Some("ready"));

    let spec = StoreSpec::Embedded { path: path.clone() };
    let err = store::open(&spec, &StoreOptions::default())
        .await
        .expect_err("a second owner must be refused");
    match &err {
        StoreError::Locked { holder, .. } => assert_eq!(*holder, LockHolder::Pid(pid)),
        other => panic!("expected Locked, got {other:?}"),
    }
    let text = format!("failed to {err}");
    assert!(text.contains(&format!("pid {pid}")), "{text}");
    assert!(text.contains(&path.display().to_string()), "{text}");

    // kill -9 leaves no stale lock: the kernel releases it with the process.
    owner.kill().await.expect("kill the owner");
    let store = store::open(&spec, &StoreOptions::default())
        .await
        .expect("the lock is free once its owner died");
    assert!(
        store
            .depth(&Target::new("owner").expect("valid"))
            .await
            .is_ok()
    );
    store.close().await.expect("close");
}

/// A TCP proxy in front of the broker that can cut every connection and refuse new ones for a
/// while: from the client's side, exactly what a broker restart looks like.
struct Proxy {
    addr: SocketAddr,
    down: Arc<std::sync::atomic::AtomicBool>,
    links: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let links = Arc::new(Mutex::new(Vec::new()));
        let (accept_down, accept_links) = (Arc::clone(&down), Arc::clone(&links));
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if accept_down.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let link = tokio::spawn(async move {
                    if let Ok(mut broker) = tokio::net::TcpStream::connect(RABBITMQ_ADDR).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut broker).await;
                    }
                });
                accept_links
                    .lock()
                    .expect("not poisoned")
                    .push(link.abort_handle());
            }
        });
        Self { addr, down, links }
    }

    /// Cuts every live connection and refuses new ones until `up` is called.
    fn cut(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        for link in self.links.lock().expect("not poisoned").drain(..) {
            link.abort();
        }
    }

    fn up(&self) {
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_store_reconnects_without_losing_or_doubling_messages() {
    if require_rabbitmq() == Service::Skip {
        return;
    }
    let proxy = Arc::new(Proxy::start().await);
    let backend = Amqp::new(&format!("amqp://guest:guest@{}/%2f", proxy.addr));
    let store = backend.open().await;
    let target = backend.target("reconnect");
    let first: Vec<Message> = (0..5)
        .map(|n| message(&target, n, &format!("before {n}")))
        .collect();
    publish_all(&*store, &first).await;
    // Read three, then lose the connection under the reader.
    assert_eq!(store.peek(&target, 3).await.expect("peek"), first[..3]);
    proxy.cut();
    // With the broker gone, health says so and the local inbox still answers.
    let mut health = Ok(());
    for _ in 0..100 {
        health = store.health().await;
        if health.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match health {
        Err(StoreError::Unavailable(why)) => assert!(!why.is_empty()),
        other => panic!("health with the broker cut: {other:?}"),
    }
    assert_eq!(store.peek(&target, 3).await.expect("peek"), first[..3]);
    assert_eq!(store.depth(&target).await.expect("depth"), 5);
    let reopen = Arc::clone(&proxy);
    let outage = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        reopen.up();
    });
    // Publishing during the outage waits for the reconnect and then succeeds.
    let second: Vec<Message> = (5..10)
        .map(|n| message(&target, n, &format!("after {n}")))
        .collect();
    publish_all(&*store, &second).await;
    outage.await.expect("outage task");

    let all: Vec<Message> = first.iter().chain(&second).cloned().collect();
    let seen = peek_all(&*store, &target).await;
    let unique: HashSet<MsgId> = ids(&seen).into_iter().collect();
    assert_eq!(
        unique.len(),
        seen.len(),
        "no message shown twice: {:?}",
        ids(&seen)
    );
    assert_eq!(seen, all, "nothing lost, original order kept");
    assert_eq!(store.depth(&target).await.expect("depth"), 10);

    // Cut again while everything is held, then ack all of it through the new connection.
    proxy.cut();
    proxy.up();
    for m in &all {
        assert!(
            store.ack(&target, m.msg_id).await.expect("ack"),
            "ack {}",
            m.msg_id
        );
    }
    assert_eq!(store.depth(&target).await.expect("depth"), 0);
    store.close().await.expect("close");

    // The restarted daemon, straight on the broker, finds nothing left: nothing was held on
    // the broker, and the acks are in the local file.
    let store = backend.open_with(RABBITMQ_URL).await;
    assert_eq!(store.depth(&target).await.expect("depth"), 0);
    assert!(peek_all(&*store, &target).await.is_empty());
    store.close().await.expect("close");
}

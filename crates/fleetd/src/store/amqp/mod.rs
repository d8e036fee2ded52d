//! The AMQP 0.9.1 inbox backend (RabbitMQ, LavinMQ). The broker is the transport, the daemon's
//! embedded file is the inbox: a publish goes to the target's durable quorum queue
//! `agent.<target>.inbox` with publisher confirms, and an ingest moves what waits in that queue
//! into the local inbox — commit locally (dedup by msgId), then `basic.ack` — so `peek`, `page`,
//! `ack`, `drain` and `depth` read and settle the local file. Knows lapin and the broker's
//! semantics; must not know who publishes or why.
//!
//! Architecture invariant: no delivery is held unacknowledged on the broker beyond its step's
//! commit and a few milliseconds of ack coalescing, and none is acked before the local commit
//! that holds it. RabbitMQ's consumer timeout (30 min by default) closes a channel that holds a
//! delivery too long and requeues it, and a message requeued `x-delivery-limit` times is
//! dead-lettered (on RabbitMQ 4.0–4.2 without a dead-letter queue: dropped).
//!
//! How messages move: a publish sends to the queue and commits to the local file at once
//! (`publish`); every queue this daemon uses has one standing consumer (`consumer`) that
//! commits what the broker pushes — another process's messages, and the broker's copies of this
//! daemon's own, which it finds known — and acks it. A queue is opened once per connection
//! (`Inner::open_queue`): declared (a legacy one migrated), what waits in it pulled in by a
//! counted ingest (`ingest`), then its consumer started — at start-up for every known queue, on
//! the first publish or read of a target, and by the sweep every [`SWEEP_INTERVAL`] (recovery
//! after an outage). Reads answer from the local file at once when the queue's consumer runs.
//!
//! Every inbox queue has an explicit `x-delivery-limit` and a dead-letter queue
//! `agent.<target>.dead`; a message fleetd cannot decode is rejected into it. Queues declared
//! by fleetd's first releases (no such arguments) are migrated on first use: see `ingest`.

mod consumer;
mod ingest;
mod lanes;
pub mod link;
mod publish;
mod session;
mod tls;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;

use fleetd_core::{Message, MessageLimits, MsgId, Target};

use super::sqlite::SqliteStore;
use super::{
    InboxStore, Page, PageRequest, PublishOutcome, StateOp, StateRecord, StateStore, StoreError,
    StoreFuture, StoreOptions,
};
use consumer::Consumers;
use session::{Backoff, Failure, Session};

/// How often every known queue is ingested even when nobody reads or publishes: picks up what
/// other publishers left and reconnects after an outage. Reads and publishes ingest at once, so
/// this only bounds how long such a message waits on the broker.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Longest a read waits for the ingest of its target before it answers from the local inbox
/// alone (the ingest carries on in the background). A live broker answers in milliseconds.
const READ_INGEST_WAIT: Duration = Duration::from_secs(2);

/// The tracing target of the per-step timings (`trace` level) the benchmark reads: a publish's
/// broker confirm and its local commit (both from its start: they run at once), and each
/// consumer step's commit.
pub const PROFILE: &str = "fleetd::amqp::profile";

/// The `fleet_state` kind under which the local file records the targets whose queues this
/// daemon uses, so the sweep knows them after a restart (AMQP 0.9.1 cannot list queues). The
/// engine skips kinds it does not know.
const QUEUE_RECORD: &str = "store.amqp.queue";

fn queue_name(target: &Target) -> String {
    AmqpStore::queue_name(target)
}

fn dead_letter_queue_name(target: &Target) -> String {
    AmqpStore::dead_letter_queue_name(target)
}

/// A queue declare that creates nothing: the broker answers the queue's counts, or closes the
/// channel with 404 when there is no such queue. It checks no permission, so any user of the
/// vhost may count any queue (and learns nothing else).
fn passive() -> lapin::options::QueueDeclareOptions {
    lapin::options::QueueDeclareOptions {
        passive: true,
        ..lapin::options::QueueDeclareOptions::default()
    }
}

/// The inbox on an AMQP broker, read and acknowledged in the local file. See the module docs.
pub struct AmqpStore {
    inner: Arc<Inner>,
    sweeper: tokio::task::AbortHandle,
}

impl fmt::Debug for AmqpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpStore")
            .field("url", &redact_url(&self.inner.url))
            .field("local", &self.inner.local.path())
            .finish_non_exhaustive()
    }
}

/// What the store's tasks share.
struct Inner {
    url: String,
    limits: MessageLimits,
    local: Arc<SqliteStore>,
    session: AsyncMutex<Option<Arc<Session>>>,
    generation: AtomicU64,
    /// Targets whose queues this daemon uses, as recorded in the local file.
    known: Mutex<BTreeSet<Target>>,
    /// Per target, the lock that keeps its declaration, migration and ingests apart.
    locks: Mutex<BTreeMap<Target, Arc<AsyncMutex<()>>>>,
    /// Ids being published right now (a concurrent second publish of one is a duplicate), and
    /// whether each one's local commit is done.
    in_flight: consumer::Flights,
    /// The standing consumer of every queue this daemon uses.
    consumers: Consumers,
    /// Per target, the publishes that go to the broker together.
    lanes: lanes::Lanes,
    /// Whether the last sweep found the broker unreachable (to log only the changes).
    broker_down: AtomicBool,
    closed: AtomicBool,
}

impl AmqpStore {
    /// The broker-side name of a target's inbox queue: `agent.<target>.inbox`.
    pub fn queue_name(target: &Target) -> String {
        format!("agent.{target}.inbox")
    }

    /// The broker-side name of a target's dead-letter queue: `agent.<target>.dead`. It receives
    /// what fleetd could not decode and what exceeded the delivery limit.
    pub fn dead_letter_queue_name(target: &Target) -> String {
        format!("agent.{target}.dead")
    }

    /// Connects to the broker at `url` (retrying for up to 30 s, so a wrong URL or a dead broker
    /// fails at start-up), then ingests every queue `local` knows from earlier runs into it.
    /// `local` is the embedded file that holds the inbox (and the fleet state).
    pub async fn open(
        url: &str,
        local: Arc<SqliteStore>,
        options: StoreOptions,
    ) -> Result<Self, StoreError> {
        let known: BTreeSet<Target> = local
            .load_state()
            .await?
            .into_iter()
            .filter(|record| record.kind == QUEUE_RECORD)
            .filter_map(|record| Target::new(record.key).ok())
            .collect();
        let inner = Arc::new(Inner {
            url: url.to_owned(),
            limits: options.limits,
            local,
            session: AsyncMutex::new(None),
            generation: AtomicU64::new(0),
            known: Mutex::new(known.clone()),
            locks: Mutex::new(BTreeMap::new()),
            in_flight: Mutex::default(),
            consumers: Consumers::default(),
            lanes: lanes::Lanes::default(),
            broker_down: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        let mut backoff = Backoff::new();
        loop {
            match inner.session().await {
                Ok(_) => break,
                Err(Failure::Fatal(err)) => return Err(err),
                Err(Failure::Transient(why)) => {
                    backoff.pause("connect to the AMQP broker", &why).await?
                }
            }
        }
        tracing::info!(url = %redact_url(url), queues = known.len(), "AMQP inbox connected");
        // What waited on the broker (a reply confirmed just before a crash) is in the local
        // inbox before the engine first reads the depths.
        inner.keep_consuming().await;
        let sweeper = tokio::spawn(sweep(Arc::downgrade(&inner))).abort_handle();
        Ok(Self { inner, sweeper })
    }
}

impl Drop for AmqpStore {
    fn drop(&mut self) {
        self.sweeper.abort();
        self.inner.consumers.abort_all();
    }
}

/// Every [`SWEEP_INTERVAL`] until the store is closed or dropped: a consumer for every known
/// queue, reconnecting first when the broker was lost.
async fn sweep(inner: Weak<Inner>) {
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closed.load(Ordering::SeqCst) {
            return;
        }
        inner.keep_consuming().await;
    }
}

impl Inner {
    /// The live session, connecting first when there is none (one attempt).
    async fn session(&self) -> Result<Arc<Session>, Failure> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Failure::Fatal(StoreError::Closed));
        }
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref().filter(|s| s.alive()) {
            return Ok(Arc::clone(session));
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let session = Arc::new(Session::connect(&self.url, generation).await?);
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Forgets `session` (if still current) so the next call reconnects.
    async fn invalidate(&self, session: &Session) {
        let mut slot = self.session.lock().await;
        if slot
            .as_ref()
            .is_some_and(|s| s.generation == session.generation)
        {
            *slot = None;
        }
    }

    fn lock(&self, target: &Target) -> Arc<AsyncMutex<()>> {
        Arc::clone(
            crate::sync::lock(&self.locks)
                .entry(target.clone())
                .or_default(),
        )
    }

    fn is_known(&self, target: &Target) -> bool {
        crate::sync::lock(&self.known).contains(target)
    }

    /// Records that this daemon uses `target`'s queue (once per target, durably).
    async fn remember(&self, target: &Target) -> Result<(), StoreError> {
        if self.is_known(target) {
            return Ok(());
        }
        self.local
            .commit_state(vec![StateOp::Put(StateRecord {
                kind: QUEUE_RECORD.to_owned(),
                key: target.to_string(),
                value: "{}".to_owned(),
            })])
            .await?;
        crate::sync::lock(&self.known).insert(target.clone());
        Ok(())
    }

    /// Brings what waits on the broker for `target` into the local inbox before a read: at once
    /// when the broker is connected, never waiting for a reconnect, and for at most
    /// [`READ_INGEST_WAIT`].
    async fn refresh(self: &Arc<Self>, target: &Target) {
        // A connect in progress holds the slot (up to its timeout): do not wait for it.
        let live = match self.session.try_lock() {
            Ok(slot) => slot.clone().filter(|s| s.alive()),
            Err(_) => None,
        };
        let Some(session) = live else { return };
        if self.consumers.is_running(target, session.generation) {
            // What the broker holds is pushed to the consumer as it comes.
            return;
        }
        let (inner, target) = (Arc::clone(self), target.clone());
        let task = tokio::spawn(async move {
            if !inner.is_known(&target) {
                // A target this daemon never published to: only a queue that exists (a legacy
                // fleetd's, another publisher's) is worth declaring and ingesting.
                match ingest::exists(&session, &target).await {
                    Ok(true) => inner.remember(&target).await.map_err(Failure::Fatal)?,
                    Ok(false) => return Ok(()),
                    Err(failure) => return Err(failure),
                }
            }
            inner.open_queue(&session, &target).await
        });
        match tokio::time::timeout(READ_INGEST_WAIT, task).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(failure))) => {
                tracing::warn!(error = %failure, "cannot ingest the AMQP queue before a read; answering from the local inbox");
            }
            Ok(Err(join)) => tracing::error!(error = %join, "an AMQP ingest task failed"),
            Err(_) => tracing::warn!(
                wait_ms = READ_INGEST_WAIT.as_millis(),
                "the AMQP ingest before a read is slow; answering from the local inbox"
            ),
        }
    }

    /// Readies `target`'s queue on `session` for its standing consumer: declared (a legacy
    /// queue migrated), what waits in it now committed locally, the consumer started. Free once
    /// the consumer runs; runs as a task of its own, so a cancelled caller never leaves a
    /// migration or an ingest half done.
    async fn open_queue(
        self: &Arc<Self>,
        session: &Arc<Session>,
        target: &Target,
    ) -> Result<(), Failure> {
        if self.consumers.is_running(target, session.generation) {
            return Ok(());
        }
        let (inner, on, owned) = (Arc::clone(self), Arc::clone(session), target.clone());
        let result = tokio::spawn(async move {
            inner.ingest(&on, &owned).await?;
            inner.ensure_consumer(&on, &owned);
            Ok(())
        })
        .await
        .map_err(|join| Failure::Transient(format!("the queue's ingest task failed: {join}")))?;
        if matches!(result, Err(Failure::Transient(_))) {
            self.invalidate(session).await;
        }
        result
    }

    /// A consumer for every known queue on the live session (what waits in the queue committed
    /// first), connecting first when there is none (one attempt).
    async fn keep_consuming(self: &Arc<Self>) {
        let session = match self.session().await {
            Ok(session) => session,
            Err(Failure::Transient(why)) => {
                self.unreachable(&why);
                return;
            }
            Err(Failure::Fatal(err)) => {
                tracing::debug!(error = %err, "no AMQP consumers started");
                return;
            }
        };
        self.reachable();
        let targets: Vec<Target> = crate::sync::lock(&self.known).iter().cloned().collect();
        for target in &targets {
            match self.open_queue(&session, target).await {
                Ok(()) => {}
                Err(Failure::Transient(why)) => {
                    // One unreachable broker is enough to know: the next sweep tries again.
                    self.unreachable(&why);
                    return;
                }
                Err(Failure::Fatal(err)) => {
                    tracing::warn!(%target, error = %err, "cannot open the AMQP queue; the next sweep tries again");
                }
            }
        }
    }

    /// Notes that the broker answered, logging the change from unreachable.
    fn reachable(&self) {
        if self.broker_down.swap(false, Ordering::SeqCst) {
            tracing::info!("AMQP broker reachable again");
        }
    }

    /// Notes that the broker could not be reached, logging the change.
    fn unreachable(&self, why: &str) {
        if !self.broker_down.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                error = %why,
                "AMQP broker unreachable: publishes fail until it is back, reads use the local inbox"
            );
        }
    }
}

impl InboxStore for AmqpStore {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(self.inner.publish_message(message))
    }

    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            self.inner.refresh(target).await;
            self.inner.local.page(target, request).await
        })
    }

    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            self.inner.refresh(target).await;
            self.inner.local.ack(target, msg_id).await
        })
    }

    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>> {
        Box::pin(async move {
            self.inner.refresh(target).await;
            self.inner.local.drain(target).await
        })
    }

    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            self.inner.refresh(target).await;
            self.inner.local.depth(target).await
        })
    }

    fn targets(&self) -> StoreFuture<'_, Vec<Target>> {
        Box::pin(async move {
            let known: Vec<Target> = crate::sync::lock(&self.inner.known)
                .iter()
                .cloned()
                .collect();
            for target in &known {
                self.inner.refresh(target).await;
            }
            self.inner.local.targets().await
        })
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.inner.local.health().await?;
            match self.inner.session().await {
                Ok(_) => Ok(()),
                Err(Failure::Fatal(err)) => Err(err),
                Err(Failure::Transient(why)) => Err(StoreError::Unavailable(why)),
            }
        })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.inner.closed.store(true, Ordering::SeqCst);
            self.sweeper.abort();
            self.inner.consumers.stop_all().await;
            // Ingests in flight finish first (each holds its target's lock), so nothing pulled
            // is left uncommitted when the connection goes.
            let locks: Vec<_> = crate::sync::lock(&self.inner.locks)
                .values()
                .cloned()
                .collect();
            for lock in locks {
                drop(lock.lock().await);
            }
            let session = self.inner.session.lock().await.take();
            if let Some(session) = session
                && let Err(err) = session::answer(
                    "connection.close",
                    session.connection.close(200, "fleetd closing".into()),
                )
                .await
            {
                tracing::debug!(error = %err, "closing the AMQP connection failed");
            }
            self.inner.local.close().await
        })
    }

    fn kind(&self) -> &'static str {
        "amqp"
    }
}

/// `url` with any password replaced by `***`, safe for logs and errors.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparseable url>".to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
    format!("{scheme}://{user}:***@{host}{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_redacted() {
        let cases = [
            (
                "amqp://guest:guest@127.0.0.1:5672/%2f",
                "amqp://guest:***@127.0.0.1:5672/%2f",
            ),
            ("amqp://u:p@ss:w@host/vh", "amqp://u:***@host/vh"),
            ("amqp://127.0.0.1:5672", "amqp://127.0.0.1:5672"),
            ("nonsense", "<unparseable url>"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn queue_names_follow_the_broker_convention() {
        let target = Target::new("alice").expect("valid");
        assert_eq!(queue_name(&target), "agent.alice.inbox");
        assert_eq!(dead_letter_queue_name(&target), "agent.alice.dead");
    }
}

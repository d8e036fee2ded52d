//! The AMQP 0.9.1 inbox backend (RabbitMQ, LavinMQ): one durable quorum queue per target named
//! `agent.<target>.inbox`, persistent messages, publisher confirms, manual acks, reconnect with
//! backoff. Knows lapin and the broker's semantics; must not know who publishes or why.
//!
//! Peek holds deliveries unacknowledged: each target has its own channel on which `basic.get`
//! (without auto-ack) pulls messages, oldest first, into an in-memory window that `peek` reads and
//! `ack` settles by delivery tag. `basic.get` answers "empty" synchronously, so "is there more?"
//! never races a delivery in flight the way a push consumer would. If the daemon dies or the
//! connection drops, the broker requeues every held delivery; when one is seen again its msgId
//! keeps it from appearing twice.
//!
//! Order: RabbitMQ quorum queues do not keep a message's place when it is requeued (measured on
//! 3.10: eight held messages came back as 7, 8, 0, 9, 1, …). So the window is kept sorted by msgId
//! — a time-ordered UUIDv7, minted monotonically by whoever publishes — and `peek` fills the whole
//! window before answering. Up to [`AmqpStore::HOLD_MAX`] pending messages per target, peek order
//! is therefore exact whatever the broker did; beyond that it is exact within the window.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex as AsyncMutex;

use fleetd_core::{Message, MessageLimits, MsgId, Target};

use super::{
    DEDUP_WINDOW, InboxStore, PublishOutcome, RecentIds, StoreError, StoreFuture, StoreOptions,
};

/// Most deliveries held unacknowledged per target: the window `peek` can see and `ack` can settle.
/// Bounds the daemon's memory (messages are up to `maxMessageBytes` each); acking frees room.
const HOLD_MAX: usize = AmqpStore::HOLD_MAX;

/// How long an operation keeps reconnecting before it gives up with [`StoreError::Unavailable`].
/// Long enough to ride out a broker restart (RabbitMQ takes ~7 s to start here).
const RECONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// First pause between reconnect attempts; doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest pause between reconnect attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest wait for the TCP + AMQP handshake of one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn queue_name(target: &Target) -> String {
    AmqpStore::queue_name(target)
}

/// The inbox on an AMQP broker. See the module docs for how peek and ack map onto AMQP.
pub struct AmqpStore {
    url: String,
    limits: MessageLimits,
    session: AsyncMutex<Option<Arc<Session>>>,
    generation: AtomicU64,
    inboxes: Mutex<BTreeMap<Target, Arc<AsyncMutex<Inbox>>>>,
    known: Mutex<Known>,
    closed: AtomicBool,
}

impl fmt::Debug for AmqpStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpStore")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

/// Ids this process has published or acknowledged: the dedup memory for publishes and redeliveries.
#[derive(Debug)]
struct Known {
    published: RecentIds,
    acked: RecentIds,
}

/// One live connection with its confirm-mode publishing channel.
struct Session {
    generation: u64,
    connection: Connection,
    publisher: Channel,
    declared: Mutex<HashSet<Target>>,
}

/// A target's held window. `held` is `None` until the target is first read, and is dropped when
/// its channel dies (the broker then requeues what it held).
#[derive(Default)]
struct Inbox {
    held: Option<Held>,
}

struct Held {
    generation: u64,
    channel: Channel,
    deliveries: VecDeque<HeldDelivery>,
    /// Deliveries that did not decode as a fleetd message: left unacknowledged (so nothing is
    /// destroyed) and never shown. They still take room in the window.
    hidden: usize,
}

struct HeldDelivery {
    message: Message,
    tag: u64,
}

/// Why one attempt failed: worth reconnecting and retrying, or final.
enum Failure {
    Transient(String),
    Fatal(StoreError),
}

impl From<lapin::Error> for Failure {
    fn from(err: lapin::Error) -> Self {
        if is_transient(&err) {
            Self::Transient(err.to_string())
        } else {
            Self::Fatal(StoreError::backend("talk to the AMQP broker", err))
        }
    }
}

/// Connection-level trouble is transient (reconnect and retry); a broker's refusal of a request
/// (wrong queue arguments, access refused) is not.
fn is_transient(err: &lapin::Error) -> bool {
    match err.kind() {
        ErrorKind::IOError(_)
        | ErrorKind::InvalidConnectionState(_)
        | ErrorKind::InvalidChannelState(..)
        | ErrorKind::InvalidChannel(_)
        | ErrorKind::MissingHeartbeatError => true,
        ErrorKind::ProtocolError(amqp) => matches!(
            amqp.kind(),
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED | AMQPHardError::INTERNALERROR)
        ),
        _ => false,
    }
}

fn is_not_found(err: &lapin::Error) -> bool {
    matches!(err.kind(), ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
}

fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Paces reconnect attempts and enforces [`RECONNECT_DEADLINE`].
struct Backoff {
    next: Duration,
    spent: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self {
            next: BACKOFF_START,
            spent: Duration::ZERO,
        }
    }

    /// Sleeps before the next attempt, or gives up once the deadline is spent.
    async fn pause(&mut self, op: &str, why: &str) -> Result<(), StoreError> {
        if self.spent >= RECONNECT_DEADLINE {
            return Err(StoreError::Unavailable(format!(
                "{op}: still failing after {}s of reconnecting ({why})",
                RECONNECT_DEADLINE.as_secs()
            )));
        }
        tracing::warn!(
            op,
            error = why,
            retry_in_ms = self.next.as_millis(),
            "AMQP inbox retrying"
        );
        tokio::time::sleep(self.next).await;
        self.spent += self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

impl Session {
    async fn connect(url: &str, generation: u64) -> Result<Self, Failure> {
        let props = ConnectionProperties::default().with_connection_name("fleetd inbox".into());
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, props))
            .await
            .map_err(|_| Failure::Transient("the connection attempt timed out".to_owned()))??;
        let publisher = connection.create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            generation,
            connection,
            publisher,
            declared: Mutex::new(HashSet::new()),
        })
    }

    fn alive(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    /// Declares the target's queue once per session (declaring is idempotent on the broker).
    async fn declare(&self, target: &Target) -> Result<(), Failure> {
        if guard(&self.declared).contains(target) {
            return Ok(());
        }
        declare(&self.publisher, target, false).await?;
        guard(&self.declared).insert(target.clone());
        Ok(())
    }
}

/// `queue.declare` for a target's inbox: durable quorum queue. `passive` only checks it exists
/// (a missing queue is a 404 that closes `channel`). Returns the count of ready messages.
async fn declare(channel: &Channel, target: &Target, passive: bool) -> Result<u32, lapin::Error> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        passive,
        ..QueueDeclareOptions::default()
    };
    let queue = channel
        .queue_declare(queue_name(target).into(), options, args)
        .await?;
    Ok(queue.message_count())
}

impl AmqpStore {
    /// Most deliveries held unacknowledged per target: the most one `peek` shows, and the reach of
    /// `ack` (it settles only messages within this window of the oldest). Bounds the daemon's
    /// memory, since each message may be up to `maxMessageBytes`; acking frees room.
    pub const HOLD_MAX: usize = 256;

    /// The broker-side name of a target's inbox queue: `agent.<target>.inbox`.
    pub fn queue_name(target: &Target) -> String {
        format!("agent.{target}.inbox")
    }

    /// Connects to the broker at `url` (retrying for up to 30 s), so a wrong URL or a dead broker
    /// fails at start-up.
    pub async fn open(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        let store = Self {
            url: url.to_owned(),
            limits: options.limits,
            session: AsyncMutex::new(None),
            generation: AtomicU64::new(0),
            inboxes: Mutex::new(BTreeMap::new()),
            known: Mutex::new(Known {
                published: RecentIds::new(DEDUP_WINDOW),
                acked: RecentIds::new(DEDUP_WINDOW),
            }),
            closed: AtomicBool::new(false),
        };
        let mut backoff = Backoff::new();
        loop {
            match store.session().await {
                Ok(_) => break,
                Err(Failure::Fatal(err)) => return Err(err),
                Err(Failure::Transient(why)) => {
                    backoff.pause("connect to the AMQP broker", &why).await?
                }
            }
        }
        tracing::info!(url = %redact_url(url), "AMQP inbox connected");
        Ok(store)
    }

    /// The live session, connecting first when there is none.
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

    fn inbox(&self, target: &Target) -> Arc<AsyncMutex<Inbox>> {
        Arc::clone(guard(&self.inboxes).entry(target.clone()).or_default())
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        guard(&self.known)
    }

    async fn publish_message(&self, message: Message) -> Result<PublishOutcome, StoreError> {
        message.check(&self.limits)?;
        let id = message.msg_id;
        if self.is_held(&message.target, id).await {
            return Ok(PublishOutcome::Duplicate);
        }
        {
            let mut known = self.known();
            if known.acked.contains(&id) || !known.published.insert(id) {
                return Ok(PublishOutcome::Duplicate);
            }
        }
        let body = serde_json::to_vec(&message)
            .map_err(|err| StoreError::backend("encode a message for the broker", err))?;
        let mut backoff = Backoff::new();
        let result = loop {
            let attempt = match self.session().await {
                Ok(session) => {
                    let result = publish_once(&session, &message, &body).await;
                    if matches!(result, Err(Failure::Transient(_))) {
                        self.invalidate(&session).await;
                    }
                    result
                }
                Err(failure) => Err(failure),
            };
            match attempt {
                Ok(()) => break Ok(PublishOutcome::Stored),
                Err(Failure::Fatal(err)) => break Err(err),
                Err(Failure::Transient(why)) => {
                    // A retry may store a second copy if the first was stored but its confirm was
                    // lost; consumers drop the copy by msgId.
                    if let Err(err) = backoff.pause("publish to the AMQP broker", &why).await {
                        break Err(err);
                    }
                }
            }
        };
        if result.is_err() {
            self.known().published.remove(&id);
        }
        result
    }

    async fn is_held(&self, target: &Target, id: MsgId) -> bool {
        let inbox = self.inbox(target);
        let inbox = inbox.lock().await;
        inbox
            .held
            .as_ref()
            .is_some_and(|held| held.deliveries.iter().any(|d| d.message.msg_id == id))
    }

    /// Runs `attempt` on `target`'s inbox until it succeeds, fails for good, or the reconnect
    /// deadline passes. Between attempts the session and the held window are dropped; `attempt`
    /// keeps whatever progress it made in itself.
    async fn with_inbox<A: Attempt>(
        &self,
        op: &'static str,
        target: &Target,
        attempt: &mut A,
    ) -> Result<A::Output, StoreError> {
        let inbox = self.inbox(target);
        let mut inbox = inbox.lock().await;
        let mut backoff = Backoff::new();
        loop {
            let failure = match self.session().await {
                Ok(session) => match attempt.run(self, &session, &mut inbox, target).await {
                    Ok(value) => return Ok(value),
                    Err(failure) => {
                        if matches!(failure, Failure::Transient(_)) {
                            inbox.held = None;
                            self.invalidate(&session).await;
                        }
                        failure
                    }
                },
                Err(failure) => failure,
            };
            match failure {
                Failure::Fatal(err) => return Err(err),
                Failure::Transient(why) => backoff.pause(op, &why).await?,
            }
        }
    }

    /// The held window of `target` on the current session, opening its channel if needed.
    /// `None` when the broker has no queue for the target (nothing was ever published to it).
    async fn held<'x>(
        &self,
        session: &Session,
        inbox: &'x mut Inbox,
        target: &Target,
    ) -> Result<Option<&'x mut Held>, Failure> {
        let stale = inbox.held.as_ref().is_some_and(|held| {
            held.generation != session.generation || !held.channel.status().connected()
        });
        if stale {
            inbox.held = None;
        }
        if inbox.held.is_none() {
            let channel = session.connection.create_channel().await?;
            match declare(&channel, target, true).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) => return Ok(None),
                Err(err) => return Err(err.into()),
            }
            inbox.held = Some(Held {
                generation: session.generation,
                channel,
                deliveries: VecDeque::new(),
                hidden: 0,
            });
        }
        Ok(inbox.held.as_mut())
    }

    /// Pulls deliveries into the window until it is full or the queue has no ready message left.
    /// One `basic.get` round trip per message; an already full window costs nothing.
    async fn fill(&self, held: &mut Held, target: &Target) -> Result<(), Failure> {
        let queue = queue_name(target);
        while held.deliveries.len() + held.hidden < HOLD_MAX {
            let got = held
                .channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await?;
            let Some(got) = got else { break };
            self.absorb(held, target, got.delivery.delivery_tag, &got.delivery.data)
                .await?;
        }
        Ok(())
    }

    /// Adds one delivery to the window, or settles it at once when its msgId is already held or
    /// was acknowledged (a redelivery or a duplicate publish).
    async fn absorb(
        &self,
        held: &mut Held,
        target: &Target,
        tag: u64,
        data: &[u8],
    ) -> Result<(), Failure> {
        let message = match serde_json::from_slice::<Message>(data) {
            Ok(message) if message.target == *target => message,
            Ok(_) | Err(_) => {
                tracing::error!(
                    queue = %queue_name(target),
                    bytes = data.len(),
                    "a message in the inbox queue is not a fleetd message for this target; left unacknowledged and hidden"
                );
                held.hidden += 1;
                return Ok(());
            }
        };
        let id = message.msg_id;
        let seen = held.deliveries.iter().any(|d| d.message.msg_id == id)
            || self.known().acked.contains(&id);
        if seen {
            held.channel
                .basic_ack(tag, BasicAckOptions::default())
                .await?;
            return Ok(());
        }
        // Keep the window in msgId order (see the module docs on requeue order).
        let position = held.deliveries.partition_point(|d| d.message.msg_id < id);
        held.deliveries
            .insert(position, HeldDelivery { message, tag });
        Ok(())
    }

    /// Acknowledges the held delivery of `msg_id`, if the window (filled first) has it.
    async fn ack_held(
        &self,
        held: &mut Held,
        target: &Target,
        msg_id: MsgId,
    ) -> Result<bool, Failure> {
        let position = |held: &Held| {
            held.deliveries
                .iter()
                .position(|d| d.message.msg_id == msg_id)
        };
        let index = match position(held) {
            Some(index) => index,
            None => {
                self.fill(held, target).await?;
                match position(held) {
                    Some(index) => index,
                    None => return Ok(false),
                }
            }
        };
        // Remember the ack before sending it: if the connection drops before the broker sees it,
        // the redelivered copy is settled on sight instead of shown again.
        self.known().acked.insert(msg_id);
        let tag = held.deliveries[index].tag;
        held.channel
            .basic_ack(tag, BasicAckOptions::default())
            .await?;
        held.deliveries.remove(index);
        Ok(true)
    }

    /// Waits until the broker has processed everything sent on the window's channel so far.
    /// `basic.ack` has no reply; a synchronous method after it does, and the broker handles a
    /// channel's methods in order. So once this returns, acks sent before it are settled on the
    /// broker and a crash of this process can no longer bring those messages back.
    async fn sync(held: &Held) -> Result<(), Failure> {
        held.channel
            .basic_qos(0, BasicQosOptions::default())
            .await?;
        Ok(())
    }
}

async fn publish_once(session: &Session, message: &Message, body: &[u8]) -> Result<(), Failure> {
    session.declare(&message.target).await?;
    let properties = BasicProperties::default()
        .with_message_id(message.msg_id.to_string().into())
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_type(message.kind.as_str().into())
        .with_timestamp(u64::try_from(message.created_at.as_second()).unwrap_or(0));
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = session
        .publisher
        .basic_publish(
            "".into(),
            queue_name(&message.target).into(),
            options,
            body,
            properties,
        )
        .await?
        .await?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_returned)) => {
            // Unroutable: the queue vanished (deleted by an operator). Declare it again and retry.
            guard(&session.declared).remove(&message.target);
            Err(Failure::Transient(format!(
                "queue {} did not exist",
                queue_name(&message.target)
            )))
        }
        Confirmation::Nack(_) => Err(Failure::Fatal(StoreError::Nacked(message.msg_id))),
        Confirmation::NotRequested => Err(Failure::Fatal(StoreError::Unavailable(
            "the publishing channel is not in confirm mode".to_owned(),
        ))),
    }
}

/// One inbox operation, retried by [`AmqpStore::with_inbox`] across reconnects. Progress that
/// must survive a retry (what was drained, whether the id was seen) lives in the implementor.
trait Attempt: Send {
    type Output;

    fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> impl Future<Output = Result<Self::Output, Failure>> + Send + 'x;
}

struct Peek {
    limit: usize,
}

impl Attempt for Peek {
    type Output = Vec<Message>;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<Vec<Message>, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(Vec::new());
        };
        // Fill the whole window, not just `limit`: requeued messages may come back after newer
        // ones, and only a full window can be put back in order.
        store.fill(held, target).await?;
        Ok(held
            .deliveries
            .iter()
            .take(self.limit)
            .map(|d| d.message.clone())
            .collect())
    }
}

struct Ack {
    msg_id: MsgId,
    /// Set once the id was seen held: a retry that then no longer finds it (the ack landed, or
    /// the redelivery was settled on sight) still means it was acknowledged.
    found: bool,
}

impl Attempt for Ack {
    type Output = bool;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<bool, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(false);
        };
        self.found |= held
            .deliveries
            .iter()
            .any(|d| d.message.msg_id == self.msg_id);
        let acked = store.ack_held(held, target, self.msg_id).await?;
        self.found |= acked;
        if acked {
            AmqpStore::sync(held).await?;
        }
        Ok(acked)
    }
}

struct Drain {
    drained: Vec<Message>,
}

impl Attempt for Drain {
    type Output = ();

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<(), Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(());
        };
        loop {
            store.fill(held, target).await?;
            let Some(first) = held.deliveries.front() else {
                return AmqpStore::sync(held).await;
            };
            let message = first.message.clone();
            if store.ack_held(held, target, message.msg_id).await? {
                self.drained.push(message);
            }
        }
    }
}

struct Depth;

impl Attempt for Depth {
    type Output = u64;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<u64, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(0);
        };
        let shown = held.deliveries.len() as u64;
        match declare(&held.channel, target, true).await {
            Ok(ready) => Ok(shown + u64::from(ready)),
            Err(err) if is_not_found(&err) => {
                // Deleted under us: the channel is closed, and there is nothing to count.
                inbox.held = None;
                Ok(0)
            }
            Err(err) => Err(err.into()),
        }
    }
}

impl InboxStore for AmqpStore {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(self.publish_message(message))
    }

    fn peek<'a>(&'a self, target: &'a Target, limit: usize) -> StoreFuture<'a, Vec<Message>> {
        Box::pin(async move {
            self.with_inbox("peek the AMQP inbox", target, &mut Peek { limit })
                .await
        })
    }

    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let mut ack = Ack {
                msg_id,
                found: false,
            };
            let acked = self
                .with_inbox("ack in the AMQP inbox", target, &mut ack)
                .await?;
            Ok(acked || ack.found)
        })
    }

    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>> {
        Box::pin(async move {
            let mut drain = Drain {
                drained: Vec::new(),
            };
            self.with_inbox("drain the AMQP inbox", target, &mut drain)
                .await?;
            Ok(drain.drained)
        })
    }

    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            self.with_inbox("count the AMQP inbox", target, &mut Depth)
                .await
        })
    }

    fn targets(&self) -> StoreFuture<'_, Vec<Target>> {
        Box::pin(async move {
            let known: Vec<Target> = guard(&self.inboxes).keys().cloned().collect();
            let mut pending = Vec::new();
            for target in known {
                if self.depth(&target).await? > 0 {
                    pending.push(target);
                }
            }
            Ok(pending)
        })
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            match self.session().await {
                Ok(_) => Ok(()),
                Err(Failure::Fatal(err)) => Err(err),
                Err(Failure::Transient(why)) => Err(StoreError::Unavailable(why)),
            }
        })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.closed.store(true, Ordering::SeqCst);
            let inboxes: Vec<_> = std::mem::take(&mut *guard(&self.inboxes))
                .into_values()
                .collect();
            for inbox in inboxes {
                inbox.lock().await.held = None;
            }
            if let Some(session) = self.session.lock().await.take() {
                // Closing the connection makes the broker requeue every delivery still held.
                if let Err(err) = session.connection.close(200, "fleetd closing".into()).await {
                    tracing::debug!(error = %err, "closing the AMQP connection failed");
                }
            }
            Ok(())
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
    }
}

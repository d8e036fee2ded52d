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
//!
//! Paging (`page` with `after`) moves through the held window only: a reader that pages without
//! acknowledging sees the oldest [`AmqpStore::HOLD_MAX`] pending messages, and the last page of
//! the window says `more: false` even when the broker holds further ones (acknowledging frees
//! room; the target's depth counts them all). A `more` that the next page could not honour would
//! send such a reader round in circles.

mod session;
mod window;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Mutex as AsyncMutex;

use fleetd_core::{Message, MessageLimits, MsgId, Target};

use super::{
    DEDUP_WINDOW, InboxStore, Page, PageRequest, PublishOutcome, RecentIds, StoreError,
    StoreFuture, StoreOptions,
};
use session::{Backoff, Failure, Session, publish_once};
use window::{Ack, Attempt, Depth, Drain, Inbox, Peek};

/// Most deliveries held unacknowledged per target: the window `peek` can see and `ack` can settle.
/// Bounds the daemon's memory (messages are up to `maxMessageBytes` each); acking frees room.
const HOLD_MAX: usize = AmqpStore::HOLD_MAX;

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

fn guard<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
}

impl InboxStore for AmqpStore {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(self.publish_message(message))
    }

    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            self.with_inbox("peek the AMQP inbox", target, &mut Peek { request })
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

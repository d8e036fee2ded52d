//! A gateway's link to the shared broker (SPEC §12): two connections, one publishing and one
//! consuming (why two: `link::connect`), kept up together for as long as the daemon runs —
//! broker URLs tried in turn, reconnecting both with backoff after any loss of either — with a
//! confirm-mode channel that publishes envelopes to `fleet.x` (mandatory, persistent, stamped
//! with the broker-validated `user_id`), and a consumer of this gateway's inbound queue that
//! hands each delivery (the `user_id` the broker vouched for, its routing key, its body) to the
//! daemon and acks it only once the daemon says its effect is durable (one the daemon refuses
//! is rejected to the dead-letter queue, logged with why and never with its body). A consumer
//! the broker cancels is consumed again. A nacked publish is tried again on a
//! new channel (RabbitMQ can keep nacking one channel's publishes to a quorum queue: see
//! [`Link::publish`]). A link counts as lost on whichever
//! shows it first: the consumer ending, an error event on either connection, or a publish the
//! connection refuses (lapin does not always end the consumer of a connection whose socket
//! died). Knows lapin; knows nothing about what
//! an envelope means. The topology is the administrator's (`fleetd gateway provision`): the link
//! only checks it is there (passive declares) and says so when it is not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::gateway::GatewayName;
use futures_util::StreamExt as _;
use tokio_util::sync::CancellationToken;

pub use super::tls::{LinkTls, TlsError};

mod connect;
mod consume;
mod depth;
mod publish;

use connect::Events;
pub use publish::Confirming;
use publish::Publisher;

/// Longest wait for one connection attempt (TCP + AMQP handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a publish's confirm before the link is presumed stuck.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);
/// Deliveries in flight to the daemon at once.
const PREFETCH: u16 = 32;
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How to reach the broker.
#[derive(Clone)]
pub struct LinkConfig {
    /// This gateway.
    pub me: GatewayName,
    /// Broker URLs without credentials (`amqp://host:5672/vhost`), tried in turn.
    pub urls: Vec<String>,
    /// The broker user.
    pub user: String,
    /// Its password (empty: none).
    pub password: String,
    /// AMQP heartbeat, in seconds.
    pub heartbeat_secs: u64,
    /// Messages waiting in the outbox beyond which the link reports an alarm.
    pub outbox_alarm: u64,
    /// Whom an `amqps://` URL's broker must prove itself to (ignored for `amqp://`).
    pub tls: LinkTls,
}

impl std::fmt::Debug for LinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkConfig")
            .field("me", &self.me)
            .field("urls", &self.urls)
            .field("user", &self.user)
            .field("password", &"[redacted]")
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// What the daemon made of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// Its effect is durable (or it was a duplicate): ack it.
    Taken,
    /// It can never be taken (not what this gateway sent there, not allowed): dead-letter it.
    Refused(String),
    /// It could not be taken now (the daemon is stopping, its store refuses): give it back.
    Later(String),
}

/// A delivery from this gateway's inbound queue, as the broker handed it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The `user_id` the broker validated against the publisher's connection (`None`: absent).
    pub user_id: Option<String>,
    /// The routing key it was published with.
    pub routing_key: String,
    /// Its body, unread.
    pub body: Vec<u8>,
}

/// A delivery settled as soon as it was handed on.
pub fn settled(disposition: Disposition) -> Pending {
    Box::pin(std::future::ready(Finish::Now(disposition)))
}

/// The daemon's side of the consumer: called once per delivery, in order; it decides whether
/// the delivery is what it claims to be ([`fleetd_core::gateway::accept`]) and hands it on. The
/// future it returns ends once the delivery is handed on (so the next one is handed on after
/// it), with a [`Pending`] for when its effect is durable: up to [`PREFETCH`] deliveries wait
/// at once, so one commit can make many durable.
pub type Deliver =
    Arc<dyn Fn(Inbound) -> Pin<Box<dyn Future<Output = Pending> + Send>> + Send + Sync>;

/// A delivery handed on, waiting for its effect to be durable.
pub type Pending = Pin<Box<dyn Future<Output = Finish> + Send>>;

/// How a handed-on delivery ends.
pub enum Finish {
    /// Settled.
    Now(Disposition),
    /// Work that runs in delivery order, after every earlier delivery's (storing a reply in the
    /// inbox, so replies are stored in the order they came), then settled.
    InTurn(Pin<Box<dyn Future<Output = Disposition> + Send>>),
}

/// Where presence broadcasts go (soft state, never acknowledged): the broker-validated
/// `user_id` they carried and their body.
pub type PresenceSink = Arc<dyn Fn(Option<&str>, &[u8]) + Send + Sync>;

/// How long a presence broadcast lives on the broker (matches the presence queues' TTL).
const PRESENCE_EXPIRATION_MS: &str = "60000";

/// What a publish came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The broker has it (routed to the destination's queue, durably).
    Confirmed,
    /// The broker has no queue for that destination: no such gateway is provisioned.
    Unroutable,
}

/// Why a publish did not happen (try again later: the envelope keeps its id).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No connection to the broker right now.
    #[error("the broker link is down: {0}")]
    Down(String),
    /// The broker refused it (a full queue, a leader change).
    #[error("the broker nacked the message: {0}")]
    Nacked(String),
}

/// The link. Cheap to clone.
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("me", &self.inner.config.me)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: LinkConfig,
    /// The publishing channel of the live connection.
    publisher: Mutex<Option<Publisher>>,
    /// Connections made so far (the generation of the live one).
    generation: std::sync::atomic::AtomicU64,
    /// A publish found the connection of this generation broken, and why.
    kicked: Mutex<Option<(u64, String)>>,
    /// Woken when `kicked` is set.
    kick: tokio::sync::Notify,
    /// Why the link is down, when it is (for `/healthz`).
    down: Mutex<Option<String>>,
    /// Woken when the link comes up.
    up: tokio::sync::Notify,
    /// Messages waiting in the outbox for the broker, as the forwarder last counted them.
    outbox: std::sync::atomic::AtomicU64,
    /// The gateways sent requests (tasks, spawns) since the backlog probe last asked
    /// (`Link::take_sent_to`).
    sent_to: Mutex<std::collections::BTreeSet<GatewayName>>,
    /// The backlog probe's channel on the publishing connection, kept between readings.
    probe: Mutex<Option<lapin::Channel>>,
}

impl Link {
    /// A link that is not connected yet ([`Link::run`] connects it).
    pub fn new(config: LinkConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                publisher: Mutex::new(None),
                generation: std::sync::atomic::AtomicU64::new(0),
                kicked: Mutex::new(None),
                kick: tokio::sync::Notify::new(),
                down: Mutex::new(Some("not connected yet".to_owned())),
                up: tokio::sync::Notify::new(),
                outbox: std::sync::atomic::AtomicU64::new(0),
                sent_to: Mutex::new(std::collections::BTreeSet::new()),
                probe: Mutex::new(None),
            }),
        }
    }

    /// The forwarder's count of messages waiting for the broker; warns once as it passes the
    /// alarm, and says when it is back under.
    pub fn set_outbox(&self, waiting: u64) {
        let alarm = self.inner.config.outbox_alarm;
        let was = self
            .inner
            .outbox
            .swap(waiting, std::sync::atomic::Ordering::Relaxed);
        #[expect(clippy::cast_precision_loss, reason = "a gauge")]
        metrics::gauge!("fleetd_gateway_outbox").set(waiting as f64);
        if was <= alarm && waiting > alarm {
            tracing::warn!(gateway = %self.inner.config.me, waiting, alarm, "the gateway outbox is over its alarm: the broker has not taken these messages (link down, or a peer's queue full); nothing is dropped");
        } else if was > alarm && waiting <= alarm {
            tracing::info!(gateway = %self.inner.config.me, waiting, "the gateway outbox is back under its alarm");
        }
    }

    /// Messages waiting for the broker, and the alarm they are compared with.
    pub fn outbox(&self) -> (u64, u64) {
        (
            self.inner.outbox.load(std::sync::atomic::Ordering::Relaxed),
            self.inner.config.outbox_alarm,
        )
    }

    /// Why the link is down, or `None` when it is up.
    pub fn down(&self) -> Option<String> {
        lock(&self.inner.down).clone()
    }

    /// Waits until the link is up (returns at once when it is).
    pub async fn until_up(&self) {
        loop {
            let notified = self.inner.up.notified();
            if self.down().is_none() {
                return;
            }
            notified.await;
        }
    }

    /// Keeps the link connected and consuming until `stop`, handing deliveries to `deliver` and
    /// presence broadcasts to `presence`.
    pub fn run(
        &self,
        deliver: Deliver,
        presence: PresenceSink,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move { this.keep_up(deliver, presence, stop).await })
    }

    async fn keep_up(self, deliver: Deliver, presence: PresenceSink, stop: CancellationToken) {
        let mut backoff = BACKOFF_START;
        let mut attempt = 0usize;
        loop {
            let urls = &self.inner.config.urls;
            let url = &urls[attempt % urls.len().max(1)];
            attempt += 1;
            let session = tokio::select! {
                session = self.connect(url) => session,
                () = stop.cancelled() => return,
            };
            match session {
                Ok(mut session) => {
                    backoff = BACKOFF_START;
                    tracing::info!(gateway = %self.inner.config.me, broker = %url, "gateway linked to the broker");
                    let why = tokio::select! {
                        why = self.consume(&mut session.consumer, &deliver) => why,
                        why = take_presence(session.presence_consumer.as_mut(), &presence) => why,
                        why = broken(&mut session.publishing_events) => why,
                        why = broken(&mut session.consuming_events) => why,
                        why = self.kicked(session.generation) => why,
                        () = stop.cancelled() => {
                            self.set_down("the daemon is stopping".to_owned());
                            session.close("fleetd stopping").await;
                            return;
                        }
                    };
                    self.set_down(why.clone());
                    tracing::warn!(gateway = %self.inner.config.me, reason = %why, "gateway link lost; reconnecting");
                    session.close("reconnecting").await;
                }
                Err(why) => {
                    self.set_down(why.clone());
                    tracing::warn!(gateway = %self.inner.config.me, broker = %url, reason = %why, retry_in_ms = backoff.as_millis(), "gateway cannot reach the broker");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    fn set_down(&self, why: String) {
        *lock(&self.inner.publisher) = None;
        *lock(&self.inner.down) = Some(why);
    }

    /// Waits until a publish finds the connection of `generation` broken; why.
    async fn kicked(&self, generation: u64) -> String {
        loop {
            let notified = self.inner.kick.notified();
            if let Some((_, why)) = lock(&self.inner.kicked).take_if(|(g, _)| *g == generation) {
                return why;
            }
            notified.await;
        }
    }

    /// A publish on the connection of `generation` failed with `why`: unless a newer connection
    /// already replaced it, the link is down and `keep_up` reconnects.
    fn kick(&self, generation: u64, why: &str) {
        let mut publisher = lock(&self.inner.publisher);
        if publisher
            .as_ref()
            .is_some_and(|p| p.generation == generation)
        {
            *publisher = None;
            drop(publisher);
            *lock(&self.inner.down) = Some(why.to_owned());
            *lock(&self.inner.kicked) = Some((generation, format!("a publish failed: {why}")));
            self.inner.kick.notify_one();
        }
    }
}

/// Hands each presence broadcast to `sink` until the consumer ends; why it ended. Without one
/// (the presence queue could not be read) it never ends.
async fn take_presence(consumer: Option<&mut lapin::Consumer>, sink: &PresenceSink) -> String {
    let Some(consumer) = consumer else {
        return std::future::pending().await;
    };
    while let Some(next) = consumer.next().await {
        match next {
            Ok(delivery) => {
                let user = delivery
                    .properties
                    .user_id()
                    .as_ref()
                    .map(|u| u.to_string());
                sink(user.as_deref(), &delivery.data);
            }
            Err(e) => return format!("the presence consumer failed: {e}"),
        }
    }
    "the broker cancelled the presence consumer".to_owned()
}

/// Waits for a connection to report an error; why.
async fn broken(events: &mut Events) -> String {
    while let Some(event) = events.next().await {
        if let lapin::Event::Error(e) = event {
            return format!("the connection failed: {e}");
        }
    }
    "the connection ended".to_owned()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    crate::sync::lock(m)
}

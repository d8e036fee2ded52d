//! A gateway's link to the shared broker (SPEC §12): one connection, kept up for as long as the
//! daemon runs — broker URLs tried in turn, reconnecting with backoff after any loss — with a
//! confirm-mode channel that publishes envelopes to `fleet.x` (mandatory, persistent, stamped
//! with the broker-validated `user_id`), and a consumer of this gateway's inbound queue that
//! hands each delivery (the `user_id` the broker vouched for, its routing key, its body) to the
//! daemon and acks it only once the daemon says its effect is durable (one the daemon refuses
//! is rejected to the dead-letter queue, logged with why and never with its body). A consumer
//! the broker cancels is consumed again. A nacked publish is tried again on a
//! new channel (RabbitMQ can keep nacking one channel's publishes to a quorum queue: see
//! [`Link::publish`]). A link counts as lost on whichever
//! shows it first: the consumer ending, an error event on the connection, or a publish the
//! connection refuses (lapin does not always end the consumer of a connection whose socket
//! died). Knows lapin; knows nothing about what
//! an envelope means. The topology is the administrator's (`fleetd gateway provision`): the link
//! only checks it is there (passive declares) and says so when it is not.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::gateway::{EXCHANGE, GatewayName};
use futures_util::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

pub use super::tls::{LinkTls, TlsError};

mod consume;
mod publish;

pub use publish::Confirming;
use publish::{Publisher, confirm_channel};

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
                Ok(Session {
                    connection,
                    consumer,
                    presence_consumer,
                    events,
                    generation,
                }) => {
                    backoff = BACKOFF_START;
                    tracing::info!(gateway = %self.inner.config.me, broker = %url, "gateway linked to the broker");
                    let why = tokio::select! {
                        why = self.consume(consumer, &deliver) => why,
                        why = take_presence(presence_consumer, &presence) => why,
                        why = broken(events) => why,
                        why = self.kicked(generation) => why,
                        () = stop.cancelled() => {
                            self.set_down("the daemon is stopping".to_owned());
                            let _ = connection.close(200, "fleetd stopping".into()).await;
                            return;
                        }
                    };
                    self.set_down(why.clone());
                    tracing::warn!(gateway = %self.inner.config.me, reason = %why, "gateway link lost; reconnecting");
                    let _ = connection.close(200, "reconnecting".into()).await;
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

    /// Connects to `url`, checks the topology is there, and starts consuming.
    async fn connect(&self, url: &str) -> Result<Session, String> {
        let config = &self.inner.config;
        let full = with_credentials(url, &config.user, &config.password, config.heartbeat_secs)?;
        let props = ConnectionProperties::default()
            .with_connection_name(format!("fleetd gateway {}", config.me).into());
        let connecting = super::tls::connect(&full, props, &config.tls);
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| format!("no answer from {url} within {}s", CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| format!("{url}: {e}"))?;
        let connection = Arc::new(connection);
        // Listening from the start: lapin only reports events to a listener that exists.
        let events = connection.events_listener();
        let publisher = confirm_channel(&connection).await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        publisher
            .exchange_declare(
                EXCHANGE.into(),
                lapin::ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|e| missing(&format!("exchange {EXCHANGE}"), &e))?;
        let consumer_channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let inbound = config.me.inbound_queue();
        consumer_channel
            .queue_declare(
                inbound.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| missing(&format!("queue {inbound}"), &e))?;
        consumer_channel
            .basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .map_err(|e| e.to_string())?;
        let consumer = consumer_channel
            .basic_consume(
                inbound.as_str().into(),
                format!("fleetd-{}", config.me).as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("cannot consume {inbound}: {e}"))?;
        // Presence is soft state: taken as it comes, never acknowledged one by one.
        let presence_queue = config.me.presence_queue();
        let presence_channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        // Not reading it costs only the other gateways' presence (their members show stale),
        // never the link: tasks and replies do not wait for it.
        let presence_consumer = match presence_channel
            .basic_consume(
                presence_queue.as_str().into(),
                format!("fleetd-{}-presence", config.me).as_str().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(consumer) => Some(consumer),
            Err(e) => {
                let why = missing(&format!("queue {presence_queue}"), &e);
                tracing::warn!(gateway = %config.me, reason = %why, "the gateway cannot read its presence queue; other gateways' members will show stale until the next reconnect");
                None
            }
        };
        let generation = self
            .inner
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        *lock(&self.inner.publisher) = Some(Publisher {
            generation,
            channel: publisher,
            connection: Arc::clone(&connection),
        });
        *lock(&self.inner.down) = None;
        self.inner.up.notify_waiters();
        Ok(Session {
            connection,
            consumer,
            presence_consumer,
            events: Box::pin(events),
            generation,
        })
    }
}

/// A live connection: its consumers, its event stream, and its generation.
struct Session {
    connection: Arc<Connection>,
    consumer: lapin::Consumer,
    presence_consumer: Option<lapin::Consumer>,
    events: Pin<Box<dyn futures_util::Stream<Item = lapin::Event> + Send>>,
    generation: u64,
}

/// Hands each presence broadcast to `sink` until the consumer ends; why it ended. Without one
/// (the presence queue could not be read) it never ends.
async fn take_presence(consumer: Option<lapin::Consumer>, sink: &PresenceSink) -> String {
    let Some(mut consumer) = consumer else {
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

/// Waits for the connection to report an error; why.
async fn broken(
    mut events: Pin<Box<dyn futures_util::Stream<Item = lapin::Event> + Send>>,
) -> String {
    while let Some(event) = events.next().await {
        if let lapin::Event::Error(e) = event {
            return format!("the connection failed: {e}");
        }
    }
    "the connection ended".to_owned()
}

/// A refusal of a passive declare, in words that say what to do.
fn missing(what: &str, e: &lapin::Error) -> String {
    if super::session::is_not_found(e) {
        format!(
            "the broker has no {what}: provision the fleet first (`fleetd gateway provision`, README)"
        )
    } else {
        format!("cannot check {what}: {e}")
    }
}

/// `amqp://host/vhost` with `user:password@` and the heartbeat.
fn with_credentials(
    url: &str,
    user: &str,
    password: &str,
    heartbeat: u64,
) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not an AMQP URL"))?;
    let auth = if password.is_empty() {
        format!("{}@", encode(user))
    } else {
        format!("{}:{}@", encode(user), encode(password))
    };
    let sep = if rest.contains('?') { '&' } else { '?' };
    Ok(format!("{scheme}://{auth}{rest}{sep}heartbeat={heartbeat}"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    crate::sync::lock(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_the_heartbeat_go_into_the_url() {
        assert_eq!(
            with_credentials("amqp://rmq:5672/fleet", "a", "p@ss/w", 15).expect("url"),
            "amqp://a:p%40ss%2Fw@rmq:5672/fleet?heartbeat=15"
        );
        assert_eq!(
            with_credentials("amqps://rmq/fleet?x=1", "b", "", 5).expect("url"),
            "amqps://b@rmq/fleet?x=1&heartbeat=5"
        );
        assert!(with_credentials("rmq:5672", "a", "", 5).is_err());
        let config = LinkConfig {
            me: GatewayName::new("a").expect("a"),
            urls: vec![],
            user: "a".to_owned(),
            password: "hunter2".to_owned(),
            heartbeat_secs: 15,
            outbox_alarm: 1000,
            tls: LinkTls::system(),
        };
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}

//! The AMQP backend's connection handling: one session (connection + confirm-mode publishing
//! channel), the queues' declaration arguments, the publish-and-confirm step, error
//! classification and the reconnect backoff. Knows lapin; knows nothing about the local inbox.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

use fleetd_core::{Message, Target};

use super::{dead_letter_queue_name, queue_name};
use crate::store::StoreError;
use crate::sync::lock;

/// How long an operation keeps reconnecting before it gives up with [`StoreError::Unavailable`].
/// Long enough to ride out a broker restart (RabbitMQ takes ~7 s to start here).
const RECONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// First pause between reconnect attempts; doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest pause between reconnect attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest wait for the TCP + AMQP handshake of one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for the broker's answer to one command. lapin can leave a command pending for
/// ever when the connection dies under it (amqp-rs/lapin#409; seen here as an ingest that held
/// its target's lock after a cut connection, so the store's close never ended): past this the
/// session counts as lost, like any connection failure, and is replaced. Generous, so a quorum
/// queue's command during a cluster node's failover is not cut short.
pub(super) const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// `op`'s own result, or a transient failure naming `what` when the broker did not answer
/// within [`ANSWER_TIMEOUT`].
pub(super) async fn within<T>(
    what: &str,
    op: impl std::future::Future<Output = T>,
) -> Result<T, Failure> {
    tokio::time::timeout(ANSWER_TIMEOUT, op).await.map_err(|_| {
        Failure::Transient(format!(
            "the broker did not answer {what} within {} s",
            ANSWER_TIMEOUT.as_secs()
        ))
    })
}

/// A lapin command's result within [`ANSWER_TIMEOUT`], its error classified.
pub(super) async fn answer<T>(
    what: &str,
    op: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, Failure> {
    Ok(within(what, op).await??)
}

/// `x-delivery-limit` of every inbox queue: after this many failed deliveries (returned by a
/// dropped connection, or, before RabbitMQ 4.3, by a consumer timeout) the broker dead-letters a
/// message instead of delivering it again. 20 is RabbitMQ 4.x's default, stated explicitly so
/// 3.x brokers (no default: unlimited) behave the same. fleetd acks every delivery within the
/// call that pulled it, so only crashes in the middle of an ingest count.
const DELIVERY_LIMIT: i32 = 20;

/// One live connection with its confirm-mode publishing channel.
pub(super) struct Session {
    pub(super) generation: u64,
    pub(super) connection: Connection,
    pub(super) publisher: Channel,
    /// Targets whose queues this session declared (and migrated, if they were old).
    ready: Mutex<HashSet<Target>>,
}

/// Why one attempt failed: worth reconnecting and retrying, or final.
#[derive(Clone)]
pub(super) enum Failure {
    Transient(String),
    Fatal(StoreError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient(why) => f.write_str(why),
            Self::Fatal(err) => err.fmt(f),
        }
    }
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

pub(super) fn is_not_found(err: &lapin::Error) -> bool {
    matches!(err.kind(), ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
}

/// The broker refused a declaration because the queue exists with other arguments (it was
/// declared by fleetd's first releases). The broker closed the channel.
pub(super) fn is_precondition_failed(err: &lapin::Error) -> bool {
    matches!(err.kind(), ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))
}

/// Paces reconnect attempts and enforces [`RECONNECT_DEADLINE`].
pub(super) struct Backoff {
    next: Duration,
    spent: Duration,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Self {
            next: BACKOFF_START,
            spent: Duration::ZERO,
        }
    }

    /// Sleeps before the next attempt, or gives up once the deadline is spent.
    pub(super) async fn pause(&mut self, op: &str, why: &str) -> Result<(), StoreError> {
        if self.spent >= RECONNECT_DEADLINE {
            return Err(StoreError::Unavailable(format!(
                "{op}: still failing after {}s of reconnecting ({why}); check that the broker named by store.url is running and reachable",
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
    pub(super) async fn connect(url: &str, generation: u64) -> Result<Self, Failure> {
        let props = ConnectionProperties::default().with_connection_name("fleetd inbox".into());
        let connection = tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect(url, props))
            .await
            .map_err(|_| Failure::Transient("the connection attempt timed out".to_owned()))??;
        let publisher = answer("channel.open", connection.create_channel()).await?;
        answer(
            "confirm.select",
            publisher.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(Self {
            generation,
            connection,
            publisher,
            ready: Mutex::new(HashSet::new()),
        })
    }

    pub(super) fn alive(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    /// Whether this session already declared `target`'s queues.
    pub(super) fn is_ready(&self, target: &Target) -> bool {
        lock(&self.ready).contains(target)
    }

    pub(super) fn set_ready(&self, target: &Target, ready: bool) {
        let mut set = lock(&self.ready);
        if ready {
            set.insert(target.clone());
        } else {
            set.remove(target);
        }
    }
}

/// The arguments of a target's inbox queue: a durable quorum queue with an explicit delivery
/// limit whose rejected and over-delivered messages go, through the default exchange, to the
/// target's dead-letter queue. At-least-once dead-lettering (RabbitMQ >= 3.10) keeps a message
/// until the dead-letter queue confirmed it; it requires `x-overflow: reject-publish`.
fn inbox_arguments(target: &Target) -> FieldTable {
    let mut args = quorum();
    let text = |value: &str| AMQPValue::LongString(value.into());
    args.insert(
        "x-delivery-limit".into(),
        AMQPValue::LongInt(DELIVERY_LIMIT),
    );
    args.insert("x-dead-letter-exchange".into(), text(""));
    args.insert(
        "x-dead-letter-routing-key".into(),
        text(&dead_letter_queue_name(target)),
    );
    args.insert("x-dead-letter-strategy".into(), text("at-least-once"));
    args.insert("x-overflow".into(), text("reject-publish"));
    args
}

/// The arguments of a durable quorum queue (a dead-letter queue).
fn quorum() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args
}

/// Declares the target's dead-letter queue, then its inbox queue with [`inbox_arguments`], on
/// `channel`. Fails with PRECONDITION_FAILED (see [`is_precondition_failed`]; the broker closes
/// the channel) when the inbox queue exists with other arguments.
pub(super) async fn declare(channel: &Channel, target: &Target) -> Result<(), lapin::Error> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(dead_letter_queue_name(target).into(), options, quorum())
        .await?;
    channel
        .queue_declare(queue_name(target).into(), options, inbox_arguments(target))
        .await?;
    Ok(())
}

/// Publishes `body` to the queue of `first`'s target and waits for the broker's confirm. The
/// body is one message (typed by its kind) or several of that target as one JSON array (typed
/// `batch`), whose first is `first`: it names the publish (its id and time) either way.
pub(super) async fn publish(
    session: &Session,
    first: &Message,
    kind: &str,
    body: &[u8],
) -> Result<(), Failure> {
    let target = &first.target;
    let properties = BasicProperties::default()
        .with_message_id(first.msg_id.to_string().into())
        .with_type(kind.into())
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_timestamp(u64::try_from(first.created_at.as_second()).unwrap_or(0));
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let publishing = session.publisher.basic_publish(
        "".into(),
        queue_name(target).into(),
        options,
        body,
        properties,
    );
    let confirm = answer("basic.publish", async { publishing.await?.await }).await?;
    match confirm {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_returned)) => {
            // Unroutable: the queue vanished (deleted by an operator). Declare it again and retry.
            session.set_ready(target, false);
            Err(Failure::Transient(format!(
                "queue {} did not exist",
                queue_name(target)
            )))
        }
        Confirmation::Nack(_) => Err(Failure::Fatal(StoreError::Nacked(first.msg_id))),
        Confirmation::NotRequested => Err(Failure::Fatal(StoreError::Unavailable(
            "the publishing channel is not in confirm mode".to_owned(),
        ))),
    }
}

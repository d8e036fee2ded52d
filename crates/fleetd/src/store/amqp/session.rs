//! The AMQP backend's connection handling: one session (connection + confirm-mode publishing
//! channel), queue declaration, the publish-and-confirm step, error classification and the
//! reconnect backoff. Knows lapin; knows nothing about held windows or peek order.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

use fleetd_core::{Message, Target};

use super::{guard, queue_name};
use crate::store::StoreError;

/// How long an operation keeps reconnecting before it gives up with [`StoreError::Unavailable`].
/// Long enough to ride out a broker restart (RabbitMQ takes ~7 s to start here).
const RECONNECT_DEADLINE: Duration = Duration::from_secs(30);
/// First pause between reconnect attempts; doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest pause between reconnect attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Longest wait for the TCP + AMQP handshake of one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One live connection with its confirm-mode publishing channel.
pub(super) struct Session {
    pub(super) generation: u64,
    pub(super) connection: Connection,
    pub(super) publisher: Channel,
    declared: Mutex<HashSet<Target>>,
}

/// Why one attempt failed: worth reconnecting and retrying, or final.
pub(super) enum Failure {
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

pub(super) fn is_not_found(err: &lapin::Error) -> bool {
    matches!(err.kind(), ErrorKind::ProtocolError(amqp)
        if *amqp.kind() == AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
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
    pub(super) async fn connect(url: &str, generation: u64) -> Result<Self, Failure> {
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

    pub(super) fn alive(&self) -> bool {
        self.connection.status().connected() && self.publisher.status().connected()
    }

    /// Declares the target's queue once per session (declaring is idempotent on the broker).
    pub(super) async fn declare(&self, target: &Target) -> Result<(), Failure> {
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
pub(super) async fn declare(
    channel: &Channel,
    target: &Target,
    passive: bool,
) -> Result<u32, lapin::Error> {
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

pub(super) async fn publish_once(
    session: &Session,
    message: &Message,
    body: &[u8],
) -> Result<(), Failure> {
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

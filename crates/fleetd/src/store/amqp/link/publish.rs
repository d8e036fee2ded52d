//! The link's publishing side: an envelope published with the broker's confirm awaited (a new
//! channel after a nack), and presence broadcast without one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use fleetd_core::gateway::{EXCHANGE, Envelope, Kind, PRESENCE_EXCHANGE, routing_key};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};

use super::{CONFIRM_TIMEOUT, Link, LinkError, PRESENCE_EXPIRATION_MS, Published, lock};

impl Link {
    /// Puts a new publishing channel on `old`'s connection in place of `old` (unless the link
    /// has moved on, or another nack of the same window already replaced it), and closes `old`;
    /// a connection that cannot open one is lost.
    async fn renew(&self, old: &Publisher) {
        let channel = match confirm_channel(&old.connection).await {
            Ok(channel) => channel,
            Err(why) => return self.kick(old.generation, &why),
        };
        // The channel no longer used: the one replaced, or the new one when the link has moved
        // on meanwhile.
        let unused = {
            let mut slot = lock(&self.inner.publisher);
            match slot.as_mut() {
                Some(current)
                    if current.generation == old.generation
                        && current.channel.id() == old.channel.id() =>
                {
                    std::mem::replace(&mut current.channel, channel)
                }
                _ => channel,
            }
        };
        let _ = unused.close(200, "a new channel after a nack".into()).await;
    }

    /// Broadcasts this gateway's presence `body` to every gateway (soft state: no confirm is
    /// waited for, and it expires on the broker after a minute). `false` when the link is down.
    pub async fn publish_presence(&self, body: &[u8]) -> bool {
        let Some(Publisher { channel, .. }) = lock(&self.inner.publisher).clone() else {
            return false;
        };
        let props = BasicProperties::default()
            .with_type("presence".into())
            .with_user_id(self.inner.config.user.as_str().into())
            .with_content_type("application/json".into())
            .with_expiration(PRESENCE_EXPIRATION_MS.into());
        channel
            .basic_publish(
                PRESENCE_EXCHANGE.into(),
                "".into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .is_ok()
    }

    /// Publishes `envelope` to its destination and waits for the broker's confirm.
    pub async fn publish(&self, envelope: &Envelope) -> Result<Published, LinkError> {
        self.send(envelope).await?.await
    }

    /// Hands `envelope` to the broker; what it returns is the broker's word on it, to be awaited
    /// in its turn. Envelopes sent one after another on the link are routed in that order, so a
    /// caller keeps many in flight and still hears of them in order.
    ///
    /// A nack puts a new publishing channel in place for the next try. RabbitMQ 3.10 nacked
    /// every publish of a channel to a quorum queue for as long as the channel lived when the
    /// channel's first publish to that queue came while the queue's leader was being elected
    /// again (its node killed): a new channel on the same connection was acked at once (measured
    /// with a three-node cluster, `tests/it/gateway_cluster.rs`). Any other nack (a full queue)
    /// costs a channel per try, nothing more.
    pub async fn send(&self, envelope: &Envelope) -> Result<Confirming, LinkError> {
        let Some(publisher) = lock(&self.inner.publisher).clone() else {
            return Err(LinkError::Down(
                self.down().unwrap_or_else(|| "not connected".to_owned()),
            ));
        };
        // Only requests are bounded by the destination's backlog: those are what the probe reads.
        if matches!(envelope.kind, Kind::Task | Kind::Spawn) {
            let mut sent_to = lock(&self.inner.sent_to);
            if !sent_to.contains(&envelope.dst) {
                sent_to.insert(envelope.dst.clone());
            }
        }
        let key = routing_key(&envelope.dst, &envelope.src, envelope.kind);
        let body = serde_json::to_vec(envelope).map_err(|e| LinkError::Nacked(e.to_string()))?;
        let props = BasicProperties::default()
            .with_message_id(envelope.msg_id.as_str().into())
            .with_type(envelope.kind.as_str().into())
            .with_user_id(self.inner.config.user.as_str().into())
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = publisher
            .channel
            .basic_publish(
                EXCHANGE.into(),
                key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &body,
                props,
            )
            .await
            .map_err(|e| self.down_after(publisher.generation, &e))?;
        let this = self.clone();
        let what = format!("{} to {}", envelope.kind.as_str(), envelope.dst);
        Ok(Box::pin(async move {
            let confirmation = tokio::time::timeout(CONFIRM_TIMEOUT, confirm)
                .await
                .map_err(|_| {
                    let why = format!(
                        "no confirm from the broker within {}s",
                        CONFIRM_TIMEOUT.as_secs()
                    );
                    this.kick(publisher.generation, &why);
                    LinkError::Down(why)
                })?
                .map_err(|e| this.down_after(publisher.generation, &e))?;
            match confirmation {
                Confirmation::Ack(None) => Ok(Published::Confirmed),
                Confirmation::Ack(Some(_)) => Ok(Published::Unroutable),
                Confirmation::Nack(_) => {
                    this.renew(&publisher).await;
                    Err(LinkError::Nacked(what))
                }
                Confirmation::NotRequested => Err(LinkError::Down("confirms are off".to_owned())),
            }
        }))
    }

    /// The connection of `generation` refused a publish with `e`: the link is down.
    fn down_after(&self, generation: u64, e: &lapin::Error) -> LinkError {
        let why = e.to_string();
        self.kick(generation, &why);
        LinkError::Down(why)
    }
}

/// The broker's word on one envelope [`Link::send`] handed over.
pub type Confirming = Pin<Box<dyn Future<Output = Result<Published, LinkError>> + Send>>;

/// The publishing side of the live connection.
#[derive(Clone)]
pub(super) struct Publisher {
    /// The connection's generation.
    pub(super) generation: u64,
    /// A confirm-mode channel.
    pub(super) channel: Channel,
    /// The connection, for a new channel after a nack.
    pub(super) connection: Arc<Connection>,
}

/// A new confirm-mode channel on `connection`.
pub(super) async fn confirm_channel(connection: &Connection) -> Result<Channel, String> {
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(channel)
}

//! How many messages wait in another gateway's queue on the broker: read by a passive declare,
//! which needs no permission (a gateway may read only its own queues, `gateway provision`), on
//! a channel of its own, since a missing queue closes the channel it was asked on. The
//! forwarder's backlog probe (`gateway::backlog`) asks, for the gateways published to since it
//! last asked.

use std::collections::BTreeSet;
use std::time::Duration;

use fleetd_core::gateway::GatewayName;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use super::{Link, lock};

/// Longest wait for one reading (channel, declare).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

impl Link {
    /// The gateways this link published to since the last call.
    pub fn take_sent_to(&self) -> BTreeSet<GatewayName> {
        std::mem::take(&mut *lock(&self.inner.sent_to))
    }

    /// Messages ready in gateway `gw`'s inbound queue on the broker now; `None` when the link
    /// is down, the queue is missing, or the broker did not answer within [`READ_TIMEOUT`].
    pub async fn queued_at(&self, gw: &GatewayName) -> Option<u64> {
        let connection = lock(&self.inner.publisher).as_ref()?.connection.clone();
        let read = async {
            let channel = connection.create_channel().await.ok()?;
            let options = QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            };
            let declared = channel
                .queue_declare(
                    gw.inbound_queue().as_str().into(),
                    options,
                    FieldTable::default(),
                )
                .await;
            if declared.is_ok() {
                let _ = channel.close(200, "read".into()).await;
            }
            declared.ok().map(|queue| u64::from(queue.message_count()))
        };
        tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .ok()
            .flatten()
    }
}

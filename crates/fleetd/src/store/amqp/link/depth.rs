//! How many messages wait in another gateway's queue on the broker: read by a passive declare,
//! which needs no permission (a gateway may read only its own queues, `gateway provision`), on
//! a channel of its own, kept between readings and opened again after one fails (a missing
//! queue closes the channel it was asked on). The backlog probe (`gateway::backlog`) asks, for
//! the gateways sent requests since it last asked.

use std::collections::BTreeSet;
use std::time::Duration;

use fleetd_core::gateway::GatewayName;
use lapin::types::FieldTable;

use super::{Link, lock};

/// Longest wait for one reading (channel, declare).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

impl Link {
    /// The gateways this link sent requests (tasks, spawns) to since the last call.
    pub fn take_sent_to(&self) -> BTreeSet<GatewayName> {
        std::mem::take(&mut *lock(&self.inner.sent_to))
    }

    /// Messages ready in gateway `gw`'s inbound queue on the broker now; `None` when the link
    /// is down, the queue is missing, or the broker did not answer within [`READ_TIMEOUT`].
    pub async fn queued_at(&self, gw: &GatewayName) -> Option<u64> {
        let connection = lock(&self.inner.publisher).as_ref()?.connection.clone();
        let kept = lock(&self.inner.probe)
            .take()
            .filter(|channel| channel.status().connected());
        let read = async {
            let channel = match kept {
                Some(channel) => channel,
                None => connection.create_channel().await.ok()?,
            };
            let queue = channel
                .queue_declare(
                    gw.inbound_queue().as_str().into(),
                    super::super::passive(),
                    FieldTable::default(),
                )
                .await
                .ok()?;
            // Kept for the next reading; one that failed (a missing queue) is closed already.
            *lock(&self.inner.probe) = Some(channel);
            Some(u64::from(queue.message_count()))
        };
        tokio::time::timeout(READ_TIMEOUT, read)
            .await
            .ok()
            .flatten()
    }
}

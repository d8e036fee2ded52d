//! The AMQP backend's publish: the message goes to the target's queue (publisher confirm) and
//! into the local inbox (one commit) at the same time, and the publish answers once both hold
//! it — so it costs the slower of the two, not their sum. The broker's copy comes back through
//! the queue's consumer, which finds the id known and acks it; a message another process
//! published arrives the same way and is committed then.

use std::sync::Arc;

use fleetd_core::Message;

use super::consumer::InFlight;
use super::session::{Backoff, Failure};
use super::{Inner, PROFILE};
use crate::store::{InboxStore, PublishOutcome, StoreError};

impl Inner {
    /// Publishes `message` to the broker and commits it to the local inbox at the same time,
    /// answering once both hold it (see [`Inner::settle_publish`]). The local file says whether
    /// it is new; a duplicate's broker copy is dropped by the consumer.
    pub(super) async fn publish_message(
        self: &Arc<Self>,
        message: Message,
    ) -> Result<PublishOutcome, StoreError> {
        message.check(&self.limits)?;
        let Some(flight) = InFlight::start(&self.in_flight, message.msg_id) else {
            return Ok(PublishOutcome::Duplicate);
        };
        let target = &message.target;
        self.remember(target).await?;
        let body = serde_json::to_vec(&message)
            .map_err(|err| StoreError::backend("encode a message for the broker", err))?;
        // The queue first (declared, a legacy one migrated, what waits in it taken in, its
        // consumer started), so this message is committed after what was there before it. A
        // failure here is the broker's half's to retry.
        if let Ok(session) = self.session().await {
            let _ = self.open_queue(&session, target).await;
        }
        let started = tokio::time::Instant::now();
        let ((carried, confirm), (kept, commit)) = tokio::join!(
            async { (self.carry(&message, &body).await, started.elapsed()) },
            async {
                let kept = self.local.publish(message.clone()).await;
                if kept.is_ok() {
                    flight.committed();
                }
                (kept, started.elapsed())
            },
        );
        tracing::trace!(
            target: PROFILE,
            confirm_us = confirm.as_micros(),
            commit_us = commit.as_micros(),
            "publish"
        );
        self.settle_publish(&message, carried, kept).await
    }

    /// The answer to a publish from its two halves. Both held: the local file's outcome. The
    /// broker confirmed but the local commit failed (the disk, say): stored, for the message is
    /// durable on the broker and its consumer commits it once the file takes writes. The broker
    /// failed: the local copy is withdrawn (the publisher is told it failed and may retry), unless
    /// the consumer had already taken a copy the broker held (a confirm lost on the way).
    async fn settle_publish(
        &self,
        message: &Message,
        carried: Result<(), StoreError>,
        kept: Result<PublishOutcome, StoreError>,
    ) -> Result<PublishOutcome, StoreError> {
        match (carried, kept) {
            (Ok(()), Ok(outcome)) => Ok(outcome),
            (Ok(()), Err(err)) => {
                tracing::warn!(
                    msg_id = %message.msg_id, error = %err,
                    "the local inbox did not take a message the broker confirmed; the queue's consumer takes it in once the file takes writes"
                );
                Ok(PublishOutcome::Stored)
            }
            (Err(err), Ok(PublishOutcome::Stored)) => {
                if let Err(retract) = self.local.retract(&message.target, message.msg_id).await {
                    tracing::error!(
                        msg_id = %message.msg_id, error = %retract,
                        "cannot withdraw a message from the local inbox after the broker refused it; it stays delivered"
                    );
                    return Ok(PublishOutcome::Stored);
                }
                Err(err)
            }
            (Err(_), Ok(PublishOutcome::Duplicate)) => Ok(PublishOutcome::Duplicate),
            (Err(err), Err(_)) => Err(err),
        }
    }

    /// Publishes `body` (of `message`) to its target's queue until the broker confirms it,
    /// reconnecting for up to the backoff's deadline.
    async fn carry(self: &Arc<Self>, message: &Message, body: &[u8]) -> Result<(), StoreError> {
        let target = &message.target;
        let mut backoff = Backoff::new();
        loop {
            let attempt = match self.session().await {
                Ok(session) => {
                    let result = match self.open_queue(&session, target).await {
                        Ok(()) => self.send(&session, message, body).await,
                        Err(failure) => Err(failure),
                    };
                    if matches!(result, Err(Failure::Transient(_))) {
                        self.invalidate(&session).await;
                    }
                    result
                }
                Err(failure) => Err(failure),
            };
            match attempt {
                Ok(()) => return Ok(()),
                Err(Failure::Fatal(err)) => return Err(err),
                // A retry may store a second copy if the first was stored but its confirm was
                // lost; the consumer drops the copy by msgId.
                Err(Failure::Transient(why)) => {
                    backoff.pause("publish to the AMQP broker", &why).await?
                }
            }
        }
    }
}

//! The link's consuming side: deliveries from this gateway's inbound queue handed to the daemon
//! one after another, in the order the broker gave them, while up to [`PREFETCH`] of them wait
//! at once for their effect to be durable; each is settled (acked, dead-lettered, or the link
//! dropped so the broker gives it back) in that same order, once it is.

use futures_util::StreamExt as _;
use futures_util::stream::FuturesOrdered;
use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicRejectOptions};

use super::{Deliver, Disposition, Finish, Inbound, Link, PREFETCH};

/// A delivery handed on: how to settle it, and what the log may say of it.
struct Waiting {
    acker: Acker,
    routing_key: String,
    from: Option<String>,
}

impl Link {
    /// Takes deliveries until the consumer or the connection ends; why it ended.
    pub(super) async fn consume(
        &self,
        consumer: &mut lapin::Consumer,
        deliver: &Deliver,
    ) -> String {
        let mut waiting = FuturesOrdered::new();
        let mut open = true;
        while open || !waiting.is_empty() {
            tokio::select! {
                biased;
                Some((delivery, finish)) = waiting.next(), if !waiting.is_empty() => {
                    let disposition = match finish {
                        Finish::Now(disposition) => disposition,
                        Finish::InTurn(work) => work.await,
                    };
                    if let Err(why) = self.settle(delivery, disposition).await {
                        return why;
                    }
                }
                next = consumer.next(), if open && waiting.len() < usize::from(PREFETCH) => {
                    let mut delivery = match next {
                        Some(Ok(delivery)) => delivery,
                        Some(Err(e)) => return format!("the consumer failed: {e}"),
                        // Settle what was handed on before going: the channel may still be open.
                        None => {
                            open = false;
                            continue;
                        }
                    };
                    let from = delivery.properties.user_id().as_ref().map(|u| u.to_string());
                    let routing_key = delivery.routing_key.to_string();
                    let pending = deliver(Inbound {
                        user_id: from.clone(),
                        routing_key: routing_key.clone(),
                        body: std::mem::take(&mut delivery.data),
                    })
                    .await;
                    let handed = Waiting { acker: delivery.acker, routing_key, from };
                    waiting.push_back(async move { (handed, pending.await) });
                }
            }
        }
        "the broker cancelled the consumer".to_owned()
    }

    /// Acks, dead-letters or gives back one delivery; why the link must go, if it must.
    async fn settle(&self, delivery: Waiting, disposition: Disposition) -> Result<(), String> {
        let me = &self.inner.config.me;
        let settled = match &disposition {
            Disposition::Taken => delivery.acker.ack(BasicAckOptions::default()).await,
            Disposition::Refused(why) => {
                tracing::warn!(gateway = %me, routing_key = %delivery.routing_key, from = ?delivery.from, reason = %why, "a delivery was refused; it goes to the dead-letter queue");
                delivery
                    .acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
            }
            // Dropping the link gives back this delivery and every later one not yet settled;
            // those the daemon already took come again as duplicates, which it takes again.
            Disposition::Later(why) => {
                tracing::warn!(gateway = %me, reason = %why, "a delivery could not be taken now; the broker gives it back");
                return Err(format!("a delivery could not be taken: {why}"));
            }
        };
        settled
            .map(drop)
            .map_err(|e| format!("cannot settle a delivery: {e}"))
    }
}

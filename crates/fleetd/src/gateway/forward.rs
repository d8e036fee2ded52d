//! The gateway's forwarder: publishes the engine's outbox records in order and tells the engine
//! each one the broker confirmed. A request the broker cannot route (no such gateway) fails where
//! it was sent; an answer it cannot route (that gateway's queue is missing for now) is parked and
//! tried again every few seconds. Order holds per destination: once a record for a
//! gateway is parked, every later record for that gateway waits behind it, so a ticket's
//! `delivered` never reaches its owner after the reply it preceded. Other gateways' records go
//! on meanwhile. Knows the link only through [`Outlet`], so the ordering is tested without a
//! broker.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use fleetd_core::gateway::{Envelope, Kind};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::EngineHandle;
use crate::store::gateway_link::{Link, LinkError, Published};

/// How long an answer the broker could not route (its gateway's queue is missing) is parked
/// before it is tried again.
const PARKED_RETRY: Duration = Duration::from_secs(5);
/// How long a nacked publish waits before it is tried again.
const NACK_RETRY: Duration = Duration::from_secs(1);
/// How often the outbox is counted again while the forwarder waits for the link: the gauge and
/// the alarm follow what piles up behind the record it holds.
const RECOUNT: Duration = Duration::from_millis(250);

/// Where the forwarder's records go, and who hears what became of them.
pub(super) trait Outlet {
    /// Returns once the link is up (at once when it is).
    fn until_up(&self) -> impl Future<Output = ()> + Send;
    /// Publishes one record and waits for the broker's word.
    fn publish(
        &self,
        envelope: &Envelope,
    ) -> impl Future<Output = Result<Published, LinkError>> + Send;
    /// How many records wait to be published (the gauge and the alarm).
    fn set_outbox(&self, waiting: u64);
    /// The broker confirmed record `seq` (or it was a request no gateway could take).
    fn forwarded(&self, seq: u64, unroutable: bool) -> impl Future<Output = ()> + Send;
}

/// The real outlet: the broker link, and the engine that owns the outbox.
pub(super) struct LinkOutlet {
    pub(super) link: Link,
    pub(super) engine: EngineHandle,
}

impl Outlet for LinkOutlet {
    async fn until_up(&self) {
        self.link.until_up().await;
    }

    async fn publish(&self, envelope: &Envelope) -> Result<Published, LinkError> {
        self.link.publish(envelope).await
    }

    fn set_outbox(&self, waiting: u64) {
        self.link.set_outbox(waiting);
    }

    async fn forwarded(&self, seq: u64, unroutable: bool) {
        let _ = self.engine.forwarded(seq, unroutable).await;
    }
}

/// Whether a message the broker cannot route fails where it was sent (a request the caller is
/// told about: no such gateway), rather than waiting for the destination's queue to be back (an
/// answer about something that gateway asked for, which must not be lost).
fn fails_when_unroutable(kind: Kind) -> bool {
    matches!(kind, Kind::Task | Kind::Spawn | Kind::Stop)
}

type Record = (u64, Box<Envelope>);

/// The records held for one destination: due again at `at`, oldest first.
struct Held {
    at: Instant,
    records: VecDeque<Record>,
}

/// Publishes each outbox record as it comes, retrying it (never skipping it) until the broker
/// confirms it; see the module docs for what is parked and what waits behind it.
pub(super) async fn forward<O: Outlet>(
    outlet: O,
    mut outbox: mpsc::UnboundedReceiver<Record>,
    stop: CancellationToken,
) {
    let mut held: BTreeMap<String, Held> = BTreeMap::new();
    let waiting = |outbox: &mpsc::UnboundedReceiver<Record>, held: &BTreeMap<String, Held>| {
        (outbox.len() + held.values().map(|h| h.records.len()).sum::<usize>()) as u64
    };
    loop {
        let due = held
            .iter()
            .min_by_key(|(_, h)| h.at)
            .map(|(dst, h)| (dst.clone(), h.at));
        tokio::select! {
            next = outbox.recv() => {
                let Some((seq, envelope)) = next else { return };
                if let Some(behind) = held.get_mut(envelope.dst.as_str()) {
                    // Its gateway has a parked record: it waits behind that one.
                    behind.records.push_back((seq, envelope));
                    outlet.set_outbox(waiting(&outbox, &held));
                    continue;
                }
                let besides = waiting(&outbox, &held) - outbox.len() as u64;
                match publish(&outlet, seq, &envelope, (&outbox, besides), &stop).await {
                    Step::Done => {}
                    Step::Parked => {
                        held.insert(envelope.dst.to_string(), Held {
                            at: Instant::now() + PARKED_RETRY,
                            records: VecDeque::from([(seq, envelope)]),
                        });
                    }
                    Step::Stopped => return,
                }
            }
            () = async {
                match &due {
                    Some((_, at)) => tokio::time::sleep_until(*at).await,
                    None => std::future::pending().await,
                }
            } => {
                let Some((dst, _)) = due else { continue };
                let Some(mut parked) = held.remove(&dst) else { continue };
                while let Some((seq, envelope)) = parked.records.pop_front() {
                    let besides = parked.records.len() as u64 + waiting(&outbox, &held)
                        - outbox.len() as u64;
                    match publish(&outlet, seq, &envelope, (&outbox, besides), &stop).await {
                        Step::Done => {}
                        Step::Parked => {
                            parked.records.push_front((seq, envelope));
                            parked.at = Instant::now() + PARKED_RETRY;
                            held.insert(dst, parked);
                            break;
                        }
                        Step::Stopped => return,
                    }
                }
            }
            () = stop.cancelled() => return,
        }
        outlet.set_outbox(waiting(&outbox, &held));
    }
}

/// What became of one record.
enum Step {
    /// Confirmed, or a request that failed as unroutable: the engine was told.
    Done,
    /// An answer the broker could not route: to be tried again.
    Parked,
    /// The daemon is stopping.
    Stopped,
}

/// Publishes one record until the broker gives its word. What waits meanwhile is counted again
/// each round (the gauge and the alarm follow what the engine sends behind it): this record,
/// the outbox channel's records and `besides` (those held for parked gateways).
async fn publish<O: Outlet>(
    outlet: &O,
    seq: u64,
    envelope: &Envelope,
    (outbox, besides): (&mpsc::UnboundedReceiver<Record>, u64),
    stop: &CancellationToken,
) -> Step {
    loop {
        outlet.set_outbox(1 + outbox.len() as u64 + besides);
        tokio::select! {
            () = outlet.until_up() => {}
            () = tokio::time::sleep(RECOUNT) => continue,
            () = stop.cancelled() => return Step::Stopped,
        }
        match outlet.publish(envelope).await {
            Ok(Published::Unroutable) if !fails_when_unroutable(envelope.kind) => {
                metrics::counter!("fleetd_gateway_forwarded_total", "outcome" => "parked")
                    .increment(1);
                tracing::warn!(seq, dst = %envelope.dst, kind = envelope.kind.as_str(), "the broker has no queue for that gateway now; the message is kept and tried again, and later ones for that gateway wait behind it");
                return Step::Parked;
            }
            Ok(published) => {
                metrics::counter!(
                    "fleetd_gateway_forwarded_total",
                    "kind" => envelope.kind.as_str(),
                    "outcome" => match published {
                        Published::Confirmed => "confirmed",
                        Published::Unroutable => "unroutable",
                    }
                )
                .increment(1);
                outlet
                    .forwarded(seq, published == Published::Unroutable)
                    .await;
                return Step::Done;
            }
            Err(LinkError::Down(why)) => {
                tracing::debug!(seq, reason = %why, "gateway forward waits for the link");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(LinkError::Nacked(why)) => {
                tracing::warn!(seq, reason = %why, "the broker nacked a gateway message; trying again");
                tokio::time::sleep(NACK_RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use fleetd_core::gateway::GatewayName;

    use super::*;

    /// A broker where gateway `gone`'s queue is missing until `back` is set; it records the
    /// (seq, dst) of every record it took, in order, and the last outbox count it was told.
    /// The link is up unless `down` is set.
    #[derive(Clone, Default)]
    struct Script {
        back: Arc<std::sync::atomic::AtomicBool>,
        down: Arc<std::sync::atomic::AtomicBool>,
        taken: Arc<Mutex<Vec<(u64, String)>>>,
        waiting: Arc<std::sync::atomic::AtomicU64>,
    }

    impl Outlet for Script {
        async fn until_up(&self) {
            while self.down.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        async fn publish(&self, envelope: &Envelope) -> Result<Published, LinkError> {
            let missing = envelope.dst.as_str() == "gone"
                && !self.back.load(std::sync::atomic::Ordering::SeqCst);
            if missing {
                return Ok(Published::Unroutable);
            }
            self.taken
                .lock()
                .expect("not poisoned")
                .push((seq_of(envelope), envelope.dst.to_string()));
            Ok(Published::Confirmed)
        }

        fn set_outbox(&self, waiting: u64) {
            self.waiting
                .store(waiting, std::sync::atomic::Ordering::SeqCst);
        }

        async fn forwarded(&self, _seq: u64, _unroutable: bool) {}
    }

    impl Script {
        fn taken(&self) -> Vec<(u64, String)> {
            self.taken.lock().expect("not poisoned").clone()
        }
    }

    fn seq_of(envelope: &Envelope) -> u64 {
        envelope.msg_id.parse().expect("a test seq")
    }

    fn record(seq: u64, dst: &str, kind: Kind) -> Record {
        let name = |n: &str| GatewayName::new(n.to_owned()).expect("name");
        (
            seq,
            Box::new(Envelope {
                v: fleetd_core::gateway::PROTOCOL,
                kind,
                src: name("a"),
                dst: name(dst),
                msg_id: seq.to_string(),
                body: serde_json::Value::Null,
            }),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_answer_holds_later_records_for_its_gateway_and_no_other() {
        let script = Script::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(forward(script.clone(), rx, stop.clone()));
        // Review M8: a ticket's `delivered` is parked (the owner's queue is being declared
        // again); its queue is back before the reply that follows, which must still not
        // overtake it.
        tx.send(record(1, "gone", Kind::Ticket)).expect("send");
        tokio::time::sleep(Duration::from_millis(10)).await;
        script.back.store(true, std::sync::atomic::Ordering::SeqCst);
        tx.send(record(2, "gone", Kind::Reply)).expect("send");
        tx.send(record(3, "other", Kind::Reply)).expect("send");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            script.taken(),
            [(3, "other".to_owned())],
            "the reply waits behind the parked record; another gateway's is not held"
        );
        tokio::time::sleep(PARKED_RETRY).await;
        let gone = |seqs: &[u64]| -> Vec<(u64, String)> {
            seqs.iter().map(|s| (*s, "gone".to_owned())).collect()
        };
        assert_eq!(script.taken()[1..], gone(&[1, 2]));
        // Missing again, and still missing at the first retry: what waits stays in order.
        script
            .back
            .store(false, std::sync::atomic::Ordering::SeqCst);
        tx.send(record(4, "gone", Kind::Question)).expect("send");
        tokio::time::sleep(Duration::from_millis(10)).await;
        tx.send(record(5, "gone", Kind::Reply)).expect("send");
        tokio::time::sleep(PARKED_RETRY + Duration::from_secs(1)).await;
        assert_eq!(script.taken().len(), 3);
        script.back.store(true, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(PARKED_RETRY).await;
        assert_eq!(script.taken()[3..], gone(&[4, 5]));
        stop.cancel();
        task.await.expect("the forwarder ends");
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_link_is_down_the_count_follows_what_queues_up_behind() {
        let script = Script::default();
        script.down.store(true, std::sync::atomic::Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(forward(script.clone(), rx, stop.clone()));
        // The first record waits for the link; the engine sends three more behind it. The
        // gauge (and the outbox alarm) must see all four, not the one held.
        tx.send(record(1, "other", Kind::Task)).expect("send");
        tokio::time::sleep(Duration::from_millis(10)).await;
        for seq in 2..=4 {
            tx.send(record(seq, "other", Kind::Task)).expect("send");
        }
        tokio::time::sleep(RECOUNT * 2).await;
        assert_eq!(script.waiting.load(std::sync::atomic::Ordering::SeqCst), 4);
        script
            .down
            .store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(script.taken().len(), 4);
        assert_eq!(script.waiting.load(std::sync::atomic::Ordering::SeqCst), 0);
        stop.cancel();
        task.await.expect("the forwarder ends");
    }
}

//! The gateway's forwarder: publishes the engine's outbox records and tells the engine each one
//! the broker confirmed. Up to [`WINDOW`] records per destination are in flight at once (the
//! broker routes one channel's publishes in order, and their confirms are read in that order),
//! so a busy gateway pays one broker round trip per window rather than per record. A request
//! the broker cannot route (no such gateway) fails where it was sent; an answer it cannot route
//! (that gateway's queue is missing for now) is parked and tried again every few seconds, and
//! every later record for that gateway waits behind it, so a ticket's `delivered` does not reach
//! its owner after the reply it preceded. Other gateways' records go on meanwhile. One limit:
//! records already in flight behind one the broker turns back (a nack, a lost link, a queue
//! missing for the milliseconds a window takes) are not recalled, so they may arrive before it
//! does; the receiving engine applies ticket events only forwards, so a late `delivered` changes
//! nothing. Knows the link only through [`Outlet`], so the ordering is tested without a broker.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use fleetd_core::gateway::{Envelope, Kind};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt as _, StreamExt as _};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::EngineHandle;
use crate::store::gateway_link::{Confirming, Link, LinkError, Published};

/// Records in flight to one destination at once.
pub(super) const WINDOW: usize = 256;
/// How long an answer the broker could not route (its gateway's queue is missing) is parked
/// before it is tried again.
const PARKED_RETRY: Duration = Duration::from_secs(5);
/// How long a nacked publish waits before it is tried again.
const NACK_RETRY: Duration = Duration::from_secs(1);

/// Where the forwarder's records go, and who hears what became of them.
pub(super) trait Outlet {
    /// Returns once the link is up (at once when it is).
    fn until_up(&self) -> impl Future<Output = ()> + Send;
    /// Hands one record to the broker; what it returns is the broker's word, still to come.
    fn send(
        &self,
        envelope: &Envelope,
    ) -> impl Future<Output = Result<Confirming, LinkError>> + Send;
    /// How many records wait to be confirmed (the gauge and the alarm).
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

    async fn send(&self, envelope: &Envelope) -> Result<Confirming, LinkError> {
        self.link.send(envelope).await
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

/// One destination's records: those to try again and those never sent (oldest first), those in
/// flight with the broker's word once it came, and when it may be sent to again.
#[derive(Default)]
struct Dest {
    again: VecDeque<Record>,
    waiting: VecDeque<Record>,
    flight: VecDeque<(Record, Option<Result<Published, LinkError>>)>,
    not_before: Option<Instant>,
}

impl Dest {
    fn len(&self) -> usize {
        self.again.len() + self.waiting.len() + self.flight.len()
    }

    /// `record` is to be tried again: in its place among those to try again, by outbox order
    /// (all of which is older than what was never sent), whichever way it came back.
    fn take_back(&mut self, record: Record) {
        let at = self.again.partition_point(|(seq, _)| *seq < record.0);
        self.again.insert(at, record);
    }

    /// The next record to send, oldest first: those turned back before those never sent.
    fn next(&mut self) -> Option<Record> {
        self.again.pop_front().or_else(|| self.waiting.pop_front())
    }
}

/// A confirm on its way: the destination and record it is for, and the broker's word.
type Word = Pin<Box<dyn Future<Output = (String, u64, Result<Published, LinkError>)> + Send>>;

/// Publishes each outbox record as it comes, trying it again (never skipping it) until the
/// broker confirms it; see the module docs for what is parked and what waits behind it.
pub(super) async fn forward<O: Outlet>(
    outlet: O,
    mut outbox: mpsc::UnboundedReceiver<Record>,
    stop: CancellationToken,
) {
    let mut dests: BTreeMap<String, Dest> = BTreeMap::new();
    let mut words: FuturesUnordered<Word> = FuturesUnordered::new();
    let mut up = true;
    loop {
        if up {
            up = send_what_can_go(&outlet, &mut dests, &mut words).await;
        }
        let waiting = outbox.len() + dests.values().map(Dest::len).sum::<usize>();
        outlet.set_outbox(waiting as u64);
        let due = dests
            .values()
            .filter(|d| !d.again.is_empty() || !d.waiting.is_empty())
            .filter_map(|d| d.not_before)
            .min();
        tokio::select! {
            next = outbox.recv() => match next {
                Some((seq, envelope)) => {
                    let dest = dests.entry(envelope.dst.to_string()).or_default();
                    dest.waiting.push_back((seq, envelope));
                    // What else came meanwhile goes in the same round.
                    while let Ok((seq, envelope)) = outbox.try_recv() {
                        let dest = dests.entry(envelope.dst.to_string()).or_default();
                        dest.waiting.push_back((seq, envelope));
                    }
                }
                None => return,
            },
            Some(first) = words.next(), if !words.is_empty() => {
                // This word and every other already come, in one round.
                let mut next = Some(first);
                while let Some((dst, seq, word)) = next {
                    if let Some(dest) = dests.get_mut(&dst) {
                        if let Some(slot) = dest.flight.iter_mut().find(|((s, _), _)| *s == seq) {
                            slot.1 = Some(word);
                        }
                        up &= settle(&outlet, dest).await;
                    }
                    next = words.next().now_or_never().flatten();
                }
            }
            () = outlet.until_up(), if !up => up = true,
            () = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now();
                for dest in dests.values_mut() {
                    if dest.not_before.is_some_and(|at| at <= now) {
                        dest.not_before = None;
                    }
                }
            }
            () = stop.cancelled() => return,
        }
        dests.retain(|_, d| d.len() > 0);
    }
}

/// Hands every destination's next records to the broker, up to [`WINDOW`] in flight each;
/// `false` when the link is down (what could not go waits, in order).
async fn send_what_can_go<O: Outlet>(
    outlet: &O,
    dests: &mut BTreeMap<String, Dest>,
    words: &mut FuturesUnordered<Word>,
) -> bool {
    let now = Instant::now();
    for (dst, dest) in dests.iter_mut() {
        if dest.not_before.is_some_and(|at| at > now) {
            continue;
        }
        while dest.flight.len() < WINDOW {
            let Some((seq, envelope)) = dest.next() else {
                break;
            };
            match outlet.send(&envelope).await {
                Ok(confirming) => {
                    let dst = dst.clone();
                    let sent = Instant::now();
                    words.push(Box::pin(async move {
                        let word = confirming.await;
                        metrics::histogram!("fleetd_gateway_confirm_seconds")
                            .record(sent.elapsed().as_secs_f64());
                        (dst, seq, word)
                    }));
                    dest.flight.push_back(((seq, envelope), None));
                }
                Err(e) => {
                    dest.take_back((seq, envelope));
                    if !turned_back(seq, dest, &e) {
                        return false;
                    }
                    break;
                }
            }
        }
    }
    true
}

/// A record the broker turned back goes to be tried again; when depends on why. `false` when
/// the link is down.
fn turned_back(seq: u64, dest: &mut Dest, e: &LinkError) -> bool {
    match e {
        LinkError::Down(why) => {
            tracing::debug!(seq, reason = %why, "gateway forward waits for the link");
            false
        }
        LinkError::Nacked(why) => {
            tracing::warn!(seq, reason = %why, "the broker nacked a gateway message; trying again");
            dest.not_before = Some(Instant::now() + NACK_RETRY);
            true
        }
    }
}

/// Takes the broker's word on `dest`'s oldest records in flight, in order, as far as it came:
/// the engine hears of each one confirmed; one turned back is tried again behind those turned
/// back before it. `false` when one found the link down.
async fn settle<O: Outlet>(outlet: &O, dest: &mut Dest) -> bool {
    let mut up = true;
    while dest.flight.front().is_some_and(|(_, word)| word.is_some()) {
        let Some(((seq, envelope), Some(word))) = dest.flight.pop_front() else {
            break;
        };
        match word {
            Ok(Published::Unroutable) if !fails_when_unroutable(envelope.kind) => {
                metrics::counter!("fleetd_gateway_forwarded_total", "outcome" => "parked")
                    .increment(1);
                tracing::warn!(seq, dst = %envelope.dst, kind = envelope.kind.as_str(), "the broker has no queue for that gateway now; the message is kept and tried again, and later ones for that gateway wait behind it");
                dest.not_before = Some(Instant::now() + PARKED_RETRY);
                dest.take_back((seq, envelope));
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
            }
            Err(e) => {
                up &= turned_back(seq, dest, &e);
                dest.take_back((seq, envelope));
            }
        }
    }
    up
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use fleetd_core::gateway::GatewayName;

    use super::*;

    /// A broker where gateway `gone`'s queue is missing until `back` is set; it records the
    /// (seq, dst) of every record it took, in order, the seqs the engine heard were forwarded,
    /// and the last outbox count it was told. The link is up unless `down` is set. With `gated`,
    /// each confirm waits until the test releases it (`release`), in whatever order.
    #[derive(Clone, Default)]
    struct Script {
        back: Arc<std::sync::atomic::AtomicBool>,
        down: Arc<std::sync::atomic::AtomicBool>,
        gated: Arc<std::sync::atomic::AtomicBool>,
        gates: Arc<Mutex<BTreeMap<u64, tokio::sync::oneshot::Sender<()>>>>,
        taken: Arc<Mutex<Vec<(u64, String)>>>,
        forwarded: Arc<Mutex<Vec<u64>>>,
        waiting: Arc<std::sync::atomic::AtomicU64>,
    }

    impl Outlet for Script {
        async fn until_up(&self) {
            while self.down.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }

        async fn send(&self, envelope: &Envelope) -> Result<Confirming, LinkError> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(LinkError::Down("scripted".to_owned()));
            }
            let missing = envelope.dst.as_str() == "gone"
                && !self.back.load(std::sync::atomic::Ordering::SeqCst);
            if missing {
                return Ok(Box::pin(async { Ok(Published::Unroutable) }));
            }
            let seq = seq_of(envelope);
            lock(&self.taken).push((seq, envelope.dst.to_string()));
            if !self.gated.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Box::pin(async { Ok(Published::Confirmed) }));
            }
            let (open, gate) = tokio::sync::oneshot::channel();
            lock(&self.gates).insert(seq, open);
            Ok(Box::pin(async move {
                let _ = gate.await;
                Ok(Published::Confirmed)
            }))
        }

        fn set_outbox(&self, waiting: u64) {
            self.waiting
                .store(waiting, std::sync::atomic::Ordering::SeqCst);
        }

        async fn forwarded(&self, seq: u64, _unroutable: bool) {
            lock(&self.forwarded).push(seq);
        }
    }

    impl Script {
        fn taken(&self) -> Vec<(u64, String)> {
            lock(&self.taken).clone()
        }

        fn release(&self, seq: u64) {
            let gate = lock(&self.gates).remove(&seq).expect("a confirm waits");
            gate.send(()).expect("the forwarder waits for it");
        }
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().expect("not poisoned")
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
        tokio::time::sleep(Duration::from_millis(500)).await;
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

    #[tokio::test(start_paused = true)]
    async fn records_go_out_in_a_window_and_the_engine_hears_of_them_in_order() {
        let script = Script::default();
        script
            .gated
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (tx, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = tokio::spawn(forward(script.clone(), rx, stop.clone()));
        for seq in 1..=3 {
            tx.send(record(seq, "other", Kind::Task)).expect("send");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            script.taken().len(),
            3,
            "all three are with the broker before any confirm came"
        );
        assert_eq!(script.waiting.load(std::sync::atomic::Ordering::SeqCst), 3);
        // The broker's word comes last first: the engine still hears 1, 2, 3.
        script.release(3);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(lock(&script.forwarded).is_empty(), "3 waits for 1 and 2");
        script.release(2);
        script.release(1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*lock(&script.forwarded), [1, 2, 3]);
        assert_eq!(script.waiting.load(std::sync::atomic::Ordering::SeqCst), 0);
        stop.cancel();
        task.await.expect("the forwarder ends");
    }
}

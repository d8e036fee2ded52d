//! The AMQP backend's standing consumers: one per inbox queue this daemon uses, on a channel of
//! its own with a prefetch window. The broker pushes each message as soon as it is enqueued; the
//! consumer takes what has arrived (up to a step), commits it to the local inbox in one
//! transaction (the broker's copy of a message this daemon just committed itself is known and
//! costs nothing), and owes the ack: one `basic.ack` with `multiple` once a step's worth is owed
//! or the oldest has waited a few milliseconds.
//!
//! Also here: [`InFlight`], the ids being published and whether each one's local commit is done.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_core::Stream;
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use fleetd_core::{MsgId, Target};

use super::ingest::{INGEST_BATCH_BYTES, Queue, ack_through, close};
use super::session::{Failure, Session, answer};
use super::{Inner, queue_name};

/// The consumers running, by target: at most one per target, on the session it was started on.
#[derive(Default)]
pub(super) struct Consumers {
    running: Mutex<HashMap<Target, Running>>,
}

struct Running {
    generation: u64,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    fn live_on(&self, generation: u64) -> bool {
        self.generation == generation && !self.task.is_finished()
    }
}

impl Consumers {
    /// Whether `target`'s consumer runs on the session of `generation`.
    pub(super) fn is_running(&self, target: &Target, generation: u64) -> bool {
        crate::sync::lock(&self.running)
            .get(target)
            .is_some_and(|running| running.live_on(generation))
    }

    /// Stops every consumer and waits for each to settle the step it holds and close its
    /// channel (which returns what it had not taken to the queue).
    pub(super) async fn stop_all(&self) {
        let running: Vec<Running> = crate::sync::lock(&self.running)
            .drain()
            .map(|(_, running)| running)
            .collect();
        for Running { stop, task, .. } in running {
            // A consumer that ended already dropped its receiver.
            let _ = stop.send(());
            if let Err(err) = task.await {
                tracing::error!(error = %err, "an AMQP consumer task failed");
            }
        }
    }

    /// Ends every consumer at once (the store is dropped without a close).
    pub(super) fn abort_all(&self) {
        for running in crate::sync::lock(&self.running).values() {
            running.task.abort();
        }
    }
}

impl Inner {
    /// Starts `target`'s consumer on `session` unless one runs there already. Nothing is started
    /// once the store is closing, nor while the local inbox takes no writes (what waits stays on
    /// the broker: the sweep starts the consumer once the file takes writes again).
    pub(super) fn ensure_consumer(self: &Arc<Self>, session: &Arc<Session>, target: &Target) {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst)
            || self.local.write_failure().is_some()
        {
            return;
        }
        let mut running = crate::sync::lock(&self.consumers.running);
        if running
            .get(target)
            .is_some_and(|running| running.live_on(session.generation))
        {
            return;
        }
        let (stop, stopped) = oneshot::channel();
        let (inner, on, owned) = (Arc::clone(self), Arc::clone(session), target.clone());
        let task = tokio::spawn(async move {
            match inner.consume_until(&on, &owned, stopped).await {
                Ok(()) => tracing::debug!(target = %owned, "AMQP consumer stopped"),
                Err(Failure::Transient(why)) => {
                    tracing::debug!(target = %owned, error = %why, "AMQP consumer lost its connection");
                    inner.invalidate(&on).await;
                }
                Err(Failure::Fatal(err)) => {
                    tracing::warn!(target = %owned, error = %err, "AMQP consumer stopped; the sweep starts it again");
                }
            }
        });
        let previous = running.insert(
            target.clone(),
            Running {
                generation: session.generation,
                stop,
                task,
            },
        );
        // One on an older session: its channel is gone with its connection.
        if let Some(previous) = previous {
            previous.task.abort();
        }
    }

    /// Declares `target`'s queues if this session has not, then consumes its inbox queue until
    /// `stopped` fires, the broker cancels the consumer (the queue was deleted) or a step cannot
    /// be committed (its deliveries go back to the queue with the channel).
    async fn consume_until(
        &self,
        session: &Session,
        target: &Target,
        stopped: oneshot::Receiver<()>,
    ) -> Result<(), Failure> {
        {
            let lock = self.lock(target);
            let _held = lock.lock().await;
            self.ensure(session, target).await?;
        }
        let channel = answer("channel.open", session.connection.create_channel()).await?;
        let result = self.take(session, &channel, target, stopped).await;
        close(&channel).await;
        result
    }

    /// The consumer's loop on `channel`: wait for a delivery, take every other one that has
    /// arrived (up to [`Inner::step_size`] or [`INGEST_BATCH_BYTES`]), commit them as one step.
    /// Acks are owed, not sent, until a step's worth is owed or the oldest has waited
    /// [`ACK_DELAY`]: on a quorum queue each ack is a replicated, fsynced command, which a
    /// publisher's next message would otherwise queue behind. The prefetch window is two steps,
    /// so the broker keeps pushing while a step commits and while its ack is owed.
    async fn take(
        &self,
        session: &Session,
        channel: &Channel,
        target: &Target,
        mut stopped: oneshot::Receiver<()>,
    ) -> Result<(), Failure> {
        let step = self.step_size();
        let qos = channel.basic_qos(step.saturating_mul(2), BasicQosOptions { global: false });
        answer("basic.qos", qos).await?;
        let consume = channel.basic_consume(
            queue_name(target).into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        let mut consumer = answer("basic.consume", consume).await?;
        let mut owed = Owed::default();
        loop {
            let next = std::future::poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx));
            let first = tokio::select! {
                _ = &mut stopped => break,
                () = owed.due() => {
                    owed.pay(channel).await?;
                    continue;
                }
                first = next => first,
            };
            let Some(first) = first else {
                // The broker cancelled the consumer: the queue is gone. The next publish or
                // sweep declares it again and starts a consumer.
                session.set_ready(target, false);
                return Ok(());
            };
            let first = first?;
            let mut bytes = first.data.len();
            let mut batch: Vec<Delivery> = vec![first];
            while batch.len() < usize::from(step) && bytes < INGEST_BATCH_BYTES {
                // What has arrived already, without waiting for more.
                let ready = std::future::poll_fn(|cx| {
                    Poll::Ready(match Pin::new(&mut consumer).poll_next(cx) {
                        Poll::Ready(Some(delivery)) => Some(delivery),
                        Poll::Ready(None) | Poll::Pending => None,
                    })
                })
                .await;
                let Some(delivery) = ready else { break };
                let delivery = delivery?;
                bytes += delivery.data.len();
                batch.push(delivery);
            }
            let count = batch.len();
            let (_, through) = {
                let lock = self.lock(target);
                let _held = lock.lock().await;
                self.commit_step(channel, target, Queue::Current, batch)
                    .await?
            };
            if let Some(tag) = through {
                owed.add(tag, count);
            }
            if owed.count >= usize::from(step) {
                owed.pay(channel).await?;
            }
        }
        owed.pay(channel).await?;
        let cancel = channel.basic_cancel(consumer.tag(), BasicCancelOptions::default());
        answer("basic.cancel", cancel).await?;
        Ok(())
    }
}

/// Longest a committed delivery's ack is held back to share one `basic.ack` with the next ones.
const ACK_DELAY: Duration = Duration::from_millis(10);

/// The acks a consumer owes: every delivery up to `through` is committed locally.
#[derive(Default)]
struct Owed {
    through: Option<u64>,
    since: Option<Instant>,
    count: usize,
}

impl Owed {
    fn add(&mut self, tag: u64, count: usize) {
        self.through = Some(tag);
        self.since.get_or_insert_with(Instant::now);
        self.count += count;
    }

    /// Fires when the oldest owed ack has waited [`ACK_DELAY`]; never when none is owed.
    async fn due(&self) {
        match self.since {
            Some(since) => tokio::time::sleep_until(since + ACK_DELAY).await,
            None => std::future::pending().await,
        }
    }

    async fn pay(&mut self, channel: &Channel) -> Result<(), Failure> {
        if let Some(tag) = self.through {
            ack_through(channel, tag).await?;
        }
        *self = Self::default();
        Ok(())
    }
}

/// The ids being published right now, each with whether its local commit is done.
pub(super) type Flights = Mutex<HashMap<MsgId, bool>>;

/// One id in [`Inner::in_flight`] for as long as its publish runs, however it ends (a caller
/// that gives up drops the publish: the id must not stay a "duplicate" for ever).
pub(super) struct InFlight<'a> {
    set: &'a Flights,
    id: MsgId,
}

impl<'a> InFlight<'a> {
    /// `None` when the id is being published already.
    pub(super) fn start(set: &'a Flights, id: MsgId) -> Option<Self> {
        // Built only when inserted: a guard built and dropped for a duplicate would free the
        // id of the publish that is running.
        let mut flights = crate::sync::lock(set);
        if flights.contains_key(&id) {
            return None;
        }
        flights.insert(id, false);
        Some(Self { set, id })
    }

    /// The message is in the local inbox: its broker copy needs no commit.
    pub(super) fn committed(&self) {
        crate::sync::lock(self.set).insert(self.id, true);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        crate::sync::lock(self.set).remove(&self.id);
    }
}

/// Whether `id` is being published by this daemon and already committed to the local inbox.
pub(super) fn committed_here(set: &Flights, id: MsgId) -> bool {
    crate::sync::lock(set).get(&id).copied().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_in_flight_only_while_its_publish_runs() {
        let set = Flights::default();
        let id = MsgId::from_parts(1_700_000_000_000, [7; 10]);
        let first = InFlight::start(&set, id).expect("not in flight yet");
        assert!(
            InFlight::start(&set, id).is_none(),
            "a concurrent publish is a duplicate"
        );
        assert!(
            crate::sync::lock(&set).contains_key(&id),
            "and the running one stays in flight"
        );
        // A publish whose caller gave up is dropped half way: the id is free again.
        assert!(
            !committed_here(&set, id),
            "its broker copy is committed by the consumer"
        );
        first.committed();
        assert!(committed_here(&set, id), "now the local copy is there");
        drop(first);
        assert!(
            !committed_here(&set, id),
            "a later copy is checked against the file"
        );
        assert!(InFlight::start(&set, id).is_some());
    }
}

//! The AMQP backend's ingest: declaring a target's queues (and migrating a legacy
//! queue), then moving what waits in it into the local inbox — commit locally, then ack —
//! on a channel of its own that is closed when done, so no delivery outlives the call.
//! What fleetd cannot take (not a fleetd message, another target's, over the size limit) is
//! rejected into the dead-letter queue. Knows lapin's channel calls; connection handling lives
//! in `session`.
//!
//! Migration. A queue declared by fleetd before the delivery limit existed has different
//! arguments, so declaring it again fails with PRECONDITION_FAILED, and arguments cannot be
//! changed in place. So: ingest every message of the old queue, delete it, declare it anew.
//! Quorum queues refuse `queue.delete` with `if_empty` (RabbitMQ 3.10 answers NOT_IMPLEMENTED
//! and closes the connection), so the delete is unconditional; it runs under the target's lock,
//! which fleetd's own publishes to the target wait for, right after the ingest found the queue
//! empty. Only a publisher outside this daemon could slip a message in between; the delete's
//! count says so, and it is logged as an error. An old queue has no dead-letter exchange, so its
//! poison is copied into the dead-letter queue (confirmed) before it is acked, never rejected.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    BasicQosOptions, BasicRejectOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, message::Delivery};

use fleetd_core::{Message, Target};

use super::session::{Failure, Session, answer, declare, is_precondition_failed, within};
use super::{Inner, queue_name};
use crate::store::{PublishOutcome, StoreError};

/// Most deliveries one ingest step pulls before it commits them (in one local transaction) and
/// acks them. Bounds the memory of a step together with [`INGEST_BATCH_BYTES`].
const INGEST_BATCH: usize = 64;

/// Most message bytes one ingest step holds (messages are up to `maxMessageBytes` each).
pub(super) const INGEST_BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Steps of at most this many messages use `basic.get` instead of a consumer (see
/// [`Inner::consume`]).
const GET_AT_MOST: u16 = 2;

/// Longest a consume step waits for the next of the deliveries it counted. The broker pushes
/// them at once; only a consumer outside this daemon taking some first leaves the step short,
/// and then it settles what came.
const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// Whether `target`'s inbox queue exists on the broker (a passive declare on a channel of its
/// own: a missing queue closes that channel, nothing else).
pub(super) async fn exists(session: &Session, target: &Target) -> Result<bool, Failure> {
    let channel = answer("channel.open", session.connection.create_channel()).await?;
    let declared = channel.queue_declare(
        queue_name(target).into(),
        super::passive(),
        FieldTable::default(),
    );
    let found = match within("queue.declare", declared).await? {
        Ok(_) => true,
        Err(err) if super::session::is_not_found(&err) => return Ok(false),
        Err(err) => return Err(err.into()),
    };
    close(&channel).await;
    Ok(found)
}

/// Closes a channel the ingest opened. Closing returns every delivery it still holds to the
/// queue; a channel the broker closed already needs nothing.
pub(super) async fn close(channel: &Channel) {
    if channel.status().connected()
        && let Err(err) = answer("channel.close", channel.close(200, "ingest done".into())).await
    {
        tracing::debug!(error = %err, "closing an ingest channel failed");
    }
}

/// The kind of inbox queue [`Inner::pull`] empties, which says when it stops and where poison
/// goes.
#[derive(Clone, Copy)]
pub(super) enum Queue<'c> {
    /// Declared with a dead-letter exchange. The pull consumes what a count found ready, a
    /// step at a time, and stops when a count finds none.
    Current,
    /// A legacy queue, declared without one, and about to be deleted: the pull stops only
    /// at `get-empty`, and poison is copied to the dead-letter queue through `publisher` (a
    /// confirm-mode channel).
    Old { publisher: &'c Channel },
}

/// Why a delivery goes to the dead-letter queue, as the metric's `reason` label.
#[derive(Debug, Clone, Copy)]
enum Poison {
    /// Not JSON of a fleetd message.
    Undecodable,
    /// A fleetd message for another target.
    WrongTarget,
    /// A fleetd message that breaks this daemon's limits.
    Refused,
}

impl Poison {
    fn as_str(self) -> &'static str {
        match self {
            Self::Undecodable => "undecodable",
            Self::WrongTarget => "wrong_target",
            Self::Refused => "refused",
        }
    }
}

impl Inner {
    /// Declares (or migrates) `target`'s queues if this session has not, then moves every
    /// message waiting in its inbox queue into the local inbox, waiting for an ingest of it that
    /// runs. Returns how many were new.
    pub(super) async fn ingest(&self, session: &Session, target: &Target) -> Result<u64, Failure> {
        let lock = self.lock(target);
        let _held = lock.lock().await;
        self.ensure(session, target).await?;
        let channel = answer("channel.open", session.connection.create_channel()).await?;
        // Every step counts first (a passive declare), so an empty queue costs no consumer.
        let result = self.pull(session, &channel, target, Queue::Current).await;
        close(&channel).await;
        result
    }

    /// Declares `target`'s queues once per session, migrating an old inbox queue. The caller
    /// holds the target's lock.
    pub(super) async fn ensure(&self, session: &Session, target: &Target) -> Result<(), Failure> {
        if session.is_ready(target) {
            return Ok(());
        }
        let channel = answer("channel.open", session.connection.create_channel()).await?;
        let declared = within("queue.declare", declare(&channel, target)).await?;
        close(&channel).await;
        match declared {
            Ok(()) => {}
            Err(err) if is_precondition_failed(&err) => self.migrate(session, target).await?,
            Err(err) => return Err(err.into()),
        }
        session.set_ready(target, true);
        Ok(())
    }

    /// Moves every message of an old-style inbox queue into the local inbox, deletes the queue
    /// and declares it again with the current arguments (see the module docs).
    async fn migrate(&self, session: &Session, target: &Target) -> Result<(), Failure> {
        let queue = queue_name(target);
        tracing::info!(
            %queue,
            "the queue was declared by fleetd's first releases (no delivery limit or dead-letter queue); moving its messages into the local inbox and declaring it again"
        );
        let channel = answer("channel.open", session.connection.create_channel()).await?;
        let result = async {
            let old = Queue::Old {
                publisher: &session.publisher,
            };
            let moved = self.pull(session, &channel, target, old).await?;
            let delete = channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default());
            let deleted = answer("queue.delete", delete).await?;
            if deleted > 0 {
                tracing::error!(
                    %queue,
                    deleted,
                    "messages arrived in the old queue between its last read and its deletion and were deleted with it: a publisher outside this fleetd uses the queue"
                );
            }
            answer("queue.declare", declare(&channel, target)).await?;
            Ok::<_, Failure>(moved)
        }
        .await;
        close(&channel).await;
        let moved = result?;
        tracing::info!(%queue, moved, "queue migrated: it now has a delivery limit and a dead-letter queue");
        Ok(())
    }

    /// Pulls every message waiting in `target`'s inbox queue on `channel`, a step at a time,
    /// each step committed to the local inbox in one go (in msgId order), then acknowledged;
    /// poison is rejected into the dead-letter queue. A delivery whose commit failed stays
    /// unacked, and the caller's closing of the channel returns it.
    async fn pull(
        &self,
        session: &Session,
        channel: &Channel,
        target: &Target,
        queue: Queue<'_>,
    ) -> Result<u64, Failure> {
        if let Some(err) = self.local.write_failure() {
            // Pulling now would only return the deliveries, each return counting toward the
            // delivery limit: leave them on the broker until the local file takes writes
            // (`/healthz` reports the failure meanwhile).
            tracing::debug!(error = %err, "the local inbox takes no writes; leaving messages on the broker");
            return Ok(0);
        }
        match queue {
            Queue::Current => self.consume(session, channel, target).await,
            Queue::Old { .. } => self.get_all(channel, target, queue).await,
        }
    }

    /// A current queue's pull. Each step counts the ready messages (a passive declare), then
    /// takes exactly that many — at most [`Inner::step_size`] — through a consumer whose
    /// prefetch is that count, so the broker pushes them in one go and none beyond: on a quorum
    /// queue a `basic.get` is a replicated, fsynced command per message, a consumer one per step.
    /// The consumer is cancelled before the step is settled, so nothing more arrives on the
    /// channel. A step of one or two messages takes them with `basic.get` (as many replicated
    /// commands as a consumer's consume and cancel). Stops when a count finds the queue empty.
    async fn consume(
        &self,
        session: &Session,
        channel: &Channel,
        target: &Target,
    ) -> Result<u64, Failure> {
        let name = queue_name(target);
        let step = self.step_size();
        let mut fresh = 0;
        loop {
            let ready = self.waiting(session, channel, target).await?;
            if ready == 0 {
                return Ok(fresh);
            }
            let want = u16::try_from(ready).unwrap_or(u16::MAX).min(step);
            if want <= GET_AT_MOST {
                // A consumer costs two replicated commands (consume, cancel): for one or two
                // messages, as many `basic.get`s cost no more.
                let mut batch: Vec<Delivery> = Vec::with_capacity(usize::from(want));
                for _ in 0..want {
                    let get =
                        channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: false });
                    let got = answer("basic.get", get).await?;
                    match got {
                        Some(got) => batch.push(got.delivery),
                        None => break,
                    }
                }
                let short = batch.len() < usize::from(want);
                fresh += self.settle(channel, target, Queue::Current, batch).await?;
                if short {
                    return Ok(fresh);
                }
                continue;
            }
            let qos = channel.basic_qos(want, BasicQosOptions { global: false });
            answer("basic.qos", qos).await?;
            let consume = channel.basic_consume(
                name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            );
            let mut consumer = answer("basic.consume", consume).await?;
            let mut batch: Vec<Delivery> = Vec::with_capacity(usize::from(want));
            while batch.len() < usize::from(want) {
                let next = std::future::poll_fn(|cx| Pin::new(&mut consumer).poll_next(cx));
                match tokio::time::timeout(DELIVERY_WAIT, next).await {
                    Ok(Some(delivery)) => batch.push(delivery?),
                    // Cancelled by the broker (the queue was deleted), or fewer came than were
                    // counted (someone else consumes the queue): settle what came.
                    Ok(None) | Err(_) => break,
                }
            }
            let cancel = channel.basic_cancel(consumer.tag(), BasicCancelOptions::default());
            answer("basic.cancel", cancel).await?;
            let short = batch.len() < usize::from(want);
            fresh += self.settle(channel, target, Queue::Current, batch).await?;
            if short {
                return Ok(fresh);
            }
        }
    }

    /// Deliveries one consume step takes: [`INGEST_BATCH`], fewer when that many messages of the
    /// largest size this daemon accepts would exceed [`INGEST_BATCH_BYTES`] (a prefetch counts
    /// messages, not bytes). Never less than one.
    pub(super) fn step_size(&self) -> u16 {
        let fits = (INGEST_BATCH_BYTES / self.largest_delivery().max(1)).clamp(1, INGEST_BATCH);
        u16::try_from(fits).unwrap_or(1)
    }

    /// The most bytes one delivery holds: one message of the largest size this daemon accepts,
    /// as JSON (room for its text, the escaping of some of it, its fields). A batch the lanes
    /// publish is never larger, so a prefetch window bounds memory as for single messages.
    pub(super) fn largest_delivery(&self) -> usize {
        self.limits
            .max_message_bytes
            .saturating_add(self.limits.max_message_bytes / 4)
            .saturating_add(4096)
    }

    /// An old queue's pull (a migration, which deletes the queue next): `basic.get` to
    /// `get-empty`, up to [`INGEST_BATCH`] deliveries or [`INGEST_BATCH_BYTES`] per step.
    async fn get_all(
        &self,
        channel: &Channel,
        target: &Target,
        queue: Queue<'_>,
    ) -> Result<u64, Failure> {
        let name = queue_name(target);
        let mut fresh = 0;
        loop {
            let mut batch: Vec<Delivery> = Vec::new();
            let (mut bytes, mut last) = (0, false);
            while batch.len() < INGEST_BATCH && bytes < INGEST_BATCH_BYTES {
                let get =
                    channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: false });
                let got = answer("basic.get", get).await?;
                let Some(got) = got else {
                    last = true;
                    break;
                };
                bytes += got.delivery.data.len();
                batch.push(got.delivery);
            }
            fresh += self.settle(channel, target, queue, batch).await?;
            if last {
                return Ok(fresh);
            }
        }
    }

    /// How many messages wait ready in `target`'s inbox queue (a passive declare, which the
    /// broker answers from the queue's state without a replicated command). A queue deleted
    /// under this session is declared again by the next ingest.
    async fn waiting(
        &self,
        session: &Session,
        channel: &Channel,
        target: &Target,
    ) -> Result<u32, Failure> {
        let declared = channel.queue_declare(
            queue_name(target).into(),
            super::passive(),
            FieldTable::default(),
        );
        match within("queue.declare", declared).await? {
            Ok(queue) => Ok(queue.message_count()),
            Err(err) if super::session::is_not_found(&err) => {
                session.set_ready(target, false);
                Ok(0)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Commits one step's deliveries locally and acks them on the broker.
    pub(super) async fn settle(
        &self,
        channel: &Channel,
        target: &Target,
        queue: Queue<'_>,
        batch: Vec<Delivery>,
    ) -> Result<u64, Failure> {
        let (fresh, through) = self.commit_step(channel, target, queue, batch).await?;
        if let Some(last) = through {
            ack_through(channel, last).await?;
        }
        Ok(fresh)
    }

    /// Commits one step's deliveries locally (poison rejected into the dead-letter queue) and
    /// returns how many were new and the tag an ack with `multiple` may cover now: every
    /// delivery up to it is committed or settled. When part of the commit failed, the committed
    /// ones are acked one by one here and the error returned (the rest go back with the channel).
    pub(super) async fn commit_step(
        &self,
        channel: &Channel,
        target: &Target,
        queue: Queue<'_>,
        batch: Vec<Delivery>,
    ) -> Result<(u64, Option<u64>), Failure> {
        // Each good delivery's fate: committed unless one of its messages says otherwise.
        let mut fates: BTreeMap<usize, Fate> = BTreeMap::new();
        let mut good: Vec<(usize, Message)> = Vec::with_capacity(batch.len());
        for (index, delivery) in batch.iter().enumerate() {
            match decode(delivery, target) {
                Ok(messages) => {
                    fates.insert(index, Fate::Committed);
                    good.extend(messages.into_iter().map(|message| (index, message)));
                }
                Err(why) => self.park(channel, target, queue, delivery, why).await?,
            }
        }
        // The broker's copies of this daemon's own publishes whose local commit is done: known,
        // nothing to write (a copy whose commit is still running is deduplicated by the file).
        let before = good.len();
        good.retain(|(_, message)| {
            !super::consumer::committed_here(&self.in_flight, message.msg_id)
        });
        let own = before - good.len();
        // Requeued messages may come back after newer ones: commit each step in msgId order.
        good.sort_by_key(|(_, message)| message.msg_id);
        let (indexes, messages): (Vec<usize>, Vec<Message>) = good.into_iter().unzip();
        let committing = tokio::time::Instant::now();
        let count = messages.len();
        let outcomes = self.local.publish_all(messages).await;
        tracing::trace!(
            target: super::PROFILE,
            step_commit_us = committing.elapsed().as_micros(),
            batch = count,
            own,
            "step"
        );
        let mut fresh = 0;
        for (index, outcome) in indexes.into_iter().zip(outcomes) {
            let fate = fates.entry(index).or_insert(Fate::Committed);
            match outcome {
                Ok(outcome) => fresh += u64::from(outcome == PublishOutcome::Stored),
                Err(StoreError::Refused(_)) if matches!(fate, Fate::Committed) => {
                    *fate = Fate::Refused;
                }
                Err(StoreError::Refused(_)) => {}
                Err(err) => {
                    if !matches!(fate, Fate::Failed(_)) {
                        *fate = Fate::Failed(err);
                    }
                }
            }
        }
        let mut committed: Vec<u64> = Vec::with_capacity(fates.len());
        let mut failed: Option<StoreError> = None;
        for (index, fate) in fates {
            let delivery = &batch[index];
            match fate {
                Fate::Committed => committed.push(delivery.delivery_tag),
                // A batch whose other messages are committed goes to the dead-letter queue whole:
                // it holds the refused one.
                Fate::Refused => {
                    self.park(channel, target, queue, delivery, Poison::Refused)
                        .await?;
                }
                Fate::Failed(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        // Acked only after the commit that holds them. Every other delivery of the step is
        // settled already (poison rejected or parked), and earlier steps were committed whole:
        // one ack with `multiple` covers exactly committed ones.
        match (failed, committed.iter().max()) {
            (None, last) => Ok((fresh, last.copied())),
            (Some(err), _) => {
                // Some stay unacked (the closing of the channel returns them): ack the
                // committed ones one by one.
                for tag in committed {
                    answer(
                        "basic.ack",
                        channel.basic_ack(tag, BasicAckOptions::default()),
                    )
                    .await?;
                }
                Err(Failure::Fatal(err))
            }
        }
    }

    /// Moves one delivery fleetd cannot take to the target's dead-letter queue: a current queue
    /// dead-letters what is rejected without requeueing; an old one has no dead-letter exchange
    /// (a reject would destroy it), so a copy is published there (confirmed) before the ack.
    /// Logged without its body.
    async fn park(
        &self,
        channel: &Channel,
        target: &Target,
        queue: Queue<'_>,
        delivery: &Delivery,
        why: Poison,
    ) -> Result<(), Failure> {
        let dead = super::dead_letter_queue_name(target);
        match queue {
            Queue::Current => {
                let reject = channel
                    .basic_reject(delivery.delivery_tag, BasicRejectOptions { requeue: false });
                answer("basic.reject", reject).await?;
            }
            Queue::Old { publisher } => {
                let publish = publisher.basic_publish(
                    "".into(),
                    dead.as_str().into(),
                    BasicPublishOptions::default(),
                    &delivery.data,
                    delivery.properties.clone(),
                );
                let confirm = answer("basic.publish", async { publish.await?.await }).await?;
                if !confirm.is_ack() {
                    return Err(Failure::Transient(format!(
                        "the broker did not confirm a copy into {dead}"
                    )));
                }
                let ack = channel.basic_ack(delivery.delivery_tag, BasicAckOptions::default());
                answer("basic.ack", ack).await?;
            }
        }
        metrics::counter!("fleetd_amqp_dead_lettered_total", "reason" => why.as_str()).increment(1);
        tracing::warn!(
            queue = %queue_name(target),
            dead_letter_queue = %dead,
            reason = why.as_str(),
            bytes = delivery.data.len(),
            "a message in the inbox queue is not a fleetd message this daemon can take; moved to the dead-letter queue"
        );
        Ok(())
    }
}

/// Acks every delivery on `channel` up to `tag` (one `basic.ack` with `multiple`).
pub(super) async fn ack_through(channel: &Channel, tag: u64) -> Result<(), Failure> {
    let multiple = BasicAckOptions { multiple: true };
    answer("basic.ack", channel.basic_ack(tag, multiple)).await
}

/// What became of one delivery of a step.
enum Fate {
    /// Every message it holds is in the local inbox.
    Committed,
    /// The local inbox refused one of its messages (over this daemon's limits).
    Refused,
    /// A commit failed: it stays unacked and goes back with the channel.
    Failed(StoreError),
}

/// The [`BasicProperties`](lapin::BasicProperties) `type` of a delivery that carries several
/// messages (a JSON array) published together: see `publish`.
pub(super) const BATCH_TYPE: &str = "batch";

/// The fleetd messages `delivery` carries for `target`: one, or the array of a batch.
fn decode(delivery: &Delivery, target: &Target) -> Result<Vec<Message>, Poison> {
    let batch = delivery
        .properties
        .kind()
        .as_ref()
        .is_some_and(|kind| kind.as_str() == BATCH_TYPE);
    let messages = if batch {
        match serde_json::from_slice::<Vec<Message>>(&delivery.data) {
            Ok(messages) if !messages.is_empty() => messages,
            _ => return Err(Poison::Undecodable),
        }
    } else {
        vec![serde_json::from_slice::<Message>(&delivery.data).map_err(|_| Poison::Undecodable)?]
    };
    if messages.iter().any(|message| message.target != *target) {
        return Err(Poison::WrongTarget);
    }
    Ok(messages)
}

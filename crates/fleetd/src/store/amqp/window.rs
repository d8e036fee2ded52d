//! The AMQP backend's held windows: per target, the deliveries pulled with `basic.get` and held
//! unacknowledged, kept in msgId order, and the retried operations (peek, ack, drain, depth) that
//! read and settle them. Knows lapin's channel calls; connection handling lives in `session`.

use std::collections::VecDeque;
use std::future::Future;

use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicQosOptions};

use fleetd_core::{Message, MsgId, Target};

use super::session::{Failure, Session, declare, is_not_found};
use super::{AmqpStore, HOLD_MAX, queue_name};
use crate::store::{Page, PageRequest};

/// A target's held window. `held` is `None` until the target is first read, and is dropped when
/// its channel dies (the broker then requeues what it held).
#[derive(Default)]
pub(super) struct Inbox {
    pub(super) held: Option<Held>,
}

/// The deliveries one channel holds unacknowledged for a target, in msgId order.
pub(super) struct Held {
    generation: u64,
    channel: Channel,
    pub(super) deliveries: VecDeque<HeldDelivery>,
    /// Deliveries that did not decode as a fleetd message: left unacknowledged (so nothing is
    /// destroyed) and never shown. They still take room in the window.
    hidden: usize,
}

/// One held delivery: the decoded message and the tag that settles it on its channel.
pub(super) struct HeldDelivery {
    pub(super) message: Message,
    tag: u64,
}

impl AmqpStore {
    /// The held window of `target` on the current session, opening its channel if needed.
    /// `None` when the broker has no queue for the target (nothing was ever published to it).
    async fn held<'x>(
        &self,
        session: &Session,
        inbox: &'x mut Inbox,
        target: &Target,
    ) -> Result<Option<&'x mut Held>, Failure> {
        let stale = inbox.held.as_ref().is_some_and(|held| {
            held.generation != session.generation || !held.channel.status().connected()
        });
        if stale {
            inbox.held = None;
        }
        if inbox.held.is_none() {
            let channel = session.connection.create_channel().await?;
            match declare(&channel, target, true).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) => return Ok(None),
                Err(err) => return Err(err.into()),
            }
            inbox.held = Some(Held {
                generation: session.generation,
                channel,
                deliveries: VecDeque::new(),
                hidden: 0,
            });
        }
        Ok(inbox.held.as_mut())
    }

    /// Pulls deliveries into the window until it is full or the queue has no ready message left.
    /// One `basic.get` round trip per message; an already full window costs nothing.
    async fn fill(&self, held: &mut Held, target: &Target) -> Result<(), Failure> {
        let queue = queue_name(target);
        while held.deliveries.len() + held.hidden < HOLD_MAX {
            let got = held
                .channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                .await?;
            let Some(got) = got else { break };
            self.absorb(held, target, got.delivery.delivery_tag, &got.delivery.data)
                .await?;
        }
        Ok(())
    }

    /// Adds one delivery to the window, or settles it at once when its msgId is already held or
    /// was acknowledged (a redelivery or a duplicate publish).
    async fn absorb(
        &self,
        held: &mut Held,
        target: &Target,
        tag: u64,
        data: &[u8],
    ) -> Result<(), Failure> {
        let message = match serde_json::from_slice::<Message>(data) {
            Ok(message) if message.target == *target => message,
            Ok(_) | Err(_) => {
                tracing::error!(
                    queue = %queue_name(target),
                    bytes = data.len(),
                    "a message in the inbox queue is not a fleetd message for this target; left unacknowledged and hidden"
                );
                held.hidden += 1;
                return Ok(());
            }
        };
        let id = message.msg_id;
        let seen = held.deliveries.iter().any(|d| d.message.msg_id == id)
            || self.known().acked.contains(&id);
        if seen {
            held.channel
                .basic_ack(tag, BasicAckOptions::default())
                .await?;
            return Ok(());
        }
        // Keep the window in msgId order (see the module docs on requeue order).
        let position = held.deliveries.partition_point(|d| d.message.msg_id < id);
        held.deliveries
            .insert(position, HeldDelivery { message, tag });
        Ok(())
    }

    /// Acknowledges the held delivery of `msg_id`, if the window (filled first) has it.
    async fn ack_held(
        &self,
        held: &mut Held,
        target: &Target,
        msg_id: MsgId,
    ) -> Result<bool, Failure> {
        let position = |held: &Held| {
            held.deliveries
                .iter()
                .position(|d| d.message.msg_id == msg_id)
        };
        let index = match position(held) {
            Some(index) => index,
            None => {
                self.fill(held, target).await?;
                match position(held) {
                    Some(index) => index,
                    None => return Ok(false),
                }
            }
        };
        // Remember the ack before sending it: if the connection drops before the broker sees it,
        // the redelivered copy is settled on sight instead of shown again.
        self.known().acked.insert(msg_id);
        let tag = held.deliveries[index].tag;
        held.channel
            .basic_ack(tag, BasicAckOptions::default())
            .await?;
        held.deliveries.remove(index);
        Ok(true)
    }

    /// Waits until the broker has processed everything sent on the window's channel so far.
    /// `basic.ack` has no reply; a synchronous method after it does, and the broker handles a
    /// channel's methods in order. So once this returns, acks sent before it are settled on the
    /// broker and a crash of this process can no longer bring those messages back.
    async fn sync(held: &Held) -> Result<(), Failure> {
        held.channel
            .basic_qos(0, BasicQosOptions::default())
            .await?;
        Ok(())
    }
}

/// One inbox operation, retried by [`AmqpStore::with_inbox`] across reconnects. Progress that
/// must survive a retry (what was drained, whether the id was seen) lives in the implementor.
pub(super) trait Attempt: Send {
    type Output;

    fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> impl Future<Output = Result<Self::Output, Failure>> + Send + 'x;
}

pub(super) struct Peek {
    pub(super) request: PageRequest,
}

impl Attempt for Peek {
    type Output = Page;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<Page, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(self.request.cut(&[]));
        };
        // Fill the whole window, not just one page: requeued messages may come back after newer
        // ones, and only a full window can be put back in order.
        store.fill(held, target).await?;
        Ok(self.request.cut(held.deliveries.iter().map(|d| &d.message)))
    }
}

pub(super) struct Ack {
    pub(super) msg_id: MsgId,
    /// Set once the id was seen held: a retry that then no longer finds it (the ack landed, or
    /// the redelivery was settled on sight) still means it was acknowledged.
    pub(super) found: bool,
}

impl Attempt for Ack {
    type Output = bool;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<bool, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(false);
        };
        self.found |= held
            .deliveries
            .iter()
            .any(|d| d.message.msg_id == self.msg_id);
        let acked = store.ack_held(held, target, self.msg_id).await?;
        self.found |= acked;
        if acked {
            AmqpStore::sync(held).await?;
        }
        Ok(acked)
    }
}

pub(super) struct Drain {
    pub(super) drained: Vec<Message>,
}

impl Attempt for Drain {
    type Output = ();

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<(), Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(());
        };
        loop {
            store.fill(held, target).await?;
            let Some(first) = held.deliveries.front() else {
                return AmqpStore::sync(held).await;
            };
            let message = first.message.clone();
            if store.ack_held(held, target, message.msg_id).await? {
                self.drained.push(message);
            }
        }
    }
}

pub(super) struct Depth;

impl Attempt for Depth {
    type Output = u64;

    async fn run<'x>(
        &'x mut self,
        store: &'x AmqpStore,
        session: &'x Session,
        inbox: &'x mut Inbox,
        target: &'x Target,
    ) -> Result<u64, Failure> {
        let Some(held) = store.held(session, inbox, target).await? else {
            return Ok(0);
        };
        let shown = held.deliveries.len() as u64;
        match declare(&held.channel, target, true).await {
            Ok(ready) => Ok(shown + u64::from(ready)),
            Err(err) if is_not_found(&err) => {
                // Deleted under us: the channel is closed, and there is nothing to count.
                inbox.held = None;
                Ok(0)
            }
            Err(err) => Err(err.into()),
        }
    }
}

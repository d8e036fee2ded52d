//! The AMQP backend's publish lanes: publishes to one target that wait at the same moment go to
//! the broker as one message and share one confirm, as the embedded writer's commits share one
//! fsync. A lane sends one group at a time: the first publish to an idle lane goes out at once,
//! alone (a plain message, as any AMQP client reads it); those that arrive while it is on its
//! way go together next, as a JSON array typed `batch` (see `ingest::decode`), never larger
//! than the largest single message the consumer is sized for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use fleetd_core::{Message, Target};

use super::Inner;
use super::session::{Failure, Session, publish};
use crate::store::StoreError;
use crate::sync::lock;

/// Most messages one group carries.
const GROUP_MESSAGES: usize = 64;

/// Every target's lane.
#[derive(Default)]
pub(super) struct Lanes {
    lanes: Mutex<HashMap<Target, Lane>>,
}

/// The publishes waiting for a target's queue, and whether a group of them is on its way.
#[derive(Default)]
struct Lane {
    waiting: Vec<Outgoing>,
    sending: bool,
}

/// One publish in a lane: its message, the message as JSON, and who waits for the confirm.
struct Outgoing {
    message: Message,
    body: Vec<u8>,
    told: oneshot::Sender<Result<(), Failure>>,
}

impl Inner {
    /// Sends `message` (as `body`) through its target's lane on `session` and waits for the
    /// confirm of the group it went out in.
    pub(super) async fn send(
        self: &Arc<Self>,
        session: &Arc<Session>,
        message: &Message,
        body: &[u8],
    ) -> Result<(), Failure> {
        let (tell, told) = oneshot::channel();
        let idle = {
            let mut lanes = lock(&self.lanes.lanes);
            let lane = lanes.entry(message.target.clone()).or_default();
            lane.waiting.push(Outgoing {
                message: message.clone(),
                body: body.to_vec(),
                told: tell,
            });
            !std::mem::replace(&mut lane.sending, true)
        };
        if idle {
            let (inner, on, target) = (
                Arc::clone(self),
                Arc::clone(session),
                message.target.clone(),
            );
            tokio::spawn(async move { inner.flush(&on, &target).await });
        }
        told.await.unwrap_or_else(|_| {
            Err(Failure::Transient(
                "the lane's sender stopped before the broker answered".to_owned(),
            ))
        })
    }

    /// Sends `target`'s waiting publishes a group at a time until none waits.
    async fn flush(&self, session: &Session, target: &Target) {
        let largest = self.largest_delivery();
        loop {
            let group: Vec<Outgoing> = {
                let mut lanes = lock(&self.lanes.lanes);
                let Some(lane) = lanes.get_mut(target) else {
                    return;
                };
                if lane.waiting.is_empty() {
                    lanes.remove(target);
                    return;
                }
                let (mut taken, mut bytes) = (0, 1);
                for next in &lane.waiting {
                    let grown = bytes + next.body.len() + 1;
                    if taken > 0 && (taken == GROUP_MESSAGES || grown > largest) {
                        break;
                    }
                    (taken, bytes) = (taken + 1, grown);
                }
                lane.waiting.drain(..taken).collect()
            };
            tracing::trace!(target: super::PROFILE, group = group.len(), "group");
            let sent = match group.as_slice() {
                [one] => {
                    let kind = one.message.kind.as_str();
                    publish(session, &one.message, kind, &one.body).await
                }
                [first, ..] => {
                    let batch = array(&group);
                    publish(session, &first.message, super::ingest::BATCH_TYPE, &batch).await
                }
                [] => Ok(()),
            };
            for outgoing in group {
                let answer = match &sent {
                    Err(Failure::Fatal(StoreError::Nacked(_))) => {
                        Err(Failure::Fatal(StoreError::Nacked(outgoing.message.msg_id)))
                    }
                    other => other.clone(),
                };
                // A publisher that gave up dropped its receiver: nothing to tell.
                let _ = outgoing.told.send(answer);
            }
        }
    }
}

/// The group's messages as one JSON array (each body is a JSON object already).
fn array(group: &[Outgoing]) -> Vec<u8> {
    let mut out = Vec::with_capacity(group.iter().map(|o| o.body.len() + 1).sum::<usize>() + 1);
    out.push(b'[');
    for (n, outgoing) in group.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&outgoing.body);
    }
    out.push(b']');
    out
}

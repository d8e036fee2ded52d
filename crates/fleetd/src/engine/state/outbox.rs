//! The gateway outbox as the engine keeps it: the records not yet confirmed by the broker, by
//! sequence (durable), with how many of them are for each other gateway, and how many messages
//! each other gateway last had waiting in its queue on the broker (soft: read by the forwarder's
//! probe, `gateway::backlog`). Together they are the backlog to one gateway, which bounds what
//! may be sent there (`gateway.peerBacklogMax`).

use std::collections::{BTreeMap, HashMap};

use fleetd_core::gateway::{Envelope, GatewayName};

/// The outbox records and each destination's backlog.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    records: BTreeMap<u64, Envelope>,
    /// Records in `records` for each destination.
    waiting_for: HashMap<GatewayName, usize>,
    /// Messages in each destination's queue on the broker, as last read.
    queued_at: HashMap<GatewayName, u64>,
}

/// What waits for one other gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Backlog {
    /// Messages in its queue on the broker, as last read.
    pub(super) queued: u64,
    /// Records for it in this outbox.
    pub(super) outboxed: usize,
}

impl Backlog {
    /// Both together.
    pub(super) fn total(self) -> u64 {
        self.queued
            .saturating_add(u64::try_from(self.outboxed).unwrap_or(u64::MAX))
    }
}

impl Outbox {
    pub(super) fn insert(&mut self, seq: u64, envelope: Envelope) {
        let dst = envelope.dst.clone();
        if let Some(old) = self.records.insert(seq, envelope) {
            self.forget(&old.dst);
        }
        *self.waiting_for.entry(dst).or_default() += 1;
    }

    pub(super) fn remove(&mut self, seq: &u64) -> Option<Envelope> {
        let envelope = self.records.remove(seq)?;
        self.forget(&envelope.dst);
        Some(envelope)
    }

    fn forget(&mut self, dst: &GatewayName) {
        if let Some(n) = self.waiting_for.get_mut(dst) {
            *n -= 1;
            if *n == 0 {
                self.waiting_for.remove(dst);
            }
        }
    }

    pub(super) fn get(&self, seq: &u64) -> Option<&Envelope> {
        self.records.get(seq)
    }

    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Gateway `dst`'s queue on the broker held `depth` messages when last read.
    pub(super) fn set_queued(&mut self, dst: GatewayName, depth: u64) {
        if depth == 0 {
            self.queued_at.remove(&dst);
        } else {
            self.queued_at.insert(dst, depth);
        }
    }

    /// What waits for gateway `dst`.
    pub(super) fn backlog(&self, dst: &GatewayName) -> Backlog {
        Backlog {
            queued: self.queued_at.get(dst).copied().unwrap_or(0),
            outboxed: self.waiting_for.get(dst).copied().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetd_core::gateway::{Kind, PROTOCOL};

    use super::*;

    fn envelope(dst: &str) -> Envelope {
        Envelope {
            v: PROTOCOL,
            kind: Kind::Task,
            src: GatewayName::new("a").expect("name"),
            dst: GatewayName::new(dst).expect("name"),
            msg_id: format!("m-{dst}"),
            body: serde_json::Value::Null,
        }
    }

    #[test]
    fn each_destinations_backlog_counts_its_records_and_its_queue() {
        let (b, c) = (
            GatewayName::new("b").expect("name"),
            GatewayName::new("c").expect("name"),
        );
        let mut outbox = Outbox::default();
        outbox.insert(1, envelope("b"));
        outbox.insert(2, envelope("b"));
        outbox.insert(3, envelope("c"));
        outbox.set_queued(b.clone(), 40);
        assert_eq!(
            outbox.backlog(&b),
            Backlog {
                queued: 40,
                outboxed: 2
            }
        );
        assert_eq!(outbox.backlog(&b).total(), 42);
        assert_eq!(outbox.backlog(&c).total(), 1);
        // The same record again (a restart restoring it) is not counted twice.
        outbox.insert(1, envelope("b"));
        assert_eq!(outbox.backlog(&b).outboxed, 2);
        assert!(outbox.remove(&1).is_some());
        assert!(outbox.remove(&1).is_none(), "gone once");
        assert!(outbox.remove(&3).is_some());
        outbox.set_queued(b.clone(), 0);
        assert_eq!(outbox.backlog(&b).total(), 1);
        assert_eq!(outbox.backlog(&c).total(), 0);
        assert_eq!(outbox.len(), 1);
    }
}

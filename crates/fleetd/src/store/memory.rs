//! The in-memory inbox backend for core and driver tests. Not durable: it must never be what a
//! running daemon stores replies in.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use fleetd_core::{Message, MessageLimits, MsgId, Target};

use super::{
    DEDUP_WINDOW, InboxStore, Page, PageRequest, PublishOutcome, RecentIds, StateOp, StateRecord,
    StateStore, StoreError, StoreFuture,
};

/// An inbox in memory. Clones share the same contents, so a test can "reopen" by cloning.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<State>>,
    limits: MessageLimits,
}

#[derive(Debug)]
struct State {
    queues: BTreeMap<Target, VecDeque<Message>>,
    acked: RecentIds,
    /// The fleet state: (kind, key) → value.
    records: BTreeMap<(String, String), String>,
    /// Writes (publishes and state commits) fail as on a full disk (a test's fault).
    writes_fail: bool,
    /// How long each state commit takes (a test's slow disk).
    state_commit_delay: std::time::Duration,
    /// How many more state loads fail (a test's unreadable store).
    loads_fail: u32,
}

impl MemoryStore {
    /// An empty store that enforces `limits`.
    pub fn new(limits: MessageLimits) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State {
                queues: BTreeMap::new(),
                acked: RecentIds::new(DEDUP_WINDOW),
                records: BTreeMap::new(),
                writes_fail: false,
                state_commit_delay: std::time::Duration::ZERO,
                loads_fail: 0,
            })),
            limits,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.inner)
    }

    /// Makes every later write (publish, state commit) fail (`true`) as on a full disk, or
    /// work again (`false`): the fault a test of "the store could not take it" needs.
    pub fn set_writes_fail(&self, fails: bool) {
        self.state().writes_fail = fails;
    }

    /// Makes the next `count` state loads fail, as a store that cannot be read.
    pub fn fail_loads(&self, count: u32) {
        self.state().loads_fail = count;
    }

    /// Makes every later state commit take `delay` before it lands (inbox writes stay quick):
    /// a test's slow fsync, to show what waits for the fleet state and what does not.
    pub fn set_state_commit_delay(&self, delay: std::time::Duration) {
        self.state().state_commit_delay = delay;
    }

    fn disk_full() -> StoreError {
        StoreError::Backend {
            op: "commit a batch of inbox writes",
            source: Arc::new(std::io::Error::other("scripted: no space left on device")),
        }
    }

    fn publish_now(&self, message: Message) -> Result<PublishOutcome, StoreError> {
        message.check(&self.limits)?;
        let mut state = self.state();
        if state.writes_fail {
            return Err(Self::disk_full());
        }
        let known = state.acked.contains(&message.msg_id)
            || state
                .queues
                .values()
                .any(|queue| queue.iter().any(|held| held.msg_id == message.msg_id));
        if known {
            return Ok(PublishOutcome::Duplicate);
        }
        state
            .queues
            .entry(message.target.clone())
            .or_default()
            .push_back(message);
        Ok(PublishOutcome::Stored)
    }

    fn ack_now(&self, target: &Target, msg_id: MsgId) -> bool {
        let mut state = self.state();
        let Some(queue) = state.queues.get_mut(target) else {
            return false;
        };
        let Some(index) = queue.iter().position(|m| m.msg_id == msg_id) else {
            return false;
        };
        queue.remove(index);
        if queue.is_empty() {
            state.queues.remove(target);
        }
        state.acked.insert(msg_id);
        true
    }
}

impl Default for MemoryStore {
    /// An empty store with the default limits.
    fn default() -> Self {
        Self::new(MessageLimits::default())
    }
}

impl InboxStore for MemoryStore {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(async move { self.publish_now(message) })
    }

    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page> {
        Box::pin(async move {
            let state = self.state();
            let empty = VecDeque::new();
            Ok(request.cut(state.queues.get(target).unwrap_or(&empty)))
        })
    }

    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool> {
        Box::pin(async move { Ok(self.ack_now(target, msg_id)) })
    }

    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>> {
        Box::pin(async move {
            let mut state = self.state();
            let drained: Vec<Message> = state
                .queues
                .remove(target)
                .map(Vec::from)
                .unwrap_or_default();
            for message in &drained {
                state.acked.insert(message.msg_id);
            }
            Ok(drained)
        })
    }

    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let state = self.state();
            Ok(state
                .queues
                .get(target)
                .map_or(0, |queue| queue.len() as u64))
        })
    }

    fn targets(&self) -> StoreFuture<'_, Vec<Target>> {
        Box::pin(async move { Ok(self.state().queues.keys().cloned().collect()) })
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move { Ok(()) })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        // Clones share the contents, and a test "reopens" by cloning: closing forgets nothing.
        Box::pin(async move { Ok(()) })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}

impl StateStore for MemoryStore {
    fn load_state(&self) -> StoreFuture<'_, Vec<StateRecord>> {
        Box::pin(async move {
            let mut state = self.state();
            if state.loads_fail > 0 {
                state.loads_fail -= 1;
                return Err(StoreError::Backend {
                    op: "read the fleet state",
                    source: Arc::new(std::io::Error::other("scripted: database is locked")),
                });
            }
            Ok(state
                .records
                .iter()
                .map(|((kind, key), value)| StateRecord {
                    kind: kind.clone(),
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect())
        })
    }

    fn commit_state(&self, ops: Vec<StateOp>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let delay = self.state().state_commit_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut state = self.state();
            if state.writes_fail {
                return Err(Self::disk_full());
            }
            for op in ops {
                match op {
                    StateOp::Put(r) => {
                        state.records.insert((r.kind, r.key), r.value);
                    }
                    StateOp::Delete { kind, key } => {
                        state.records.remove(&(kind, key));
                    }
                }
            }
            Ok(())
        })
    }
}

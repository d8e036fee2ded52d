//! The inbox as the tools use it: the store, plus what the engine must hear of each change, so
//! an acknowledgement can never forget to tell it, and the rule for replies handed to
//! a waiting `fleet_send`: such a reply is not acknowledged when the waiter returns
//! it, but by the caller's next call (or its `fleet_ack`), and a waiter that fails or is dropped
//! before returning it gives it back to be nudged about. Reads go to the store directly.

use std::sync::Arc;

use fleetd_core::{MsgId, Target, Ticket};

use crate::engine::EngineHandle;
use crate::store::{InboxStore, StoreError};

/// The store and the engine, together.
#[derive(Debug, Clone)]
pub struct Inbox {
    store: Arc<dyn InboxStore>,
    engine: EngineHandle,
}

impl Inbox {
    /// The inbox over `store`, telling `engine` of changes.
    pub fn new(store: Arc<dyn InboxStore>, engine: EngineHandle) -> Self {
        Self { store, engine }
    }

    /// The store, for reads.
    pub fn store(&self) -> &Arc<dyn InboxStore> {
        &self.store
    }

    /// Acknowledges `ids` in `target`'s inbox; one answer per id (false: it was not there).
    /// The engine hears of it whatever happened, so the push loop re-reads the depth.
    pub async fn ack(&self, target: &Target, ids: &[MsgId]) -> Result<Vec<bool>, StoreError> {
        let mut acked = Vec::with_capacity(ids.len());
        let mut result = Ok(());
        for id in ids {
            match self.store.ack(target, *id).await {
                Ok(done) => acked.push(done),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let _ = self.engine.acked(target.clone(), ids.to_vec()).await;
        result.map(|()| acked)
    }

    /// Acknowledges the replies handed to `holder` by its earlier waits: it has called again,
    /// so they reached it.
    pub async fn settle_handed(&self, holder: &str) {
        let Ok(handed) = self.engine.take_handed(holder.to_owned()).await else {
            return;
        };
        for (target, id) in handed {
            if let Err(e) = self.ack(&target, &[id]).await {
                tracing::warn!(%target, error = %e, "could not acknowledge a reply its waiter returned; it stays in the inbox");
            }
        }
    }

    /// A guard for the reply a waiter on `ticket` may be handed: unless it is confirmed, it is
    /// given back to be nudged about when the guard drops (the request failed, timed out, or
    /// was dropped).
    pub fn hand_guard(&self, ticket: Ticket) -> HandedGuard {
        HandedGuard {
            engine: self.engine.clone(),
            ticket,
            confirmed: false,
        }
    }
}

/// See [`Inbox::hand_guard`].
#[derive(Debug)]
pub struct HandedGuard {
    engine: EngineHandle,
    ticket: Ticket,
    confirmed: bool,
}

impl HandedGuard {
    /// The reply is being returned to `holder`: its next call acknowledges it.
    pub async fn confirm(mut self, holder: String) {
        self.confirmed = self.engine.handed_to(self.ticket, holder).await.is_ok();
    }
}

impl Drop for HandedGuard {
    fn drop(&mut self) {
        if !self.confirmed {
            self.engine.unhand_now(self.ticket);
        }
    }
}

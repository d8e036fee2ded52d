//! A store decorator that times the durable operations (`publish`, `ack`) into the
//! `fleetd_store_*_seconds` histograms; every call passes through unchanged. `open` wraps each
//! backend in it, so no backend carries metrics code.

use std::fmt;

use fleetd_core::{Message, MsgId, Target};
use tokio::time::Instant;

use super::{InboxStore, Page, PageRequest, PublishOutcome, StoreFuture};

/// `S`, timed. Holds the backend behind an `Arc`, so the embedded store can be the fleet-state
/// store too.
pub(super) struct Metered<S>(pub(super) std::sync::Arc<S>);

impl<S: fmt::Debug> fmt::Debug for Metered<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<S: InboxStore> InboxStore for Metered<S> {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(async move {
            let started = Instant::now();
            let outcome = self.0.publish(message).await;
            metrics::histogram!("fleetd_store_publish_seconds")
                .record(started.elapsed().as_secs_f64());
            outcome
        })
    }

    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page> {
        self.0.page(target, request)
    }

    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let started = Instant::now();
            let acked = self.0.ack(target, msg_id).await;
            metrics::histogram!("fleetd_store_ack_seconds").record(started.elapsed().as_secs_f64());
            acked
        })
    }

    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>> {
        self.0.drain(target)
    }

    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64> {
        self.0.depth(target)
    }

    fn targets(&self) -> StoreFuture<'_, Vec<Target>> {
        self.0.targets()
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        self.0.health()
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        self.0.close()
    }

    fn kind(&self) -> &'static str {
        self.0.kind()
    }
}

//! The backlog probe: how many messages wait in each other gateway's queue on the broker, read
//! every [`PROBE_EVERY`] for the gateways sent tasks or spawns since the last reading (what the
//! bound holds back; replies and ticket states to a gateway cost no reading) and for those
//! whose last reading was not zero (so a refusal lifts once the queue drains, with nothing sent
//! meanwhile), and told to the engine as it changes. The engine adds its outbox's records for
//! that gateway and refuses new tasks and spawns for it at `gateway.peerBacklogMax`
//! (`gateway_busy`): a gateway that falls behind, or is down, slows its senders, where before
//! the broker's queue (100,000) and this outbox (`gateway.outboxMax`) took everything and a
//! task waited minutes behind the others.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetd_core::gateway::GatewayName;
use tokio_util::sync::CancellationToken;

use crate::engine::EngineHandle;
use crate::store::gateway_link::Link;

/// How often the queues are read.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Reads the queues until `stop`.
pub(super) fn watch(link: Link, engine: EngineHandle, stop: CancellationToken) {
    tokio::spawn(async move {
        // The last reading of each gateway's queue that was not zero.
        let mut queued: BTreeMap<GatewayName, u64> = BTreeMap::new();
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.cancelled() => return,
            }
            let mut due = link.take_sent_to();
            due.extend(queued.keys().cloned());
            for gw in due {
                let Some(depth) = link.queued_at(&gw).await else {
                    continue;
                };
                let was = if depth == 0 {
                    queued.remove(&gw)
                } else {
                    queued.insert(gw.clone(), depth)
                };
                if was.unwrap_or(0) == depth {
                    continue;
                }
                #[expect(clippy::cast_precision_loss, reason = "a gauge")]
                metrics::gauge!("fleetd_gateway_peer_queued", "gateway" => gw.to_string())
                    .set(depth as f64);
                if engine.peer_queued(gw, depth).await.is_err() {
                    return;
                }
            }
        }
    });
}

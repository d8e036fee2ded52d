//! The running gateway: the broker link (`store::gateway_link`), the forwarder (`forward`) that
//! publishes the engine's outbox records in order, and the
//! consumer's side — each delivery from another gateway checked (`fleetd_core::gateway::accept`:
//! an envelope, from whom the broker vouched for; one that is not is refused to the dead-letter
//! queue and reported to the engine, which counts it and tells the lead) and handed to the
//! engine, a reply for one of this gateway's tickets published into this host's inbox first
//! (the engine hears of a reply only once it is durable), and the broker acked only once the
//! engine says the effect is committed. A spawn another gateway asks for is acked once the engine has recorded it, then
//! run by the spawn service on a task of its own; the engine sends back what it came to.

use fleetd_core::refusal::Code;
use std::sync::Arc;

use fleetd_core::Message;
use fleetd_core::gateway::{Envelope, GatewayName, Kind, accept};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{EngineHandle, GatewayOutcome, PeerRefusal, PeerSpawn};
use crate::members::{SpawnRequest, Spawner};
use crate::store::gateway_link::{
    Deliver, Disposition, Finish, Inbound, Link, LinkConfig, Pending, settled,
};
use crate::store::{InboxStore, StoreError};

/// Starts the link and the forwarder; they run until `stop`.
pub fn start(
    config: LinkConfig,
    engine: EngineHandle,
    store: Arc<dyn InboxStore>,
    spawner: Spawner,
    peers: &super::presence::Peers,
    outbox: mpsc::UnboundedReceiver<(u64, Box<Envelope>)>,
    stop: CancellationToken,
) -> Link {
    let me = config.me.clone();
    let link = Link::new(config);
    let outlet = super::forward::LinkOutlet {
        link: link.clone(),
        engine: engine.clone(),
    };
    tokio::spawn(super::forward::forward(outlet, outbox, stop.clone()));
    super::backlog::watch(link.clone(), engine.clone(), stop.clone());
    super::presence::broadcast(
        link.clone(),
        engine.clone(),
        spawner.config.clone(),
        stop.clone(),
    );
    super::presence::tell_events(peers.clone(), engine.clone(), stop.clone());
    link.run(deliver(me, engine, store, spawner), peers.sink(), stop);
    link
}

/// Runs a spawn another gateway asked for (recorded by the engine, whose answer goes back).
fn spawn_for_peer(engine: EngineHandle, spawner: &Spawner, request: PeerSpawn) {
    let saga = spawner.start(SpawnRequest {
        profile: request.profile,
        name: request.name,
        ..SpawnRequest::default()
    });
    tokio::spawn(async move {
        let outcome = match saga.await {
            Ok(Ok(spawned)) => Ok((spawned.target, spawned.pane.to_string(), spawned.profile)),
            Ok(Err(refusal)) => Err(refusal),
            Err(e) => Err(fleetd_core::access::Refusal::new(
                Code::SpawnFailed,
                format!("the spawn stopped before it finished ({e})"),
            )),
        };
        let _ = engine.peer_spawned(request.req, outcome).await;
    });
}

/// The consumer's side: whether each delivery is an envelope from whom it claims (else it is
/// refused, and the engine told), then handed to the engine; what the engine made of it once
/// its effect is durable (at once for a reply, which changes nothing until it is stored), a
/// reply stored in the inbox in turn.
#[expect(
    clippy::async_yields_async,
    reason = "handing on ends before the effect is durable: the link waits for the second future later"
)]
fn deliver(
    me: GatewayName,
    engine: EngineHandle,
    store: Arc<dyn InboxStore>,
    spawner: Spawner,
) -> Deliver {
    Arc::new(move |inbound: Inbound| {
        let me = me.clone();
        let engine = engine.clone();
        let store = Arc::clone(&store);
        let spawner = spawner.clone();
        Box::pin(async move {
            let checked = accept(
                &me,
                inbound.user_id.as_deref(),
                &inbound.routing_key,
                &inbound.body,
            );
            let envelope = match checked {
                Ok(envelope) => envelope,
                Err(refused) => {
                    let why = refused.to_string();
                    let refusal = PeerRefusal {
                        from: inbound.user_id,
                        reason: refused.reason(),
                        why: why.clone(),
                        parked: true,
                    };
                    // Refused whether or not the engine still hears of it.
                    let _ = engine.gateway_refused(refusal).await;
                    return settled(Disposition::Refused(why));
                }
            };
            let (kind, handed) = (envelope.kind, Instant::now());
            let Ok(outcome) = engine.hand_in(envelope).await else {
                return settled(Disposition::Later("the engine has stopped".to_owned()));
            };
            let from = inbound.user_id;
            Box::pin(async move {
                let disposition = match outcome.await {
                    Err(_) => Disposition::Later("the engine has stopped".to_owned()),
                    Ok(Err(why)) => Disposition::Later(why),
                    Ok(Ok(GatewayOutcome::Taken)) => Disposition::Taken,
                    // Counted and raised as an incident by the engine, where it was decided.
                    Ok(Ok(GatewayOutcome::Refused { why, .. })) => Disposition::Refused(why),
                    Ok(Ok(GatewayOutcome::Spawn(request))) => {
                        spawn_for_peer(engine, &spawner, *request);
                        Disposition::Taken
                    }
                    Ok(Ok(GatewayOutcome::PublishReply(message))) => {
                        return Finish::InTurn(Box::pin(async move {
                            let stored = store_reply(engine, store, from, *message).await;
                            taken(kind, handed, &stored);
                            stored
                        }));
                    }
                };
                taken(kind, handed, &disposition);
                Finish::Now(disposition)
            }) as Pending
        })
    })
}

/// Records how long a delivery of `kind` handed to the engine at `handed` took to be taken here
/// (its effect durable; a reply stored in the inbox and its ticket told), when it was.
fn taken(kind: Kind, handed: Instant, disposition: &Disposition) {
    if *disposition == Disposition::Taken {
        metrics::histogram!("fleetd_gateway_taken_seconds", "kind" => kind.as_str())
            .record(handed.elapsed().as_secs_f64());
    }
}

/// Stores a reply from another gateway's member in the inbox, then tells the engine it is there.
async fn store_reply(
    engine: EngineHandle,
    store: Arc<dyn InboxStore>,
    from: Option<String>,
    message: Message,
) -> Disposition {
    match store.publish(message.clone()).await {
        Ok(_) => match engine.reply_stored(message).await {
            Ok(_) => Disposition::Taken,
            Err(_) => Disposition::Later("the engine has stopped".to_owned()),
        },
        // It breaks this inbox's limits (`inbox.maxMessageBytes`): no retry can store it, so it
        // is refused for good — dead-lettered, counted and told to the lead — rather than
        // redelivered forever (attack G11).
        Err(StoreError::Refused(e)) => {
            let why = format!(
                "a reply from member {} for ticket {} that this gateway's inbox cannot store ({e})",
                message.target,
                message.ticket.map(|t| t.to_string()).unwrap_or_default(),
            );
            let refusal = PeerRefusal {
                from,
                reason: "unstorable",
                why: why.clone(),
                parked: true,
            };
            let _ = engine.gateway_refused(refusal).await;
            Disposition::Refused(why)
        }
        Err(e) => Disposition::Later(format!("cannot store a reply: {e}")),
    }
}

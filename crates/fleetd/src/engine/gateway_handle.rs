//! The engine's side of the gateway (SPEC §12), as its handle offers them: deliveries from
//! other gateways and the broker's confirms of the outbox, stops and spawns across gateways (a
//! lead's `fleet_spawn` on another gateway, and what the spawn service made of a request another
//! gateway sent here). What they do to the state is `state::remote_spawns`'s and `state::gateway`'s.

use fleetd_core::Target;
use fleetd_core::Ticket;
use fleetd_core::access::Refusal;
use tokio::sync::oneshot;

use super::{Command, EngineGone, EngineHandle, GatewayOutcome, LeadRef, PeerRefusal};

/// A member another gateway spawned for a caller here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteSpawned {
    /// Its name, `name@gateway`.
    pub target: Target,
    /// Its pane as its gateway names it, prefixed with the gateway (`b/member:w1:p3`).
    pub pane: String,
    /// Its profile (the other gateway's).
    pub profile: String,
    /// The first task's ticket, when the request carried one.
    pub ticket: Option<Ticket>,
}

/// What `fleet_spawn` with another `gateway` asks for.
#[derive(Debug, Clone)]
pub struct SpawnRemote {
    /// The gateway to spawn on.
    pub gateway: String,
    /// Its profile's name there.
    pub profile: String,
    /// The member's name; `None`: that gateway picks a free one.
    pub name: Option<String>,
    /// A first task, sent once the member is ready.
    pub task: Option<String>,
    /// The lead that asked (the new member reports to it).
    pub lead: Option<LeadRef>,
    /// The delegating member that asked, when one did.
    pub by: Option<Target>,
}

/// A spawn another gateway asked of this one, for the spawn service to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpawn {
    /// The request's id (the answer carries it back).
    pub req: String,
    /// The profile, one of this gateway's.
    pub profile: String,
    /// The member's name, when the request gave one.
    pub name: Option<String>,
}

/// Where the outcome of a spawn on another gateway arrives.
pub type SpawnAnswer = oneshot::Receiver<Result<RemoteSpawned, Refusal>>;

impl EngineHandle {
    /// Hands a delivery from another gateway to the engine, which checks and applies it in the
    /// order handed; returns once it is queued, with where its outcome arrives once its effect
    /// is durable (`Err`: it could not be written, give it back; closed: the engine stopped).
    pub async fn hand_in(
        &self,
        envelope: fleetd_core::gateway::Envelope,
    ) -> Result<oneshot::Receiver<Result<GatewayOutcome, String>>, EngineGone> {
        let (reply, outcome) = oneshot::channel();
        self.send(Command::GatewayIn {
            envelope: Box::new(envelope),
            reply,
        })
        .await?;
        Ok(outcome)
    }

    /// [`Self::hand_in`], its outcome awaited (the engine's tests; the link pipelines).
    #[cfg(test)]
    pub(crate) async fn gateway_in(
        &self,
        envelope: fleetd_core::gateway::Envelope,
    ) -> Result<Result<GatewayOutcome, String>, EngineGone> {
        self.hand_in(envelope).await?.await.map_err(|_| EngineGone)
    }

    /// The broker confirmed outbox record `seq` (or has no gateway for it: `unroutable`).
    pub async fn forwarded(&self, seq: u64, unroutable: bool) -> Result<(), EngineGone> {
        self.send(Command::Forwarded { seq, unroutable }).await
    }

    /// Gateway `gateway`'s queue on the broker held `depth` messages just now (the forwarder's
    /// probe): new requests to it are refused while that and this outbox's records for it reach
    /// `gateway.peerBacklogMax`.
    pub async fn peer_queued(
        &self,
        gateway: fleetd_core::gateway::GatewayName,
        depth: u64,
    ) -> Result<(), EngineGone> {
        self.send(Command::PeerQueued { gateway, depth }).await
    }

    /// Asks `target`'s gateway (another host's) to stop it; `false` when this fleetd is no
    /// gateway or `target` is local.
    pub async fn stop_remote(&self, target: Target, cause: String) -> Result<bool, EngineGone> {
        self.ask(|reply| Command::StopRemote {
            target,
            cause,
            reply,
        })
        .await
    }

    /// Asks another gateway to spawn a member; answered once the request is durable with its
    /// id and a receiver for what it came to.
    pub async fn spawn_remote(
        &self,
        request: SpawnRemote,
    ) -> Result<Result<(String, SpawnAnswer), Refusal>, EngineGone> {
        let gateway = request.gateway.clone();
        self.life
            .busy
            .held(&gateway, || {
                self.ask(|reply| Command::SpawnRemote {
                    request: Box::new(request.clone()),
                    reply,
                })
            })
            .await
    }

    /// A delivery from another gateway was refused before the engine saw it (it is no
    /// envelope, or not from whom it claims): counted, and an incident to this gateway's lead
    /// (bounded per sender and reason) and on `/events`. What the engine refuses itself it
    /// counts and raises where it decides.
    pub async fn gateway_refused(&self, refused: PeerRefusal) -> Result<(), EngineGone> {
        self.send(Command::GatewayRefused { refused }).await
    }

    /// The spawn service finished request `req` of another gateway: `(target, pane, profile)`
    /// or why it failed. The answer goes back to that gateway.
    pub async fn peer_spawned(
        &self,
        req: String,
        outcome: Result<(Target, String, String), Refusal>,
    ) -> Result<(), EngineGone> {
        self.send(Command::PeerSpawned { req, outcome }).await
    }
}

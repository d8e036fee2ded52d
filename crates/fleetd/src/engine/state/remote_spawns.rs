//! Spawns across gateways (SPEC §12), as the engine keeps them. A lead's `fleet_spawn` with
//! another `gateway` is a request recorded here (durable until answered) and sent there; the
//! answer binds the new `name@gateway` to the lead, and comes back to the waiting call or, when
//! none waits any more, as a notice in that member's inbox here. A request from another gateway
//! (allowed by `gateway.peers`) is recorded before the broker is acked, handed to the spawn
//! service, and answered with what it came to; a copy of a request already taken is not spawned
//! again, and one a restart interrupted is answered as failed.

use fleetd_core::access::Refusal;
use fleetd_core::gateway::{GatewayName, Kind};
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use fleetd_core::{MessageKind, Target};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::super::{LeadRef, PeerSpawn, RemoteSpawned, SpawnAnswer, SpawnRemote};
use super::{GatewayOutcome, Io, State, TaskOrder};
use crate::events::FleetEvent;

/// How long a spawn request served for another gateway is remembered after it finished, so a
/// copy the broker delivers again (a restart between the commit and the ack) is not spawned.
const SERVED_KEPT: SignedDuration = SignedDuration::from_hours(24);

/// A spawn request's body.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpawnBody {
    req: String,
    profile: String,
    #[serde(default)]
    name: Option<String>,
    /// Who asked, as the asking gateway names it (`L@a`): for the log only.
    by: String,
}

/// What a spawn came to.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpawnedBody {
    req: String,
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    pane: Option<String>,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    error: Option<SpawnError>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SpawnError {
    code: String,
    message: String,
}

/// A spawn this gateway asked another for, until its answer comes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Asked {
    dst: GatewayName,
    #[serde(default)]
    lead: Option<LeadRef>,
    #[serde(default)]
    by: Option<Target>,
    profile: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    task: Option<String>,
    /// The `fleet_spawn` call waiting for it (none after a restart, or once it gave up).
    #[serde(skip)]
    waiter: Option<oneshot::Sender<Result<RemoteSpawned, Refusal>>>,
}

/// A spawn another gateway asked of this one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Served {
    src: GatewayName,
    at: Timestamp,
    done: bool,
}

/// The durable key of an asked (`asked:<req>`) or served (`served:<req>`) spawn.
pub(super) fn spawn_key(asked: bool, req: &str) -> String {
    format!("{}:{req}", if asked { "asked" } else { "served" })
}

/// Another gateway's spawn request, or its refusal as malformed.
fn spawn_request(body: serde_json::Value) -> Result<SpawnBody, GatewayOutcome> {
    serde_json::from_value(body)
        .map_err(|_| GatewayOutcome::malformed("a spawn request without its id or profile"))
}

impl State {
    /// `fleet_spawn` on another gateway: the request is recorded and sent; the receiver gets
    /// what it came to.
    pub(in crate::engine) fn spawn_remote(
        &mut self,
        request: SpawnRemote,
        now: Timestamp,
    ) -> Result<(String, SpawnAnswer), Refusal> {
        let Some(gw) = &self.gateway else {
            return Err(Refusal::new(
                Code::NoGateway,
                format!(
                    "gateway {} is another host, and this fleetd is no gateway: configure `gateway:` (docs/MULTIHOST.md)",
                    request.gateway
                ),
            ));
        };
        let me = gw.me.clone();
        let dst = GatewayName::new(request.gateway.clone()).map_err(|e| {
            Refusal::new(Code::InvalidGateway, format!("{:?}: {e}", request.gateway))
        })?;
        self.outbox_room(&dst)?;
        if let Some(name) = &request.name {
            Target::local(name.as_str())
                .map_err(|e| Refusal::new(Code::InvalidName, format!("{name:?}: {e}")))?;
        }
        let req = self.ids.new_id().to_string();
        let sender = request
            .by
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| request.lead.as_ref().map(|l| Self::lead_id(l).0))
            .unwrap_or_else(|| "operator".to_owned());
        let body = SpawnBody {
            req: req.clone(),
            profile: request.profile.clone(),
            name: request.name.clone(),
            by: format!("{sender}@{me}"),
        };
        let (tx, rx) = oneshot::channel();
        self.asked_spawns.insert(
            req.clone(),
            Asked {
                dst: dst.clone(),
                lead: request.lead,
                by: request.by,
                profile: request.profile,
                name: request.name,
                task: request.task,
                waiter: Some(tx),
            },
        );
        self.dirty.spawns.insert(spawn_key(true, &req));
        self.send_out(&dst, Kind::Spawn, body);
        tracing::debug!(%req, %dst, at = %now, "spawn asked of another gateway");
        Ok((req, rx))
    }

    /// A spawn request from gateway `src` (its right already checked): recorded, then handed to
    /// the spawn service once that is durable. A copy of one taken before is only acked.
    pub(super) fn spawn_in(
        &mut self,
        src: &GatewayName,
        body: serde_json::Value,
        now: Timestamp,
    ) -> GatewayOutcome {
        let body = match spawn_request(body) {
            Ok(body) => body,
            Err(malformed) => return malformed,
        };
        if self.served_spawns.contains_key(&body.req) {
            return GatewayOutcome::Taken;
        }
        tracing::info!(req = %body.req, from = %src, by = %body.by, profile = %body.profile, "spawning a member for another gateway");
        self.served_spawns.insert(
            body.req.clone(),
            Served {
                src: src.clone(),
                at: now,
                done: false,
            },
        );
        self.dirty.spawns.insert(spawn_key(false, &body.req));
        GatewayOutcome::Spawn(Box::new(PeerSpawn {
            req: body.req,
            profile: body.profile,
            name: body.name,
        }))
    }

    /// A spawn request from gateway `src` this gateway does not take: answered with `why`.
    pub(super) fn spawn_refused(
        &mut self,
        src: &GatewayName,
        body: serde_json::Value,
        why: &str,
    ) -> GatewayOutcome {
        let body = match spawn_request(body) {
            Ok(body) => body,
            Err(malformed) => return malformed,
        };
        tracing::warn!(req = %body.req, from = %src, reason = why, "a spawn request was refused");
        let answer = SpawnedBody {
            req: body.req,
            error: Some(SpawnError {
                code: "not_allowed".to_owned(),
                message: why.to_owned(),
            }),
            ..SpawnedBody::default()
        };
        self.send_out(src, Kind::Spawned, answer);
        GatewayOutcome::Taken
    }

    /// The spawn service finished request `req` of another gateway: the answer goes back.
    pub(in crate::engine) fn peer_spawned(
        &mut self,
        req: &str,
        outcome: Result<(Target, String, String), Refusal>,
    ) {
        let Some(served) = self.served_spawns.get_mut(req) else {
            return;
        };
        served.done = true;
        let src = served.src.clone();
        self.dirty.spawns.insert(spawn_key(false, req));
        let body = match outcome {
            Ok((target, pane, profile)) => SpawnedBody {
                req: req.to_owned(),
                target: Some(target.member_name().to_owned()),
                pane: Some(pane),
                profile: Some(profile),
                error: None,
            },
            Err(refusal) => SpawnedBody {
                req: req.to_owned(),
                error: Some(SpawnError {
                    code: refusal.code.as_str().to_owned(),
                    message: refusal.message,
                }),
                ..SpawnedBody::default()
            },
        };
        self.send_out(&src, Kind::Spawned, body);
    }

    /// What gateway `src` made of a spawn this gateway asked for.
    pub(super) fn spawned_in(
        &mut self,
        src: &GatewayName,
        body: serde_json::Value,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> GatewayOutcome {
        let Ok(body) = serde_json::from_value::<SpawnedBody>(body) else {
            return GatewayOutcome::malformed("a spawn result without its request id");
        };
        let done = super::gateway::done_key("spawned", &body.req, src);
        if self
            .asked_spawns
            .get(&body.req)
            .is_none_or(|a| a.dst != *src)
        {
            if self.answered.contains_key(&done) {
                return GatewayOutcome::Taken; // a copy of the answer taken before
            }
            return GatewayOutcome::refused(
                super::gateway_refusals::reason::NEVER_SENT,
                format!(
                    "a spawn result for request {}, which was never sent to gateway {src}",
                    body.req
                ),
            );
        }
        let Some(mut asked) = self.asked_spawns.remove(&body.req) else {
            return GatewayOutcome::Taken;
        };
        self.dirty.spawns.insert(spawn_key(true, &body.req));
        self.done_with(done, now);
        let spawned = match (&body.error, &body.target) {
            (None, Some(name)) => Target::local(name.as_str())
                .ok()
                .map(|t| t.at(src.as_str())),
            _ => None,
        };
        let Some(target) = spawned else {
            let (code, message) = body.error.map_or_else(
                || {
                    (
                        "spawn_failed".to_owned(),
                        "no member name in the answer".to_owned(),
                    )
                },
                |e| (e.code, e.message),
            );
            let refusal = Refusal::new(
                Code::RemoteSpawnFailed,
                format!(
                    "gateway {src} could not spawn {}: {code}: {message}",
                    asked.profile
                ),
            );
            self.spawn_answered(&mut asked, None, Err(refusal), io);
            return GatewayOutcome::Taken;
        };
        let pane = format!("{src}/{}", body.pane.unwrap_or_default());
        let profile = body.profile.unwrap_or_else(|| asked.profile.clone());
        let lead_id = asked.lead.as_ref().map(Self::lead_id);
        if let Some(lead) = &lead_id {
            self.feed_push(
                PushInput::Bound {
                    target: target.clone(),
                    lead: lead.clone(),
                },
                now,
                io,
            );
        }
        self.emit(FleetEvent::MemberSpawned {
            target: target.to_string(),
            profile: profile.clone(),
            backend: None,
            pane: pane.clone(),
            lead: asked.lead.as_ref().map(|l| Self::lead_id(l).0),
            // Its gateway knows its worktree; fleet_list shows what its presence says.
            branch: None,
        });
        let ticket = match asked.task.take() {
            Some(task) => self
                .submit_remote(
                    TaskOrder {
                        lead: asked.lead.as_ref(),
                        by: asked.by.clone(),
                        target: target.clone(),
                        task,
                    },
                    now,
                    io,
                )
                .ok(),
            None => None,
        };
        let done = RemoteSpawned {
            target: target.clone(),
            pane,
            profile,
            ticket,
        };
        self.spawn_answered(&mut asked, Some(&target), Ok(done), io);
        GatewayOutcome::Taken
    }

    /// Hands a spawn's outcome to its waiting call; with none waiting, a member's readiness
    /// goes to its inbox here as a notice (its lead is nudged about it) and a failure is logged
    /// and shown as an incident.
    fn spawn_answered(
        &mut self,
        asked: &mut Asked,
        target: Option<&Target>,
        outcome: Result<RemoteSpawned, Refusal>,
        io: &mut Vec<Io>,
    ) {
        let outcome = match asked.waiter.take() {
            Some(waiter) => match waiter.send(outcome) {
                Ok(()) => return,
                Err(outcome) => outcome,
            },
            None => outcome,
        };
        match (outcome, target) {
            (Ok(done), Some(target)) => io.push(Io::Notice {
                target: target.clone(),
                ticket: done.ticket,
                kind: MessageKind::Incident,
                text: format!(
                    "[fleet] {} is ready: spawned on gateway {} from profile {} in {} (the fleet_spawn that asked for it had stopped waiting)",
                    done.target, asked.dst, done.profile, done.pane
                ),
            }),
            (Err(refusal), _) => {
                tracing::warn!(gateway = %asked.dst, profile = %asked.profile, reason = %refusal.message, "a spawn on another gateway failed after its caller stopped waiting");
                self.emit(FleetEvent::Incident {
                    kind: "gateway".to_owned(),
                    targets: Vec::new(),
                    text: refusal.message,
                });
            }
            (Ok(_), None) => {}
        }
    }

    /// The broker has no gateway for a spawn request: it fails here.
    pub(super) fn spawn_unroutable(&mut self, body: serde_json::Value, io: &mut Vec<Io>) {
        let Ok(body) = serde_json::from_value::<SpawnBody>(body) else {
            return;
        };
        if let Some(mut asked) = self.asked_spawns.remove(&body.req) {
            self.dirty.spawns.insert(spawn_key(true, &body.req));
            let refusal = Refusal::new(
                Code::UnknownGateway,
                format!("no gateway {} on the broker", asked.dst),
            );
            self.spawn_answered(&mut asked, None, Err(refusal), io);
        }
    }

    /// The durable record of spawn key `key` (`None`: deleted).
    pub(super) fn spawn_record(&self, key: &str) -> Option<Result<String, serde_json::Error>> {
        let (kind, req) = key.split_once(':')?;
        match kind {
            "asked" => self.asked_spawns.get(req).map(serde_json::to_string),
            _ => self.served_spawns.get(req).map(serde_json::to_string),
        }
    }

    /// Restores a spawn record; a served one a restart interrupted is answered as failed, and
    /// one finished long ago is forgotten.
    pub(super) fn restore_spawn(&mut self, key: &str, value: &str, now: Timestamp) {
        let Some((kind, req)) = key.split_once(':') else {
            return;
        };
        let restored = match kind {
            "asked" => serde_json::from_str::<Asked>(value).map(|a| {
                self.asked_spawns.insert(req.to_owned(), a);
            }),
            _ => serde_json::from_str::<Served>(value).map(|served| {
                let (done, at) = (served.done, served.at);
                self.served_spawns.insert(req.to_owned(), served);
                if !done {
                    self.peer_spawned(
                        req,
                        Err(Refusal::new(Code::SpawnInterrupted,
                            "this gateway restarted while the spawn ran; nothing was registered (a pane it had opened may remain): ask again",
                        )),
                    );
                } else if now.duration_since(at) > SERVED_KEPT {
                    self.served_spawns.remove(req);
                    self.dirty.spawns.insert(spawn_key(false, req));
                }
            }),
        };
        if let Err(e) = restored {
            tracing::error!(key, error = %e, "a spawn record does not decode; it is skipped");
        }
    }
}

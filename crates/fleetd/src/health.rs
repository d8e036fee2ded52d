//! The health report behind `GET /healthz` (SPEC §9): which parts of the daemon answer — the
//! store takes a write, every multiplexer daemon answers, the engine runs. Owns the report's
//! shape, the probe, and the rule "ok only when every part answers"; asks the store and the
//! multiplexer daemons through their own modules and never speaks their protocols itself.

use std::sync::Arc;

use fleetd_core::MuxDaemon;
use serde::Serialize;

use crate::engine::EngineHandle;
use crate::mux::{BackendKind, MuxRouter};
use crate::store::InboxStore;

/// The body of `/healthz`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthReport {
    /// `ok` when every part answers, else `degraded`.
    pub status: HealthStatus,
    /// fleetd's own version.
    pub version: &'static str,
    /// The inbox store.
    pub store: PartHealth,
    /// The fleet engine (the one task that owns members, tickets and the push loop).
    pub engine: EngineHealth,
    /// The lead multiplexer daemon (herdr `herdrSocket`, or tmux), when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lead: Option<DaemonHealth>,
    /// The member herdr daemon; absent unless `memberHerdrSocket` is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<DaemonHealth>,
    /// True when the lead and member daemons report different protocol numbers.
    pub protocol_mismatch: bool,
    /// This fleetd as a gateway of a multi-host fleet: its link to the shared broker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayHealth>,
}

/// A gateway's link to the broker.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayHealth {
    /// The gateway's name.
    pub name: String,
    /// Whether it is connected and consuming its queue.
    pub linked: bool,
    /// Why not, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Messages waiting in its outbox for the broker.
    pub outbox: u64,
    /// The outbox length beyond which the gateway counts as degraded (`gateway.outboxAlarm`).
    pub outbox_alarm: u64,
    /// What the outbox's length means, when it is over the alarm (set by
    /// [`HealthReport::with_gateway`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_warning: Option<String>,
}

/// Overall state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Every part answered.
    Ok,
    /// At least one part did not.
    Degraded,
}

/// One non-multiplexer part (the store).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartHealth {
    /// Which backend (`embedded`, `amqp`).
    pub kind: &'static str,
    /// Did it answer.
    pub ok: bool,
    /// Why not, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The engine.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EngineHealth {
    /// Whether its task runs.
    pub alive: bool,
}

/// One multiplexer daemon.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonHealth {
    /// `herdr` or `tmux`.
    pub kind: &'static str,
    /// The socket fleetd talks to.
    pub socket: String,
    /// Did it answer `ping` (herdr) / `-V` and `list-sessions` (tmux).
    pub ok: bool,
    /// The daemon's version, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// herdr's socket protocol number, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// Why not, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HealthReport {
    /// Builds the report from its parts, deriving `status` and `protocolMismatch`.
    pub fn from_parts(
        store: PartHealth,
        engine: EngineHealth,
        lead: Option<DaemonHealth>,
        member: Option<DaemonHealth>,
    ) -> Self {
        let daemons_ok = lead.iter().chain(member.iter()).all(|d| d.ok);
        let protocol_mismatch = match (&lead, &member) {
            (Some(l), Some(m)) => {
                l.protocol.is_some() && m.protocol.is_some() && l.protocol != m.protocol
            }
            _ => false,
        };
        let status = if store.ok && engine.alive && daemons_ok {
            HealthStatus::Ok
        } else {
            HealthStatus::Degraded
        };
        Self {
            status,
            version: env!("CARGO_PKG_VERSION"),
            store,
            engine,
            lead,
            member,
            protocol_mismatch,
            gateway: None,
        }
    }

    /// The report with `gateway`'s link in it (degraded while the link is down, or while more
    /// than the alarm's worth of messages wait in its outbox: messages to and from other hosts
    /// wait, nothing is lost).
    pub fn with_gateway(mut self, mut gateway: GatewayHealth) -> Self {
        if gateway.outbox > gateway.outbox_alarm {
            gateway.outbox_warning = Some(format!(
                "{} messages wait in the outbox, over gateway.outboxAlarm ({}): the broker has not taken them (the link is down, or a peer's queue is full); nothing is dropped, they go once it takes them",
                gateway.outbox, gateway.outbox_alarm
            ));
        }
        if !gateway.linked || gateway.outbox_warning.is_some() {
            self.status = HealthStatus::Degraded;
        }
        self.gateway = Some(gateway);
        self
    }
}

/// What the probe asks: the store, the multiplexer daemons (with what each is reached through,
/// for the report) and the engine.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The inbox store.
    pub store: Arc<dyn InboxStore>,
    /// The multiplexers.
    pub mux: MuxRouter,
    /// What each daemon is reached through (socket path or tmux server).
    pub endpoints: Vec<(MuxDaemon, String)>,
    /// The engine.
    pub engine: EngineHandle,
    /// The gateway's broker link, when this fleetd is one.
    pub gateway: Option<(String, crate::store::gateway_link::Link)>,
}

impl Probe {
    /// Asks every part whether it answers.
    pub async fn report(&self) -> HealthReport {
        let (store, pings) = tokio::join!(self.store.health(), self.mux.ping_all());
        let store = PartHealth {
            kind: self.store.kind(),
            ok: store.is_ok(),
            error: store.err().map(|e| format!("failed to {e}")),
        };
        let mut lead = None;
        let mut member = None;
        for (daemon, result) in pings {
            let socket = self
                .endpoints
                .iter()
                .find(|(d, _)| *d == daemon)
                .map(|(_, e)| e.clone())
                .unwrap_or_default();
            let kind = match self.mux.daemon(daemon).map(|m| m.kind()) {
                Ok(BackendKind::Tmux) => "tmux",
                _ => "herdr",
            };
            let (ok, version, protocol, error) = match result {
                Ok(info) => (true, Some(info.version), info.protocol, None),
                Err(e) => (false, None, None, Some(e.to_string())),
            };
            let health = DaemonHealth {
                kind,
                socket,
                ok,
                version,
                protocol,
                error,
            };
            match daemon {
                MuxDaemon::Lead => lead = Some(health),
                MuxDaemon::Member => member = Some(health),
            }
        }
        let engine = EngineHealth {
            alive: self.engine.is_alive(),
        };
        let report = HealthReport::from_parts(store, engine, lead, member);
        match &self.gateway {
            Some((name, link)) => {
                let down = link.down();
                let (outbox, outbox_alarm) = link.outbox();
                report.with_gateway(GatewayHealth {
                    name: name.clone(),
                    linked: down.is_none(),
                    error: down,
                    outbox,
                    outbox_alarm,
                    outbox_warning: None,
                })
            }
            None => report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALIVE: EngineHealth = EngineHealth { alive: true };

    fn store(ok: bool) -> PartHealth {
        PartHealth {
            kind: "embedded",
            ok,
            error: (!ok).then(|| "disk full".to_owned()),
        }
    }

    fn daemon(ok: bool, protocol: u32) -> DaemonHealth {
        DaemonHealth {
            kind: "herdr",
            socket: "/s".to_owned(),
            ok,
            version: ok.then(|| "0.8.0".to_owned()),
            protocol: ok.then_some(protocol),
            error: (!ok).then(|| "connection refused".to_owned()),
        }
    }

    #[test]
    fn a_gateway_is_degraded_while_unlinked_or_over_its_outbox_alarm() {
        let ok = || HealthReport::from_parts(store(true), ALIVE, Some(daemon(true, 20)), None);
        let gateway = |linked: bool, outbox: u64| GatewayHealth {
            name: "a".to_owned(),
            linked,
            error: (!linked).then(|| "connection refused".to_owned()),
            outbox,
            outbox_alarm: 10,
            outbox_warning: None,
        };
        let at_alarm = ok().with_gateway(gateway(true, 10));
        assert_eq!(at_alarm.status, HealthStatus::Ok);
        assert_eq!(at_alarm.gateway.and_then(|g| g.outbox_warning), None);
        let past = ok().with_gateway(gateway(true, 11));
        assert_eq!(past.status, HealthStatus::Degraded, "past the alarm");
        let warning = past
            .gateway
            .and_then(|g| g.outbox_warning)
            .unwrap_or_default();
        assert!(
            warning.contains("11 messages wait in the outbox, over gateway.outboxAlarm (10)"),
            "{warning}"
        );
        assert_eq!(
            ok().with_gateway(gateway(false, 0)).status,
            HealthStatus::Degraded,
            "unlinked"
        );
    }

    #[test]
    fn ok_only_when_every_part_answers() {
        let all = HealthReport::from_parts(
            store(true),
            ALIVE,
            Some(daemon(true, 20)),
            Some(daemon(true, 20)),
        );
        assert_eq!(all.status, HealthStatus::Ok);
        let engine_down = HealthReport::from_parts(
            store(true),
            EngineHealth { alive: false },
            Some(daemon(true, 20)),
            None,
        );
        assert_eq!(engine_down.status, HealthStatus::Degraded);
        assert!(!all.protocol_mismatch);
        let member_down = HealthReport::from_parts(
            store(true),
            ALIVE,
            Some(daemon(true, 20)),
            Some(daemon(false, 20)),
        );
        assert_eq!(member_down.status, HealthStatus::Degraded);
        assert_eq!(
            HealthReport::from_parts(store(false), ALIVE, None, None).status,
            HealthStatus::Degraded
        );
    }

    #[test]
    fn different_protocols_are_flagged_and_single_daemon_has_no_member_key() {
        let mismatch = HealthReport::from_parts(
            store(true),
            ALIVE,
            Some(daemon(true, 20)),
            Some(daemon(true, 21)),
        );
        assert!(mismatch.protocol_mismatch);
        let single = serde_json::to_value(HealthReport::from_parts(
            store(true),
            ALIVE,
            Some(daemon(true, 20)),
            None,
        ))
        .expect("serializes");
        assert!(single.get("member").is_none());
        assert_eq!(single["protocolMismatch"], false);
        assert_eq!(single["lead"]["protocol"], 20);
    }
}

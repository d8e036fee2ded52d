//! `gateway:` judged (stage two of configuration): this fleetd's gateway name, the shared broker
//! and what other gateways may ask of it. Pure; every refusal names its key.

use std::collections::BTreeMap;

use fleetd_core::gateway::GatewayName;

use super::raw::{At, RawBrokerTls, RawGateway};
use super::validate::{Judge, bounded, require_secret};
use super::{
    ConfigError, Environment, Gateway, GatewayBroker, GatewayTls, PeerRight, SecretSource,
};

const DEFAULT_HEARTBEAT_SECS: u64 = 15;
const MAX_HEARTBEAT_SECS: u64 = 600;
const DEFAULT_PRESENCE_SECS: u64 = 10;
const MAX_PRESENCE_SECS: u64 = 300;
const DEFAULT_OUTBOX_ALARM: u64 = 1000;
const MAX_OUTBOX_ALARM: u64 = 10_000_000;
const DEFAULT_OUTBOX_MAX: u64 = 100_000;
const DEFAULT_PEER_BACKLOG_MAX: u64 = 2000;

pub(super) fn gateway(
    judge: &Judge<'_>,
    raw: Option<At<RawGateway>>,
    env: &Environment,
    secrets: &BTreeMap<String, SecretSource>,
) -> Result<Option<Gateway>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let name = match (&raw.value.name, &env.hostname) {
        (Some(n), _) => GatewayName::new(n.value.clone())
            .map_err(|e| judge.at("gateway.name", n, e.to_string()))?,
        (None, Some(host)) => GatewayName::new(host.clone()).map_err(|_| {
            judge.at(
                "gateway.name",
                &raw,
                format!("this host's name {host:?} cannot be a gateway name: set `name:` (1 to 32 of a-z, 0-9 and '-', starting with a letter)"),
            )
        })?,
        (None, None) => {
            return Err(judge.at("gateway.name", &raw, "set `name:`: this host's name could not be read"));
        }
    };
    let Some(broker) = &raw.value.broker else {
        return Err(judge.at(
            "gateway.broker",
            &raw,
            "a gateway needs `broker: {urls: [amqp://host:5672/vhost], passwordSecret: NAME}`",
        ));
    };
    let urls = broker.value.urls.clone().unwrap_or_default();
    if urls.is_empty() {
        return Err(judge.at(
            "gateway.broker.urls",
            broker,
            "list at least one broker URL, e.g. `urls: [amqp://rmq1:5672/fleet]` (several: tried in turn)",
        ));
    }
    for url in &urls {
        let rest = url
            .value
            .strip_prefix("amqp://")
            .or_else(|| url.value.strip_prefix("amqps://"));
        let Some(rest) = rest else {
            return Err(judge.at(
                "gateway.broker.urls",
                url,
                format!(
                    "{:?} is not an AMQP URL: write amqp://host:5672/vhost",
                    url.value
                ),
            ));
        };
        if rest
            .split('/')
            .next()
            .is_some_and(|auth| auth.contains('@'))
        {
            return Err(judge.at(
                "gateway.broker.urls",
                url,
                "no credentials in a broker URL: the user is the gateway's name (or `user:`) and the password comes from `passwordSecret`",
            ));
        }
    }
    let tls = tls(judge, &urls, broker.value.tls.as_ref())?;
    if let Some(secret) = &broker.value.password_secret {
        require_secret(
            judge,
            "gateway.broker.passwordSecret",
            secret,
            &secret.value,
            secrets,
        )?;
    }
    // The user is stamped on every message as its broker-validated `user_id`, and a receiver
    // takes a message only when that `user_id` is the gateway it comes from (SPEC §12): under
    // another name every gateway would refuse everything this one sends as impersonation.
    if let Some(user) = &broker.value.user
        && user.value != name.as_str()
    {
        return Err(judge.at(
            "gateway.broker.user",
            user,
            format!(
                "the broker user {:?} is not gateway.name {:?}: every message carries the broker user as its user_id, and other gateways refuse one whose user_id is not the gateway it comes from (impersonation). Name the broker user like the gateway (`fleetd gateway provision` does), or remove `user:`",
                user.value,
                name.as_str()
            ),
        ));
    }
    let user = name.to_string();
    let heartbeat_secs = bounded(
        judge,
        "gateway.broker.heartbeatSecs",
        broker.value.heartbeat_secs.clone(),
        DEFAULT_HEARTBEAT_SECS,
        MAX_HEARTBEAT_SECS,
    )?;
    let mut peers = BTreeMap::new();
    for (peer, rights) in raw.value.peers.iter().flatten() {
        let key = format!("gateway.peers.{peer}");
        GatewayName::new(peer.clone()).map_err(|e| judge.at(&key, rights, e.to_string()))?;
        let mut allow = Vec::new();
        for right in rights.value.allow.iter().flatten() {
            let r = match right.value.as_str() {
                "send" => PeerRight::Send,
                "spawn" => PeerRight::Spawn,
                "stop" => PeerRight::Stop,
                "answer" => PeerRight::Answer,
                other => {
                    return Err(judge.at(
                        &format!("{key}.allow"),
                        right,
                        format!("{other:?} is not a right: use send, spawn, stop or answer"),
                    ));
                }
            };
            allow.push(r);
        }
        allow.sort();
        allow.dedup();
        peers.insert(peer.clone(), allow);
    }
    let presence_interval_secs = bounded(
        judge,
        "gateway.presenceIntervalSecs",
        raw.value.presence_interval_secs.clone(),
        DEFAULT_PRESENCE_SECS,
        MAX_PRESENCE_SECS,
    )?;
    let outbox_alarm = bounded(
        judge,
        "gateway.outboxAlarm",
        raw.value.outbox_alarm.clone(),
        DEFAULT_OUTBOX_ALARM,
        MAX_OUTBOX_ALARM,
    )?;
    let outbox_max = match raw.value.outbox_max.clone() {
        Some(max) if max.value < outbox_alarm => {
            return Err(judge.at(
                "gateway.outboxMax",
                &max,
                format!(
                    "{} is below gateway.outboxAlarm ({outbox_alarm}): the alarm must come before the refusals; raise outboxMax or lower outboxAlarm",
                    max.value
                ),
            ));
        }
        max => bounded(
            judge,
            "gateway.outboxMax",
            max,
            DEFAULT_OUTBOX_MAX.max(outbox_alarm),
            MAX_OUTBOX_ALARM,
        )?,
    };
    let peer_backlog_max = bounded(
        judge,
        "gateway.peerBacklogMax",
        raw.value.peer_backlog_max.clone(),
        DEFAULT_PEER_BACKLOG_MAX,
        MAX_OUTBOX_ALARM,
    )?;
    Ok(Some(Gateway {
        presence_interval_secs,
        outbox_alarm,
        outbox_max,
        peer_backlog_max,
        name,
        broker: GatewayBroker {
            urls: urls.into_iter().map(|u| u.value).collect(),
            user,
            password_secret: broker
                .value
                .password_secret
                .as_ref()
                .map(|s| s.value.clone()),
            heartbeat_secs,
            tls,
        },
        peers,
    }))
}

/// `gateway.broker.tls:` and the URLs' schemes: all `amqps://` or all `amqp://` (a link that
/// failed over to a plain URL would carry in clear what TLS was chosen to protect), and `tls:`
/// only with `amqps://`.
fn tls(
    judge: &Judge<'_>,
    urls: &[At<String>],
    raw: Option<&At<RawBrokerTls>>,
) -> Result<Option<GatewayTls>, ConfigError> {
    let is_tls = |u: &At<String>| u.value.starts_with("amqps://");
    let plain = urls.iter().find(|u| !is_tls(u));
    if let Some(plain) = plain.filter(|_| urls.iter().any(is_tls)) {
        return Err(judge.at(
            "gateway.broker.urls",
            plain,
            format!("{:?} is plain AMQP next to amqps:// URLs: a link that fails over to it would carry in clear what TLS protects; write amqps:// for every broker", plain.value),
        ));
    }
    let Some(raw) = raw else {
        return Ok(None);
    };
    if let Some(plain) = plain {
        return Err(judge.at(
            "gateway.broker.tls",
            plain,
            format!("`tls:` is set but {:?} is plain AMQP: write amqps://host:5671/vhost (the broker's TLS listener), or remove `tls:`", plain.value),
        ));
    }
    let ca_file = match &raw.value.ca_file {
        Some(path) if !path.value.is_absolute() => {
            return Err(judge.at(
                "gateway.broker.tls.caFile",
                path,
                "must be an absolute path to the PEM file of the CA that signed the broker's certificate (omit it to trust the system's CAs)",
            ));
        }
        Some(path) => Some(path.value.clone()),
        None => None,
    };
    Ok(Some(GatewayTls { ca_file }))
}

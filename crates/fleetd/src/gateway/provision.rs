//! `fleetd gateway provision`: the broker side of a multi-host fleet, as one RabbitMQ
//! definitions document an administrator loads with `rabbitmqctl import_definitions` (LavinMQ:
//! `lavinmqctl import_definitions`, without topic permissions, which it has not). Gateways then
//! only passive-declare: none of them needs the `configure` permission.
//!
//! Per gateway `g`: a user `g` (when a passwords directory is given: a new random password,
//! written to `<dir>/g` 0600 for the gateway's `passwordSecret`, and only its salted hash in the
//! document); `write` on the two exchanges, `read` on its own queues, `configure` on nothing; on
//! RabbitMQ a topic permission that lets it publish only keys `to.*.from.g.*`; its inbound
//! quorum queue (single active consumer) bound to `to.g.#`, its dead-letter queue and its
//! presence queue. A policy sets the inbound queues' delivery limit, dead-lettering, overflow
//! and length (policies, unlike queue arguments, can be changed later).

use std::io::Write as _;
use std::path::Path;

use base64::Engine as _;
use fleetd_core::gateway::{DEAD_LETTER_EXCHANGE, EXCHANGE, GatewayName, PRESENCE_EXCHANGE};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// Which broker the document is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Broker {
    /// RabbitMQ (a cluster with quorum queues).
    Rabbitmq,
    /// LavinMQ (no topic permissions; `quorum` becomes its replicated durable queue).
    Lavinmq,
}

/// The inbound queues' delivery limit: a message redelivered this often is dead-lettered.
pub const DELIVERY_LIMIT: u64 = 20;
/// Most messages one gateway's inbound queue holds; beyond it a publish is refused and stays in
/// the sender's outbox.
pub const MAX_INBOUND: u64 = 100_000;
/// How long a presence broadcast stays in a presence queue.
pub const PRESENCE_TTL_MS: u64 = 60_000;

/// The definitions document for `gateways` in `vhost`; with `passwords`, each gateway's user with
/// a new password written there.
pub fn definitions(
    gateways: &[GatewayName],
    vhost: &str,
    broker: Broker,
    passwords: Option<&Path>,
) -> anyhow::Result<Value> {
    let mut users = Vec::new();
    let mut permissions = Vec::new();
    let mut topic_permissions = Vec::new();
    let mut queues = Vec::new();
    let mut bindings = Vec::new();
    for g in gateways {
        if let Some(dir) = passwords {
            let password = hex(&random_bytes::<32>()?);
            write_secret(&dir.join(g.as_str()), &password)?;
            users.push(json!({
                "name": g.as_str(),
                "password_hash": password_hash(&password, random_bytes::<4>()?),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": [],
            }));
        }
        permissions.push(json!({
            "user": g.as_str(),
            "vhost": vhost,
            "configure": "^$",
            "write": format!("^({}|{})$", regex_escape(EXCHANGE), regex_escape(PRESENCE_EXCHANGE)),
            "read": format!(
                "^({}|{}|{})$",
                regex_escape(&g.inbound_queue()),
                regex_escape(&g.dead_queue()),
                regex_escape(&g.presence_queue())
            ),
        }));
        if broker == Broker::Rabbitmq {
            topic_permissions.push(json!({
                "user": g.as_str(),
                "vhost": vhost,
                "exchange": EXCHANGE,
                "write": format!("^to\\.[a-z][a-z0-9-]*\\.from\\.{}\\.[a-z]+$", regex_escape(g.as_str())),
                "read": "^$",
            }));
        }
        let quorum = json!({ "x-queue-type": "quorum" });
        queues.push(queue(
            vhost,
            &g.inbound_queue(),
            &json!({
                "x-queue-type": "quorum",
                "x-single-active-consumer": true,
            }),
        ));
        queues.push(queue(vhost, &g.dead_queue(), &quorum));
        queues.push(queue(
            vhost,
            &g.presence_queue(),
            // Replicated like the others: a gateway whose presence queue lived on a dead node
            // would hear from no one until an administrator stepped in.
            &json!({
                "x-queue-type": "quorum",
                "x-message-ttl": PRESENCE_TTL_MS,
                "x-max-length": 1000,
                "x-overflow": "drop-head",
            }),
        ));
        let to_me = format!("to.{g}.#");
        bindings.push(binding(vhost, EXCHANGE, &g.inbound_queue(), &to_me));
        bindings.push(binding(
            vhost,
            DEAD_LETTER_EXCHANGE,
            &g.dead_queue(),
            &to_me,
        ));
        bindings.push(binding(vhost, PRESENCE_EXCHANGE, &g.presence_queue(), ""));
    }
    let mut policy = json!({
        "delivery-limit": DELIVERY_LIMIT,
        "dead-letter-exchange": DEAD_LETTER_EXCHANGE,
        "overflow": "reject-publish",
        "max-length": MAX_INBOUND,
    });
    if broker == Broker::Rabbitmq {
        policy["dead-letter-strategy"] = json!("at-least-once");
    }
    let mut doc = json!({
        "users": users,
        "vhosts": [{ "name": vhost }],
        "permissions": permissions,
        "policies": [{
            "vhost": vhost,
            "name": "fleet-gw",
            "pattern": "^fleet\\.gw\\.[^.]+\\.in$",
            "apply-to": "queues",
            "priority": 0,
            "definition": policy,
        }],
        "exchanges": [
            exchange(vhost, EXCHANGE, "topic"),
            exchange(vhost, DEAD_LETTER_EXCHANGE, "topic"),
            exchange(vhost, PRESENCE_EXCHANGE, "fanout"),
        ],
        "queues": queues,
        "bindings": bindings,
    });
    if broker == Broker::Rabbitmq {
        doc["topic_permissions"] = Value::Array(topic_permissions);
    }
    Ok(doc)
}

fn queue(vhost: &str, name: &str, arguments: &Value) -> Value {
    json!({ "name": name, "vhost": vhost, "durable": true, "auto_delete": false, "arguments": arguments })
}

fn exchange(vhost: &str, name: &str, kind: &str) -> Value {
    json!({
        "name": name, "vhost": vhost, "type": kind, "durable": true, "auto_delete": false,
        "internal": false, "arguments": {},
    })
}

fn binding(vhost: &str, source: &str, queue: &str, key: &str) -> Value {
    json!({
        "source": source, "vhost": vhost, "destination": queue, "destination_type": "queue",
        "routing_key": key, "arguments": {},
    })
}

/// RabbitMQ's `rabbit_password_hashing_sha256`: base64(salt ‖ SHA-256(salt ‖ password)).
fn password_hash(password: &str, salt: [u8; 4]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(salt);
    hasher.update(password.as_bytes());
    let mut out = salt.to_vec();
    out.extend_from_slice(&hasher.finalize());
    base64::engine::general_purpose::STANDARD.encode(out)
}

/// Escapes the regex metacharacters a gateway or queue name can hold (`.`, `-`).
fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escape = matches!(
                c,
                '.' | '-'
                    | '+'
                    | '*'
                    | '?'
                    | '('
                    | ')'
                    | '['
                    | ']'
                    | '{'
                    | '}'
                    | '|'
                    | '^'
                    | '$'
                    | '\\'
            );
            escape.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

fn random_bytes<const N: usize>() -> anyhow::Result<[u8; N]> {
    use std::io::Read as _;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes a secret file readable by its owner alone (created so, never widened after).
fn write_secret(path: &Path, value: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot create {} (it must not exist yet): {e}",
                path.display()
            )
        })?;
    file.write_all(value.as_bytes())?;
    file.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_hash_is_rabbitmqs() {
        // rabbit_password_hashing_sha256 of "test12" with salt 908D C60A, as RabbitMQ's
        // documentation works it out ("Computing Password Hash").
        assert_eq!(
            password_hash("test12", [0x90, 0x8d, 0xc6, 0x0a]),
            "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"
        );
    }

    #[test]
    fn each_gateway_reads_only_its_own_queues_and_configures_nothing() {
        let gws = [
            GatewayName::new("a").expect("a"),
            GatewayName::new("build-2").expect("b"),
        ];
        let doc = definitions(&gws, "fleet", Broker::Rabbitmq, None).expect("doc");
        let perm = &doc["permissions"][1];
        assert_eq!(perm["configure"], "^$");
        assert_eq!(
            perm["read"],
            "^(fleet\\.gw\\.build\\-2\\.in|fleet\\.gw\\.build\\-2\\.dead|fleet\\.gw\\.build\\-2\\.presence)$"
        );
        assert_eq!(
            doc["topic_permissions"][1]["write"],
            "^to\\.[a-z][a-z0-9-]*\\.from\\.build\\-2\\.[a-z]+$"
        );
        assert_eq!(doc["queues"].as_array().map(Vec::len), Some(6));
        assert_eq!(doc["users"], json!([]), "no passwords asked for: no users");
        let lavin = definitions(&gws, "fleet", Broker::Lavinmq, None).expect("doc");
        assert!(lavin.get("topic_permissions").is_none());
    }
}

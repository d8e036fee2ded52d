//! Several hosts, one fleet (SPEC §12): the pure parts of the gateway protocol. A gateway is one
//! host's fleetd; gateways talk only through one shared AMQP broker. This module owns their
//! names, the `name@gateway` address of a remote member, the broker's names for each gateway's
//! queues, the routing-key grammar `to.<dst>.from.<src>.<kind>`, the envelope every cross-host
//! message travels in, and the receiver's first check of a delivery (who it claims to come from
//! against what the broker vouches for). No I/O, no broker client: `store::amqp::link` carries
//! envelopes, the engine decides what they mean.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::Target;

/// The one topic exchange every gateway publishes to.
pub const EXCHANGE: &str = "fleet.x";
/// Where a message the receiving gateway could not take goes (then to its `.dead` queue).
pub const DEAD_LETTER_EXCHANGE: &str = "fleet.dlx";
/// The presence broadcast (soft state: which members and profiles each gateway has).
pub const PRESENCE_EXCHANGE: &str = "fleet.presence";
/// The version of the envelope this build speaks.
pub const PROTOCOL: u32 = 1;

/// A gateway's name: `[a-z][a-z0-9-]{0,31}`, also its broker user.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GatewayName(String);

/// Why a gateway name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a gateway name: use 1 to 32 of a-z, 0-9 and '-', starting with a letter")]
pub struct BadGatewayName(pub String);

impl GatewayName {
    /// Validates `name`.
    pub fn new(name: impl Into<String>) -> Result<Self, BadGatewayName> {
        let name = name.into();
        let mut bytes = name.bytes();
        let ok = bytes.next().is_some_and(|b| b.is_ascii_lowercase())
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && name.len() <= 32;
        if ok {
            Ok(Self(name))
        } else {
            Err(BadGatewayName(name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The gateway's inbound queue: every message for it, from every other gateway.
    pub fn inbound_queue(&self) -> String {
        format!("fleet.gw.{}.in", self.0)
    }

    /// Where its inbound messages that could not be taken wait for an operator.
    pub fn dead_queue(&self) -> String {
        format!("fleet.gw.{}.dead", self.0)
    }

    /// Its presence queue (a copy of every gateway's presence broadcast).
    pub fn presence_queue(&self) -> String {
        format!("fleet.gw.{}.presence", self.0)
    }
}

crate::text_impls::string_newtype_impls!(GatewayName, BadGatewayName);

/// Where a member is: on this gateway (a bare name) or another (`name@gateway`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Address {
    /// The member's name on its gateway.
    pub name: Target,
    /// Its gateway; `None` for this one.
    pub gateway: Option<GatewayName>,
}

impl Address {
    /// Parses `name` or `name@gateway`; `local` is this gateway's own name, so `alice@a` on
    /// gateway `a` is the local `alice`.
    pub fn parse(text: &str, local: Option<&GatewayName>) -> Result<Self, String> {
        let (name, gateway) = match text.split_once('@') {
            Some((name, gw)) => (name, Some(GatewayName::new(gw).map_err(|e| e.to_string())?)),
            None => (text, None),
        };
        let name = Target::new(name).map_err(|e| e.to_string())?;
        let gateway = gateway.filter(|g| Some(g) != local);
        Ok(Self { name, gateway })
    }

    /// Whether it is on another gateway.
    pub fn is_remote(&self) -> bool {
        self.gateway.is_some()
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gateway {
            Some(g) => write!(f, "{}@{g}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// What a cross-host message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A task for a member of the receiving gateway (the sender owns the ticket).
    Task,
    /// A ticket's new state, from the gateway that delivers it to the one that owns it.
    Ticket,
    /// A member's reply (or its turn-done fallback) for a ticket the receiver owns.
    Reply,
    /// A request to spawn a member on the receiving gateway.
    Spawn,
    /// The answer to a spawn request.
    Spawned,
    /// Stop a member of the receiving gateway.
    Stop,
    /// A member's question for the lead that owns its ticket.
    Question,
    /// The answer to a question.
    Answer,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Self; 8] = [
        Self::Task,
        Self::Ticket,
        Self::Reply,
        Self::Spawn,
        Self::Spawned,
        Self::Stop,
        Self::Question,
        Self::Answer,
    ];

    /// Its word in routing keys and envelopes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Task => "task",
            Self::Ticket => "ticket",
            Self::Reply => "reply",
            Self::Spawn => "spawn",
            Self::Spawned => "spawned",
            Self::Stop => "stop",
            Self::Question => "question",
            Self::Answer => "answer",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == word)
    }
}

/// `to.<dst>.from.<src>.<kind>`: what the exchange routes on.
pub fn routing_key(dst: &GatewayName, src: &GatewayName, kind: Kind) -> String {
    format!("to.{dst}.from.{src}.{}", kind.as_str())
}

/// The parts of a routing key, when it has that shape.
pub fn parse_routing_key(key: &str) -> Option<(GatewayName, GatewayName, Kind)> {
    let mut parts = key.split('.');
    let (Some("to"), Some(dst), Some("from"), Some(src), Some(kind), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    Some((
        GatewayName::new(dst).ok()?,
        GatewayName::new(src).ok()?,
        Kind::parse(kind)?,
    ))
}

/// One cross-host message: the body of an AMQP message whose `message_id` is `msg_id`, whose
/// `type` is `kind` and whose `user_id` the broker validated as `src`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Envelope {
    /// The protocol version.
    pub v: u32,
    /// What it is.
    pub kind: Kind,
    /// The sending gateway.
    pub src: GatewayName,
    /// The receiving gateway.
    pub dst: GatewayName,
    /// Its id (a UUIDv7 string): the receiver takes it once.
    pub msg_id: String,
    /// What it carries, by kind (the engine's business).
    pub body: serde_json::Value,
}

/// Why a delivery was refused before its body was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The body is not an envelope of this protocol: what kind of flaw and where (never what
    /// the body holds: a parser's message can quote its values).
    Malformed(String),
    /// No broker-validated `user_id`: the sender cannot be told.
    NoUserId,
    /// The `user_id`, the routing key and the envelope do not name one sending gateway (or
    /// not this receiver), or the kind differs.
    Impersonation(String),
    /// A protocol version this build does not speak.
    Version(u32),
}

impl Refused {
    /// The short reason, for metrics labels and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::NoUserId => "no_user_id",
            Self::Impersonation(_) => "impersonation",
            Self::Version(_) => "version",
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed(why) => write!(f, "not a fleet envelope: {why}"),
            Self::NoUserId => f.write_str("no user_id: the broker vouched for no sender"),
            Self::Impersonation(why) => write!(f, "sender mismatch: {why}"),
            Self::Version(v) => write!(f, "protocol version {v}, this gateway speaks {PROTOCOL}"),
        }
    }
}

/// What is wrong with a body that is no envelope, in words that quote nothing of it: serde's
/// own message can (`invalid type: string "…"`), and a refusal is logged and shown to a lead.
fn malformed(e: &serde_json::Error) -> Refused {
    let what = match e.classify() {
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Eof => "JSON cut short",
        serde_json::error::Category::Data => {
            "JSON without the fields of an envelope (v, kind, src, dst, msgId, body), or with others"
        }
        serde_json::error::Category::Io => "unreadable",
    };
    Refused::Malformed(format!(
        "{what} (at line {} column {})",
        e.line(),
        e.column()
    ))
}

/// The receiver's check of a delivery to `me`: the broker-validated `user_id`, the routing key
/// and the envelope must all name the same sender, the key and the envelope this receiver and
/// one kind. What the message asks is checked after (by what this gateway sent there).
pub fn accept(
    me: &GatewayName,
    user_id: Option<&str>,
    routing_key: &str,
    body: &[u8],
) -> Result<Envelope, Refused> {
    let envelope: Envelope = serde_json::from_slice(body).map_err(|e| malformed(&e))?;
    if envelope.v != PROTOCOL {
        return Err(Refused::Version(envelope.v));
    }
    let user = user_id.ok_or(Refused::NoUserId)?;
    let (dst, src, kind) = parse_routing_key(routing_key)
        .ok_or_else(|| Refused::Impersonation(format!("routing key {routing_key:?}")))?;
    if user != src.as_str() || src != envelope.src {
        return Err(Refused::Impersonation(format!(
            "user {user}, key from {src}, envelope from {}",
            envelope.src
        )));
    }
    if dst != *me || envelope.dst != *me {
        return Err(Refused::Impersonation(format!(
            "addressed to {dst} / {}, received by {me}",
            envelope.dst
        )));
    }
    if kind != envelope.kind {
        return Err(Refused::Impersonation(format!(
            "key says {}, envelope {}",
            kind.as_str(),
            envelope.kind.as_str()
        )));
    }
    Ok(envelope)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn gw(name: &str) -> GatewayName {
        GatewayName::new(name).expect("valid")
    }

    fn envelope(src: &str, dst: &str, kind: Kind) -> Envelope {
        Envelope {
            v: PROTOCOL,
            kind,
            src: gw(src),
            dst: gw(dst),
            msg_id: "01a23300-0000-7000-8000-000000000000".to_owned(),
            body: serde_json::json!({ "x": 1 }),
        }
    }

    #[test]
    fn names_addresses_and_queues() {
        for ok in ["a", "build-2", "x1", &"a".repeat(32)] {
            assert!(GatewayName::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "2b", "B", "a_b", "a.b", &"a".repeat(33)] {
            assert!(GatewayName::new(bad).is_err(), "{bad}");
        }
        let b = gw("b");
        assert_eq!(b.inbound_queue(), "fleet.gw.b.in");
        assert_eq!(b.dead_queue(), "fleet.gw.b.dead");
        let remote = Address::parse("alice@b", Some(&gw("a"))).expect("address");
        assert!(remote.is_remote());
        assert_eq!(remote.to_string(), "alice@b");
        let mine = Address::parse("alice@a", Some(&gw("a"))).expect("address");
        assert!(!mine.is_remote(), "its own gateway's name is local");
        assert_eq!(mine.to_string(), "alice");
        assert!(Address::parse("alice@B", None).is_err());
        assert!(Address::parse("Alice@b", None).is_err());
    }

    #[test]
    fn a_delivery_must_name_one_sender_everywhere() {
        let me = gw("a");
        let body = |e: &Envelope| serde_json::to_vec(e).expect("json");
        let good = envelope("b", "a", Kind::Reply);
        let key = routing_key(&gw("a"), &gw("b"), Kind::Reply);
        assert_eq!(accept(&me, Some("b"), &key, &body(&good)), Ok(good.clone()));
        assert_eq!(
            accept(&me, None, &key, &body(&good)),
            Err(Refused::NoUserId)
        );
        let refused = |user: &str, key: &str, e: &Envelope| {
            accept(&me, Some(user), key, &body(e)).map_err(|r| r.reason())
        };
        // c claims to be b: the broker vouches for c.
        assert_eq!(refused("c", &key, &good), Err("impersonation"));
        // c's own key, b's envelope.
        let c_key = routing_key(&gw("a"), &gw("c"), Kind::Reply);
        assert_eq!(refused("c", &c_key, &good), Err("impersonation"));
        // For someone else.
        let for_d = envelope("b", "d", Kind::Reply);
        assert_eq!(refused("b", &key, &for_d), Err("impersonation"));
        // A kind that differs from the key's.
        let task = envelope("b", "a", Kind::Task);
        assert_eq!(refused("b", &key, &task), Err("impersonation"));
        assert_eq!(refused("b", "to.a.from.b", &good), Err("impersonation"));
        assert_eq!(
            accept(&me, Some("b"), &key, b"not json").map_err(|r| r.reason()),
            Err("malformed")
        );
        // What a malformed body held is never quoted in the refusal (it is logged and shown).
        for body in [
            br#"{"v":"rm -rf /","kind":"task"}"#.as_slice(),
            br#"{"v":1,"kind":"rm -rf /"}"#,
            br#"{"v":1,"rm -rf /":2}"#,
        ] {
            let why = accept(&me, Some("b"), &key, body)
                .expect_err("malformed")
                .to_string();
            assert!(why.starts_with("not a fleet envelope: "), "{why}");
            assert!(!why.contains("rm -rf"), "{why}");
        }
        let mut old = good;
        old.v = 9;
        assert_eq!(refused("b", &key, &old), Err("version"));
    }

    proptest! {
        #[test]
        fn routing_keys_round_trip(
            dst in "[a-z][a-z0-9-]{0,31}",
            src in "[a-z][a-z0-9-]{0,31}",
            k in 0usize..8,
        ) {
            let kind = Kind::ALL[k];
            let key = routing_key(&gw(&dst), &gw(&src), kind);
            prop_assert_eq!(parse_routing_key(&key), Some((gw(&dst), gw(&src), kind)));
        }

        #[test]
        fn envelopes_round_trip(src in "[a-z][a-z0-9-]{0,31}", text in ".*") {
            let mut e = envelope(&src, "a", Kind::Task);
            e.body = serde_json::json!({ "task": text });
            let back: Envelope = serde_json::from_slice(&serde_json::to_vec(&e).expect("json")).expect("parse");
            prop_assert_eq!(back, e);
        }
    }
}

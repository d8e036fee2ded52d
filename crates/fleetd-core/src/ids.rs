//! Identifier newtypes shared across fleetd. Owns validation of ids; knows nothing about where ids
//! come from (no I/O, no multiplexer or MCP knowledge).

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why a string was refused as an identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// A member name that does not match `[a-z][a-z0-9_-]{0,31}` (with `@gateway` for a
    /// member on another host).
    #[error(
        "invalid target {0:?}: a member name starts with a lowercase letter, then up to 31 of a-z, 0-9, '_' or '-' (a member on another host: name@gateway)"
    )]
    Target(String),
    /// A message id or ticket that is not a UUID.
    #[error(
        "invalid {kind} {value:?}: expected a UUID such as 0190f5c4-7a3e-7c51-9a7e-2f6d1b3c4d5e"
    )]
    Uuid {
        /// Which id was being parsed (`msgId`, `ticket`, ...).
        kind: &'static str,
        /// The refused text.
        value: String,
    },
}

/// A member's name: `[a-z][a-z0-9_-]{0,31}`, or `name@gateway` for a member another host's
/// fleetd runs (SPEC §12; the gateway part is `[a-z][a-z0-9-]{0,31}`). Used as the inbox key
/// and as the address in every tool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Target(String);

impl Target {
    /// Longest accepted name, in bytes.
    pub const MAX_LEN: usize = 32;

    /// Validates `name` as a target: a local member's name, or `name@gateway`.
    pub fn new(name: impl Into<String>) -> Result<Self, IdError> {
        let name = name.into();
        let ok = match name.split_once('@') {
            Some((member, gateway)) => {
                is_local_name(member) && crate::gateway::GatewayName::new(gateway).is_ok()
            }
            None => is_local_name(&name),
        };
        if ok {
            Ok(Self(name))
        } else {
            Err(IdError::Target(name))
        }
    }

    /// Validates `name` as a member of this host (no `@gateway`): what a spawn may name.
    pub fn local(name: impl Into<String>) -> Result<Self, IdError> {
        let name = name.into();
        if is_local_name(&name) {
            Ok(Self(name))
        } else {
            Err(IdError::Target(name))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The gateway of a member on another host (`alice@b` → `b`).
    pub fn gateway(&self) -> Option<&str> {
        self.0.split_once('@').map(|(_, g)| g)
    }

    /// The member's name on its own host (`alice@b` → `alice`).
    pub fn member_name(&self) -> &str {
        self.0.split_once('@').map_or(self.0.as_str(), |(m, _)| m)
    }

    /// The same member as its own host names it (`alice@b` → `alice`).
    pub fn on_its_host(&self) -> Self {
        Self(self.member_name().to_owned())
    }

    /// This host's member `self` as gateway `gateway` addresses it (`alice` → `alice@b`).
    pub fn at(&self, gateway: &str) -> Self {
        Self(format!("{}@{gateway}", self.member_name()))
    }
}

/// `[a-z][a-z0-9_-]{0,31}`.
fn is_local_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && name.len() <= Target::MAX_LEN
}

crate::text_impls::string_newtype_impls!(Target, IdError);

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(Uuid);

        impl $name {
            /// Wraps an existing UUID (the caller chose the version; fleetd mints v7).
            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// A new time-ordered id from the given unix time in milliseconds and 10 random bytes.
            /// The core has no clock and no RNG: the caller supplies both.
            pub fn from_parts(unix_ms: u64, random: [u8; 10]) -> Self {
                Self(uuid::Builder::from_unix_timestamp_millis(unix_ms, &random).into_uuid())
            }

            /// Parses the textual form.
            pub fn parse(text: &str) -> Result<Self, IdError> {
                Uuid::parse_str(text).map(Self).map_err(|_| IdError::Uuid {
                    kind: $kind,
                    value: text.to_owned(),
                })
            }

            /// The underlying UUID.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::parse(&value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                value.0.to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

uuid_id!(
    /// A message id: a time-ordered UUIDv7, the inbox's dedup key.
    MsgId,
    "msgId"
);
uuid_id!(
    /// A ticket: one delegated task's id, a time-ordered UUIDv7.
    Ticket,
    "ticket"
);

#[cfg(test)]
mod tests {
    use super::*;

    fn check_target(input: &str, ok: bool) {
        assert_eq!(Target::new(input).is_ok(), ok, "target {input:?}");
    }

    #[test]
    fn target_names() {
        for good in [
            "a",
            "alice",
            "bob-2",
            "x_y",
            "a234567890123456789012345678901",
        ] {
            check_target(good, true);
        }
        check_target(&format!("a{}", "b".repeat(31)), true);
        for bad in [
            "",
            "A",
            "1abc",
            "-x",
            "al ice",
            "élan",
            "alice/../x",
            &format!("a{}", "b".repeat(32)),
            "alice@",
            "@b",
            "alice@B",
            "alice@b@c",
            "alice@b_c",
        ] {
            check_target(bad, false);
        }
        // A member on another host.
        let remote = Target::new("alice@build-2").expect("remote");
        assert_eq!(remote.gateway(), Some("build-2"));
        assert_eq!(remote.member_name(), "alice");
        assert_eq!(remote.on_its_host().as_str(), "alice");
        assert_eq!(
            Target::new("alice").expect("local").at("b").as_str(),
            "alice@b"
        );
        assert!(
            Target::local("alice@b").is_err(),
            "a spawn names a local member"
        );
        assert!(Target::local("alice").is_ok());
    }

    #[test]
    fn uuid_ids_round_trip_and_order_by_time() {
        let early = MsgId::from_parts(1_000, [0; 10]);
        let late = MsgId::from_parts(2_000, [0; 10]);
        assert!(early < late);
        assert_eq!(MsgId::parse(&early.to_string()), Ok(early));
        assert_eq!(early.as_uuid().get_version_num(), 7);
        assert!(matches!(
            Ticket::parse("nope"),
            Err(IdError::Uuid { kind: "ticket", .. })
        ));
    }
}

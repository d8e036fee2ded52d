//! The inbox message model and its pure validation (size and sender limits, UTF-8 intake). Knows
//! nothing about where messages are stored or how they travel: no I/O, no clock, no storage engine.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::ids::{MsgId, Target, Ticket};

/// What a message is about. Serialized in lowercase (`reply`, `fallback`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageKind {
    /// A member's answer sent with `fleet_reply`.
    Reply,
    /// The turn-done fallback: a turn ended without a reply, so fleetd recorded the pane's tail.
    Fallback,
    /// A member's question (`fleet_ask`) that outlived its wait.
    Question,
    /// A backend incident (health probe went down) addressed to a lead.
    Incident,
    /// A member whose backend is no longer mapped (e.g. after a config reload).
    Unmapped,
}

impl MessageKind {
    /// Every kind, in declaration order.
    pub const ALL: [Self; 5] = [
        Self::Reply,
        Self::Fallback,
        Self::Question,
        Self::Incident,
        Self::Unmapped,
    ];

    /// The wire name (`reply`, `fallback`, `question`, `incident`, `unmapped`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reply => "reply",
            Self::Fallback => "fallback",
            Self::Question => "question",
            Self::Incident => "incident",
            Self::Unmapped => "unmapped",
        }
    }
}

crate::text_impls::named_enum_impls!(MessageKind, MessageError, |text| {
    MessageError::UnknownKind(text.to_owned())
});

/// One inbox message. The JSON form uses camelCase names (`msgId`, `createdAt`) and omits an absent
/// `ticket`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Message {
    /// The dedup key: a time-ordered UUIDv7 minted when the message was created.
    pub msg_id: MsgId,
    /// Whose inbox the message is in.
    pub target: Target,
    /// The ticket the message answers, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<Ticket>,
    /// What the message is about.
    pub kind: MessageKind,
    /// The payload, always valid UTF-8 (the type guarantees it).
    pub text: String,
    /// Who sent it: a member's name, or `fleetd` for messages fleetd writes itself.
    pub from: String,
    /// When the message was created.
    pub created_at: Timestamp,
}

/// Limits a message must satisfy before any store accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    /// Largest accepted `text`, in bytes (config `inbox.maxMessageBytes`).
    pub max_message_bytes: usize,
}

impl MessageLimits {
    /// The default of `inbox.maxMessageBytes`: 1 MiB.
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;
    /// Longest accepted `from`, in bytes. Senders are names, so this is generous.
    pub const MAX_FROM_BYTES: usize = 256;
}

impl Default for MessageLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// Why a message was refused. Display states the rule that was broken and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    /// The text is larger than `inbox.maxMessageBytes`.
    #[error(
        "message text is {size} bytes, over the limit inbox.maxMessageBytes = {limit} bytes; send a shorter text or raise the limit"
    )]
    TooLarge {
        /// Size of the refused text in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The sender name is empty or longer than [`MessageLimits::MAX_FROM_BYTES`].
    #[error("message sender is {size} bytes; it must be between 1 and {limit} bytes")]
    BadSender {
        /// Size of the refused sender in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The text bytes are not valid UTF-8.
    #[error("message text is not valid UTF-8 (first invalid byte at offset {offset})")]
    InvalidUtf8 {
        /// Byte offset of the first invalid sequence.
        offset: usize,
    },
    /// A kind name that is not one of `reply|fallback|question|incident|unmapped`.
    #[error("unknown message kind {0:?}: expected reply, fallback, question, incident or unmapped")]
    UnknownKind(String),
}

impl Message {
    /// Checks the message against `limits`: text size and sender length. The target and ids are
    /// already valid by construction (their types validate), and `text` is UTF-8 by type.
    pub fn check(&self, limits: &MessageLimits) -> Result<(), MessageError> {
        check_text_len(self.text.len(), limits)?;
        let from = self.from.len();
        if from == 0 || from > MessageLimits::MAX_FROM_BYTES {
            return Err(MessageError::BadSender {
                size: from,
                limit: MessageLimits::MAX_FROM_BYTES,
            });
        }
        Ok(())
    }
}

fn check_text_len(size: usize, limits: &MessageLimits) -> Result<(), MessageError> {
    if size > limits.max_message_bytes {
        return Err(MessageError::TooLarge {
            size,
            limit: limits.max_message_bytes,
        });
    }
    Ok(())
}

/// Turns raw intake bytes (an HTTP body, a decoded tool argument) into message text: the size limit
/// is checked first, so an oversized body is refused without being scanned, then UTF-8 validity.
/// Invalid UTF-8 is refused, never repaired, so it cannot reach a store.
pub fn text_from_bytes(bytes: Vec<u8>, limits: &MessageLimits) -> Result<String, MessageError> {
    check_text_len(bytes.len(), limits)?;
    String::from_utf8(bytes).map_err(|err| MessageError::InvalidUtf8 {
        offset: err.utf8_error().valid_up_to(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str) -> Message {
        Message {
            msg_id: MsgId::from_parts(1_700_000_000_000, [7; 10]),
            target: Target::new("alice").expect("valid target"),
            ticket: None,
            kind: MessageKind::Reply,
            text: text.to_owned(),
            from: "alice".to_owned(),
            created_at: Timestamp::from_second(1_700_000_000).expect("valid timestamp"),
        }
    }

    fn check_size(text_len: usize, limit: usize, ok: bool) {
        let limits = MessageLimits {
            max_message_bytes: limit,
        };
        let result = message(&"x".repeat(text_len)).check(&limits);
        assert_eq!(
            result.is_ok(),
            ok,
            "text {text_len} bytes, limit {limit}: {result:?}"
        );
    }

    #[test]
    fn size_limit_is_inclusive_and_counts_bytes() {
        check_size(0, 10, true);
        check_size(10, 10, true);
        check_size(11, 10, false);
        check_size(
            MessageLimits::DEFAULT_MAX_MESSAGE_BYTES,
            MessageLimits::DEFAULT_MAX_MESSAGE_BYTES,
            true,
        );
        // Multi-byte characters count by their UTF-8 bytes, not as characters.
        let limits = MessageLimits {
            max_message_bytes: 8,
        };
        assert!(message("日本語").check(&limits).is_err(), "9 bytes > 8");
        assert!(message("日本").check(&limits).is_ok(), "6 bytes <= 8");
    }

    #[test]
    fn too_large_error_names_the_limit() {
        let limits = MessageLimits {
            max_message_bytes: 4,
        };
        let err = message("hello").check(&limits).expect_err("5 > 4");
        assert_eq!(err, MessageError::TooLarge { size: 5, limit: 4 });
        let text = err.to_string();
        assert!(text.contains("inbox.maxMessageBytes = 4 bytes"), "{text}");
        assert!(text.contains("5 bytes"), "{text}");
    }

    #[test]
    fn sender_must_be_a_short_non_empty_name() {
        let limits = MessageLimits::default();
        let mut m = message("hi");
        m.from = String::new();
        assert!(matches!(
            m.check(&limits),
            Err(MessageError::BadSender { size: 0, .. })
        ));
        m.from = "a".repeat(MessageLimits::MAX_FROM_BYTES + 1);
        assert!(matches!(
            m.check(&limits),
            Err(MessageError::BadSender { .. })
        ));
        m.from = "a".repeat(MessageLimits::MAX_FROM_BYTES);
        assert_eq!(m.check(&limits), Ok(()));
    }

    #[test]
    fn intake_refuses_invalid_utf8_and_oversize_bytes() {
        let limits = MessageLimits {
            max_message_bytes: 16,
        };
        assert_eq!(
            text_from_bytes(b"ok \xc3\xa9".to_vec(), &limits).as_deref(),
            Ok("ok é")
        );
        assert_eq!(
            text_from_bytes(b"ab\xffcd".to_vec(), &limits),
            Err(MessageError::InvalidUtf8 { offset: 2 })
        );
        // A truncated multi-byte sequence is invalid too.
        assert_eq!(
            text_from_bytes(b"\xe6\x97".to_vec(), &limits),
            Err(MessageError::InvalidUtf8 { offset: 0 })
        );
        assert_eq!(
            text_from_bytes(vec![b'x'; 17], &limits),
            Err(MessageError::TooLarge {
                size: 17,
                limit: 16
            })
        );
    }

    #[test]
    fn json_uses_camel_case_and_lowercase_kinds() {
        let mut m = message("héllo 🌍");
        let json = serde_json::to_value(&m).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({
                "msgId": m.msg_id.to_string(),
                "target": "alice",
                "kind": "reply",
                "text": "héllo 🌍",
                "from": "alice",
                "createdAt": "2023-11-14T22:13:20Z",
            })
        );
        m.ticket = Some(Ticket::from_parts(1_700_000_000_001, [1; 10]));
        m.kind = MessageKind::Unmapped;
        let text = serde_json::to_string(&m).expect("serializes");
        assert!(text.contains("\"ticket\":"), "{text}");
        assert!(text.contains("\"kind\":\"unmapped\""), "{text}");
        let back: Message = serde_json::from_str(&text).expect("round trips");
        assert_eq!(back, m);
    }

    #[test]
    fn json_with_an_invalid_target_or_kind_is_refused() {
        let good = serde_json::to_value(message("x")).expect("serializes");
        for (field, bad) in [("target", "Bad/Name"), ("kind", "shout"), ("msgId", "nope")] {
            let mut value = good.clone();
            value[field] = serde_json::Value::String(bad.to_owned());
            let parsed: Result<Message, _> = serde_json::from_value(value);
            assert!(parsed.is_err(), "{field}={bad:?} must be refused");
        }
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in MessageKind::ALL {
            assert_eq!(kind.as_str().parse::<MessageKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_string(&kind).expect("serializes"),
                format!("\"{kind}\"")
            );
        }
        assert_eq!(
            "Reply".parse::<MessageKind>(),
            Err(MessageError::UnknownKind("Reply".to_owned()))
        );
    }
}

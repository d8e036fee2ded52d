//! Why fleetd refused a request: a [`Code`] from a closed set, each of one [`Kind`], and a
//! sentence saying what to do instead. Every door shows the code as the same snake_case text
//! (the MCP error, the REST body, logs); the HTTP door picks its status from the kind, so a new
//! code cannot be added without saying which kind of refusal it is.

use serde::Serialize;

/// What kind of refusal a code is: what the caller can do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Names something that does not exist.
    NotFound,
    /// The request itself is malformed.
    Invalid,
    /// Too large to accept.
    TooLarge,
    /// A cap is reached: the same request succeeds once the fleet catches up.
    Cap,
    /// Clashes with what exists.
    Conflict,
    /// Not allowed for this caller (or the delegation tree's shape): asking again changes
    /// nothing.
    Forbidden,
    /// fleetd's own trouble (the store, the multiplexer, a spawn, shutting down): retry later.
    Trouble,
}

macro_rules! codes {
    ($($kind:ident { $($variant:ident = $text:literal,)+ })+) => {
        /// A refusal's stable, machine-readable code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(
                #[doc = concat!("`", $text, "`")]
                $variant,
            )+)+
        }

        impl Code {
            /// Every code.
            pub const ALL: &[Self] = &[$($(Self::$variant,)+)+];

            /// The code as every door shows it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($(Self::$variant => $text,)+)+
                }
            }

            /// What kind of refusal it is.
            pub const fn kind(self) -> Kind {
                match self {
                    $($(Self::$variant => Kind::$kind,)+)+
                }
            }
        }
    };
}

codes! {
    NotFound {
        UnknownTarget = "unknown_target",
        UnknownTicket = "unknown_ticket",
        UnknownQuestion = "unknown_question",
        UnknownPane = "unknown_pane",
        UnknownProfile = "unknown_profile",
        UnknownBackend = "unknown_backend",
        UnknownGateway = "unknown_gateway",
        UnknownTool = "unknown_tool",
        UnknownChoice = "unknown_choice",
    }
    Invalid {
        InvalidTarget = "invalid_target",
        InvalidArguments = "invalid_arguments",
        InvalidMsgId = "invalid_msg_id",
        InvalidTicket = "invalid_ticket",
        InvalidPane = "invalid_pane",
        InvalidName = "invalid_name",
        InvalidGateway = "invalid_gateway",
        NoName = "no_name",
        EmptyTask = "empty_task",
        EmptyQuestion = "empty_question",
    }
    TooLarge {
        TaskTooLarge = "task_too_large",
        AnswerTooLarge = "answer_too_large",
        QuestionTooLarge = "question_too_large",
        ReplyRefused = "reply_refused",
    }
    Cap {
        QueueFull = "queue_full",
        TooManyQuestions = "too_many_questions",
        TooManyMembers = "too_many_members",
        TooManyCalls = "too_many_calls",
        GatewayBacklog = "gateway_backlog",
        GatewayBusy = "gateway_busy",
        BudgetReached = "budget_reached",
    }
    Conflict {
        NameTaken = "name_taken",
        NotBlocked = "not_blocked",
        NoDialog = "no_dialog",
        DialogChanged = "dialog_changed",
    }
    Forbidden {
        NotALead = "not_a_lead",
        NotAMember = "not_a_member",
        AnonymousCaller = "anonymous_caller",
        UnregisteredPane = "unregistered_pane",
        StrayPane = "stray_pane",
        SharedDaemon = "shared_daemon",
        NotYourTicket = "not_your_ticket",
        NotYourMember = "not_your_member",
        DelegationCycle = "delegation_cycle",
        DelegationTooDeep = "delegation_too_deep",
        NoGateway = "no_gateway",
        ModelKeyRefused = "model_key_refused",
        ApprovalsOff = "approvals_off",
    }
    Trouble {
        StoreUnavailable = "store_unavailable",
        StoreFailed = "store_failed",
        SpawnFailed = "spawn_failed",
        BackendUnreachable = "backend_unreachable",
        SpawnInterrupted = "spawn_interrupted",
        RemoteSpawnFailed = "remote_spawn_failed",
        WorktreeFailed = "worktree_failed",
        SandboxUnavailable = "sandbox_unavailable",
        ProfileNotReady = "profile_not_ready",
        AgentNotReady = "agent_not_ready",
        NoRandomness = "no_randomness",
        ShuttingDown = "shutting_down",
        Cancelled = "cancelled",
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A refusal: a stable code and a sentence saying what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    /// Stable, machine-readable code.
    pub code: Code,
    /// What happened and what to do next.
    pub message: String,
}

impl Refusal {
    /// A refusal with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_distinct_snake_case_text() {
        let mut seen = std::collections::BTreeSet::new();
        for code in Code::ALL {
            let text = code.as_str();
            assert!(
                text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{text}"
            );
            assert!(seen.insert(text), "{text} twice");
        }
        assert_eq!(
            serde_json::to_value(Code::NameTaken).expect("serializes"),
            "name_taken"
        );
        assert_eq!(Code::QueueFull.kind(), Kind::Cap);
    }
}

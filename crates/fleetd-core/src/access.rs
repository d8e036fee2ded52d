//! Who may call which MCP tool (SPEC §2): the roles fleetd derives from a connection and the
//! refusal each wrong pairing gets. Pure policy — it never sees arguments, so nothing a caller
//! passes can change its role.

use serde::Serialize;

use crate::ids::Target;

/// The caller's role, decided by the daemon from the connection alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A process in a member's pane: that member.
    Member {
        /// The member it is.
        target: Target,
        /// Its profile's `allowDelegation`.
        allow_delegation: bool,
    },
    /// A process in a pane that is not a member's: a lead.
    Lead,
    /// A process in no pane (a plain shell, another host). `token` is true when it presented the
    /// configured API token, which makes it a lead.
    Anonymous {
        /// Whether it presented the configured API token.
        token: bool,
    },
}

/// The kinds of tool, by who may call them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Lead-side tools that only read (`fleet_profiles`, `fleet_list`, `fleet_status`,
    /// `fleet_poll`): leads, delegating members, and anonymous callers.
    ReadOnly,
    /// Lead-side tools that change things (`fleet_spawn`, `fleet_send`, `fleet_ack`,
    /// `fleet_answer`, `fleet_stop`): leads and delegating members.
    Orchestration,
    /// Member-side tools (`fleet_reply`, `fleet_ask`): members only.
    Worker,
}

/// A refusal: a stable code and a sentence saying what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Refusal {
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// What happened and what to do next.
    pub message: String,
}

impl Refusal {
    /// A refusal with `code` and `message`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Decides whether `role` may call a tool of `class` named `tool`.
pub fn authorize(role: &Role, class: ToolClass, tool: &str) -> Result<(), Refusal> {
    match (role, class) {
        (Role::Member { .. }, ToolClass::Worker) => Ok(()),
        (
            Role::Member {
                allow_delegation: true,
                ..
            },
            _,
        ) => Ok(()),
        (Role::Member { target, .. }, _) => Err(Refusal::new(
            "not_a_lead",
            format!(
                "{tool} is a lead's tool and you are member {target}, whose profile does not allow delegation: answer your task with fleet_reply (or ask with fleet_ask) instead"
            ),
        )),
        (Role::Lead | Role::Anonymous { token: true }, ToolClass::Worker) => Err(Refusal::new(
            "not_a_member",
            format!(
                "{tool} is for members answering a task, and this connection is not from a member's pane: leads read replies with fleet_poll and send work with fleet_send"
            ),
        )),
        (Role::Lead | Role::Anonymous { token: true }, _) => Ok(()),
        (Role::Anonymous { token: false }, ToolClass::ReadOnly) => Ok(()),
        (Role::Anonymous { token: false }, _) => Err(Refusal::new(
            "anonymous_caller",
            format!(
                "{tool} changes the fleet, and this connection comes from no pane fleetd knows: call it from the lead's agent pane, or present the configured API token as a bearer token"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(delegate: bool) -> Role {
        Role::Member {
            target: Target::new("alice").expect("valid"),
            allow_delegation: delegate,
        }
    }

    /// Renders the decision table: one line per role with ok/code for each class.
    fn table() -> Vec<String> {
        let roles = [
            ("member", member(false)),
            ("delegating-member", member(true)),
            ("lead", Role::Lead),
            ("anonymous", Role::Anonymous { token: false }),
            ("token", Role::Anonymous { token: true }),
        ];
        let classes = [
            ToolClass::ReadOnly,
            ToolClass::Orchestration,
            ToolClass::Worker,
        ];
        roles
            .iter()
            .map(|(name, role)| {
                let cells: Vec<&str> = classes
                    .iter()
                    .map(|c| match authorize(role, *c, "fleet_x") {
                        Ok(()) => "ok",
                        Err(r) => r.code,
                    })
                    .collect();
                format!("{name}: {}", cells.join(" "))
            })
            .collect()
    }

    #[test]
    fn decision_table() {
        assert_eq!(
            table(),
            [
                "member: not_a_lead not_a_lead ok",
                "delegating-member: ok ok ok",
                "lead: ok ok not_a_member",
                "anonymous: ok anonymous_caller anonymous_caller",
                "token: ok ok not_a_member",
            ]
        );
    }

    #[test]
    fn refusals_say_what_to_do() {
        let err =
            authorize(&member(false), ToolClass::Orchestration, "fleet_send").expect_err("refused");
        assert!(err.message.contains("fleet_reply"), "{err}");
        let err = authorize(&Role::Lead, ToolClass::Worker, "fleet_reply").expect_err("refused");
        assert!(err.message.contains("fleet_poll"), "{err}");
    }
}

//! Who a caller is and what it may do (SPEC §2, §9): the role fleetd derives from the facts of a
//! connection, and which role may call which class of operation, with the refusal each wrong
//! pairing gets. Pure policy, the one policy for every door (MCP over HTTP, the stdio shim, the
//! REST API, the operator's socket): it never sees tool arguments, so nothing a caller passes
//! can change its role.

use serde::Serialize;

use crate::ids::Target;
pub use crate::refusal::{Code, Refusal};

/// The door a connection came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Door {
    /// The TCP listener (`/mcp`, the REST API): agents in panes, and clients with the token.
    Tcp,
    /// The stdio shim's unix socket (`fleetd mcp`): agents that only speak stdio.
    Shim,
    /// The operator's unix socket (the human CLI): the daemon's own user at a shell.
    Operator,
}

/// Where the caller's process runs, as the locator found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// In a registered member's pane (the pane process or a descendant of it).
    Member {
        /// The member.
        target: Target,
        /// Its profile's `allowDelegation`.
        allow_delegation: bool,
    },
    /// In a pane of the members' workspace (or the members' multiplexer daemon) that is not a
    /// registered member: a pane a member opened, or one left behind by a released member.
    MembersSpace,
    /// In a pane outside the members' workspace that fleetd holds for the user's own: a lead's
    /// pane by the lead rule (it predates the members, is a lead tab's lead, or was admitted).
    OtherPane,
    /// In a pane outside the members' workspace that no fact ties to the user: opened while
    /// members ran (one may have opened it), never admitted. Nothing more than nobody.
    StrayPane,
    /// In no pane, but its environment says it was started from a member (`FLEETD_TARGET`): a
    /// member's child that left the pane's process tree (`setsid`, re-parented orphan).
    LeftMember,
    /// In no pane at all.
    Nowhere,
}

/// Everything the role is decided from. Each field comes from the kernel or the multiplexer,
/// never from the caller's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerFacts {
    /// The door.
    pub door: Door,
    /// The peer runs as the daemon's own user (TCP: the socket's owner; unix sockets:
    /// `SO_PEERCRED`). False when it is unknown (a remote peer).
    pub same_uid: bool,
    /// It presented the configured API token.
    pub token: bool,
    /// Where its process runs (only looked at for a peer of the daemon's own user).
    pub place: Place,
}

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
    /// An agent in a pane outside the members' workspace, of the daemon's own user.
    Lead,
    /// A human: the CLI on the operator's socket as the daemon's own user, or any client with
    /// the API token. A lead's powers, without a pane to bind or nudge.
    Operator,
    /// A pane in the members' workspace that is no member, or a stray pane outside it: it may
    /// call nothing.
    Nobody,
    /// Everything else: another user's process, a process in no pane, a member's child that
    /// left its pane. May list profiles and members, never read a body or change anything.
    Anonymous,
}

impl Role {
    /// The role's name, for logs and metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Member { .. } => "member",
            Role::Lead => "lead",
            Role::Operator => "operator",
            Role::Nobody => "nobody",
            Role::Anonymous => "anonymous",
        }
    }
}

/// Decides the role from the facts (SPEC §2).
///
/// - Another user (or an unknown one) is anonymous, or the operator with the token: a pane of
///   another user's is never trusted as a lead or member.
/// - A pane decides before any token: a member is that member, a non-member pane in the members'
///   workspace or a stray pane (one no fact ties to the user) is nobody; a token never lifts
///   either.
/// - A member's child that left its pane stays anonymous on every door, the operator's too.
/// - Otherwise the operator's socket makes the operator, a lead's pane a lead, and the token an
///   operator; a process in no pane without the token is anonymous.
pub fn role_of(facts: &CallerFacts) -> Role {
    if !facts.same_uid {
        return if facts.token {
            Role::Operator
        } else {
            Role::Anonymous
        };
    }
    match (&facts.place, facts.door) {
        (
            Place::Member {
                target,
                allow_delegation,
            },
            _,
        ) => Role::Member {
            target: target.clone(),
            allow_delegation: *allow_delegation,
        },
        (Place::MembersSpace | Place::StrayPane, _) => Role::Nobody,
        (Place::LeftMember, _) => Role::Anonymous,
        (_, Door::Operator) => Role::Operator,
        (Place::OtherPane, _) => Role::Lead,
        (Place::Nowhere, _) if facts.token => Role::Operator,
        (Place::Nowhere, _) => Role::Anonymous,
    }
}

/// The kinds of operation, by who may perform them. Every MCP tool and every REST route is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolClass {
    /// Names only, no bodies or task texts (`fleet_profiles`, `fleet_list`, `GET /sessions`,
    /// `/metrics`): everyone but nobody.
    Public,
    /// Reading bodies, questions and details (`fleet_status`, `fleet_poll{target}`, `GET
    /// /sessions/{t}/replies`): leads, operators and delegating members.
    ReadOnly,
    /// Reading one ticket (`fleet_poll{ticket}`): leads and operators any ticket, a member its own
    /// (the tool checks which is whose).
    Ticket,
    /// Changing the fleet (`fleet_spawn`, `fleet_send`, `fleet_ack`, `fleet_answer`,
    /// `fleet_stop`, the REST acks, drains and tasks): leads, operators and delegating members.
    Orchestration,
    /// Answering a task (`fleet_reply`, `fleet_ask`): members only.
    Worker,
    /// Watching the whole fleet (`GET /events`): leads and operators only. Unlike the other
    /// lead classes, a delegating member may not: the stream covers every lead's members.
    Observe,
}

/// Decides whether `role` may perform an operation of `class` named `tool`.
pub fn authorize(role: &Role, class: ToolClass, tool: &str) -> Result<(), Refusal> {
    match (role, class) {
        (Role::Nobody, _) => Err(Refusal::new(
            Code::UnregisteredPane,
            format!(
                "{tool} refused: this connection comes from a pane in the members' workspace that is not a registered member (a pane a member opened, or one left by a released member); members are started with fleet_spawn"
            ),
        )),
        (_, ToolClass::Public) => Ok(()),
        (Role::Member { .. }, ToolClass::Worker | ToolClass::Ticket) => Ok(()),
        (Role::Member { target, .. }, ToolClass::Observe) => Err(Refusal::new(
            Code::NotALead,
            format!(
                "{tool} shows the whole fleet and is for leads and the operator; you are member {target}: ask your lead, or read your own sub-members with fleet_list and fleet_status"
            ),
        )),
        (
            Role::Member {
                allow_delegation: true,
                ..
            },
            _,
        ) => Ok(()),
        (Role::Member { target, .. }, _) => Err(Refusal::new(
            Code::NotALead,
            format!(
                "{tool} is a lead's tool and you are member {target}, whose profile does not allow delegation: answer your task with fleet_reply (or ask with fleet_ask) instead"
            ),
        )),
        (Role::Lead | Role::Operator, ToolClass::Worker) => Err(Refusal::new(
            Code::NotAMember,
            format!(
                "{tool} is for members answering a task, and this connection is not from a member's pane: leads read replies with fleet_poll and send work with fleet_send"
            ),
        )),
        (Role::Lead | Role::Operator, _) => Ok(()),
        (Role::Anonymous, _) => Err(Refusal::new(
            Code::AnonymousCaller,
            format!(
                "{tool} needs a lead or the operator, and this connection comes from no pane fleetd trusts (no pane, another user, or a member's process that left its pane): call it from the lead's agent pane, use the fleetd CLI as the daemon's user, or present the API token as a bearer token"
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice(delegate: bool) -> Place {
        Place::Member {
            target: Target::new("alice").expect("valid"),
            allow_delegation: delegate,
        }
    }

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
            ("operator", Role::Operator),
            ("nobody", Role::Nobody),
            ("anonymous", Role::Anonymous),
        ];
        let classes = [
            ToolClass::Public,
            ToolClass::ReadOnly,
            ToolClass::Ticket,
            ToolClass::Orchestration,
            ToolClass::Worker,
            ToolClass::Observe,
        ];
        roles
            .iter()
            .map(|(name, role)| {
                let cells: Vec<&str> = classes
                    .iter()
                    .map(|c| match authorize(role, *c, "fleet_x") {
                        Ok(()) => "ok",
                        Err(r) => r.code.as_str(),
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
                "member: ok not_a_lead ok not_a_lead ok not_a_lead",
                "delegating-member: ok ok ok ok ok not_a_lead",
                "lead: ok ok ok ok not_a_member ok",
                "operator: ok ok ok ok not_a_member ok",
                "nobody: unregistered_pane unregistered_pane unregistered_pane unregistered_pane unregistered_pane unregistered_pane",
                "anonymous: ok anonymous_caller anonymous_caller anonymous_caller anonymous_caller anonymous_caller",
            ]
        );
    }

    /// Renders the role for every door × place × uid × token.
    fn roles() -> Vec<String> {
        let places = [
            ("member", alice(false)),
            ("members-space", Place::MembersSpace),
            ("other-pane", Place::OtherPane),
            ("stray-pane", Place::StrayPane),
            ("left-member", Place::LeftMember),
            ("nowhere", Place::Nowhere),
        ];
        let mut out = Vec::new();
        for door in [Door::Tcp, Door::Shim, Door::Operator] {
            for (name, place) in &places {
                let cell = |same_uid, token| {
                    role_of(&CallerFacts {
                        door,
                        same_uid,
                        token,
                        place: place.clone(),
                    })
                    .as_str()
                };
                out.push(format!(
                    "{door:?} {name}: {} {} | other uid: {} {}",
                    cell(true, false),
                    cell(true, true),
                    cell(false, false),
                    cell(false, true),
                ));
            }
        }
        out
    }

    #[test]
    fn roles_by_door_place_uid_and_token() {
        // Columns: same uid without / with token | another uid without / with token.
        assert_eq!(
            roles(),
            [
                "Tcp member: member member | other uid: anonymous operator",
                "Tcp members-space: nobody nobody | other uid: anonymous operator",
                "Tcp other-pane: lead lead | other uid: anonymous operator",
                "Tcp stray-pane: nobody nobody | other uid: anonymous operator",
                "Tcp left-member: anonymous anonymous | other uid: anonymous operator",
                "Tcp nowhere: anonymous operator | other uid: anonymous operator",
                "Shim member: member member | other uid: anonymous operator",
                "Shim members-space: nobody nobody | other uid: anonymous operator",
                "Shim other-pane: lead lead | other uid: anonymous operator",
                "Shim stray-pane: nobody nobody | other uid: anonymous operator",
                "Shim left-member: anonymous anonymous | other uid: anonymous operator",
                "Shim nowhere: anonymous operator | other uid: anonymous operator",
                "Operator member: member member | other uid: anonymous operator",
                "Operator members-space: nobody nobody | other uid: anonymous operator",
                "Operator other-pane: operator operator | other uid: anonymous operator",
                "Operator stray-pane: nobody nobody | other uid: anonymous operator",
                "Operator left-member: anonymous anonymous | other uid: anonymous operator",
                "Operator nowhere: operator operator | other uid: anonymous operator",
            ]
        );
    }

    #[test]
    fn a_member_is_never_more_than_itself() {
        // Whatever the door and token, a member's pane never makes a lead or operator.
        for door in [Door::Tcp, Door::Shim, Door::Operator] {
            for token in [false, true] {
                let role = role_of(&CallerFacts {
                    door,
                    same_uid: true,
                    token,
                    place: alice(false),
                });
                assert_eq!(role, member(false));
                assert!(authorize(&role, ToolClass::Orchestration, "fleet_ack").is_err());
                assert!(authorize(&role, ToolClass::ReadOnly, "fleet_poll").is_err());
            }
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let err =
            authorize(&member(false), ToolClass::Orchestration, "fleet_send").expect_err("refused");
        assert!(err.message.contains("fleet_reply"), "{err}");
        let err = authorize(&Role::Lead, ToolClass::Worker, "fleet_reply").expect_err("refused");
        assert!(err.message.contains("fleet_poll"), "{err}");
        let err =
            authorize(&Role::Anonymous, ToolClass::ReadOnly, "fleet_poll").expect_err("refused");
        assert!(err.message.contains("API token"), "{err}");
        let err = authorize(&Role::Nobody, ToolClass::Public, "fleet_list").expect_err("refused");
        assert!(err.message.contains("fleet_spawn"), "{err}");
    }
}

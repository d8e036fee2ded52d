//! `fleet_poll`: read a ticket's state, or a member's pending replies and questions. Never
//! destructive: messages stay until `fleet_ack`.

use fleetd_core::access::{Role, ToolClass};
use fleetd_core::{MessageKind, Ticket};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, output, store_error, target};
use crate::engine::TicketAnswer;
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// How many messages one poll returns at most; ack them to see the rest.
const POLL_LIMIT: usize = 100;

/// Arguments of `fleet_poll`: exactly one of `ticket` or `target`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// A ticket from fleet_send: returns its state and reply.
    ticket: Option<String>,
    /// A member's name: returns its pending replies and open questions.
    target: Option<String>,
}

pub(crate) struct Poll;

impl FleetTool for Poll {
    const NAME: &'static str = "fleet_poll";
    const DESCRIPTION: &'static str = "Read without removing. ticket=T → {ticket, state, reply?}. target=NAME → {target, replies:[{msgId, kind, ticket?, text, createdAt}], questions:[{questionId, question}]}. Acknowledge what you have read with fleet_ack so it is not shown (or nudged about) again. A member may call it with its own ticket to read a long task.";
    const CLASS: ToolClass = ToolClass::ReadOnly;
    type Args = Args;

    /// Reading one ticket is its own class: a member may read its own task through it (the
    /// pointer it is given for a task too long to type).
    fn class_of(args: &serde_json::Value) -> ToolClass {
        if args.get("ticket").is_some_and(|t| !t.is_null()) {
            ToolClass::Ticket
        } else {
            Self::CLASS
        }
    }

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        match (args.ticket, args.target) {
            (Some(ticket), None) => by_ticket(fleet, caller, &ticket).await,
            (None, Some(name)) => by_target(fleet, &name).await,
            _ => Err(ToolError::new(
                "invalid_arguments",
                "give exactly one of `ticket` (a ticket from fleet_send) or `target` (a member's name)",
            )),
        }
    }
}

async fn by_ticket(fleet: &Fleet, caller: &Caller, text: &str) -> Result<ToolOutput, ToolError> {
    let ticket =
        Ticket::parse(text).map_err(|e| ToolError::new("invalid_ticket", e.to_string()))?;
    let answer = fleet.engine.ticket(ticket).await.map_err(gone)?;
    if let Role::Member {
        target,
        allow_delegation,
    } = &caller.role
    {
        // A member reads its own task (the pointer for a task too long to type); a delegating
        // member reads the tickets it sent, like a lead (review M14).
        let sent_it = *allow_delegation
            && matches!(&answer, TicketAnswer::Live(view) if view.sent_by.as_deref() == Some(target.as_str()));
        if !sent_it {
            return match fleet.engine.task_text(ticket).await.map_err(gone)? {
                Some((owner, task)) if owner == *target => output(
                    json!({ "ticket": ticket, "task": task }),
                    format!("task {ticket} ({} bytes)", task.len()),
                ),
                _ => Err(ToolError::new(
                    "not_your_ticket",
                    format!(
                        "ticket {ticket} is not one of yours; answer your current task with fleet_reply"
                    ),
                )),
            };
        }
    }
    match answer {
        TicketAnswer::Live(view) => {
            let pending = fleet
                .store
                .peek(&view.target, POLL_LIMIT)
                .await
                .map_err(|e| store_error(&e))?;
            let reply = pending
                .iter()
                .filter(|m| m.ticket == Some(ticket))
                .find(|m| m.kind == MessageKind::Reply)
                .or_else(|| pending.iter().find(|m| m.ticket == Some(ticket)));
            let mut value = json!({ "ticket": ticket, "target": view.target, "state": view.state, "cause": view.cause });
            if let Some(reply) = reply {
                value["reply"] = super::send::reply_json(reply);
            }
            output(value, format!("ticket {ticket}: {}", view.state.as_str()))
        }
        TicketAnswer::Expired => output(
            json!({ "ticket": ticket, "state": "expired", "hint": "the ticket finished longer ago than tickets.ttlAfterFinishSecs; its reply, if unread, is in the member's inbox: fleet_poll(target=...)" }),
            format!("ticket {ticket} expired; read the member's inbox with fleet_poll(target=...)"),
        ),
        TicketAnswer::Unknown => Err(ToolError::new(
            "unknown_ticket",
            format!(
                "fleetd never issued ticket {ticket} (or restarted since): read the member's inbox with fleet_poll(target=...)"
            ),
        )),
    }
}

async fn by_target(fleet: &Fleet, name: &str) -> Result<ToolOutput, ToolError> {
    let target = target(name)?;
    let pending = fleet
        .store
        .peek(&target, POLL_LIMIT)
        .await
        .map_err(|e| store_error(&e))?;
    let questions = fleet
        .engine
        .questions(Some(target.clone()))
        .await
        .map_err(gone)?;
    let replies: Vec<_> = pending.iter().map(super::send::reply_json).collect();
    let summary = format!(
        "{target}: {} pending messages, {} open questions",
        replies.len(),
        questions.len()
    );
    output(
        json!({ "target": target, "replies": replies, "questions": questions }),
        summary,
    )
}

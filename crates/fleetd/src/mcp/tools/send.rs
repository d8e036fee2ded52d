//! `fleet_send`: delegate a task to a member; by default wait for its reply.

use fleetd_core::refusal::Code;
use std::time::Duration;

use fleetd_core::access::ToolClass;
use fleetd_core::{Message, TicketState};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{FleetTool, gone, member_of, output, target};
use crate::engine::{LeadRef, TicketAnswer};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Longest wait a caller may ask for: an hour. A longer wait only ties up a connection; the
/// reply waits in the inbox anyway.
const MAX_WAIT_SECS: u64 = 3600;

/// Arguments of `fleet_send`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The member's name (see fleet_list).
    pub(crate) target: String,
    /// The task, in plain words. It is typed into the member's pane when the member is ready
    /// (a long task is handed over as a pointer the member reads with fleet_poll).
    pub(crate) task: String,
    /// Wait for the reply (default true). With false, returns the ticket at once; read the
    /// reply later with fleet_poll.
    pub(crate) wait: Option<bool>,
    /// How long to wait, in seconds (default 120, at most 3600). When it passes first, the
    /// ticket is returned with its current state and the reply lands in the inbox.
    pub(crate) timeout_secs: Option<u64>,
}

pub(crate) struct Send;

/// The JSON of a reply message for a tool result.
pub(crate) fn reply_json(message: &Message) -> serde_json::Value {
    json!({
        "msgId": message.msg_id,
        "kind": message.kind,
        "ticket": message.ticket,
        "text": message.text,
        "createdAt": message.created_at,
    })
}

impl FleetTool for Send {
    const NAME: &'static str = "fleet_send";
    const DESCRIPTION: &'static str = "Delegate a task to a member. Returns {ticket, status, reply?, msgId?}. With wait (the default) the call returns when the ticket settles (replied, ended_without_reply, stalled, failed) or the timeout passes (status working/queued: the reply will land in the inbox and you will be nudged). A reply returned here is acknowledged by your next fleet call. With wait=false it returns {ticket, status:queued} at once. A client that takes MCP tasks (Claude Code) gets the wait as a background task instead: the call returns at once and a new turn starts with the ticket's first news (its reply, a question from the member, or how it ended).";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let lead = caller.lead();
        if let Some(lead) = &lead {
            fleet.engine.lead_seen(lead.clone()).await.map_err(gone)?;
        }
        // A delegating member is recorded as the ticket's sender, so it may poll it.
        let member = member_of(caller);
        delegate(fleet, lead, member, caller.holder(), &caller.cancel, args).await
    }
}

/// Submits `args.task` to its target on behalf of `lead` (bound as the target's delegating lead
/// when there is one; with none, nudges go to the primary) and, with wait, waits for the ticket
/// to settle. The one path for `fleet_send` and the REST API's `POST /sessions/{target}/tasks`.
/// When `cancel` fires the wait stops and the reply stays in the inbox.
pub(crate) async fn delegate(
    fleet: &Fleet,
    lead: Option<LeadRef>,
    member: Option<fleetd_core::Target>,
    holder: Option<String>,
    cancel: &CancellationToken,
    args: Args,
) -> Result<ToolOutput, ToolError> {
    let target = target(&args.target)?;
    let offline = match target.gateway() {
        Some(gw) => super::gateway_known(fleet, gw)?,
        None => None,
    };
    let max = super::max_message_bytes(fleet);
    if args.task.len() > max {
        return Err(ToolError::new(
            Code::TaskTooLarge,
            format!(
                "the task is {} bytes; the limit is {max} (inbox.maxMessageBytes): put the details in a file and send its path",
                args.task.len()
            ),
        ));
    }
    if args.task.trim().is_empty() {
        return Err(ToolError::new(
            Code::EmptyTask,
            "the task is empty: say what the member should do",
        ));
    }
    let submitted = match member {
        Some(by) => {
            fleet
                .engine
                .submit_for_member(by, target.clone(), args.task)
                .await
        }
        None => fleet.engine.submit(lead, target.clone(), args.task).await,
    };
    let ticket = submitted.map_err(gone)??;
    if !args.wait.unwrap_or(true) {
        let mut value = json!({ "ticket": ticket, "status": "queued" });
        let mut summary =
            format!("ticket {ticket} queued for {target}; fleet_poll(ticket) reads the reply");
        if let Some(note) = &offline {
            value["gatewayNote"] = json!(note);
            summary = format!("{summary}. {note}");
        }
        return output(value, summary);
    }
    let secs = args.timeout_secs.unwrap_or(120).min(MAX_WAIT_SECS);
    // A reply the waiter is handed and does not return (this request fails, times out, or is
    // dropped) goes back to be nudged about.
    let guard = fleet.inbox.hand_guard(ticket);
    let waiter = fleet.engine.wait(ticket).await.map_err(gone)?;
    let settled = tokio::select! {
        settled = tokio::time::timeout(Duration::from_secs(secs), waiter) => settled,
        () = cancel.cancelled() => {
            // Nobody will read an answer: drop the waiter so the reply stays in the inbox.
            return Err(ToolError::new(Code::Cancelled, "the request was abandoned; the reply will land in the inbox"));
        }
    };
    match settled {
        Ok(Ok(settled)) => {
            let mut value = json!({ "ticket": ticket, "status": settled.state });
            let mut summary = format!("ticket {ticket}: {}", settled.state.as_str());
            if let Some(reply) = &settled.reply {
                // Not acknowledged here: the answer may never be written. The caller's next
                // call (or its fleet_ack of msgId) acknowledges it.
                value["reply"] = json!(reply.text);
                value["msgId"] = json!(reply.msg_id);
                if let Some(holder) = holder {
                    guard.confirm(holder).await;
                }
                summary = format!("{target} replied ({} bytes)", reply.text.len());
            }
            output(value, summary)
        }
        _ => {
            let state = match fleet.engine.ticket(ticket).await.map_err(gone)? {
                TicketAnswer::Live(view) => view.state,
                _ => TicketState::Queued,
            };
            let mut value = json!({ "ticket": ticket, "status": state });
            let mut summary = format!(
                "ticket {ticket} still {}; the reply will land in the inbox",
                state.as_str()
            );
            if let Some(note) = &offline {
                value["gatewayNote"] = json!(note);
                summary = format!("{summary}. {note}");
            }
            output(value, summary)
        }
    }
}

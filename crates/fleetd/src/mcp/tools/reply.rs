//! `fleet_reply`: a member answers its task. The reply is durable before anyone is told.

use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use fleetd_core::{Message, MessageKind, MsgId, Ticket};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, calling_member, gone, output, store_error};
use crate::engine::TicketAnswer;
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_reply`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// Your answer to the lead: the result of your task.
    text: String,
    /// The ticket you answer (default: your current task).
    ticket: Option<String>,
}

pub(crate) struct Reply;

impl FleetTool for Reply {
    const NAME: &'static str = "fleet_reply";
    const DESCRIPTION: &'static str = "Send your answer to the lead who gave you the task. This is the only way your work reaches the lead: text you only print in your pane reaches nobody. Returns {msgId, delivered: waiter|inbox}; either way the reply is stored safely.";
    const CLASS: ToolClass = ToolClass::Worker;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = calling_member(caller, Self::NAME)?;
        let ticket = match args.ticket {
            Some(text) => {
                let ticket = Ticket::parse(&text)
                    .map_err(|e| ToolError::new(Code::InvalidTicket, e.to_string()))?;
                match fleet.engine.ticket(ticket).await.map_err(gone)? {
                    TicketAnswer::Live(view) if view.target == *target => Some(ticket),
                    TicketAnswer::Live(_) => {
                        return Err(ToolError::new(
                            Code::NotYourTicket,
                            format!(
                                "ticket {ticket} was given to another member; omit `ticket` to answer your current task"
                            ),
                        ));
                    }
                    // An expired or unknown ticket (e.g. after a restart) is still worth keeping.
                    _ => Some(ticket),
                }
            }
            None => fleet
                .engine
                .current_ticket(target.clone())
                .await
                .map_err(gone)?,
        };
        let message = Message {
            msg_id: MsgId::from_uuid(fleet.clock.new_id()),
            target: target.clone(),
            ticket,
            kind: MessageKind::Reply,
            // A member asked to hand over its credentials does not get them to the lead.
            text: fleet.redactor.redact(&args.text).into_owned(),
            from: target.to_string(),
            created_at: fleet.clock.now(),
        };
        fleet.store.publish(message.clone()).await.map_err(|e| match e {
            crate::store::StoreError::Refused(refusal) => ToolError::new(Code::ReplyRefused,
                format!("{refusal}: shorten the reply, or write the details to a file and reply with its path"),
            ),
            other => store_error(&other),
        })?;
        let msg_id = message.msg_id;
        let delivered = fleet.engine.reply_stored(message).await.map_err(gone)?;
        output(
            json!({ "msgId": msg_id, "delivered": delivered }),
            format!("reply {msg_id} stored ({delivered:?})"),
        )
    }
}

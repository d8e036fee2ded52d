//! `fleet_ack`: acknowledge read messages, removing them from a member's inbox.

use fleetd_core::MsgId;
use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, output, store_error, target, within_reach};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_ack`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The member whose inbox holds the messages.
    target: String,
    /// One message id (from fleet_poll).
    msg_id: Option<String>,
    /// Several message ids.
    msg_ids: Option<Vec<String>>,
}

pub(crate) struct Ack;

impl FleetTool for Ack {
    const NAME: &'static str = "fleet_ack";
    const DESCRIPTION: &'static str = "Acknowledge messages you have read (msgId, or msgIds for several) so they leave the member's inbox and stop the reminders. An unknown or already acknowledged id is not an error: it reports acked=false. A delegating member may acknowledge only its own subtree's messages (not_your_member).";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = target(&args.target)?;
        within_reach(fleet, caller, &target, Self::NAME).await?;
        let ids: Vec<String> = args
            .msg_id
            .into_iter()
            .chain(args.msg_ids.unwrap_or_default())
            .collect();
        if ids.is_empty() {
            return Err(ToolError::new(
                Code::InvalidArguments,
                "give `msgId` or `msgIds` (from fleet_poll)",
            ));
        }
        let msg_ids = ids
            .iter()
            .map(|id| {
                MsgId::parse(id).map_err(|e| ToolError::new(Code::InvalidMsgId, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let acked = fleet
            .inbox
            .ack(&target, &msg_ids)
            .await
            .map_err(|e| store_error(&e))?;
        let results: Vec<_> = msg_ids
            .iter()
            .zip(acked)
            .map(|(msg_id, acked)| json!({ "msgId": msg_id, "acked": acked }))
            .collect();
        let n = results.iter().filter(|r| r["acked"] == true).count();
        output(
            json!({ "target": target, "acked": results }),
            format!("acknowledged {n} of {} messages", ids.len()),
        )
    }
}

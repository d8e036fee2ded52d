//! `fleet_status`: one member in detail, with its recent tickets and open questions.

use fleetd_core::Target;
use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, output, target, within_reach};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// The member's name (see fleet_list).
    target: String,
}

pub(crate) struct Status;

impl FleetTool for Status {
    const NAME: &'static str = "fleet_status";
    const DESCRIPTION: &'static str = "Show one member in detail: its state, pane, inbox depth, its place in the delegation tree, its worktree (branch, uncommitted changes, commits ahead of its base) when it has one, its recent tickets with their states, and its open questions (answer them with fleet_answer).";
    const CLASS: ToolClass = ToolClass::ReadOnly;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = target(&args.target)?;
        // Its tickets and question texts are its delegating lead's business.
        within_reach(fleet, caller, &target, Self::NAME).await?;
        let member = detail(fleet, &target).await?;
        let summary = format!(
            "{target}: {}, {} recent tickets, {} open questions",
            member["status"].as_str().unwrap_or("unknown"),
            member["tickets"].as_array().map_or(0, Vec::len),
            member["questions"].as_array().map_or(0, Vec::len)
        );
        output(member, summary)
    }
}

/// One member with its inbox depth, recent tickets and open questions (for `fleet_status` and
/// `GET /sessions/{target}`).
pub(crate) async fn detail(fleet: &Fleet, target: &Target) -> Result<serde_json::Value, ToolError> {
    let members = super::list::members_json(fleet).await?;
    let Some(mut member) = members.into_iter().find(|m| m["target"] == target.as_str()) else {
        return Err(ToolError::new(
            Code::UnknownTarget,
            format!("no member named {target}: call fleet_list to see members"),
        ));
    };
    let tickets = fleet.engine.recent(target.clone()).await.map_err(gone)?;
    let questions = fleet
        .engine
        .questions(Some(target.clone()))
        .await
        .map_err(gone)?;
    member["tickets"] = json!(tickets);
    member["questions"] = json!(questions);
    Ok(member)
}

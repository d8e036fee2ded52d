//! `fleet_list`: every member with its state, inbox depth and open tickets.

use fleetd_core::access::ToolClass;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, output};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {}

pub(crate) struct List;

/// Members with their inbox depth, as JSON.
pub(crate) async fn members_json(fleet: &Fleet) -> Result<Vec<serde_json::Value>, ToolError> {
    let members = fleet.engine.list().await.map_err(gone)?;
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let depth = fleet.store.depth(&m.target).await.ok();
        let mut value = serde_json::to_value(&m).unwrap_or_default();
        value["inboxDepth"] = json!(depth);
        out.push(value);
    }
    Ok(out)
}

impl FleetTool for List {
    const NAME: &'static str = "fleet_list";
    const DESCRIPTION: &'static str = "List every member: target name, profile, pane id, status (idle/working/blocked/done/unknown), whether its agent is connected, inbox depth (replies waiting for fleet_poll), open tickets and its delegating lead.";
    const CLASS: ToolClass = ToolClass::Public;
    type Args = Args;

    async fn call(fleet: &Fleet, _caller: &Caller, _args: Args) -> Result<ToolOutput, ToolError> {
        let members = members_json(fleet).await?;
        let summary = match members.len() {
            0 => "no members: fleet_spawn starts one".to_owned(),
            n => format!(
                "{n} members: {}",
                members
                    .iter()
                    .map(|m| format!(
                        "{} ({})",
                        m["target"].as_str().unwrap_or("?"),
                        m["status"].as_str().unwrap_or("?")
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        output(json!({ "members": members }), summary)
    }
}

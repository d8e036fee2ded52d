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

/// Members with their inbox depth, as JSON: this host's, then other gateways' as their
/// presence said (`name@gateway`, with this host's inbox for them and the tickets sent from
/// here still open).
pub(crate) async fn members_json(fleet: &Fleet) -> Result<Vec<serde_json::Value>, ToolError> {
    let members = fleet.engine.list().await.map_err(gone)?;
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let depth = fleet.store.depth(&m.target).await.ok();
        let mut value = serde_json::to_value(&m).unwrap_or_default();
        value["inboxDepth"] = json!(depth);
        out.push(value);
    }
    for mut value in fleet.peers.members() {
        let Some(target) = value["target"]
            .as_str()
            .and_then(|t| fleetd_core::Target::new(t).ok())
        else {
            continue;
        };
        let open: Vec<_> = fleet
            .engine
            .recent(target.clone())
            .await
            .map_err(gone)?
            .into_iter()
            .filter(|t| !t.state.is_terminal())
            .map(|t| t.ticket)
            .collect();
        value["openTickets"] = json!(open);
        value["inboxDepth"] = json!(fleet.store.depth(&target).await.ok());
        out.push(value);
    }
    Ok(out)
}

impl FleetTool for List {
    const NAME: &'static str = "fleet_list";
    const DESCRIPTION: &'static str = "List every member: target name, profile, pane id, status (idle/working/blocked/done/unknown), whether its agent is connected, inbox depth (replies waiting for fleet_poll), open tickets, its delegating lead, and its place in the delegation tree: `delegator` (the member it reports to, when a member delegated to it) and `depth` (1 under a lead); with a worktree profile, `branch` and `worktree` {path, branch, base, uncommitted, ahead}; when its model backend is served through fleetd, `usage` (tokens by kind, totalTokens, costUsd, its budget) and, heading a delegation tree, `treeUsage`. `usage` beside the members totals what was spent by profile, tree and lead, released members included. In a fleet across hosts, other gateways' members follow as `name@gateway` (send to them by that name) with `gateway`, `stale` and `seenSecsAgo`; a gateway not heard from for three of its presence intervals shows its members `unreachable`.";
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
                    .map(|m| match m["delegator"].as_str() {
                        Some(up) => format!(
                            "{} ({}, under {up})",
                            m["target"].as_str().unwrap_or("?"),
                            m["status"].as_str().unwrap_or("?")
                        ),
                        None => format!(
                            "{} ({})",
                            m["target"].as_str().unwrap_or("?"),
                            m["status"].as_str().unwrap_or("?")
                        ),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        // What members spent through the model gateway, released ones included: by profile,
        // delegation tree and lead (each member's own is on its entry).
        let totals = fleet.engine.usage_totals().await.map_err(gone)?;
        let spent = |map: &std::collections::BTreeMap<String, fleetd_core::usage::Spent>| {
            map.iter()
                .map(|(k, s)| {
                    (
                        k.clone(),
                        json!({
                            "tokens": s.tokens,
                            "totalTokens": s.tokens.total(),
                            "costUsd": s.cost_micros as f64 / 1e6,
                        }),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
        };
        let usage = json!({
            "profiles": spent(&totals.profiles),
            "trees": spent(&totals.trees),
            "leads": spent(&totals.leads),
        });
        output(json!({ "members": members, "usage": usage }), summary)
    }
}

//! `fleet_spawn`: start a member from a profile in its own pane and wait until its agent is
//! ready. The spawn itself is the member service's (`members::Spawner`), run on a task of its
//! own; this tool only hands it the request and shapes its answer.

use fleetd_core::access::ToolClass;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, output};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};
use crate::members::SpawnRequest;

/// Arguments of `fleet_spawn`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// The profile to start (see fleet_profiles).
    profile: String,
    /// The member's name (`[a-z][a-z0-9_-]{0,31}`); default: a free readable name.
    name: Option<String>,
    /// Working directory; default: the profile's.
    cwd: Option<String>,
    /// A first task to send once it is ready (returns its ticket).
    task: Option<String>,
}

pub(crate) struct Spawn;

impl FleetTool for Spawn {
    const NAME: &'static str = "fleet_spawn";
    const DESCRIPTION: &'static str = "Start a member from a profile (see fleet_profiles) in a new pane and wait until its agent is ready. Returns {target, paneId, terminalId, profile} and, with `task`, the first task's ticket. Fails clearly (profile not ready, pane closed, agent not ready in time) without leaving a half-registered member.";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let spawned = fleet
            .spawner
            .spawn(SpawnRequest {
                profile: args.profile,
                name: args.name,
                cwd: args.cwd,
                task: args.task,
                lead: caller.lead(),
            })
            .await?;
        let mut value = json!({
            "target": spawned.target,
            "paneId": spawned.pane.to_string(),
            "terminalId": spawned.terminal,
            "profile": spawned.profile,
        });
        if let Some(ticket) = spawned.ticket {
            value["ticket"] = json!(ticket);
        }
        output(
            value,
            format!(
                "spawned {} ({}) in {}",
                spawned.target, spawned.profile, spawned.pane
            ),
        )
    }
}

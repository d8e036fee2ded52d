//! `fleet_profiles`: the configured member profiles and whether each can be spawned now.

use fleetd_core::access::ToolClass;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, output};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {}

pub(crate) struct Profiles;

impl FleetTool for Profiles {
    const NAME: &'static str = "fleet_profiles";
    const DESCRIPTION: &'static str = "List the member profiles fleetd can spawn (fleet_spawn profile=...): name, agent kind, backend, model, sandbox (whether its members run boxed, and with the network or not; null: not boxed), runAs (the second user its members run as; null: fleetd's own), and ready=false with the reason when a secret it needs does not resolve. In a fleet across hosts, other gateways' profiles follow as `profile@gateway` (spawn one with fleet_spawn profile=PROFILE gateway=GATEWAY), not ready while that gateway is not heard from.";
    const CLASS: ToolClass = ToolClass::Public;
    type Args = Args;

    async fn call(fleet: &Fleet, _caller: &Caller, _args: Args) -> Result<ToolOutput, ToolError> {
        let config = fleet.config.current();
        let profiles: Vec<_> = config
            .profiles
            .iter()
            .map(|(name, p)| {
                let missing = crate::members::missing_secret(&config, p);
                json!({
                    "name": name,
                    "agent": p.agent,
                    "backend": p.backend,
                    "model": p.model,
                    // Whether its members run in a sandbox, and with the network or not.
                    "sandbox": p.sandbox.as_ref().map(|b| json!({ "network": b.network })),
                    "runAs": p.run_as,
                    "ready": missing.is_none(),
                    "notReadyBecause": missing,
                })
            })
            .chain(fleet.peers.profiles())
            .collect();
        let ready = profiles.iter().filter(|p| p["ready"] == true).count();
        let summary = format!("{} profiles, {ready} ready", profiles.len());
        output(json!({ "profiles": profiles }), summary)
    }
}

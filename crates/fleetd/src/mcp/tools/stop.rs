//! `fleet_stop`: release a member and close its pane.

use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, output, target, within_reach};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_stop`: `target` or `paneId`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The member's name.
    target: Option<String>,
    /// Or its pane id, daemon-qualified (`member:w1:p2`); a bare id must be unambiguous.
    pane_id: Option<String>,
    /// Why (recorded on its open tickets; default "stopped").
    cause: Option<String>,
}

pub(crate) struct Stop;

impl FleetTool for Stop {
    const NAME: &'static str = "fleet_stop";
    const DESCRIPTION: &'static str = "Stop a member: close its pane and release it. Its open tickets fail with the cause (default \"stopped\"); replies it already sent stay in its inbox. Name it by target, or by paneId (daemon-qualified like member:w1:p2; an ambiguous bare id is refused). A delegating member may stop only members of its own subtree (not_your_member).";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = match (args.target, args.pane_id) {
            (Some(name), None) => target(&name)?,
            (None, Some(pane)) => {
                let pane = fleet
                    .mux
                    .resolve(&pane)
                    .await
                    .map_err(|e| ToolError::new(Code::InvalidPane, e.to_string()))?;
                let members = fleet.engine.list().await.map_err(gone)?;
                members
                    .into_iter()
                    .find(|m| m.pane_id == pane)
                    .map(|m| m.target)
                    .ok_or_else(|| {
                        ToolError::new(
                            Code::UnknownPane,
                            format!("pane {pane} holds no member: call fleet_list"),
                        )
                    })?
            }
            _ => {
                return Err(ToolError::new(
                    Code::InvalidArguments,
                    "give exactly one of `target` or `paneId`",
                ));
            }
        };
        within_reach(fleet, caller, &target, Self::NAME).await?;
        let cause = args.cause.unwrap_or_else(|| "stopped".to_owned());
        if target.gateway().is_some() {
            // A member on another host: its gateway stops it; its tickets here end as that
            // gateway reports.
            if !fleet
                .engine
                .stop_remote(target.clone(), cause.clone())
                .await
                .map_err(gone)?
            {
                return Err(ToolError::new(
                    Code::NoGateway,
                    format!(
                        "{target} is a member on another host, and this fleetd is no gateway (configure `gateway:`)"
                    ),
                ));
            }
            return output(
                json!({ "target": target, "cause": cause, "stop": "sent" }),
                format!(
                    "asked {target}'s gateway to stop it ({cause}); its open tickets end when that gateway reports"
                ),
            );
        }
        let Some(pane) = fleet
            .engine
            .release(target.clone(), cause.clone())
            .await
            .map_err(gone)?
        else {
            return Err(ToolError::new(
                Code::UnknownTarget,
                format!("no member named {target}: call fleet_list"),
            ));
        };
        let closed = match fleet.mux.close_pane(&pane).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                tracing::warn!(%pane, error = %e, "released member's pane did not close");
                false
            }
        };
        output(
            json!({ "target": target, "paneId": pane.to_string(), "cause": cause, "paneClosed": closed }),
            format!("stopped {target} ({cause})"),
        )
    }
}

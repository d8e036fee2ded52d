//! `fleet_approve`: type one choice into a member's dialog (SPEC §20). The operator's, always;
//! a lead's for its own members only where `approvals.by: operator-and-lead` says so (off by
//! default: a lead is an agent, and the dialog asks a person). Never a member's. The REST route
//! `POST /sessions/{target}/approve` (`fleetd approve`, the dashboard) is this tool.

use fleetd_core::access::{Role, ToolClass};
use fleetd_core::refusal::Code;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;

use super::{FleetTool, gone, output, target};
use crate::config::ApprovalsBy;
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_approve`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The member waiting on a dialog.
    target: String,
    /// The choice: its number as the dialog shows it (`1`), or its words.
    choice: String,
    /// The dialog answered (the `dialog` of its `member.blocked` event): typed only if that
    /// dialog is still the one on screen.
    dialog: Option<String>,
}

pub(crate) struct Approve;

impl FleetTool for Approve {
    const NAME: &'static str = "fleet_approve";
    const DESCRIPTION: &'static str = "Answer a member's dialog (a permission prompt it waits on: status blocked, a member.blocked event) by typing one of its choices into its pane: the choice's number (or words), and the dialog's fingerprint from the event to make sure the same dialog is still on screen. Nothing is typed unless the member is blocked on a dialog fleetd recognises that offers the choice. The operator's; a lead may answer its own members only when fleetd's configuration says approvals.by: operator-and-lead (approvals_off otherwise). Members never.";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = target(&args.target)?;
        let by = match &caller.role {
            Role::Operator => "operator".to_owned(),
            Role::Lead => lead_may_approve(fleet, caller, &target).await?,
            _ => {
                return Err(ToolError::new(
                    Code::ApprovalsOff,
                    "members never answer a dialog: the operator does (fleetd approve, the dashboard)",
                ));
            }
        };
        let done = fleet
            .human
            .approve(&target, &args.choice, args.dialog.as_deref(), &by)
            .await?;
        let summary = format!(
            "typed {} ({}) into {target}'s dialog: {}",
            done.choice,
            done.label,
            if done.outcome == "answered" {
                "the dialog went"
            } else {
                "the dialog is still on screen"
            }
        );
        output(serde_json::to_value(&done).unwrap_or_default(), summary)
    }
}

/// A lead may answer member `target`'s dialog when the configuration lets leads approve and
/// `target` works for this lead; who it is, for the log and the event.
async fn lead_may_approve(
    fleet: &Fleet,
    caller: &Caller,
    target: &fleetd_core::Target,
) -> Result<String, ToolError> {
    if fleet.config.current().approvals.by != ApprovalsBy::OperatorAndLead {
        return Err(ToolError::new(
            Code::ApprovalsOff,
            "leads may not answer members' dialogs here (approvals.by is operator): ask your user, who can answer with fleetd approve or the dashboard",
        ));
    }
    let pane = caller
        .pane
        .as_ref()
        .map(|p| p.pane.to_string())
        .unwrap_or_default();
    let members = fleet.engine.list().await.map_err(gone)?;
    let theirs = members
        .iter()
        .any(|m| m.target == *target && m.lead.as_deref() == Some(pane.as_str()));
    if !theirs {
        return Err(ToolError::new(
            Code::NotYourMember,
            format!(
                "{target} is not one of your members: a lead answers only its own members' dialogs"
            ),
        ));
    }
    Ok(format!("lead:{pane}"))
}

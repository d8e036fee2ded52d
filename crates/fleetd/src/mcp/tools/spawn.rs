//! `fleet_spawn`: start a member from a profile in its own pane and wait until its agent is
//! ready. The spawn itself is the member service's (`members::Spawner`), run on a task of its
//! own; this tool only hands it the request and shapes its answer.

use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use fleetd_core::{Target, Ticket};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{FleetTool, member_of, output};
use crate::config::BudgetSpec;
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
    /// The gateway (host) to spawn it on, for a fleet across hosts; default: this one. Its
    /// profiles are that gateway's (fleet_profiles shows them as `profile@gateway`).
    gateway: Option<String>,
    /// A model budget for the member, when its backend is served through fleetd: its model
    /// requests are refused once it is spent. It tightens the profile's `budget`, never
    /// loosens it.
    budget: Option<BudgetArg>,
    /// A model budget for the delegation tree the member heads (itself and every member under
    /// it together); it tightens the profile's `treeBudget`, never loosens it.
    #[serde(rename = "treeBudget")]
    tree_budget: Option<BudgetArg>,
}

/// A model budget as `fleet_spawn` takes it.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct BudgetArg {
    /// Tokens of every kind together (input, output, cache reads and writes).
    tokens: Option<u64>,
    /// Cost in US dollars, at the backend's configured prices.
    cost_usd: Option<f64>,
    /// The fraction of a limit at which your lead is warned (0 to 1; default 0.8).
    warn_at: Option<f64>,
}

/// Whether `profile`'s backend is served through fleetd's model gateway (an unknown profile
/// counts as served: the spawn refuses it, naming it).
fn served_through_fleetd(config: &crate::config::Config, profile: &str) -> bool {
    config.profiles.get(profile).is_none_or(|p| {
        p.backend
            .as_ref()
            .and_then(|b| config.backends.get(b))
            .is_some_and(|b| b.through_fleetd)
    })
}

/// `arg` (named `name` in the arguments) as a budget, or the refusal naming its bad field.
fn budget(name: &str, arg: Option<&BudgetArg>) -> Result<Option<BudgetSpec>, ToolError> {
    let Some(arg) = arg else {
        return Ok(None);
    };
    let invalid = |message: String| ToolError::new(Code::InvalidArguments, message);
    match crate::config::budget_from(arg.tokens, arg.cost_usd, arg.warn_at) {
        Ok(Some(spec)) => Ok(Some(spec)),
        Ok(None) => Err(invalid(format!(
            "`{name}` sets no limit: give `tokens` (all kinds together) and/or `costUsd`"
        ))),
        Err(e) => Err(invalid(format!("`{name}.{}`: {}", e.field, e.message))),
    }
}

/// How long `fleet_spawn` on another gateway waits for its answer: that gateway's own wait for
/// the agent, plus the broker's round trips.
const REMOTE_WAIT: std::time::Duration =
    crate::members::READY_TIMEOUT.saturating_add(std::time::Duration::from_secs(30));

pub(crate) struct Spawn;

impl FleetTool for Spawn {
    const NAME: &'static str = "fleet_spawn";
    const DESCRIPTION: &'static str = "Start a member from a profile (see fleet_profiles) in a new pane and wait until its agent is ready. Returns {target, paneId, terminalId, profile} and, with `task`, the first task's ticket. A profile with `worktree` starts the member in a git worktree of its own on a new branch. Fails clearly without leaving a half-registered member, pane, worktree or branch: profile not ready, pane closed, agent not ready in time; worktree_failed when the worktree cannot be made (not a git repository, an unknown base, git or a hook refusing; git's own words follow); too_many_members when the lead (you, or the member you are) has maxMembersPerLead members already; delegation_too_deep when you are a member at maxDelegationDepth of its delegation tree. `budget` / `treeBudget` ({tokens, costUsd, warnAt}) limit what the member (or the tree it heads) may spend on its model backend, within its profile's budgets.";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let me = fleet
            .config
            .current()
            .gateway
            .as_ref()
            .map(|g| g.name.to_string());
        let own_budget = budget("budget", args.budget.as_ref())?;
        let tree_budget = budget("treeBudget", args.tree_budget.as_ref())?;
        if let Some(gateway) = args.gateway.clone().filter(|g| Some(g) != me.as_ref()) {
            if own_budget.is_some() || tree_budget.is_some() {
                return Err(ToolError::new(
                    Code::InvalidArguments,
                    "`budget` and `treeBudget` apply where the member runs: a member on another gateway has its profile's budgets there",
                ));
            }
            return remote(fleet, caller, args, gateway).await;
        }
        if (own_budget.is_some() || tree_budget.is_some())
            && !served_through_fleetd(&fleet.config.current(), &args.profile)
        {
            return Err(ToolError::new(
                Code::InvalidArguments,
                format!(
                    "profile {} has no backend served through fleetd (throughFleetd), so fleetd sees none of its model requests: `budget` and `treeBudget` cannot apply",
                    args.profile
                ),
            ));
        }
        // Where a worktree profile branches from by default: the caller's pane directory.
        let origin = match &caller.pane {
            Some(p) => fleet.locator.cwd_of(p.shell_pid).await,
            None => None,
        };
        let spawned = fleet
            .spawner
            .spawn(SpawnRequest {
                profile: args.profile,
                name: args.name,
                cwd: args.cwd,
                task: args.task,
                lead: caller.lead(),
                by: member_of(caller),
                origin,
                budget: own_budget,
                tree_budget,
            })
            .await?;
        let value = json!({
            "target": spawned.target,
            "paneId": spawned.pane.to_string(),
            "terminalId": spawned.terminal,
            "profile": spawned.profile,
        });
        spawned_output(
            value,
            spawned.ticket,
            &spawned.target,
            &spawned.profile,
            &spawned.pane,
        )
    }
}

/// `fleet_spawn` on another gateway: asked there through the broker, answered with the member
/// as `name@gateway`.
async fn remote(
    fleet: &Fleet,
    caller: &Caller,
    args: Args,
    gateway: String,
) -> Result<ToolOutput, ToolError> {
    if args.cwd.is_some() {
        return Err(ToolError::new(
            Code::InvalidArguments,
            "`cwd` is a directory on this host: a member on another gateway starts in its profile's directory there",
        ));
    }
    let offline = super::gateway_known(fleet, &gateway)?;
    let (req, answer) = fleet
        .engine
        .spawn_remote(crate::engine::SpawnRemote {
            gateway: gateway.clone(),
            profile: args.profile,
            name: args.name,
            task: args.task,
            lead: caller.lead(),
            by: member_of(caller),
        })
        .await
        .map_err(super::gone)??;
    let spawned = tokio::select! {
        answer = tokio::time::timeout(REMOTE_WAIT, answer) => answer,
        () = caller.cancel.cancelled() => {
            return Err(ToolError::new(Code::Cancelled, format!("the request was abandoned; spawn request {req} on gateway {gateway} goes on, and its member's readiness will be a notice in its inbox")));
        }
    };
    let spawned = match spawned {
        Ok(Ok(outcome)) => outcome?,
        _ => {
            let mut value = json!({ "spawn": "requested", "gateway": gateway, "request": req });
            let mut summary = format!(
                "gateway {gateway} has not answered spawn request {req} yet; the member's readiness will arrive as a notice in its inbox"
            );
            if let Some(note) = offline {
                value["gatewayNote"] = json!(note);
                summary = format!("{summary}. {note}");
            }
            return output(value, summary);
        }
    };
    // Read your own writes: the new member is in this host's fleet_list at once.
    let interval = fleet
        .config
        .current()
        .gateway
        .as_ref()
        .map_or(10, |g| g.presence_interval_secs);
    fleet.peers.spawned(
        &gateway,
        crate::gateway::presence::PeerMember {
            name: spawned.target.member_name().to_owned(),
            profile: spawned.profile.clone(),
            status: if spawned.ticket.is_some() {
                "working"
            } else {
                "idle"
            }
            .to_owned(),
            pane: spawned
                .pane
                .strip_prefix(&format!("{gateway}/"))
                .unwrap_or(&spawned.pane)
                .to_owned(),
            open_tickets: usize::from(spawned.ticket.is_some()),
        },
        interval,
    );
    let value = json!({
        "target": spawned.target,
        "paneId": spawned.pane,
        "profile": spawned.profile,
        "gateway": gateway,
    });
    spawned_output(
        value,
        spawned.ticket,
        &spawned.target,
        &spawned.profile,
        &spawned.pane,
    )
}

/// The answer for a member spawned here or on another gateway: `value` with the first task's
/// ticket, when there is one, and the one-line summary.
fn spawned_output(
    mut value: Value,
    ticket: Option<Ticket>,
    target: &Target,
    profile: &str,
    pane: &dyn std::fmt::Display,
) -> Result<ToolOutput, ToolError> {
    if let Some(ticket) = ticket {
        value["ticket"] = json!(ticket);
    }
    output(value, format!("spawned {target} ({profile}) in {pane}"))
}

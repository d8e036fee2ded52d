//! The tool registry: every tool of SPEC §3, its JSON schema, and one dispatch path that checks
//! the caller's role, parses arguments into the tool's struct (bad input is a tool error naming
//! the problem, never a panic) and runs it. One file per tool below; none holds business logic.

mod ack;
mod answer;
mod approve;
mod ask;
mod list;
pub(crate) mod poll;
mod profiles;
mod reply;
pub(crate) mod send;
pub(crate) mod spawn;
pub(crate) mod status;
mod stop;

use fleetd_core::refusal::Code;
use std::future::Future;

use fleetd_core::Target;
use fleetd_core::access::ToolClass;
use rmcp::handler::server::common::schema_for_type;
use rmcp::model::Tool;
use rmcp::schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Caller, Fleet, ToolError, ToolOutput};
use crate::engine::EngineGone;

/// One MCP tool: its name, description, who may call it, its arguments and its call.
pub(crate) trait FleetTool {
    /// The tool's name (SPEC §3).
    const NAME: &'static str;
    /// What an agent reads to decide to call it.
    const DESCRIPTION: &'static str;
    /// Who may call it.
    const CLASS: ToolClass;
    /// Its arguments.
    type Args: DeserializeOwned + JsonSchema + Send + 'static;

    /// Who may make this call, from its raw arguments (before they are parsed, so a caller that
    /// may not call the tool learns nothing from a parse error): the tool's [`FleetTool::CLASS`]
    /// unless one of its forms is another class.
    fn class_of(_args: &Value) -> ToolClass {
        Self::CLASS
    }

    /// Runs the tool for an authorized caller.
    fn call(
        fleet: &Fleet,
        caller: &Caller,
        args: Self::Args,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;
}

fn definition<T: FleetTool>() -> Tool {
    Tool::new(T::NAME, T::DESCRIPTION, schema_for_type::<T::Args>())
}

/// Makes [`definitions`] and [`call`] from one list of the tools (`module::Tool`, in
/// `tools/list` order), so no tool can be listed and not served, or served and not listed.
macro_rules! tools {
    ($($module:ident::$tool:ident),* $(,)?) => {
        /// Every tool's definition, for `tools/list`.
        pub(crate) fn definitions() -> Vec<Tool> {
            vec![$(definition::<$module::$tool>()),*]
        }

        /// Runs tool `name` for `caller` with raw `args`.
        pub(crate) async fn call(
            fleet: &Fleet,
            caller: &Caller,
            name: &str,
            args: Value,
        ) -> Result<ToolOutput, ToolError> {
            match name {
                $($module::$tool::NAME => run::<$module::$tool>(fleet, caller, args).await,)*
                other => counted(
                    "unknown",
                    Err(ToolError::new(
                        Code::UnknownTool,
                        format!(
                            "there is no tool {other:?}: fleetd's tools all start with fleet_ (see tools/list)"
                        ),
                    )),
                ),
            }
        }
    };
}

tools!(
    profiles::Profiles,
    spawn::Spawn,
    list::List,
    status::Status,
    send::Send,
    poll::Poll,
    ack::Ack,
    answer::Answer,
    stop::Stop,
    approve::Approve,
    reply::Reply,
    ask::Ask,
);

/// Counts a tool call by tool and outcome (`ok` or the refusal code) and passes it through.
fn counted(
    tool: &'static str,
    outcome: Result<ToolOutput, ToolError>,
) -> Result<ToolOutput, ToolError> {
    let code = match &outcome {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    };
    metrics::counter!("fleetd_tool_calls_total", "tool" => tool, "outcome" => code).increment(1);
    outcome
}

async fn run<T: FleetTool>(
    fleet: &Fleet,
    caller: &Caller,
    args: Value,
) -> Result<ToolOutput, ToolError> {
    let outcome = async {
        caller
            .authorize(T::class_of(&args), T::NAME)
            .map_err(|e| caller.explain(e))?;
        // A member's share of the calls under way (attack C2), held until this call ends.
        let _slot = match &caller.role {
            fleetd_core::access::Role::Member { target, .. } => {
                let cap = fleet.config.current().connections.per_member;
                let cap = usize::try_from(cap).unwrap_or(usize::MAX);
                Some(fleet.calls.take(target, cap).ok_or_else(|| {
                    ToolError::new(Code::TooManyCalls,
                        format!(
                            "member {target} has {cap} calls under way already, the most one member may (connections.perMember = {cap}): wait for one to end (a fleet_ask or a waiting fleet_send ends when it is answered or times out)"
                        ),
                    )
                })?)
            }
            _ => None,
        };
        // Its call proves the replies its earlier waits returned reached it. A
        // `fleet_ack` settles them after acknowledging, so the ids it names answer acked=true.
        let holder = caller.holder();
        let settle_after = T::NAME == ack::Ack::NAME;
        if let Some(holder) = holder.as_deref().filter(|_| !settle_after) {
            fleet.inbox.settle_handed(holder).await;
        }
        let args: T::Args = serde_json::from_value(args).map_err(|e| {
            ToolError::new(Code::InvalidArguments,
                format!(
                    "{} got arguments it cannot use: {e}; see its input schema in tools/list",
                    T::NAME
                ),
            )
        })?;
        let out = T::call(fleet, caller, args).await;
        if let Some(holder) = holder.as_deref().filter(|_| settle_after) {
            fleet.inbox.settle_handed(holder).await;
        }
        out
    }
    .await;
    counted(T::NAME, outcome)
}

/// Builds a successful output.
pub(crate) fn output(value: Value, summary: impl Into<String>) -> Result<ToolOutput, ToolError> {
    Ok(ToolOutput {
        value,
        summary: summary.into(),
    })
}

/// Parses a member name from a tool argument.
pub(crate) fn target(name: &str) -> Result<Target, ToolError> {
    Target::new(name).map_err(|e| ToolError::new(Code::InvalidTarget, e.to_string()))
}

/// A delegating member may act on `target` with `tool` only within its subtree (the members
/// whose chain of delegating leads includes it: `not_your_member` otherwise); a lead and the
/// operator on any member.
pub(crate) async fn within_reach(
    fleet: &Fleet,
    caller: &Caller,
    target: &Target,
    tool: &'static str,
) -> Result<(), ToolError> {
    match &caller.role {
        fleetd_core::access::Role::Member { target: by, .. } => fleet
            .engine
            .reach(by.clone(), target.clone(), tool)
            .await
            .map_err(gone)?,
        _ => Ok(()),
    }
}

/// Whether gateway `gw` (a target's, or a spawn's) is one this fleetd knows: itself, one of
/// `gateway.peers`, or one heard from since it started (a presence broadcast, a spawn's answer).
/// An unknown one (a typo such as `zed`) is refused, naming the known ones; a known one that is
/// not heard from lately gets a note to pass on: the request waits on the broker for it.
pub(crate) fn gateway_known(fleet: &Fleet, gw: &str) -> Result<Option<String>, ToolError> {
    let config = fleet.config.current();
    let Some(me) = config.gateway.as_ref() else {
        return Ok(None); // no gateway here: the engine refuses it as `no_gateway`
    };
    if me.name.as_str() == gw {
        return Ok(None);
    }
    match fleet.peers.heard_from(gw) {
        Some((false, _)) => Ok(None),
        Some((true, ago)) => Ok(Some(format!(
            "gateway {gw} has not been heard from for {ago} s: the request waits on the broker and goes through once it is back"
        ))),
        None if me.peers.contains_key(gw) => Ok(Some(format!(
            "gateway {gw} has not been heard from since this fleetd started: the request waits on the broker and goes through once it is back"
        ))),
        None => {
            let mut known: Vec<String> = me.peers.keys().cloned().collect();
            known.extend(fleet.peers.heard());
            known.sort();
            known.dedup();
            let known = if known.is_empty() {
                "none yet".to_owned()
            } else {
                known.join(", ")
            };
            Err(ToolError::new(
                Code::UnknownGateway,
                format!(
                    "no gateway named {gw} is known here (known: {known}; this one is {}): check the name. A gateway is known from `gateway.peers` or once its first presence broadcast arrives, within {} s of its start",
                    me.name, me.presence_interval_secs
                ),
            ))
        }
    }
}

/// The member the caller is, for a tool (`tool`) that is for members only.
pub(crate) fn calling_member<'a>(caller: &'a Caller, tool: &str) -> Result<&'a Target, ToolError> {
    match &caller.role {
        fleetd_core::access::Role::Member { target, .. } => Ok(target),
        _ => Err(ToolError::new(
            Code::NotAMember,
            format!("{tool} is for members"),
        )),
    }
}

/// The member the caller is, when it is one.
pub(crate) fn member_of(caller: &Caller) -> Option<Target> {
    match &caller.role {
        fleetd_core::access::Role::Member { target, .. } => Some(target.clone()),
        _ => None,
    }
}

/// The largest task, reply, question or answer the inbox takes (`inbox.maxMessageBytes`), as a
/// length to compare a text's with (saturated where `usize` is narrower than the setting).
pub(crate) fn max_message_bytes(fleet: &Fleet) -> usize {
    usize::try_from(fleet.config.current().inbox.max_message_bytes).unwrap_or(usize::MAX)
}

/// The engine stopped under a call: the daemon is shutting down.
pub(crate) fn gone(e: EngineGone) -> ToolError {
    e.into()
}

/// A store failure, as a tool error.
pub(crate) fn store_error(e: &crate::store::StoreError) -> ToolError {
    ToolError::new(
        Code::StoreUnavailable,
        format!("fleetd failed to {e}; retry shortly"),
    )
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_reach;

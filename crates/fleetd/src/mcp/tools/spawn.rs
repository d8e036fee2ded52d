//! `fleet_spawn`: start a member from a profile in its own pane, with the backend's credentials
//! in its environment only, and wait until its agent is ready.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetd_core::access::ToolClass;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, output};
use crate::config::{Config, Profile};
use crate::engine::NewMember;
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};
use crate::mux::{Launch, OpenPane, Placement};
use crate::secrets::Secrets;

/// How long a spawned agent has to show up ready (status at rest and its MCP session seen).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How often readiness is checked while waiting.
const READY_POLL: Duration = Duration::from_millis(100);

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

fn env_lookup(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// The first secret `profile` needs that does not resolve, if any (names only).
pub(crate) fn missing_secret(config: &Config, profile: &Profile) -> Option<String> {
    let backend = config.backends.get(profile.backend.as_deref()?)?;
    let name = backend.auth_token_secret.as_deref()?;
    let secrets = Secrets::new(&config.secrets, &env_lookup);
    secrets.resolve(name).err().map(|e| e.to_string())
}

/// Logs, per profile, which secret names it needs and whether each resolved — names only, never
/// a value (SPEC §7). Run at start and after each applied reload.
pub(crate) fn log_secret_names(config: &Config) {
    let secrets = Secrets::new(&config.secrets, &env_lookup);
    for (name, profile) in &config.profiles {
        let needed = profile
            .backend
            .as_deref()
            .and_then(|b| config.backends.get(b))
            .and_then(|b| b.auth_token_secret.as_deref());
        match needed {
            Some(secret) => match secrets.resolve(secret) {
                Ok(_) => tracing::info!(profile = %name, secret, "profile secret resolved"),
                Err(e) => {
                    tracing::warn!(profile = %name, secret, reason = %e, "profile secret does not resolve: fleet_spawn of this profile will be refused");
                }
            },
            None => tracing::info!(profile = %name, "profile needs no secret"),
        }
    }
}

/// The environment variables a backend is handed in, by agent kind.
fn backend_vars(agent: &str) -> (&'static str, &'static str) {
    match agent {
        "claude" => ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN"),
        "codex" => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        _ => ("FLEETD_BACKEND_URL", "FLEETD_BACKEND_TOKEN"),
    }
}

/// The member's environment: profile env, backend URL and token (members only), its name and
/// fleetd's URL. Backends and secrets come from `config`, the snapshot the call started with, so a
/// profile added by a reload resolves its secrets from the same reload.
fn member_env(
    fleet: &Fleet,
    config: &Config,
    profile: &Profile,
    target: &str,
) -> Result<BTreeMap<String, String>, ToolError> {
    let mut env = profile.env.clone();
    if let Some(name) = &profile.backend {
        let backend = config.backends.get(name).ok_or_else(|| {
            ToolError::new(
                "unknown_backend",
                format!("the profile names backend {name}, which is not configured"),
            )
        })?;
        let (url_var, token_var) = backend_vars(&profile.agent);
        env.insert(url_var.to_owned(), backend.base_url.clone());
        if let Some(secret) = &backend.auth_token_secret {
            let value = Secrets::new(&config.secrets, &env_lookup)
                .resolve(secret)
                .map_err(|e| ToolError::new("profile_not_ready", e.to_string()))?;
            // Redacted from whatever this member sends towards a lead, even after a reload.
            fleet.redactor.remember(secret, &value);
            env.insert(token_var.to_owned(), value.expose().to_owned());
        }
    }
    if let Some(model) = &profile.model {
        env.insert("FLEETD_MODEL".to_owned(), model.clone());
        if profile.agent == "claude" {
            env.insert("ANTHROPIC_MODEL".to_owned(), model.clone());
        }
    }
    env.insert("FLEETD_TARGET".to_owned(), target.to_owned());
    env.insert("FLEETD_URL".to_owned(), fleet.url.clone());
    Ok(env)
}

impl FleetTool for Spawn {
    const NAME: &'static str = "fleet_spawn";
    const DESCRIPTION: &'static str = "Start a member from a profile (see fleet_profiles) in a new pane and wait until its agent is ready. Returns {target, paneId, terminalId, profile} and, with `task`, the first task's ticket. Fails clearly (profile not ready, pane closed, agent not ready in time) without leaving a half-registered member.";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        // One snapshot for the whole call: a reload meanwhile does not mix two configurations.
        let config = fleet.config.current();
        let Some(profile) = config.profiles.get(&args.profile) else {
            return Err(ToolError::new(
                "unknown_profile",
                format!("no profile {:?}: fleet_profiles lists them", args.profile),
            ));
        };
        let lead = caller.lead();
        if let Some(lead) = &lead {
            fleet.engine.lead_seen(lead.clone()).await.map_err(gone)?;
        }
        let target = fleet.engine.reserve(args.name).await.map_err(gone)??;
        let opened = open(
            fleet,
            &config,
            Member {
                profile,
                profile_name: &args.profile,
                target: &target,
            },
            args.cwd,
        )
        .await;
        let pane = match opened {
            Ok(pane) => pane,
            Err(e) => {
                let _ = fleet.engine.unreserve(target).await;
                return Err(e);
            }
        };
        fleet
            .engine
            .add_member(NewMember {
                target: target.clone(),
                profile: args.profile.clone(),
                agent: profile.agent.clone(),
                pane: pane.id.clone(),
                terminal: pane.info.terminal.clone(),
                allow_delegation: profile.allow_delegation,
                idle_timeout_secs: profile.idle_timeout_secs,
                backend: profile.backend.clone(),
                lead: lead.clone(),
            })
            .await
            .map_err(gone)?;
        fleet.locator.invalidate();
        if let Err(e) = wait_ready(fleet, &target).await {
            if fleet
                .engine
                .release(target.clone(), "spawn_failed".to_owned())
                .await
                .ok()
                .flatten()
                .is_some()
            {
                let _ = fleet.mux.close_pane(&pane.id).await;
            }
            return Err(e);
        }
        let mut value = json!({
            "target": target,
            "paneId": pane.id.to_string(),
            "terminalId": pane.info.terminal,
            "profile": args.profile,
        });
        if let Some(task) = args.task {
            let ticket = fleet
                .engine
                .submit(lead, target.clone(), task)
                .await
                .map_err(gone)??;
            value["ticket"] = json!(ticket);
        }
        output(
            value,
            format!("spawned {target} ({}) in {}", args.profile, pane.id),
        )
    }
}

/// The member being opened.
struct Member<'a> {
    profile: &'a Profile,
    profile_name: &'a str,
    target: &'a fleetd_core::Target,
}

async fn open(
    fleet: &Fleet,
    config: &Config,
    member: Member<'_>,
    cwd: Option<String>,
) -> Result<crate::mux::RoutedPane, ToolError> {
    let Member {
        profile,
        profile_name,
        target,
    } = member;
    let env = member_env(fleet, config, profile, target.as_str())?;
    // A known agent kind without its own command is started the multiplexer's way (herdr's
    // `agent.start`); the multiplexer decides how.
    let launch = match &profile.command {
        Some(command) => Launch::Argv(
            std::iter::once(command.clone())
                .chain(profile.args.iter().cloned())
                .collect(),
        ),
        None => Launch::Agent {
            name: target.to_string(),
            kind: profile.agent.clone(),
            args: profile.args.clone(),
        },
    };
    let request = OpenPane {
        placement: Placement::NewTab {
            workspace: config.members_workspace.clone(),
        },
        label: Some(target.to_string()),
        cwd: cwd.map(Into::into).or_else(|| profile.cwd.clone()),
        env,
        launch,
    };
    tracing::info!(%target, profile = profile_name, "spawning member");
    fleet.mux.open_member_pane(request).await.map_err(|e| {
        ToolError::new(
            "spawn_failed",
            format!("the multiplexer could not open a pane for {target}: {e}"),
        )
    })
}

/// Waits until `target` is at rest with its MCP presence seen; fails if it leaves or times out.
async fn wait_ready(fleet: &Fleet, target: &fleetd_core::Target) -> Result<(), ToolError> {
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let members = fleet.engine.list().await.map_err(gone)?;
        let Some(member) = members.iter().find(|m| m.target == *target) else {
            return Err(ToolError::new(
                "spawn_failed",
                format!(
                    "{target}'s pane closed before its agent was ready: check the profile's command"
                ),
            ));
        };
        if member.connected && matches!(member.status.as_str(), "idle" | "done") {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ToolError::new(
                "agent_not_ready",
                format!(
                    "{target}'s agent was not ready within {}s (status {}, MCP {}): is fleetd in its MCP config?",
                    READY_TIMEOUT.as_secs(),
                    member.status,
                    if member.connected {
                        "connected"
                    } else {
                        "not connected"
                    }
                ),
            ));
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

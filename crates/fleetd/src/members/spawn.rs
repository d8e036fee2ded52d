//! The spawn saga: reserve a name (engine) → open a pane with the member's environment (mux) →
//! register the member (engine) → wait for the engine's readiness one-shot → hand it its first
//! task. It runs on a task of its own, so the request that asked for it may go away at any step
//! without leaving anything half-done; an [`Undo`] guard gives back whatever the saga holds —
//! the name, the pane, the member — when it fails, and when it is cancelled. It must not know
//! which multiplexer backend runs the pane (the `Launch` says what to run; `mux` decides how).

use std::time::Duration;

use fleetd_core::access::Refusal;
use fleetd_core::{QualifiedPaneId, Target, TerminalId, Ticket};
use tokio::task::JoinHandle;

use super::env::MemberEnv;
use crate::config::{Config, Live, Profile};
use crate::engine::{EngineGone, EngineHandle, LeadRef, NewMember, Readiness};
use crate::locate::Locator;
use crate::mux::{Launch, MuxRouter, OpenPane, Placement};
use crate::secrets::Redactor;

/// How long a spawned agent has to show up ready (status at rest and its MCP session seen).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What `fleet_spawn` asks for.
#[derive(Debug, Clone)]
pub struct SpawnRequest {
    /// The profile to start.
    pub profile: String,
    /// The member's name; `None` takes a free readable one.
    pub name: Option<String>,
    /// Its working directory; `None` takes the profile's.
    pub cwd: Option<String>,
    /// A first task, sent once it is ready.
    pub task: Option<String>,
    /// The lead that asked (its delegation binding), when the caller is one in a pane.
    pub lead: Option<LeadRef>,
}

/// A member that was spawned and is ready.
#[derive(Debug, Clone)]
pub struct Spawned {
    /// Its name.
    pub target: Target,
    /// Its profile.
    pub profile: String,
    /// Its pane.
    pub pane: QualifiedPaneId,
    /// The pane's incarnation.
    pub terminal: TerminalId,
    /// The first task's ticket, when the request carried one.
    pub ticket: Option<Ticket>,
}

/// The spawn service. Cheap to clone; holds handles only.
#[derive(Debug, Clone)]
pub struct Spawner {
    /// The engine (names, members, readiness, the first task).
    pub engine: EngineHandle,
    /// The multiplexers (member panes open on the member daemon).
    pub mux: MuxRouter,
    /// Told that a pane now holds a member, so the member's first call is placed at once.
    pub locator: Locator,
    /// The running configuration; each spawn keeps the snapshot it started with.
    pub config: Live,
    /// Learns each backend token a member is given.
    pub redactor: Redactor,
    /// fleetd's own URL as members reach it (`FLEETD_URL`).
    pub url: String,
}

impl Spawner {
    /// Spawns a member and waits for the outcome. The saga runs on its own task: if this future
    /// is dropped, the spawn still finishes (or is undone) without it.
    pub async fn spawn(&self, request: SpawnRequest) -> Result<Spawned, Refusal> {
        match self.start(request).await {
            Ok(outcome) => outcome,
            Err(e) => Err(Refusal::new(
                "spawn_failed",
                format!(
                    "the spawn stopped before it finished ({e}); what it had reserved or opened is given back"
                ),
            )),
        }
    }

    /// Starts the saga on its own task and returns its handle.
    pub fn start(&self, request: SpawnRequest) -> JoinHandle<Result<Spawned, Refusal>> {
        tokio::spawn(self.clone().run(request))
    }

    async fn run(self, mut request: SpawnRequest) -> Result<Spawned, Refusal> {
        // One snapshot for the whole saga: a reload meanwhile does not mix two configurations.
        let config = self.config.current();
        let Some(profile) = config.profiles.get(&request.profile) else {
            return Err(Refusal::new(
                "unknown_profile",
                format!(
                    "no profile {:?}: fleet_profiles lists them",
                    request.profile
                ),
            ));
        };
        if let Some(lead) = &request.lead {
            self.engine.lead_seen(lead.clone()).await?;
        }
        let target = self.engine.reserve(request.name.take()).await??;
        let mut undo = Undo {
            engine: self.engine.clone(),
            mux: self.mux.clone(),
            target: target.clone(),
            pane: None,
            registered: false,
            armed: true,
        };
        let saga = Saga {
            spawner: &self,
            config: &config,
            profile,
            target,
            request,
        };
        match saga.steps(&mut undo).await {
            Ok(spawned) => {
                undo.armed = false;
                Ok(spawned)
            }
            Err(e) => {
                tracing::info!(target = %undo.target, code = e.code, "spawn failed; undoing it");
                // Undone before the answer, so a retry under the same name finds it free.
                undo.run().await;
                Err(e)
            }
        }
    }
}

/// One spawn in progress.
struct Saga<'a> {
    spawner: &'a Spawner,
    config: &'a Config,
    profile: &'a Profile,
    target: Target,
    request: SpawnRequest,
}

impl Saga<'_> {
    /// Every step after the name is reserved, telling `undo` what it holds as it goes.
    async fn steps(self, undo: &mut Undo) -> Result<Spawned, Refusal> {
        let Saga {
            spawner,
            config,
            profile,
            target,
            request,
        } = self;
        let env = MemberEnv {
            config,
            profile,
            target: &target,
            redactor: &spawner.redactor,
            url: &spawner.url,
        }
        .build()?;
        let open = OpenPane {
            placement: Placement::NewTab {
                workspace: config.members_workspace.clone(),
            },
            label: Some(target.to_string()),
            cwd: request.cwd.map(Into::into).or_else(|| profile.cwd.clone()),
            env,
            launch: launch(profile, &target),
        };
        tracing::info!(%target, profile = %request.profile, "spawning member");
        let pane = spawner.mux.open_member_pane(open).await.map_err(|e| {
            Refusal::new(
                "spawn_failed",
                format!("the multiplexer could not open a pane for {target}: {e}"),
            )
        })?;
        undo.pane = Some(pane.id.clone());
        spawner
            .engine
            .add_member(NewMember {
                target: target.clone(),
                profile: request.profile.clone(),
                agent: profile.agent.clone(),
                pane: pane.id.clone(),
                terminal: pane.info.terminal.clone(),
                allow_delegation: profile.allow_delegation,
                idle_timeout_secs: profile.idle_timeout_secs,
                backend: profile.backend.clone(),
                lead: request.lead.clone(),
            })
            .await?;
        undo.registered = true;
        spawner.locator.invalidate();
        spawner.wait_ready(&target).await?;
        let ticket = match request.task {
            Some(task) => Some(
                spawner
                    .engine
                    .submit(request.lead, target.clone(), task)
                    .await??,
            ),
            None => None,
        };
        Ok(Spawned {
            target,
            profile: request.profile,
            pane: pane.id,
            terminal: pane.info.terminal,
            ticket,
        })
    }
}

/// What the pane runs: the profile's own command, or its agent kind started the multiplexer's
/// way.
fn launch(profile: &Profile, target: &Target) -> Launch {
    match &profile.command {
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
    }
}

impl Spawner {
    /// Waits for the engine to say `target` is ready; fails when it goes or the time is up.
    async fn wait_ready(&self, target: &Target) -> Result<(), Refusal> {
        let ready = self.engine.when_ready(target.clone()).await?;
        match tokio::time::timeout(READY_TIMEOUT, ready).await {
            Ok(Ok(Readiness::Ready)) => Ok(()),
            Ok(Ok(Readiness::Gone)) => Err(Refusal::new(
                "spawn_failed",
                format!(
                    "{target}'s pane closed before its agent was ready: check the profile's command"
                ),
            )),
            Ok(Err(_)) => Err(EngineGone.into()),
            Err(_) => {
                let members = self.engine.list().await?;
                let member = members.iter().find(|m| m.target == *target);
                Err(Refusal::new(
                    "agent_not_ready",
                    format!(
                        "{target}'s agent was not ready within {}s (status {}, MCP {}): is fleetd in its MCP config?",
                        READY_TIMEOUT.as_secs(),
                        member.map_or("gone", |m| m.status.as_str()),
                        if member.is_some_and(|m| m.connected) {
                            "connected"
                        } else {
                            "not connected"
                        }
                    ),
                ))
            }
        }
    }
}

/// What a saga holds and must give back unless it succeeds: its reserved name, then its pane,
/// then its registered member. A failed saga runs it before answering; dropped while armed (the
/// saga's task was cancelled or panicked), it does the same on a task of its own.
#[derive(Debug)]
struct Undo {
    engine: EngineHandle,
    mux: MuxRouter,
    target: Target,
    pane: Option<QualifiedPaneId>,
    registered: bool,
    armed: bool,
}

impl Undo {
    /// Gives everything back now.
    async fn run(&mut self) {
        self.armed = false;
        undo(
            self.engine.clone(),
            self.mux.clone(),
            self.target.clone(),
            self.pane.clone(),
            self.registered,
        )
        .await;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        tracing::warn!(target = %self.target, "a spawn was cancelled midway; undoing it");
        let work = undo(
            self.engine.clone(),
            self.mux.clone(),
            self.target.clone(),
            self.pane.take(),
            self.registered,
        );
        // Without a runtime the daemon is stopping, and its engine with it: nothing is left to
        // give anything back to.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(work);
        }
    }
}

/// Gives back a spawn's member (through the one release path, which fails its tickets and
/// forgets its bindings), or else its reserved name, and closes its pane.
async fn undo(
    engine: EngineHandle,
    mux: MuxRouter,
    target: Target,
    pane: Option<QualifiedPaneId>,
    registered: bool,
) {
    let pane = if registered {
        // `None`: released already (its pane closed, or it was stopped): nothing left to close.
        engine
            .release(target, "spawn_failed".to_owned())
            .await
            .ok()
            .flatten()
    } else {
        let _ = engine.unreserve(target).await;
        pane
    };
    if let Some(pane) = pane {
        match mux.close_pane(&pane).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => tracing::warn!(%pane, error = %e, "cannot close a failed spawn's pane"),
        }
    }
}

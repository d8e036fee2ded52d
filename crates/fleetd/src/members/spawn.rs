//! The spawn saga: reserve a name (engine) → open a pane with the member's environment (mux) →
//! register the member (engine) → wait for the engine's readiness one-shot → hand it its first
//! task. It runs on a task of its own, so the request that asked for it may go away at any step
//! without leaving anything half-done; an [`Undo`] guard gives back whatever the saga holds —
//! the name, the pane, the member — when it fails, and when it is cancelled. It must not know
//! which multiplexer backend runs the pane (the `Launch` says what to run; `mux` decides how).

use fleetd_core::refusal::Code;
use std::time::Duration;

use fleetd_core::access::Refusal;
use fleetd_core::{QualifiedPaneId, Target, TerminalId, Ticket};
use tokio::task::JoinHandle;

use super::env::MemberEnv;
use super::kinds::MemberArgs;
use crate::config::{Config, Live, Profile};
use crate::engine::{Delegator, EngineGone, EngineHandle, LeadRef, NewMember, Readiness};
use crate::locate::Locator;
use crate::mux::{Launch, MuxRouter, OpenPane, Placement};
use crate::secrets::Redactor;

/// How long a spawned agent has to show up ready (status at rest and its MCP session seen).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What `fleet_spawn` asks for. The default asks for nothing beyond its profile: no name, no
/// first task, no caller to bind it to, the profile's own directory and budgets.
#[derive(Debug, Clone, Default)]
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
    /// The delegating member that asked, when the caller is one: it becomes the new member's
    /// lead (within `maxDelegationDepth` and `maxMembersPerLead`).
    pub by: Option<Target>,
    /// The caller's pane directory (its pane process's working directory): where a worktree
    /// profile branches from when neither its `repo` nor `cwd` says.
    pub origin: Option<std::path::PathBuf>,
    /// Its model budget, held within the profile's (`BudgetSpec::within`).
    pub budget: Option<crate::config::BudgetSpec>,
    /// The model budget of the tree it will head, held within the profile's.
    pub tree_budget: Option<crate::config::BudgetSpec>,
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
                Code::SpawnFailed,
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
                Code::UnknownProfile,
                format!(
                    "no profile {:?}: fleet_profiles lists them",
                    request.profile
                ),
            ));
        };
        if let Some(lead) = &request.lead {
            self.engine.lead_seen(lead.clone()).await?;
        }
        let delegator = match (&request.by, &request.lead) {
            (Some(member), _) => Delegator::Member(member.clone()),
            (None, Some(lead)) => Delegator::Lead(lead.clone()),
            (None, None) => Delegator::Operator,
        };
        let (target, lead) = self
            .engine
            .reserve(request.name.take(), delegator)
            .await??;
        request.lead = lead;
        let mut undo = Undo {
            engine: self.engine.clone(),
            mux: self.mux.clone(),
            held: Held {
                target: target.clone(),
                pane: None,
                registered: false,
                worktree: None,
            },
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
                tracing::info!(target = %undo.held.target, code = e.code.as_str(), "spawn failed; undoing it");
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
        let super::env::Built { mut env, key_hash } = MemberEnv {
            config,
            profile,
            target: &target,
            redactor: &spawner.redactor,
            url: &spawner.url,
        }
        .build()?;
        let worktree = match plan_worktree(config, profile, &request, &target).await? {
            Some(info) => {
                // Durable before git makes anything: a kill -9 from here until the member is
                // registered leaves a record the next start settles.
                spawner
                    .engine
                    .worktree_making(target.clone(), info.clone(), request.lead.clone())
                    .await??;
                // (A failed `make` takes back what git left itself.)
                undo.held.worktree = Some(HeldWorktree::Making(info.clone()));
                let made = crate::worktree::make(&info).await;
                undo.held.worktree = made.is_ok().then(|| HeldWorktree::Made(info.clone()));
                made.map_err(|e| worktree_refusal(&target, &e))?;
                Some(info)
            }
            None => None,
        };
        let mut cwd = match &worktree {
            Some(w) => Some(w.path.clone()),
            None => request.cwd.map(Into::into).or_else(|| profile.cwd.clone()),
        };
        let backend_url = profile
            .backend
            .as_deref()
            .and_then(|b| crate::model_gateway::member_url(config, b, &spawner.url));
        let kind_args = MemberArgs {
            agent: &profile.agent,
            backend_url: backend_url.as_deref(),
            model: profile.model.as_deref(),
            fleet_url: &spawner.url,
            cwd: cwd.as_deref(),
            fleet_over_stdio: codex_fleet_over_stdio(profile, &config.codex_home).await,
        }
        .build();
        let mut launch = launch(profile, &target, kind_args);
        let _home = match &profile.sandbox {
            Some(spec) => {
                let (boxed, claim) = spawner
                    .boxed(
                        config,
                        &request.profile,
                        spec,
                        &target,
                        &cwd,
                        worktree.is_some(),
                        &env,
                        &launch,
                    )
                    .await?;
                launch = boxed;
                Some(claim)
            }
            None => None,
        };
        let (user, user_claim) = match &profile.run_as {
            Some(name) => {
                let argv = launch.argv();
                let (argv, claim, user) = crate::sandbox::as_user(
                    &spawner.engine,
                    &request.profile,
                    name,
                    &mut env,
                    &mut cwd,
                    &argv,
                )
                .await
                .map_err(|e| Refusal::new(Code::SandboxUnavailable, format!("{target}: {e}")))?;
                launch = Launch::Argv(argv);
                (Some(user), Some(claim))
            }
            None => (None, None),
        };
        let open = OpenPane {
            placement: Placement::NewTab {
                workspace: config.members_workspace.clone(),
            },
            label: Some(target.to_string()),
            launch,
            cwd,
            env,
        };
        tracing::info!(%target, profile = %request.profile, "spawning member");
        let pane = spawner.mux.open_member_pane(open).await.map_err(|e| {
            Refusal::new(
                Code::SpawnFailed,
                format!("the multiplexer could not open a pane for {target}: {e}"),
            )
        })?;
        undo.held.pane = Some(pane.id.clone());
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
                worktree: worktree.clone(),
                model: key_hash
                    .zip(profile.backend.clone())
                    .map(|(key_hash, backend)| crate::engine::MemberModel {
                        backend,
                        key_hash,
                        // A budget given at spawn tightens the profile's, never loosens it.
                        budget: request
                            .budget
                            .map_or(profile.budget, |b| Some(b.within(profile.budget))),
                        tree_budget: request
                            .tree_budget
                            .map_or(profile.tree_budget, |b| Some(b.within(profile.tree_budget))),
                    }),
                user,
            })
            .await?;
        undo.held.registered = true;
        // Its agent spoke MCP as its user before it was registered, and may not speak again.
        if user_claim.is_some_and(|c| c.seen()) {
            spawner.engine.presence(target.clone()).await?;
        }
        spawner.locator.invalidate();
        spawner.wait_ready(&target).await?;
        let ticket = match request.task {
            Some(task) => Some(match request.by {
                // Sent by the member, so it may poll the ticket (its lead is bound already).
                Some(by) => {
                    spawner
                        .engine
                        .submit_for_member(by, target.clone(), task)
                        .await??
                }
                None => {
                    spawner
                        .engine
                        .submit(request.lead, target.clone(), task)
                        .await??
                }
            }),
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

/// The member's own git worktree as planned (nothing made yet), when its profile gives it one:
/// branched from the profile's `repo`, else the spawn's `cwd`, else the caller's pane directory
/// (then the profile's `cwd`).
async fn plan_worktree(
    config: &Config,
    profile: &Profile,
    request: &SpawnRequest,
    target: &Target,
) -> Result<Option<crate::worktree::WorktreeInfo>, Refusal> {
    let Some(w) = &profile.worktree else {
        return Ok(None);
    };
    let from = w
        .repo
        .clone()
        .or_else(|| request.cwd.clone().map(Into::into))
        .or_else(|| request.origin.clone())
        .or_else(|| profile.cwd.clone())
        .ok_or_else(|| {
            Refusal::new(Code::WorktreeFailed,
                format!(
                    "profile {} gives each member a git worktree, but there is no repository to branch from (the caller is in no pane): set profiles.{}.worktree.repo, or pass `cwd`",
                    request.profile, request.profile
                ),
            )
        })?;
    let root = config.state_dir.join("worktrees");
    crate::worktree::plan(&crate::worktree::WorktreeRequest {
        from: &from,
        branch_prefix: &w.branch_prefix,
        name: target.as_str(),
        base: w.base.as_deref(),
        root: &root,
    })
    .await
    .map(Some)
    .map_err(|e| worktree_refusal(target, &e))
}

/// A worktree that could not be planned or made.
fn worktree_refusal(target: &Target, e: &str) -> Refusal {
    Refusal::new(Code::WorktreeFailed, format!("{target}'s worktree: {e}"))
}

/// What the pane runs: the profile's own command, or its agent kind started the multiplexer's
/// way with `kind_args` (what fleetd knows the kind needs, `kinds`) before the profile's args.
fn launch(profile: &Profile, target: &Target, kind_args: Vec<String>) -> Launch {
    match &profile.command {
        Some(command) => Launch::Argv(
            std::iter::once(command.clone())
                .chain(profile.args.iter().cloned())
                .collect(),
        ),
        None => Launch::Agent {
            name: target.to_string(),
            kind: profile.agent.clone(),
            args: kind_args
                .into_iter()
                .chain(profile.args.iter().cloned())
                .collect(),
        },
    }
}

impl Spawner {
    /// `launch` boxed as the profile's `spec` says (SPEC §19), and the hold on the member's home
    /// until it is registered; a sandbox this machine cannot give fails the spawn.
    #[expect(
        clippy::too_many_arguments,
        reason = "one spawn's facts, each from another step"
    )]
    async fn boxed(
        &self,
        config: &Config,
        profile: &str,
        spec: &crate::config::Sandbox,
        target: &Target,
        cwd: &Option<std::path::PathBuf>,
        worktree: bool,
        env: &std::collections::BTreeMap<String, String>,
        launch: &Launch,
    ) -> Result<(Launch, crate::sandbox::Claim), Refusal> {
        let claim = crate::sandbox::claim(&config.state_dir, target);
        let request = crate::sandbox::Request {
            profile,
            spec,
            state_dir: &config.state_dir,
            target,
            workdir: cwd.as_deref(),
            worktree,
            env,
            fleet_addr: self
                .url
                .strip_prefix("http://")
                .and_then(|a| a.parse().ok()),
        };
        let argv = crate::sandbox::boxed(&request, &launch.argv())
            .await
            .map_err(|e| Refusal::new(Code::SandboxUnavailable, format!("{target}: {e}")))?;
        Ok((Launch::Argv(argv), claim))
    }

    /// Waits for the engine to say `target` is ready; fails when it goes or the time is up.
    async fn wait_ready(&self, target: &Target) -> Result<(), Refusal> {
        let ready = self.engine.when_ready(target.clone()).await?;
        match tokio::time::timeout(READY_TIMEOUT, ready).await {
            Ok(Ok(Readiness::Ready)) => Ok(()),
            Ok(Ok(Readiness::Gone)) => Err(Refusal::new(
                Code::SpawnFailed,
                format!(
                    "{target}'s pane closed before its agent was ready: check the profile's command"
                ),
            )),
            Ok(Err(_)) => Err(EngineGone.into()),
            Err(_) => {
                let members = self.engine.list().await?;
                let member = members.iter().find(|m| m.target == *target);
                Err(Refusal::new(
                    Code::AgentNotReady,
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

/// What a saga holds and must give back unless it succeeds: its reserved name, then its
/// worktree, its pane, then its registered member. A failed saga runs it before answering;
/// dropped while armed (the saga's task was cancelled or panicked), it does the same on a task
/// of its own.
#[derive(Debug)]
struct Undo {
    engine: EngineHandle,
    mux: MuxRouter,
    held: Held,
    armed: bool,
}

/// What a saga has taken so far.
#[derive(Debug, Clone)]
struct Held {
    target: Target,
    pane: Option<QualifiedPaneId>,
    registered: bool,
    /// Its worktree (a registered member's is settled by its release instead).
    worktree: Option<HeldWorktree>,
}

/// A spawn's worktree, as far as it got.
#[derive(Debug, Clone)]
enum HeldWorktree {
    /// `git worktree add` is running: what it leaves is taken back (`worktree::abandon`).
    Making(crate::worktree::WorktreeInfo),
    /// Made: taken back whole (`worktree::discard`).
    Made(crate::worktree::WorktreeInfo),
}

impl Undo {
    /// Gives everything back now.
    async fn run(&mut self) {
        self.armed = false;
        undo(self.engine.clone(), self.mux.clone(), self.held.clone()).await;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        tracing::warn!(target = %self.held.target, "a spawn was cancelled midway; undoing it");
        let work = undo(self.engine.clone(), self.mux.clone(), self.held.clone());
        // Without a runtime the daemon is stopping, and its engine with it: nothing is left to
        // give anything back to (a worktree's record stays, and the next start settles it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(work);
        }
    }
}

/// Gives back a spawn's member (through the one release path, which fails its tickets, forgets
/// its bindings and settles its worktree), or else closes its pane, takes back the worktree
/// made for it and then gives back its reserved name (which drops the worktree's record: only
/// once the worktree is gone, so a kill -9 meanwhile leaves the record for the next start).
async fn undo(engine: EngineHandle, mux: MuxRouter, held: Held) {
    let Held {
        target,
        pane,
        registered,
        worktree,
    } = held;
    let pane = if registered {
        // `None`: released already (its pane closed, or it was stopped): nothing left to close.
        engine
            .release(target.clone(), "spawn_failed".to_owned())
            .await
            .ok()
            .flatten()
    } else {
        pane
    };
    if let Some(pane) = pane {
        match mux.close_pane(&pane).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => tracing::warn!(%pane, error = %e, "cannot close a failed spawn's pane"),
        }
    }
    if !registered {
        match worktree {
            Some(HeldWorktree::Making(info)) => crate::worktree::abandon(&info).await,
            Some(HeldWorktree::Made(info)) => crate::worktree::discard(&info).await,
            None => {}
        }
        let _ = engine.unreserve(target).await;
    }
}

/// Whether a Codex member of `profile` finds fleetd through the stdio shim in its user's
/// `config.toml` (under the profile's `CODEX_HOME`, else `codex_home`). False for any other
/// agent, and when the file is absent or unreadable.
/// Never for a member that runs as another user (`runAs`): the shim's socket is fleetd's user's.
async fn codex_fleet_over_stdio(profile: &Profile, codex_home: &std::path::Path) -> bool {
    if profile.agent != "codex" || profile.run_as.is_some() {
        return false;
    }
    let home = profile
        .env
        .get("CODEX_HOME")
        .map_or_else(|| codex_home.to_owned(), std::path::PathBuf::from);
    tokio::fs::read_to_string(home.join("config.toml"))
        .await
        .is_ok_and(|text| crate::ops::install::codex::fleet_server_is_stdio(&text))
}

//! The engine: the one task that owns the fleet's live state — members, tickets, task queues,
//! questions, waiters, lead bindings — and runs the core's policies (`Injector`, `PushLoop`,
//! `TicketBook`) against the multiplexer and the store. MCP and HTTP handlers talk to it only
//! through [`EngineHandle`], which sends a closed [`Command`] with a oneshot reply; nothing else
//! holds the state. Architecture invariant: the engine never blocks on I/O — every multiplexer or
//! store call runs in a spawned task that reports back as an [`Event`].

mod effects;
mod gateway_handle;
mod lead_tabs;
mod registry;
mod run;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_durable;
#[cfg(test)]
mod tests_gateway;
mod verify;
mod wake;

use std::sync::Arc;

use fleetd_core::access::Refusal;
use fleetd_core::{AgentStatus, Message, QualifiedPaneId, Target, TerminalId, Ticket, TicketState};
use jiff::Timestamp;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::clock::SharedClock;
use crate::mux::MuxRouter;
use crate::store::InboxStore;

pub use gateway_handle::{PeerSpawn, RemoteSpawned, SpawnAnswer, SpawnRemote};
pub use run::spawn;
pub use state::{Delegator, GatewayOutcome, PeerRefusal, Standing};
pub use wake::WakeView;

/// Capacity of the engine's inbox. Commands are small and handled in microseconds; 1024 absorbs
/// a burst from every member of a large fleet replying at once without making callers wait.
const ENGINE_QUEUE: usize = 1024;

/// A member as tools show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberView {
    /// Its name.
    pub target: Target,
    /// The profile it was spawned from.
    pub profile: String,
    /// Its profile's model backend, when it names one.
    pub backend: Option<String>,
    /// Its pane, daemon-qualified.
    pub pane_id: QualifiedPaneId,
    /// Its pane's incarnation.
    pub terminal_id: TerminalId,
    /// `idle`, `working`, `blocked`, `done`, `unknown` (or `gone` once released).
    pub status: String,
    /// Whether its agent has opened an MCP session with fleetd.
    pub connected: bool,
    /// Tasks waiting to be typed into its pane.
    pub queued: usize,
    /// Its tickets that are not finished.
    pub open_tickets: Vec<Ticket>,
    /// The lead that delegated to it, if any.
    pub lead: Option<String>,
    /// The delegating member it reports to, when its lead is a member.
    pub delegator: Option<Target>,
    /// Its depth in its delegation tree: 1 under a lead, one more per delegating member above.
    pub depth: u64,
    /// Its worktree's branch, when it has one.
    pub branch: Option<String>,
    /// Its worktree and what it holds (read at each turn's end), when it has one.
    pub worktree: Option<WorktreeView>,
    /// When it joined.
    pub joined_at: Timestamp,
}

/// A member's worktree as tools show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeView {
    /// Where it is.
    pub path: std::path::PathBuf,
    /// Its branch.
    pub branch: String,
    /// What the branch started from.
    pub base: String,
    /// Paths with uncommitted changes (`None` until first read).
    pub uncommitted: Option<u64>,
    /// Commits on the branch that its base lacks (`None` until first read).
    pub ahead: Option<u64>,
}

/// One ticket as tools show it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketView {
    /// The ticket.
    pub ticket: Ticket,
    /// The member it went to.
    pub target: Target,
    /// Its state.
    pub state: TicketState,
    /// Why it failed or was cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// When it was opened.
    pub created_at: Timestamp,
    /// When it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// Who sent it: a lead's pane id, or a delegating member's name.
    #[serde(skip)]
    pub sent_by: Option<String>,
}

/// An open question (`fleet_ask`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuestionView {
    /// Its id.
    pub question_id: String,
    /// The asking member.
    #[serde(skip)]
    pub target: Option<Target>,
    /// The question.
    pub question: String,
}

/// How a ticket ended, for a waiting `fleet_send`.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The ticket's state.
    pub state: TicketState,
    /// The reply (or fallback) message, still pending in the inbox: the waiter acknowledges it.
    pub reply: Option<Message>,
}

/// Where a reply went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivered {
    /// A `fleet_send` was waiting for it.
    Waiter,
    /// It waits in the inbox for `fleet_poll`.
    Inbox,
}

/// What `fleet_answer` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerRoute {
    /// The member was still waiting in `fleet_ask`.
    Waiter,
    /// The member had stopped waiting: the answer goes to it as a task.
    Task,
    /// The member is on another host: the answer goes to its gateway, which hands it to the
    /// waiting member (or as a task).
    Gateway,
}

/// A ticket lookup.
#[derive(Debug, Clone)]
pub enum TicketAnswer {
    /// Known.
    Live(TicketView),
    /// Finished longer ago than the retention.
    Expired,
    /// Never seen.
    Unknown,
}

/// How a wait for a member's readiness ended ([`EngineHandle::when_ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Its agent is at rest (idle or done) and a process in its pane has spoken MCP to fleetd
    /// since the pane's current incarnation: a task can be delivered.
    Ready,
    /// It was released (its pane closed, it was stopped) or was never a member: it will never be
    /// ready.
    Gone,
}

/// A new member to register (the pane exists already). Also the record kept in
/// `<state dir>/members.json`, from which a restarted daemon re-adopts the members still running.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewMember {
    /// Its (reserved) name.
    pub target: Target,
    /// Its profile.
    pub profile: String,
    /// Its profile's agent kind.
    pub agent: String,
    /// Its pane.
    pub pane: QualifiedPaneId,
    /// The pane's incarnation.
    pub terminal: TerminalId,
    /// Its profile's `allowDelegation`.
    pub allow_delegation: bool,
    /// Its profile's `idleTimeoutSecs`.
    pub idle_timeout_secs: Option<u64>,
    /// Its profile's backend, if any (health incidents go to the members that use it).
    pub backend: Option<String>,
    /// The lead that spawned it.
    pub lead: Option<LeadRef>,
    /// Its git worktree, when its profile gives it one (removed or kept at release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::WorktreeInfo>,
}

/// A lead, by its pane and incarnation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeadRef {
    /// Its pane.
    pub pane: QualifiedPaneId,
    /// The incarnation that called.
    pub terminal: TerminalId,
}

/// Requests to the engine. Each carries its reply channel.
#[derive(Debug)]
pub(crate) enum Command {
    Standing {
        pane: QualifiedPaneId,
        terminal: TerminalId,
        age: Option<std::time::Duration>,
        reply: oneshot::Sender<Standing>,
    },
    Presence {
        target: Target,
    },
    PaneSeen {
        pane: QualifiedPaneId,
        terminal: TerminalId,
    },
    BackendHealth {
        name: String,
        down: Option<String>,
    },
    Shutdown {
        reply: oneshot::Sender<()>,
    },
    LeadSeen {
        lead: LeadRef,
    },
    Submit {
        lead: Option<LeadRef>,
        /// Who sent it when that is no lead: a delegating member's name.
        by: Option<Target>,
        target: Target,
        task: String,
        reply: oneshot::Sender<Result<Ticket, Refusal>>,
    },
    Wait {
        ticket: Ticket,
        reply: oneshot::Sender<Settled>,
    },
    Ticket {
        ticket: Ticket,
        reply: oneshot::Sender<TicketAnswer>,
    },
    TaskText {
        ticket: Ticket,
        reply: oneshot::Sender<Option<(Target, String)>>,
    },
    CurrentTicket {
        target: Target,
        reply: oneshot::Sender<Option<Ticket>>,
    },
    ReplyStored {
        message: Message,
        reply: oneshot::Sender<Delivered>,
    },
    InboxChanged {
        target: Target,
    },
    Ask {
        target: Target,
        question: String,
        reply: oneshot::Sender<Result<(String, oneshot::Receiver<String>), Refusal>>,
    },
    Answer {
        /// The delegating member answering, when a member is: only within its subtree.
        by: Option<Target>,
        question_id: String,
        answer: String,
        reply: oneshot::Sender<Result<AnswerRoute, Refusal>>,
    },
    Reach {
        by: Target,
        target: Target,
        tool: &'static str,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    Questions {
        target: Option<Target>,
        reply: oneshot::Sender<Vec<QuestionView>>,
    },
    List {
        reply: oneshot::Sender<Vec<MemberView>>,
    },
    Recent {
        target: Target,
        reply: oneshot::Sender<Vec<TicketView>>,
    },
    Reserve {
        name: Option<String>,
        delegator: Delegator,
        reply: oneshot::Sender<Result<(Target, Option<LeadRef>), Refusal>>,
    },
    Unreserve {
        target: Target,
    },
    WorktreeMaking {
        target: Target,
        info: Box<crate::worktree::WorktreeInfo>,
        lead: Option<LeadRef>,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    AddMember {
        member: Box<NewMember>,
    },
    WhenReady {
        target: Target,
        reply: oneshot::Sender<Readiness>,
    },
    Release {
        target: Target,
        cause: String,
        reply: oneshot::Sender<Option<QualifiedPaneId>>,
    },
    SetStatus {
        target: Target,
        status: AgentStatus,
    },
    /// A wake (MCP task) request (`wake`).
    Wake(wake::WakeCommand),
    /// A test-only fault: the engine panics on it.
    Panic,
    HandedTo {
        ticket: Ticket,
        holder: String,
    },
    Unhand {
        ticket: Ticket,
    },
    TakeHanded {
        holder: String,
        reply: oneshot::Sender<Vec<(Target, fleetd_core::MsgId)>>,
    },
    Acked {
        target: Target,
        ids: Vec<fleetd_core::MsgId>,
    },
    GatewayIn {
        envelope: Box<fleetd_core::gateway::Envelope>,
        reply: oneshot::Sender<Result<GatewayOutcome, String>>,
    },
    Forwarded {
        seq: u64,
        unroutable: bool,
    },
    StopRemote {
        target: Target,
        cause: String,
        reply: oneshot::Sender<bool>,
    },
    SpawnRemote {
        request: Box<SpawnRemote>,
        reply: oneshot::Sender<Result<(String, SpawnAnswer), Refusal>>,
    },
    PeerSpawned {
        req: String,
        outcome: Result<(Target, String, String), Refusal>,
    },
    GatewayRefused {
        refused: PeerRefusal,
    },
}

/// The handle every handler holds: cheap to clone, sends commands to the engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<run::Msg>,
    life: Arc<run::Life>,
}

/// A handle that does not keep the engine alive (the engine ends when the last strong handle is
/// dropped): for background tasks that should end with it.
#[derive(Debug, Clone)]
pub struct WeakEngineHandle {
    tx: mpsc::WeakSender<run::Msg>,
    life: Arc<run::Life>,
}

impl WeakEngineHandle {
    /// The engine, while it runs.
    pub fn upgrade(&self) -> Option<EngineHandle> {
        self.tx.upgrade().map(|tx| EngineHandle {
            tx,
            life: Arc::clone(&self.life),
        })
    }
}

impl EngineHandle {
    /// The fleet's event stream (`GET /events`).
    pub fn events(&self) -> &Arc<crate::events::EventHub> {
        &self.life.events
    }

    /// Publishes `event` to the fleet's event stream now: for what is decided outside the
    /// engine (presence: other gateways' members as they are heard of).
    pub fn publish_event(&self, event: &crate::events::FleetEvent) {
        self.life.events.publish(event, self.life.clock.now());
    }

    /// The last hour's delivery and nudge latencies (`GET /events/latency`).
    pub fn latency(&self) -> crate::events::LatencyRecord {
        self.life.events.latency(self.life.clock.now())
    }

    /// A handle that does not keep the engine running.
    pub fn downgrade(&self) -> WeakEngineHandle {
        WeakEngineHandle {
            tx: self.tx.downgrade(),
            life: Arc::clone(&self.life),
        }
    }

    /// Whether the engine task still runs (false once it panicked or stopped).
    pub fn is_alive(&self) -> bool {
        self.life.alive()
    }

    /// Completes when the engine task has stopped, for whatever reason.
    pub async fn stopped(&self) {
        self.life.stopped().cancelled_owned().await;
    }
}

/// The engine stopped (daemon shutting down).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the fleet engine has stopped (fleetd is shutting down)")]
pub struct EngineGone;

impl From<EngineGone> for Refusal {
    /// The engine stopped under a call: the daemon is shutting down.
    fn from(e: EngineGone) -> Self {
        Refusal::new("shutting_down", format!("{e}; retry once it is back"))
    }
}

impl EngineHandle {
    async fn send(&self, command: Command) -> Result<(), EngineGone> {
        self.tx
            .send(run::Msg::Command(command))
            .await
            .map_err(|_| EngineGone)
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, EngineGone> {
        let (tx, rx) = oneshot::channel();
        self.send(make(tx)).await?;
        rx.await.map_err(|_| EngineGone)
    }

    /// What pane incarnation `pane`/`terminal` is — a member's, a lead's or a stray — its own
    /// process `age` old (`None`: unknown), by the lead rule (`state::standing`).
    pub async fn standing(
        &self,
        pane: QualifiedPaneId,
        terminal: TerminalId,
        age: Option<std::time::Duration>,
    ) -> Result<Standing, EngineGone> {
        self.ask(|reply| Command::Standing {
            pane,
            terminal,
            age,
            reply,
        })
        .await
    }

    /// A process in `target`'s pane spoke MCP to fleetd.
    pub async fn presence(&self, target: Target) -> Result<(), EngineGone> {
        self.send(Command::Presence { target }).await
    }

    /// A process in a pane that is no member (yet) spoke MCP: remembered, so a member spawned
    /// into that pane incarnation counts as present even if its agent connected first.
    pub async fn pane_seen(
        &self,
        pane: QualifiedPaneId,
        terminal: TerminalId,
    ) -> Result<(), EngineGone> {
        self.send(Command::PaneSeen { pane, terminal }).await
    }

    /// The daemon is stopping: every member is released with cause `shutdown` (its open tickets
    /// fail, and a notice lands durably in its inbox for the lead to read after a restart; panes
    /// are left running). Returns once those notices are stored; the engine then stops.
    pub async fn shutdown(&self) -> Result<(), EngineGone> {
        self.ask(|reply| Command::Shutdown { reply }).await
    }

    /// The health prober's reading of backend `name`: up, or down with why.
    pub async fn backend_health(
        &self,
        name: String,
        down: Option<String>,
    ) -> Result<(), EngineGone> {
        self.send(Command::BackendHealth { name, down }).await
    }

    /// A lead called an orchestration tool.
    pub async fn lead_seen(&self, lead: LeadRef) -> Result<(), EngineGone> {
        self.send(Command::LeadSeen { lead }).await
    }

    /// Queues `task` for `target`; returns its ticket, or the refusal (no such member, or
    /// `limits.maxQueuedTasks` tasks already wait for it).
    pub async fn submit(
        &self,
        lead: Option<LeadRef>,
        target: Target,
        task: String,
    ) -> Result<Result<Ticket, Refusal>, EngineGone> {
        self.ask(|reply| Command::Submit {
            lead,
            by: None,
            target,
            task,
            reply,
        })
        .await
    }

    /// Queues `task` for `target` on behalf of delegating member `by` (who may then poll its
    /// ticket); returns the ticket.
    pub async fn submit_for_member(
        &self,
        by: Target,
        target: Target,
        task: String,
    ) -> Result<Result<Ticket, Refusal>, EngineGone> {
        self.ask(|reply| Command::Submit {
            lead: None,
            by: Some(by),
            target,
            task,
            reply,
        })
        .await
    }

    /// A receiver that fires when `ticket` settles (at once if it already has).
    pub async fn wait(&self, ticket: Ticket) -> Result<oneshot::Receiver<Settled>, EngineGone> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Wait { ticket, reply: tx }).await?;
        Ok(rx)
    }

    /// Looks a ticket up.
    pub async fn ticket(&self, ticket: Ticket) -> Result<TicketAnswer, EngineGone> {
        self.ask(|reply| Command::Ticket { ticket, reply }).await
    }

    /// The task text of a ticket (for a member reading a long task), with its member.
    pub async fn task_text(&self, ticket: Ticket) -> Result<Option<(Target, String)>, EngineGone> {
        self.ask(|reply| Command::TaskText { ticket, reply }).await
    }

    /// The ticket `target` is working on, if any.
    pub async fn current_ticket(&self, target: Target) -> Result<Option<Ticket>, EngineGone> {
        self.ask(|reply| Command::CurrentTicket { target, reply })
            .await
    }

    /// A reply was made durable: settle its ticket and tell its waiter or the push loop.
    pub async fn reply_stored(&self, message: Message) -> Result<Delivered, EngineGone> {
        self.ask(|reply| Command::ReplyStored { message, reply })
            .await
    }

    /// `target`'s inbox changed (acks): re-read its depth.
    pub async fn inbox_changed(&self, target: Target) -> Result<(), EngineGone> {
        self.send(Command::InboxChanged { target }).await
    }

    /// Opens a question; returns its id and a receiver for the answer, or the refusal when
    /// `target` already has `limits.maxOpenQuestions` open.
    pub async fn ask_question(
        &self,
        target: Target,
        question: String,
    ) -> Result<Result<(String, oneshot::Receiver<String>), Refusal>, EngineGone> {
        self.ask(|reply| Command::Ask {
            target,
            question,
            reply,
        })
        .await
    }

    /// Answers a question; for delegating member `by`, only one a member of its subtree asked
    /// (`not_your_member` otherwise).
    pub async fn answer(
        &self,
        by: Option<Target>,
        question_id: String,
        answer: String,
    ) -> Result<Result<AnswerRoute, Refusal>, EngineGone> {
        self.ask(|reply| Command::Answer {
            by,
            question_id,
            answer,
            reply,
        })
        .await
    }

    /// Whether delegating member `by` may act on `target` with `tool`: `not_your_member` unless
    /// `target` is in its subtree (its chain of delegating leads includes `by`).
    pub async fn reach(
        &self,
        by: Target,
        target: Target,
        tool: &'static str,
    ) -> Result<Result<(), Refusal>, EngineGone> {
        self.ask(|reply| Command::Reach {
            by,
            target,
            tool,
            reply,
        })
        .await
    }

    /// Open questions, of one member or all.
    pub async fn questions(&self, target: Option<Target>) -> Result<Vec<QuestionView>, EngineGone> {
        self.ask(|reply| Command::Questions { target, reply }).await
    }

    /// Every member.
    pub async fn list(&self) -> Result<Vec<MemberView>, EngineGone> {
        self.ask(|reply| Command::List { reply }).await
    }

    /// `target`'s recent tickets, newest first.
    pub async fn recent(&self, target: Target) -> Result<Vec<TicketView>, EngineGone> {
        self.ask(|reply| Command::Recent { target, reply }).await
    }

    /// Reserves a member name (`name`, or a free readable one) for a spawn `delegator` asks
    /// for, within the delegation limits; with the lead the member will report to.
    pub async fn reserve(
        &self,
        name: Option<String>,
        delegator: Delegator,
    ) -> Result<Result<(Target, Option<LeadRef>), Refusal>, EngineGone> {
        self.ask(|reply| Command::Reserve {
            name,
            delegator,
            reply,
        })
        .await
    }

    /// Gives a reserved name back (its spawn failed), and forgets the worktree it was making
    /// (taken back first).
    pub async fn unreserve(&self, target: Target) -> Result<(), EngineGone> {
        self.send(Command::Unreserve { target }).await
    }

    /// A spawn is about to make `target`'s worktree `info` (for a member of `lead`): answered
    /// once that is durable, so a kill -9 before the member is registered leaves a record the
    /// next start settles (the worktree removed when it holds nothing new, else kept and `lead`
    /// told). `add_member` or `unreserve` drops the record.
    pub async fn worktree_making(
        &self,
        target: Target,
        info: crate::worktree::WorktreeInfo,
        lead: Option<LeadRef>,
    ) -> Result<Result<(), Refusal>, EngineGone> {
        self.ask(|reply| Command::WorktreeMaking {
            target,
            info: Box::new(info),
            lead,
            reply,
        })
        .await
    }

    /// Registers a spawned member.
    pub async fn add_member(&self, member: NewMember) -> Result<(), EngineGone> {
        self.send(Command::AddMember {
            member: Box::new(member),
        })
        .await
    }

    /// A receiver that fires once `target` is ready (at once if it is), or with
    /// [`Readiness::Gone`] when it is released or is no member. The engine fires it from the
    /// status and presence it handles; nothing polls.
    pub async fn when_ready(
        &self,
        target: Target,
    ) -> Result<oneshot::Receiver<Readiness>, EngineGone> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::WhenReady { target, reply: tx }).await?;
        Ok(rx)
    }

    /// Releases a member: its open tickets fail with `cause`, its bindings go. Returns its pane
    /// (for the caller to close), or `None` when no such member exists.
    pub async fn release(
        &self,
        target: Target,
        cause: String,
    ) -> Result<Option<QualifiedPaneId>, EngineGone> {
        self.ask(|reply| Command::Release {
            target,
            cause,
            reply,
        })
        .await
    }

    /// The waiter for `ticket` returned its reply to `holder` (see [`crate::inbox`]).
    pub async fn handed_to(&self, ticket: Ticket, holder: String) -> Result<(), EngineGone> {
        self.send(Command::HandedTo { ticket, holder }).await
    }

    /// The waiter for `ticket` did not return its reply: it is mail to nudge about again. Does
    /// not wait (it is called from a drop guard); a full queue only delays the nudge until the
    /// next depth reading.
    pub fn unhand_now(&self, ticket: Ticket) {
        let _ = self
            .tx
            .try_send(run::Msg::Command(Command::Unhand { ticket }));
    }

    /// The replies handed to `holder` (taken: the caller acknowledges them).
    pub async fn take_handed(
        &self,
        holder: String,
    ) -> Result<Vec<(Target, fleetd_core::MsgId)>, EngineGone> {
        self.ask(|reply| Command::TakeHanded { holder, reply })
            .await
    }

    /// Messages of `target` were acknowledged.
    pub async fn acked(
        &self,
        target: Target,
        ids: Vec<fleetd_core::MsgId>,
    ) -> Result<(), EngineGone> {
        self.send(Command::Acked { target, ids }).await
    }

    /// A test-only fault hook: makes the engine task panic, to show what supervision does.
    pub async fn inject_panic(&self) -> Result<(), EngineGone> {
        self.send(Command::Panic).await
    }

    /// Records a member's status read directly from the multiplexer (at spawn).
    pub async fn set_status(&self, target: Target, status: AgentStatus) -> Result<(), EngineGone> {
        self.send(Command::SetStatus { target, status }).await
    }
}

/// The durable side of the engine (SPEC §15).
#[derive(Debug, Clone)]
pub struct Durable {
    /// The fleet state's store.
    pub store: Arc<dyn crate::store::StateStore>,
    /// The member registry an older fleetd kept (`<state dir>/members.json`): imported once when
    /// the store holds no members, then removed.
    pub legacy_members_file: Option<std::path::PathBuf>,
}

/// What the engine needs to run.
#[derive(Debug, Clone)]
pub struct EngineParts {
    /// Where the fleet state is kept across restarts; `None` keeps it in memory only.
    pub durable: Option<Durable>,
    /// The running configuration: read at start; applied reloads reach the engine through it
    /// (members whose backend vanished get an `unmapped` incident).
    pub config: crate::config::Live,
    /// The clock.
    pub clock: SharedClock,
    /// The inbox store.
    pub store: Arc<dyn InboxStore>,
    /// The multiplexers.
    pub mux: MuxRouter,
    /// Takes secret values out of the texts the engine stores for leads (fallback tails,
    /// incidents).
    pub redactor: crate::secrets::Redactor,
    /// This engine as one gateway of a multi-host fleet; `None`: one host.
    pub gateway: Option<GatewayParts>,
}

/// What the engine needs to be a gateway.
#[derive(Debug, Clone)]
pub struct GatewayParts {
    /// Its name.
    pub me: fleetd_core::gateway::GatewayName,
    /// What each other gateway may ask of it.
    pub peers: std::collections::BTreeMap<String, Vec<crate::config::PeerRight>>,
    /// Where outbox records go, in order, once committed: the forwarder.
    pub forward: tokio::sync::mpsc::UnboundedSender<(u64, Box<fleetd_core::gateway::Envelope>)>,
    /// `gateway.outboxMax`: records in the outbox at which new requests to other gateways are
    /// refused. The channel to the forwarder carries each record once, so it holds no more
    /// than the outbox does.
    pub outbox_max: usize,
}

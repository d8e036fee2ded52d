//! [`EngineHandle`]: what every handler holds to talk to the engine — one method per
//! [`Command`], each a send and, where there is an answer, its oneshot reply.

use fleetd_core::refusal::Code;
use std::sync::Arc;

use fleetd_core::access::Refusal;
use fleetd_core::{AgentStatus, Message, QualifiedPaneId, Target, TerminalId, Ticket};
use tokio::sync::{mpsc, oneshot};

use super::{
    AnswerRoute, Command, Delegator, Delivered, LeadRef, MemberView, NewMember, QuestionView,
    Readiness, Settled, Standing, TicketAnswer, TicketView, run,
};

/// The handle every handler holds: cheap to clone, sends commands to the engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    pub(super) tx: mpsc::Sender<run::Msg>,
    pub(super) life: Arc<run::Life>,
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
        Refusal::new(Code::ShuttingDown, format!("{e}; retry once it is back"))
    }
}

impl EngineHandle {
    pub(super) async fn send(&self, command: Command) -> Result<(), EngineGone> {
        self.tx
            .send(run::Msg::Command(command))
            .await
            .map_err(|_| EngineGone)
    }

    pub(super) async fn ask<T>(
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

    /// The member that runs as user `uid` (`runAs`) and whether it may delegate, if one is here.
    pub async fn member_of_user(&self, uid: u32) -> Result<Option<(Target, bool)>, EngineGone> {
        self.ask(|reply| Command::MemberOfUser { uid, reply }).await
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
        self.submit_as(lead, None, target, task).await
    }

    /// Queues `task` for `target` on behalf of delegating member `by` (who may then poll its
    /// ticket); returns the ticket.
    pub async fn submit_for_member(
        &self,
        by: Target,
        target: Target,
        task: String,
    ) -> Result<Result<Ticket, Refusal>, EngineGone> {
        self.submit_as(None, Some(by), target, task).await
    }

    /// A task for `target` from `lead` or delegating member `by`; one for a member on another
    /// gateway that is behind waits for room (`busy`).
    async fn submit_as(
        &self,
        lead: Option<LeadRef>,
        by: Option<Target>,
        target: Target,
        task: String,
    ) -> Result<Result<Ticket, Refusal>, EngineGone> {
        let ask = || {
            self.ask(|reply| Command::Submit {
                lead: lead.clone(),
                by: by.clone(),
                target: target.clone(),
                task: task.clone(),
                reply,
            })
        };
        match target.gateway() {
            Some(gateway) => self.life.busy.held(gateway, ask).await,
            None => ask().await,
        }
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

    /// May member `target`, presenting a model key whose hash is `key_hash`, send a request to
    /// `backend`? The account to count it on, or why not (`state::spend`).
    pub async fn model_admit(
        &self,
        target: Target,
        key_hash: String,
        backend: String,
    ) -> Result<Result<u64, Refusal>, EngineGone> {
        self.ask(|reply| Command::ModelAdmit {
            target,
            key_hash,
            backend,
            reply,
        })
        .await
    }

    /// [`EngineHandle::model_admit`] for the member at `pane`, whose incarnation is
    /// `terminal`, in one turn of the engine: `None` when no member is there (then the caller
    /// finds out who it is the long way, for its refusal).
    pub async fn model_admit_at(
        &self,
        pane: QualifiedPaneId,
        terminal: TerminalId,
        key_hash: String,
        backend: String,
    ) -> Result<Option<Result<(Target, u64), Refusal>>, EngineGone> {
        self.ask(|reply| Command::ModelAdmitAt {
            pane,
            terminal,
            key_hash,
            backend,
            reply,
        })
        .await
    }

    /// The model gateway's passes as the engine last published them (`state::passes`): whom
    /// [`EngineHandle::model_admit_at`] would admit, read without its turn; `None` once the
    /// engine is gone.
    pub fn model_passes(&self) -> Option<Arc<super::Passes>> {
        self.life
            .alive()
            .then(|| Arc::clone(&crate::sync::lock(&self.life.passes)))
    }

    /// A model response on `account` ended with `tokens` costing `cost_micros`: returns once
    /// that is durable.
    pub async fn model_usage(
        &self,
        account: u64,
        tokens: fleetd_core::usage::Tokens,
        cost_micros: u64,
    ) -> Result<Result<(), Refusal>, EngineGone> {
        self.ask(|reply| Command::ModelUsage {
            account,
            tokens,
            cost_micros,
            reply,
        })
        .await
    }

    /// Sets `target`'s model budget (`tree`: the budget of the tree it heads; `None` lifts it).
    pub async fn set_budget(
        &self,
        target: Target,
        tree: bool,
        budget: Option<crate::config::BudgetSpec>,
    ) -> Result<Result<super::UsageView, Refusal>, EngineGone> {
        self.ask(|reply| Command::SetBudget {
            target,
            tree,
            budget,
            reply,
        })
        .await
    }

    /// Model spending totals by member, profile, tree and lead.
    pub async fn usage_totals(&self) -> Result<super::UsageTotals, EngineGone> {
        self.ask(|reply| Command::UsageTotals { reply }).await
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

//! The closed set of requests [`super::EngineHandle`] sends the engine task, each with its reply
//! channel.

use fleetd_core::access::Refusal;
use fleetd_core::{AgentStatus, Message, QualifiedPaneId, Target, TerminalId, Ticket};
use tokio::sync::oneshot;

use super::{
    AnswerRoute, Delegator, Delivered, GatewayOutcome, LeadRef, MemberView, NewMember, PeerRefusal,
    QuestionView, Readiness, Settled, SpawnAnswer, SpawnRemote, Standing, TicketAnswer, TicketView,
    wake,
};

/// Requests to the engine. Each carries its reply channel.
#[derive(Debug)]
pub(crate) enum Command {
    Standing {
        pane: QualifiedPaneId,
        terminal: TerminalId,
        age: Option<std::time::Duration>,
        reply: oneshot::Sender<Standing>,
    },
    MemberOfUser {
        uid: u32,
        reply: oneshot::Sender<Option<(Target, bool)>>,
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
    /// The model gateway asks whether a member may send a model request (`spend`).
    ModelAdmit {
        target: Target,
        key_hash: String,
        backend: String,
        reply: oneshot::Sender<Result<u64, Refusal>>,
    },
    /// `ModelAdmit` for the member at `pane` (incarnation `terminal`), in one turn: `None`
    /// when no member is there.
    ModelAdmitAt {
        pane: QualifiedPaneId,
        terminal: TerminalId,
        key_hash: String,
        backend: String,
        reply: oneshot::Sender<Option<Result<(Target, u64), Refusal>>>,
    },
    /// A model response on an account ended with this usage; answered once it is durable.
    ModelUsage {
        account: u64,
        tokens: fleetd_core::usage::Tokens,
        cost_micros: u64,
        reply: oneshot::Sender<Result<(), Refusal>>,
    },
    /// The operator sets a member's (or its tree's) model budget.
    SetBudget {
        target: Target,
        tree: bool,
        budget: Option<crate::config::BudgetSpec>,
        reply: oneshot::Sender<Result<super::UsageView, Refusal>>,
    },
    UsageTotals {
        reply: oneshot::Sender<super::UsageTotals>,
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
    PeerQueued {
        gateway: fleetd_core::gateway::GatewayName,
        depth: u64,
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

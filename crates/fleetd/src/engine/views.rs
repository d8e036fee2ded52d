//! What the engine answers with: members, worktrees, tickets and questions as tools show them,
//! and the outcomes of its calls.

use fleetd_core::{AgentStatus, Message, QualifiedPaneId, Target, TerminalId, Ticket, TicketState};
use jiff::Timestamp;
use serde::Serialize;

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
    /// What its agent is doing, as its pane last showed.
    pub status: AgentStatus,
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
    /// What it spent on its model backend, when that is served through fleetd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<super::UsageView>,
    /// What the delegation tree it heads spent, when it heads one that spent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_usage: Option<super::UsageView>,
    /// The second user it runs as (`runAs`), when its profile names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
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
    /// Its model key and budgets, when its backend is served through fleetd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<super::MemberModel>,
    /// The second user it runs as (`runAs`): every connection of that user is this member's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<MemberUser>,
}

/// A member's own user (`runAs`, SPEC §19).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberUser {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
}

/// A lead, by its pane and incarnation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeadRef {
    /// Its pane.
    pub pane: QualifiedPaneId,
    /// The incarnation that called.
    pub terminal: TerminalId,
}

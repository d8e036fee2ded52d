//! The engine's state and its synchronous handling of commands and events. Owns members,
//! tickets, task texts, questions and waiters, and composes the core's `Injector`, `PushLoop`
//! and `TicketBook`. Does no I/O: it returns [`Io`] requests that `run` performs in spawned tasks.

use std::collections::{BTreeMap, HashMap};

use fleetd_core::injector::{Injector, InjectorInput};
use fleetd_core::push::{LeadActivity, LeadId, PushInput, PushLoop};
use fleetd_core::{AgentStatus, MessageKind, QualifiedPaneId, Target, TerminalId, Ticket};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::oneshot;

mod delegation;
mod delivery;
mod durable;
mod gateway;
mod gateway_inbound;
mod gateway_refusals;
mod handed_replies;
mod members;
mod outbox;
mod passes;
mod push;
mod questions;
mod remote_spawns;
mod spend;
mod standing;
mod tickets;
mod wakes;
mod worktrees;

pub use delegation::Delegator;
pub(in crate::engine) use delegation::TreeLimits;
pub(in crate::engine) use delivery::TaskOrder;
pub(in crate::engine) use durable::Restored;
pub use gateway::GatewayOutcome;
pub(in crate::engine) use gateway::GatewayState;
pub use gateway_refusals::PeerRefusal;
#[cfg(test)]
pub(in crate::engine) use gateway_refusals::REFUSAL_WINDOW;
#[cfg(test)]
pub(in crate::engine) use handed_replies::HANDED_TTL;
pub(in crate::engine) use passes::PassBoard;
pub use passes::Passes;
pub(in crate::engine) use push::push_config;
pub(in crate::engine) use spend::ACCOUNT;
pub use spend::{MemberModel, UsageTotals, UsageView};
pub use standing::Standing;
#[cfg(test)]
pub(in crate::engine) use wakes::WAKE_GRACE;

use super::lead_tabs::LeadTabs;
use super::{NewMember, Readiness, TicketView};

/// I/O the engine wants done; `run` spawns a task per request and reports back as an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Io {
    /// Type a task into a member's pane.
    Type {
        target: Target,
        ticket: Ticket,
        pane: QualifiedPaneId,
        text: String,
    },
    /// Press Enter again in a member's pane.
    Enter {
        target: Target,
        ticket: Ticket,
        pane: QualifiedPaneId,
    },
    /// After a restart: read a member's pane to learn whether a task handed to the
    /// multiplexer before the restart reached it (its `text` on the screen, or the member busy).
    FindTyped {
        target: Target,
        ticket: Ticket,
        pane: QualifiedPaneId,
        text: String,
    },
    /// Capture the tail of a member's pane and publish it as the ticket's fallback.
    Fallback {
        target: Target,
        ticket: Ticket,
        pane: QualifiedPaneId,
        /// The task's text as typed: a turn it still waits unsent after was not its turn.
        text: String,
    },
    /// Publish a notice to `target`'s inbox (stalled / failed tickets, late answers).
    Notice {
        target: Target,
        ticket: Option<Ticket>,
        kind: MessageKind,
        text: String,
    },
    /// Type a nudge into a lead's pane, after checking its incarnation.
    Nudge {
        lead: LeadId,
        pane: QualifiedPaneId,
        terminal: TerminalId,
        text: String,
    },
    /// Start watching a pane's status.
    Watch { pane: QualifiedPaneId },
    /// Stop watching a pane.
    Unwatch { pane: QualifiedPaneId },
    /// Re-read `target`'s inbox depth.
    Depth { target: Target },
    /// Close a released member's pane.
    Close { pane: QualifiedPaneId },
    /// A member's pane came back after a multiplexer restart with a new incarnation (herdr
    /// restores its layout with fresh shells): close it if it holds only a shell.
    CloseRestored {
        pane: QualifiedPaneId,
        old: TerminalId,
    },
    /// List every pane for the lead-tab scanner.
    ScanLeads,
    /// Re-read every target's inbox depth (at start: mail from before a restart is nudged too).
    DepthAll,
    /// Check that a member from before a restart still runs in its pane incarnation.
    Adopt(Box<NewMember>),
    /// Read `target`'s inbox for replies to its open `tickets` (after a restart: a reply stored
    /// just before it may not have settled its ticket).
    Reconcile {
        target: Target,
        tickets: std::collections::BTreeSet<Ticket>,
    },
    /// Publish a fleet event (`/events`). Published in order, after the change it reports is
    /// committed, never in a task of its own.
    Event(crate::events::FleetEvent),
    /// Read what a member's worktree holds (uncommitted paths, commits ahead of its base).
    InspectWorktree {
        target: Target,
        info: crate::worktree::WorktreeInfo,
    },
    /// A released member's worktree: removed with its branch when it holds nothing new, else
    /// kept (and its lead told). `orphan`: one a spawn cut short by a restart left, which no
    /// member claims (`worktree::reclaim`: a branch made for a directory that never came to be
    /// goes too). `after_close`: the member's pane incarnation, closed and seen gone before
    /// anything is judged (a member still running could commit between the reading and the
    /// delete).
    SettleWorktree {
        target: Target,
        info: crate::worktree::WorktreeInfo,
        orphan: bool,
        after_close: Option<(QualifiedPaneId, TerminalId)>,
    },
    /// Hand outbox record `seq` to the gateway forwarder (in order, never in a task of its own).
    Forward {
        seq: u64,
        envelope: Box<fleetd_core::gateway::Envelope>,
    },
    /// Remove a reply from this host's inbox once it is on its way to the gateway that owns its
    /// ticket, then read the inbox's depth.
    AckLocal {
        target: Target,
        msg_id: fleetd_core::MsgId,
    },
    /// Remove the legacy member registry (`members.json`): only after the batch that
    /// carried its members is committed, so a crash in between imports it again.
    RemoveLegacyRegistry(std::path::PathBuf),
}

impl Io {
    /// Whether this request runs at once rather than after its batch's commit: it changes
    /// nothing a restart must find done. Reading an inbox's depth is a read; a nudge points a
    /// lead at mail the inbox already holds durably (a reply is committed before the engine
    /// hears of it), or at a question it can read now — after a kill between the nudge and the
    /// commit, the next daemon nudges again from what it loads. A task is never typed this way.
    pub(super) fn needs_no_commit(&self) -> bool {
        matches!(self, Io::Depth { .. } | Io::Nudge { .. })
    }
}

#[derive(Debug, Clone)]
struct Member {
    profile: String,
    pane: QualifiedPaneId,
    terminal: TerminalId,
    status: AgentStatus,
    allow_delegation: bool,
    lead: Option<LeadId>,
    /// Its profile's backend.
    backend: Option<String>,
    /// An `unmapped` incident was raised for it (once per member).
    unmapped: bool,
    joined_at: Timestamp,
    /// Since when the member has been at rest (for the idle reaper).
    idle_since: Option<Timestamp>,
    idle_timeout: Option<SignedDuration>,
    /// What its worktree held when last read (it has one when its registry record says so).
    worktree_state: Option<crate::worktree::WorktreeState>,
}

#[derive(Debug)]
struct Question {
    target: Target,
    text: String,
    waiter: Option<oneshot::Sender<String>>,
    /// The other gateway the question travels with: for a member on another host
    /// (`target` is `name@gateway`), the gateway it came from and its answer goes to; for a
    /// member here, the gateway whose task it asked about, which answers it.
    peer: Option<fleetd_core::gateway::GatewayName>,
}

#[derive(Debug, Clone)]
struct Lead {
    pane: QualifiedPaneId,
    terminal: TerminalId,
    /// When it last called a lead tool or was resolved by the scanner.
    seen_at: Timestamp,
}

/// Names handed out when `fleet_spawn` gets none: short, readable, distinct.
const NAMES: &[&str] = &[
    "ada", "bo", "cy", "dex", "eve", "fay", "gus", "hal", "ivy", "jo", "kit", "lux", "max", "ned",
    "oz", "pia", "quin", "rex", "sky", "tam", "uma", "vic", "wes", "xan", "yui", "zed",
];

/// The engine's state.
#[derive(Debug)]
pub(super) struct State {
    /// Fleet events decided by the inputs handled since the last flush, in order.
    events: Vec<crate::events::FleetEvent>,
    members: BTreeMap<Target, Member>,
    /// Names a spawn holds between reserving them and registering its member, with when each
    /// was reserved; one older than [`RESERVATION_TTL`] expires on the next tick.
    reserved: BTreeMap<Target, Timestamp>,
    /// Spawns waiting for a member to become ready.
    ready_waiters: BTreeMap<Target, Vec<oneshot::Sender<Readiness>>>,
    by_pane: HashMap<QualifiedPaneId, Target>,
    /// Every ticket and its side data (task, sender, owner, typed, reply, waiters).
    tickets: tickets::Tickets,
    injector: Injector,
    push: PushLoop,
    questions: BTreeMap<String, Question>,
    leads: BTreeMap<LeadId, Lead>,
    lead_tabs: LeadTabs,
    /// Every registered member as it was added (its durable record).
    registry: BTreeMap<Target, NewMember>,
    /// Keys changed since the last durable batch.
    dirty: durable::Dirty,
    /// Where ticket and question ids come from (the clock seam).
    ids: crate::clock::SharedClock,
    /// Replies given to a waiter and not yet acknowledged, by ticket.
    handed: HashMap<Ticket, handed_replies::Handed>,
    /// Tickets watched for their callers through MCP tasks, by task id (durable).
    wakes: HashMap<String, wakes::Wake>,
    /// Each inbox's depth as last read.
    raw_depth: HashMap<Target, u64>,
    /// Backends the prober last found down, with why.
    backends_down: BTreeMap<String, String>,
    /// Panes whose status watch failed transiently, with when to try again.
    rewatch: BTreeMap<QualifiedPaneId, Timestamp>,
    /// Pane incarnations that spoke MCP before they held a member (newest last, bounded).
    seen: std::collections::VecDeque<(QualifiedPaneId, TerminalId)>,
    max_inject: usize,
    /// The per-member caps (`limits:`), as last configured.
    limits: crate::config::Limits,
    /// How deep and wide delegation trees may grow, as last configured.
    tree: TreeLimits,
    /// The lead each name reserved for a spawn will report to (counted against its width).
    reserved_for: BTreeMap<Target, LeadId>,
    /// Delegating members with delegated work outstanding, as last told to the injector.
    delegating: std::collections::BTreeSet<Target>,
    /// Members a message was stored for since their inbox depth was last read (the read is
    /// on its way): their mail is unread for delegation's sake meanwhile.
    depth_pending: std::collections::HashSet<Target>,
    /// When each lead's unnudged mail first landed: its first nudge tells how long after.
    mail_since: HashMap<LeadId, Timestamp>,
    /// Released members' worktrees not settled yet (durable: a restart settles them).
    pending_worktrees: BTreeMap<Target, crate::worktree::WorktreeInfo>,
    /// Worktrees spawns are making, until their member is registered (durable: a restart
    /// settles one no member claims).
    spawn_worktrees: BTreeMap<Target, worktrees::SpawnWorktree>,
    /// This engine as one gateway of a multi-host fleet.
    gateway: Option<GatewayState>,
    /// Messages for other gateways not yet confirmed by the broker, by sequence (durable), and
    /// each destination's backlog.
    outbox: outbox::Outbox,
    /// The last outbox sequence number handed out.
    outbox_seq: u64,
    /// Outbox records to hand the forwarder after this input's commit.
    to_forward: Vec<u64>,
    /// Spawns this gateway asked other gateways for, until answered (durable).
    asked_spawns: BTreeMap<String, remote_spawns::Asked>,
    /// Spawns other gateways asked of this one (durable, kept a while after they finish).
    served_spawns: BTreeMap<String, remote_spawns::Served>,
    /// Other gateways' refused messages, folded per sender and reason into bounded incidents.
    refusals: gateway_refusals::Refusals,
    /// What other gateways sent that is done with here, with when (durable, kept for
    /// [`ANSWERED_TTL`], keyed by [`gateway::done_key`]): their members' questions answered
    /// here, and their answers to this gateway's spawn requests. The broker may deliver one
    /// again after it was taken (its ack lost with the link): a copy must neither open a
    /// question again nor be refused as something never asked.
    answered: BTreeMap<String, Timestamp>,
    /// When members were here (durable): the lead rule's spans (`standing`).
    busy: standing::Busy,
    /// Stray pane incarnations already warned about (cleared past a bound).
    strays_told: std::collections::HashSet<(QualifiedPaneId, TerminalId)>,
    /// What members spend on their model backends (durable).
    ledger: spend::Ledger,
}

/// How many not-yet-member pane incarnations are remembered as having spoken MCP. Only the
/// moments between a pane opening and its member being registered matter, so a few hundred is
/// plenty even with many leads.
const SEEN_PANES: usize = 256;

/// How long a name reservation lasts when its spawn neither registers a member nor gives the
/// name back. A spawn gives up on its agent after 90 s (`members::READY_TIMEOUT`, which starts
/// after the reservation has already become a member); one still holding a bare reservation
/// after that plus a margin is a spawn that died without cleaning up (a lost message, a bug).
pub(super) const RESERVATION_TTL: SignedDuration = SignedDuration::from_secs(120);

/// How long what another gateway sent is remembered once done with (`State::answered`): a copy comes
/// again once the link that lost its ack is back, which is seconds or, for a host that was
/// away, days.
pub(super) const ANSWERED_TTL: SignedDuration = SignedDuration::from_hours(7 * 24);

/// How long after a failed status watch it is tried again. Without a watch a lead is never seen
/// idle (so never nudged) and a member never at rest, so this retries until the pane is gone.
const REWATCH_AFTER: SignedDuration = SignedDuration::from_secs(2);

impl State {
    pub(super) fn new(
        ttl: SignedDuration,
        grace: SignedDuration,
        push: PushLoop,
        lead_tabs: LeadTabs,
        max_inject: usize,
        ids: crate::clock::SharedClock,
    ) -> Self {
        Self {
            events: Vec::new(),
            members: BTreeMap::new(),
            reserved: BTreeMap::new(),
            ready_waiters: BTreeMap::new(),
            by_pane: HashMap::new(),
            tickets: tickets::Tickets::new(ttl),
            injector: Injector::new(grace),
            push,
            questions: BTreeMap::new(),
            leads: BTreeMap::new(),
            lead_tabs,
            rewatch: BTreeMap::new(),
            backends_down: BTreeMap::new(),
            registry: BTreeMap::new(),
            dirty: durable::Dirty::default(),
            ids,
            handed: HashMap::new(),
            wakes: HashMap::new(),
            raw_depth: HashMap::new(),
            seen: std::collections::VecDeque::new(),
            max_inject,
            limits: crate::config::Limits {
                max_queued_tasks: u64::MAX,
                max_open_questions: u64::MAX,
            },
            tree: TreeLimits {
                max_depth: u64::MAX,
                max_members_per_lead: u64::MAX,
            },
            reserved_for: BTreeMap::new(),
            delegating: std::collections::BTreeSet::new(),
            depth_pending: std::collections::HashSet::new(),
            mail_since: HashMap::new(),
            pending_worktrees: BTreeMap::new(),
            spawn_worktrees: BTreeMap::new(),
            gateway: None,
            outbox: outbox::Outbox::default(),
            outbox_seq: 0,
            to_forward: Vec::new(),
            asked_spawns: BTreeMap::new(),
            served_spawns: BTreeMap::new(),
            refusals: gateway_refusals::Refusals::default(),
            answered: BTreeMap::new(),
            busy: standing::Busy::default(),
            strays_told: std::collections::HashSet::new(),
            ledger: spend::Ledger::default(),
        }
    }

    /// Applies the per-member caps and the delegation limits (at start, and on each reload: to
    /// what is asked next).
    pub(super) fn set_limits(&mut self, limits: crate::config::Limits, tree: TreeLimits) {
        self.limits = limits;
        self.tree = tree;
    }

    /// Records a fleet event for `/events` (published after the change is committed).
    pub(super) fn emit(&mut self, event: crate::events::FleetEvent) {
        self.events.push(event);
    }

    /// What every turn ends with, before its changes are committed and its replies sent: the
    /// delegation settled, the lead rule's busy spans followed, the model passes published,
    /// and the forwards and fleet events it decided added to its I/O.
    pub(super) fn end_turn(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        self.settle_delegation(now, io);
        self.follow_busy(now);
        self.publish_passes();
        io.extend(self.take_forwards());
        io.extend(self.take_events().into_iter().map(Io::Event));
    }

    /// The fleet events decided since the last call, in order.
    pub(super) fn take_events(&mut self) -> Vec<crate::events::FleetEvent> {
        std::mem::take(&mut self.events)
    }

    /// Forgets which records changed (state kept in memory only).
    pub(super) fn discard_dirty(&mut self) {
        self.dirty = durable::Dirty::default();
    }

    /// The earliest time something is due.
    pub(super) fn next_wake(&self) -> Option<Timestamp> {
        let reap = self
            .members
            .values()
            .filter_map(|m| m.idle_since?.checked_add(m.idle_timeout?).ok());
        [
            self.injector.next_wake(),
            self.push.next_wake(),
            self.tickets.book.next_expiry(),
            self.lead_tabs.next_scan(!self.leads.is_empty()),
            self.rewatch.values().min().copied(),
            self.reservations_expire(),
            self.refusals_wake(),
        ]
        .into_iter()
        .flatten()
        .chain(reap)
        .min()
    }

    /// A status reading for a pane incarnation, from the multiplexer.
    pub(super) fn pane_status(
        &mut self,
        pane: &QualifiedPaneId,
        terminal: &TerminalId,
        status: AgentStatus,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        tracing::debug!(%pane, %terminal, ?status, "pane status");
        if let Some(target) = self.by_pane.get(pane).cloned() {
            self.set_status(&target, Some(terminal), status, now, io);
        }
        let lead = LeadId(pane.to_string());
        if self
            .leads
            .get(&lead)
            .is_some_and(|l| l.terminal == *terminal)
        {
            let activity = match status {
                AgentStatus::Idle | AgentStatus::Done => LeadActivity::Receptive,
                // A dialog is up: typed text would answer it (SPEC §5).
                AgentStatus::Working | AgentStatus::Blocked => LeadActivity::Busy,
                AgentStatus::Unknown => LeadActivity::Unknown,
            };
            self.feed_push(PushInput::LeadStatus { lead, activity }, now, io);
        }
    }

    /// A pane incarnation ended: a member there is released with cause `exited`.
    pub(super) fn pane_gone(
        &mut self,
        pane: &QualifiedPaneId,
        terminal: Option<&TerminalId>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        if let Some(target) = self.by_pane.get(pane).cloned()
            && let Some(member) = self.members.get(&target)
            && terminal.is_none_or(|t| *t == member.terminal)
        {
            self.release(&target, "exited", now, io);
            if let Some(old) = terminal {
                io.push(Io::CloseRestored {
                    pane: pane.clone(),
                    old: old.clone(),
                });
            }
        }
        let lead = LeadId(pane.to_string());
        if self
            .leads
            .get(&lead)
            .is_some_and(|l| terminal.is_none_or(|t| *t == l.terminal))
        {
            self.lead_gone(&lead, now, io);
        }
    }

    /// Opens a ticket (its record and side data, in [`tickets::Tickets::open`]), tells the
    /// event stream and the gauges, and marks it for the next durable batch.
    fn open_ticket(&mut self, opening: tickets::Opening, now: Timestamp) {
        let ticket = opening.ticket;
        self.tickets.open(opening, now);
        self.emit_ticket(ticket, now);
        self.ticket_gauges();
        self.dirty.tickets.insert(ticket);
    }

    /// Time passed: deadlines, retention, the idle reaper.
    pub(super) fn tick(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        self.inject(InjectorInput::Tick, now, io);
        self.feed_push(PushInput::Tick, now, io);
        self.scan_if_due(now, io);
        self.rewatch_due(now, io);
        self.expire_reservations(now);
        self.refusals_due(now, io);
        self.forget_answered(now);
        let pruned = self.tickets.prune_at(now);
        if !pruned.is_empty() {
            self.ticket_gauges();
        }
        for ticket in pruned {
            self.forget_wakes(ticket);
            if self.handed.contains_key(&ticket) {
                self.unhand(ticket, now, io);
            }
            self.dirty.tickets.insert(ticket);
        }
        self.wakes_due(now, io);
        self.unhand_stale(None, now, io);
        let idle: Vec<Target> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.idle_since
                    .zip(m.idle_timeout)
                    .and_then(|(s, t)| s.checked_add(t).ok())
                    .is_some_and(|due| now >= due)
            })
            .map(|(t, _)| t.clone())
            .collect();
        for target in idle {
            tracing::info!(%target, "releasing idle member");
            if let Some(pane) = self.release(&target, "idle", now, io) {
                io.push(Io::Close { pane });
            }
        }
    }
}

fn view(r: &fleetd_core::TicketRecord, sent_by: Option<&String>) -> TicketView {
    TicketView {
        ticket: r.ticket,
        target: r.target.clone(),
        state: r.state,
        cause: r.cause.clone(),
        created_at: r.created_at,
        finished_at: r.finished_at,
        sent_by: sent_by.cloned(),
    }
}

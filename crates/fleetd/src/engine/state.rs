//! The engine's state and its synchronous handling of commands and events. Owns members,
//! tickets, task texts, questions and waiters, and composes the core's `Injector`, `PushLoop`
//! and `TicketBook`. Does no I/O: it returns [`Io`] requests that `run` performs in spawned tasks.

use std::collections::{BTreeMap, HashMap};

use fleetd_core::access::Refusal;
use fleetd_core::injector::{Activity, Injector, InjectorEffect, InjectorInput};
use fleetd_core::push::{InjectOutcome, LeadActivity, LeadId, PushEffect, PushInput, PushLoop};
use fleetd_core::{
    AgentStatus, Message, MessageKind, QualifiedPaneId, Target, TerminalId, Ticket, TicketBook,
    TicketEvent, TicketLookup,
};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::oneshot;

use super::leads::{LeadTabs, ScanChange, ScanPane};
use super::{
    AnswerRoute, Delivered, LeadRef, MemberView, NewMember, QuestionView, Settled, TicketAnswer,
    TicketView,
};

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
    /// Capture the tail of a member's pane and publish it as the ticket's fallback.
    Fallback {
        target: Target,
        ticket: Ticket,
        pane: QualifiedPaneId,
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
    /// List every pane for the lead-tab scanner.
    ScanLeads,
    /// Re-read every target's inbox depth (at start: mail from before a restart is nudged too).
    DepthAll,
    /// Keep this member list on disk (the registry a restarted daemon re-adopts from).
    SaveMembers(Vec<NewMember>),
    /// Check that a member from before a restart still runs in its pane incarnation.
    Adopt(Box<NewMember>),
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
}

#[derive(Debug)]
struct Question {
    target: Target,
    text: String,
    waiter: Option<oneshot::Sender<String>>,
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
    members: BTreeMap<Target, Member>,
    reserved: BTreeMap<Target, Timestamp>,
    by_pane: HashMap<QualifiedPaneId, Target>,
    tickets: TicketBook,
    tasks: HashMap<Ticket, String>,
    replies: HashMap<Ticket, Message>,
    waiters: HashMap<Ticket, Vec<oneshot::Sender<Settled>>>,
    injector: Injector,
    push: PushLoop,
    questions: BTreeMap<String, Question>,
    leads: BTreeMap<LeadId, Lead>,
    lead_tabs: LeadTabs,
    /// What `members.json` holds: every registered member as it was added.
    registry: BTreeMap<Target, NewMember>,
    /// Backends the prober last found down, with why.
    backends_down: BTreeMap<String, String>,
    /// Panes whose status watch failed transiently, with when to try again.
    rewatch: BTreeMap<QualifiedPaneId, Timestamp>,
    /// Pane incarnations that spoke MCP before they held a member (newest last, bounded).
    seen: std::collections::VecDeque<(QualifiedPaneId, TerminalId)>,
    max_inject: usize,
}

/// How many not-yet-member pane incarnations are remembered as having spoken MCP. Only the
/// moments between a pane opening and its member being registered matter, so a few hundred is
/// plenty even with many leads.
const SEEN_PANES: usize = 256;

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
    ) -> Self {
        Self {
            members: BTreeMap::new(),
            reserved: BTreeMap::new(),
            by_pane: HashMap::new(),
            tickets: TicketBook::new(ttl),
            tasks: HashMap::new(),
            replies: HashMap::new(),
            waiters: HashMap::new(),
            injector: Injector::new(grace),
            push,
            questions: BTreeMap::new(),
            leads: BTreeMap::new(),
            lead_tabs,
            rewatch: BTreeMap::new(),
            backends_down: BTreeMap::new(),
            registry: BTreeMap::new(),
            seen: std::collections::VecDeque::new(),
            max_inject,
        }
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
            self.tickets.next_expiry(),
            self.lead_tabs.next_scan(!self.leads.is_empty()),
            self.rewatch.values().min().copied(),
        ]
        .into_iter()
        .flatten()
        .chain(reap)
        .min()
    }

    pub(super) fn member_at(
        &self,
        pane: &QualifiedPaneId,
        terminal: &TerminalId,
    ) -> Option<(Target, bool)> {
        let target = self.by_pane.get(pane)?;
        let m = self.members.get(target)?;
        (m.terminal == *terminal).then(|| (target.clone(), m.allow_delegation))
    }

    pub(super) fn lead_id(lead: &LeadRef) -> LeadId {
        LeadId(lead.pane.to_string())
    }

    /// A lead called a lead tool. Without a pinned primary tab the first lead seen becomes the
    /// primary; with one, a scan decides whether this caller is in it.
    pub(super) fn lead_seen(&mut self, lead: &LeadRef, now: Timestamp, io: &mut Vec<Io>) {
        let new = self.register_lead(lead, now, io);
        if self.lead_tabs.primary_pinned() {
            if new {
                self.lead_tabs.expire();
            }
        } else if self.push.primary().is_none() {
            self.set_primary(Some(Self::lead_id(lead)), now, io);
        }
    }

    /// Records a lead incarnation and watches its status; a different incarnation in the same
    /// pane is forgotten first. Returns whether it was new.
    fn register_lead(&mut self, lead: &LeadRef, now: Timestamp, io: &mut Vec<Io>) -> bool {
        let id = Self::lead_id(lead);
        match self.leads.get_mut(&id) {
            Some(known) if known.terminal == lead.terminal => {
                known.seen_at = now;
                return false;
            }
            Some(_) => self.lead_gone(&id, now, io),
            None => {}
        }
        tracing::info!(lead = %id, "lead registered");
        self.leads.insert(
            id,
            Lead {
                pane: lead.pane.clone(),
                terminal: lead.terminal.clone(),
                seen_at: now,
            },
        );
        io.push(Io::Watch {
            pane: lead.pane.clone(),
        });
        true
    }

    fn set_primary(&mut self, lead: Option<LeadId>, now: Timestamp, io: &mut Vec<Io>) {
        if self.push.primary() == lead.as_ref() {
            return;
        }
        match &lead {
            Some(l) => tracing::info!(lead = %l, "primary lead"),
            None => tracing::info!(
                "no primary lead: mail without a delegating lead waits for fleet_poll"
            ),
        }
        let effects = self.push.handle_at(PushInput::Primary(lead), now);
        self.push_effects(effects, now, io);
    }

    /// A lead is affirmatively gone (pane closed, new incarnation, not-found answer): its
    /// bindings go, and mail falls back to the primary; a lost primary is replaced by the pinned
    /// tab's next lead (a scan is due at once) or, unpinned, by the lead seen most recently.
    fn lead_gone(&mut self, lead: &LeadId, now: Timestamp, io: &mut Vec<Io>) {
        if self.leads.remove(lead).is_some() {
            tracing::info!(%lead, "lead gone");
        }
        for member in self.members.values_mut() {
            if member.lead.as_ref() == Some(lead) {
                member.lead = None;
            }
        }
        let effects = self
            .push
            .handle_at(PushInput::LeadGone { lead: lead.clone() }, now);
        self.push_effects(effects, now, io);
        if self.push.primary().is_none() {
            if self.lead_tabs.primary_pinned() {
                self.lead_tabs.expire();
            } else {
                let next = self
                    .leads
                    .iter()
                    .max_by_key(|(_, l)| l.seen_at)
                    .map(|(id, _)| id.clone());
                self.set_primary(next, now, io);
            }
        }
    }

    /// A backend health reading. A transition (up → down, down → up) is an incident in the inbox
    /// of every member on that backend, which nudges their leads; a repeated reading is nothing.
    pub(super) fn backend_health(&mut self, name: &str, down: Option<String>, io: &mut Vec<Io>) {
        let was_down = self.backends_down.contains_key(name);
        let text = match (&down, was_down) {
            (Some(why), false) => {
                tracing::warn!(backend = name, reason = %why, "backend down");
                format!(
                    "[fleet] incident: backend {name} is down ({why}); members on it cannot reach their model"
                )
            }
            (None, true) => {
                tracing::info!(backend = name, "backend up again");
                format!("[fleet] incident resolved: backend {name} is up again")
            }
            _ => return,
        };
        match down {
            Some(why) => self.backends_down.insert(name.to_owned(), why),
            None => self.backends_down.remove(name),
        };
        self.incident(|m| m.backend.as_deref() == Some(name), &text, io);
    }

    /// A reload was applied: members whose backend is no longer configured are `unmapped`.
    pub(super) fn config_reloaded(&mut self, config: &crate::config::Config, io: &mut Vec<Io>) {
        self.backends_down
            .retain(|name, _| config.backends.contains_key(name));
        let vanished: Vec<(Target, String)> = self
            .members
            .iter()
            .filter(|(_, m)| !m.unmapped)
            .filter_map(|(t, m)| {
                let backend = m.backend.as_ref()?;
                (!config.backends.contains_key(backend)).then(|| (t.clone(), backend.clone()))
            })
            .collect();
        for (target, backend) in vanished {
            tracing::warn!(%target, %backend, "member's backend is no longer configured");
            if let Some(m) = self.members.get_mut(&target) {
                m.unmapped = true;
            }
            io.push(Io::Notice {
                target,
                ticket: None,
                kind: MessageKind::Incident,
                text: format!("[fleet] incident: backend {backend} was removed from the configuration; this member keeps running on the settings it was started with — stop it or add the backend back"),
            });
        }
    }

    /// Publishes `text` as an incident to every member `which` selects.
    fn incident(&self, which: impl Fn(&Member) -> bool, text: &str, io: &mut Vec<Io>) {
        for (target, _) in self.members.iter().filter(|(_, m)| which(m)) {
            io.push(Io::Notice {
                target: target.clone(),
                ticket: None,
                kind: MessageKind::Incident,
                text: text.to_owned(),
            });
        }
    }

    /// Watching `pane` failed transiently: try again shortly while a lead or member is there.
    pub(super) fn watch_failed(&mut self, pane: QualifiedPaneId, now: Timestamp) {
        if let Ok(at) = now.checked_add(REWATCH_AFTER) {
            self.rewatch.insert(pane, at);
        }
    }

    fn rewatch_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let due: Vec<QualifiedPaneId> = self
            .rewatch
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(p, _)| p.clone())
            .collect();
        for pane in due {
            self.rewatch.remove(&pane);
            let wanted =
                self.by_pane.contains_key(&pane) || self.leads.values().any(|l| l.pane == pane);
            if wanted {
                io.push(Io::Watch { pane });
            }
        }
    }

    /// Starts a lead-tab scan when one is due.
    fn scan_if_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let due = self
            .lead_tabs
            .next_scan(!self.leads.is_empty())
            .is_some_and(|at| at <= now);
        if due && self.lead_tabs.start() {
            io.push(Io::ScanLeads);
        }
    }

    /// The scanner's listing arrived (`None`: the reading failed, every answer stands).
    pub(super) fn leads_scanned(
        &mut self,
        panes: Option<Vec<ScanPane>>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let Some(panes) = panes else {
            self.lead_tabs.failed(now);
            return;
        };
        let callers = self
            .leads
            .iter()
            .map(|(id, l)| (id.clone(), l.terminal.clone()))
            .collect();
        for change in self.lead_tabs.scanned(&panes, &callers, now) {
            match change {
                ScanChange::Gone { lead } => self.lead_gone(&lead, now, io),
                ScanChange::Resolved {
                    lead,
                    primary,
                    name,
                } => {
                    if let Some(name) = &name {
                        tracing::info!(lead = %lead.pane, %name, "lead tab resolved");
                    }
                    self.register_lead(&lead, now, io);
                    if primary {
                        self.set_primary(Some(Self::lead_id(&lead)), now, io);
                    }
                }
            }
        }
    }

    pub(super) fn presence(&mut self, target: Target, now: Timestamp, io: &mut Vec<Io>) {
        let effects = self
            .injector
            .handle_at(InjectorInput::PresenceSeen { target }, now);
        self.injector_effects(effects, now, io);
    }

    pub(super) fn pane_seen(
        &mut self,
        pane: QualifiedPaneId,
        terminal: TerminalId,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        // The member may have been registered between the caller's lookup and this message.
        if let Some((target, _)) = self.member_at(&pane, &terminal) {
            self.presence(target, now, io);
            return;
        }
        tracing::debug!(%pane, %terminal, "MCP seen from a pane that holds no member yet");
        let key = (pane, terminal);
        if !self.seen.contains(&key) {
            self.seen.push_back(key);
            if self.seen.len() > SEEN_PANES {
                self.seen.pop_front();
            }
        }
    }

    pub(super) fn submit(
        &mut self,
        lead: Option<&LeadRef>,
        target: Target,
        task: String,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<Ticket, Refusal> {
        let Some(member) = self.members.get_mut(&target) else {
            return Err(Refusal::new(
                "unknown_target",
                format!(
                    "no member named {target}: call fleet_list to see members, or fleet_spawn to start one"
                ),
            ));
        };
        if let Some(lead) = lead {
            let id = Self::lead_id(lead);
            member.lead = Some(id.clone());
            let effects = self.push.handle_at(
                PushInput::Bound {
                    target: target.clone(),
                    lead: id,
                },
                now,
            );
            self.push_effects(effects, now, io);
        }
        let ticket = Ticket::from_uuid(uuid::Uuid::now_v7());
        self.tickets.open_at(ticket, target.clone(), now);
        self.ticket_gauges();
        self.tasks.insert(ticket, task);
        let effects = self
            .injector
            .handle_at(InjectorInput::Enqueue { target, ticket }, now);
        self.injector_effects(effects, now, io);
        Ok(ticket)
    }

    pub(super) fn wait(&mut self, ticket: Ticket, reply: oneshot::Sender<Settled>, now: Timestamp) {
        match self.tickets.get_at(ticket, now) {
            TicketLookup::Live(r) if r.state.is_terminal() => {
                let _ = reply.send(Settled {
                    state: r.state,
                    reply: self.replies.get(&ticket).cloned(),
                });
            }
            TicketLookup::Live(_) => self.waiters.entry(ticket).or_default().push(reply),
            // Unknown or expired: the sender is dropped; the waiter reads that as "no answer".
            _ => {}
        }
    }

    pub(super) fn ticket(&self, ticket: Ticket, now: Timestamp) -> TicketAnswer {
        match self.tickets.get_at(ticket, now) {
            TicketLookup::Live(r) => TicketAnswer::Live(view(r)),
            TicketLookup::Expired => TicketAnswer::Expired,
            TicketLookup::Unknown => TicketAnswer::Unknown,
        }
    }

    pub(super) fn task_text(&self, ticket: Ticket, now: Timestamp) -> Option<(Target, String)> {
        let TicketLookup::Live(r) = self.tickets.get_at(ticket, now) else {
            return None;
        };
        Some((r.target.clone(), self.tasks.get(&ticket)?.clone()))
    }

    pub(super) fn current_ticket(&self, target: &Target) -> Option<Ticket> {
        self.injector.current(target)
    }

    /// A durable reply (or fallback): settle its ticket, hand it to a waiter if one is alive.
    pub(super) fn reply_stored(
        &mut self,
        message: Message,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Delivered {
        let target = message.target.clone();
        let mut delivered = Delivered::Inbox;
        if let Some(ticket) = message.ticket {
            let event = match message.kind {
                MessageKind::Fallback => TicketEvent::TurnEndedWithoutReply,
                _ => TicketEvent::Replied,
            };
            if message.kind == MessageKind::Reply {
                let effects = self.injector.handle_at(
                    InjectorInput::Replied {
                        target: target.clone(),
                        ticket,
                    },
                    now,
                );
                self.injector_effects(effects, now, io);
            }
            self.replies.insert(ticket, message);
            if self.apply(ticket, event, now) && self.settle(ticket, now) {
                delivered = Delivered::Waiter;
            }
        }
        // A reply handed to a waiter is acknowledged by it in a moment (and the depth re-read
        // then); telling the push loop now would nudge the lead about mail it is receiving.
        if delivered == Delivered::Inbox {
            io.push(Io::Depth { target });
        }
        delivered
    }

    /// Sets the `fleetd_tickets{state}` gauges from the book.
    fn ticket_gauges(&self) {
        let counts = self.tickets.count_by_state();
        for state in fleetd_core::TicketState::ALL {
            #[expect(
                clippy::cast_precision_loss,
                reason = "a gauge: ticket counts are far below 2^52"
            )]
            let n = counts.get(&state).copied().unwrap_or(0) as f64;
            metrics::gauge!("fleetd_tickets", "state" => state.as_str()).set(n);
        }
    }

    /// Applies a ticket event; true when it changed the ticket.
    fn apply(&mut self, ticket: Ticket, event: TicketEvent, now: Timestamp) -> bool {
        if event == TicketEvent::Delivered
            && let TicketLookup::Live(r) = self.tickets.get_at(ticket, now)
        {
            let waited = now.duration_since(r.created_at).as_secs_f64();
            metrics::histogram!("fleetd_delivery_seconds").record(waited.max(0.0));
        }
        let changed = self.apply_event(ticket, event, now);
        self.ticket_gauges();
        changed
    }

    fn apply_event(&mut self, ticket: Ticket, event: TicketEvent, now: Timestamp) -> bool {
        match self.tickets.apply_at(ticket, event, now) {
            Ok(_) => true,
            Err(refusal) => {
                tracing::debug!(%refusal, "ticket event ignored");
                false
            }
        }
    }

    /// Hands a settled ticket to its waiters; true when at least one was still listening.
    fn settle(&mut self, ticket: Ticket, now: Timestamp) -> bool {
        let TicketLookup::Live(record) = self.tickets.get_at(ticket, now) else {
            return false;
        };
        if !record.state.is_terminal() {
            return false;
        }
        let settled = Settled {
            state: record.state,
            reply: self.replies.get(&ticket).cloned(),
        };
        let mut taken = false;
        for waiter in self.waiters.remove(&ticket).unwrap_or_default() {
            taken |= waiter.send(settled.clone()).is_ok();
        }
        taken
    }

    pub(super) fn inbox_depth(
        &mut self,
        target: Target,
        pending: u64,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a gauge: inbox depths are far below 2^52"
        )]
        metrics::gauge!("fleetd_inbox_depth", "target" => target.to_string()).set(pending as f64);
        let effects = self
            .push
            .handle_at(PushInput::Inbox { target, pending }, now);
        self.push_effects(effects, now, io);
    }

    pub(super) fn ask(
        &mut self,
        target: Target,
        text: String,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> (String, oneshot::Receiver<String>) {
        let id = uuid::Uuid::now_v7().to_string();
        let (tx, rx) = oneshot::channel();
        self.questions.insert(
            id.clone(),
            Question {
                target: target.clone(),
                text,
                waiter: Some(tx),
            },
        );
        let effects = self.push.handle_at(
            PushInput::QuestionOpened {
                target,
                question_id: id.clone(),
            },
            now,
        );
        self.push_effects(effects, now, io);
        (id, rx)
    }

    pub(super) fn answer(
        &mut self,
        id: &str,
        answer: String,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<AnswerRoute, Refusal> {
        let Some(mut question) = self.questions.remove(id) else {
            return Err(Refusal::new(
                "unknown_question",
                format!(
                    "no open question {id}: it was answered already or never asked; fleet_poll(target=...) lists open questions"
                ),
            ));
        };
        let effects = self.push.handle_at(
            PushInput::QuestionClosed {
                question_id: id.to_owned(),
            },
            now,
        );
        self.push_effects(effects, now, io);
        let answer = match question.waiter.take() {
            Some(waiter) => match waiter.send(answer) {
                Ok(()) => return Ok(AnswerRoute::Waiter),
                Err(answer) => answer,
            },
            None => answer,
        };
        // The member stopped waiting: the answer reaches it as a task, in order with its others.
        let task = format!("Answer to your question {id} ({}): {answer}", question.text);
        match self.submit(None, question.target.clone(), task, now, io) {
            Ok(_) => Ok(AnswerRoute::Task),
            Err(refusal) => Err(refusal),
        }
    }

    /// A question's asker stopped waiting: it stays open for `fleet_answer`.
    pub(super) fn questions(&self, target: Option<&Target>) -> Vec<QuestionView> {
        self.questions
            .iter()
            .filter(|(_, q)| target.is_none_or(|t| *t == q.target))
            .map(|(id, q)| QuestionView {
                question_id: id.clone(),
                target: Some(q.target.clone()),
                question: q.text.clone(),
            })
            .collect()
    }

    pub(super) fn list(&self) -> Vec<MemberView> {
        self.members
            .iter()
            .map(|(target, m)| self.member_view(target, m))
            .collect()
    }

    fn member_view(&self, target: &Target, m: &Member) -> MemberView {
        MemberView {
            target: target.clone(),
            profile: m.profile.clone(),
            pane_id: m.pane.clone(),
            terminal_id: m.terminal.clone(),
            status: m.status.as_str().to_owned(),
            connected: self.injector.presence(target),
            queued: self.injector.queued(target),
            open_tickets: self
                .tickets
                .open_for(target)
                .iter()
                .map(|r| r.ticket)
                .collect(),
            lead: m.lead.as_ref().map(|l| l.0.clone()),
            joined_at: m.joined_at,
        }
    }

    pub(super) fn recent(&self, target: &Target) -> Vec<TicketView> {
        self.tickets
            .recent_for(target, 10)
            .into_iter()
            .map(view)
            .collect()
    }

    pub(super) fn reserve(
        &mut self,
        name: Option<String>,
        now: Timestamp,
    ) -> Result<Target, Refusal> {
        let taken = |t: &Target, s: &Self| s.members.contains_key(t) || s.reserved.contains_key(t);
        let target = match name {
            Some(name) => {
                let target =
                    Target::new(name).map_err(|e| Refusal::new("invalid_name", e.to_string()))?;
                if taken(&target, self) {
                    return Err(Refusal::new(
                        "name_taken",
                        format!(
                            "a member named {target} exists already: pick another name, or omit `name` to get a free one"
                        ),
                    ));
                }
                target
            }
            None => (0..)
                .flat_map(|round| {
                    NAMES.iter().map(move |n| {
                        if round == 0 {
                            (*n).to_owned()
                        } else {
                            format!("{n}{round}")
                        }
                    })
                })
                .filter_map(|n| Target::new(n).ok())
                .find(|t| !taken(t, self))
                .ok_or_else(|| Refusal::new("no_name", "no free member name"))?,
        };
        self.reserved.insert(target.clone(), now);
        Ok(target)
    }

    pub(super) fn unreserve(&mut self, target: &Target) {
        self.reserved.remove(target);
    }

    pub(super) fn add_member(&mut self, new: NewMember, now: Timestamp, io: &mut Vec<Io>) {
        self.reserved.remove(&new.target);
        self.registry.insert(new.target.clone(), new.clone());
        io.push(Io::SaveMembers(self.registry.values().cloned().collect()));
        let lead = new.lead.as_ref().map(Self::lead_id);
        self.by_pane.insert(new.pane.clone(), new.target.clone());
        self.members.insert(
            new.target.clone(),
            Member {
                profile: new.profile,
                pane: new.pane.clone(),
                terminal: new.terminal,
                status: AgentStatus::Unknown,
                allow_delegation: new.allow_delegation,
                lead: lead.clone(),
                backend: new.backend.clone(),
                unmapped: false,
                joined_at: now,
                idle_since: None,
                idle_timeout: new
                    .idle_timeout_secs
                    .and_then(|s| i64::try_from(s).ok())
                    .map(SignedDuration::from_secs),
            },
        );
        let effects = self.injector.handle_at(
            InjectorInput::MemberAdded {
                target: new.target.clone(),
            },
            now,
        );
        self.injector_effects(effects, now, io);
        let incarnation = (new.pane.clone(), self.members[&new.target].terminal.clone());
        if let Some(i) = self.seen.iter().position(|k| *k == incarnation) {
            // Its agent connected before the member was registered: that was its presence.
            self.seen.remove(i);
            self.presence(new.target.clone(), now, io);
        }
        if let Some(lead) = lead {
            let effects = self.push.handle_at(
                PushInput::Bound {
                    target: new.target,
                    lead,
                },
                now,
            );
            self.push_effects(effects, now, io);
        }
        io.push(Io::Watch { pane: new.pane });
    }

    /// A member from before a restart still runs in its pane: it is a member again (present,
    /// since it was connected when it was spawned; its delegating lead is not known any more, so
    /// its mail goes to the primary).
    pub(super) fn adopt(&mut self, member: NewMember, now: Timestamp, io: &mut Vec<Io>) {
        if self.members.contains_key(&member.target) {
            return;
        }
        tracing::info!(target = %member.target, pane = %member.pane, "re-adopted a member from before the restart");
        let target = member.target.clone();
        self.add_member(
            NewMember {
                lead: None,
                ..member
            },
            now,
            io,
        );
        self.presence(target, now, io);
    }

    /// A member from before a restart is gone (its pane closed or holds another incarnation).
    pub(super) fn adoption_failed(&mut self, target: &Target, io: &mut Vec<Io>) {
        tracing::info!(%target, "a member from before the restart is gone");
        if self.registry.remove(target).is_some() {
            io.push(Io::SaveMembers(self.registry.values().cloned().collect()));
        }
    }

    /// Releases every member with `cause` (daemon shutdown).
    pub(super) fn release_all(&mut self, cause: &str, now: Timestamp, io: &mut Vec<Io>) {
        let targets: Vec<Target> = self.members.keys().cloned().collect();
        for target in targets {
            self.release(&target, cause, now, io);
        }
    }

    /// The one release path: fails open tickets with `cause`, forgets bindings and the queue,
    /// and tells the lead through the inbox. Returns the pane.
    pub(super) fn release(
        &mut self,
        target: &Target,
        cause: &str,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Option<QualifiedPaneId> {
        let member = self.members.remove(target)?;
        self.by_pane.remove(&member.pane);
        if self.registry.remove(target).is_some() && cause != "shutdown" {
            // A member released by a shutdown stays in the registry: it keeps running, and the
            // next daemon re-adopts it.
            io.push(Io::SaveMembers(self.registry.values().cloned().collect()));
        }
        io.push(Io::Unwatch {
            pane: member.pane.clone(),
        });
        let open: Vec<Ticket> = self
            .tickets
            .open_for(target)
            .iter()
            .map(|r| r.ticket)
            .collect();
        for ticket in &open {
            self.apply(*ticket, TicketEvent::MemberGone(cause.to_owned()), now);
            self.settle(*ticket, now);
        }
        if !open.is_empty() {
            io.push(Io::Notice {
                target: target.clone(),
                ticket: open.first().copied(),
                kind: MessageKind::Incident,
                text: format!(
                    "[fleet] member {target} was released ({cause}); its open tickets failed: {}",
                    open.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let effects = self.injector.handle_at(
            InjectorInput::MemberRemoved {
                target: target.clone(),
            },
            now,
        );
        self.injector_effects(effects, now, io);
        let effects = self.push.handle_at(
            PushInput::Unbound {
                target: target.clone(),
            },
            now,
        );
        self.push_effects(effects, now, io);
        // Questions of a released member can never be answered in its pane.
        let asked: Vec<String> = self
            .questions
            .iter()
            .filter(|(_, q)| q.target == *target)
            .map(|(id, _)| id.clone())
            .collect();
        for id in asked {
            self.questions.remove(&id);
            let effects = self
                .push
                .handle_at(PushInput::QuestionClosed { question_id: id }, now);
            self.push_effects(effects, now, io);
        }
        Some(member.pane)
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
                AgentStatus::Idle | AgentStatus::Done | AgentStatus::Blocked => {
                    LeadActivity::Receptive
                }
                AgentStatus::Working => LeadActivity::Busy,
                AgentStatus::Unknown => LeadActivity::Unknown,
            };
            let effects = self
                .push
                .handle_at(PushInput::LeadStatus { lead, activity }, now);
            self.push_effects(effects, now, io);
        }
    }

    pub(super) fn set_status(
        &mut self,
        target: &Target,
        terminal: Option<&TerminalId>,
        status: AgentStatus,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let Some(member) = self.members.get_mut(target) else {
            return;
        };
        if terminal.is_some_and(|t| *t != member.terminal) {
            return; // A reading of another incarnation of the pane.
        }
        member.status = status;
        member.idle_since = match (status.is_at_rest(), member.idle_since) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(now),
            (false, _) => None,
        };
        let activity = match status {
            AgentStatus::Idle | AgentStatus::Done => Activity::AtRest,
            AgentStatus::Working | AgentStatus::Blocked => Activity::Busy,
            AgentStatus::Unknown => Activity::Unknown,
        };
        let effects = self.injector.handle_at(
            InjectorInput::Activity {
                target: target.clone(),
                activity,
            },
            now,
        );
        self.injector_effects(effects, now, io);
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

    pub(super) fn typed(
        &mut self,
        target: Target,
        ticket: Ticket,
        ok: bool,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let effects = self
            .injector
            .handle_at(InjectorInput::Typed { target, ticket, ok }, now);
        self.injector_effects(effects, now, io);
    }

    pub(super) fn fallback_recorded(&mut self, target: Target, now: Timestamp, io: &mut Vec<Io>) {
        let effects = self
            .injector
            .handle_at(InjectorInput::FallbackRecorded { target }, now);
        self.injector_effects(effects, now, io);
    }

    pub(super) fn injected(
        &mut self,
        lead: LeadId,
        outcome: InjectOutcome,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        if outcome == InjectOutcome::NotFound {
            self.lead_gone(&lead, now, io);
            return;
        }
        let effects = self
            .push
            .handle_at(PushInput::Injected { lead, outcome }, now);
        self.push_effects(effects, now, io);
    }

    /// Time passed: deadlines, retention, the idle reaper.
    pub(super) fn tick(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let effects = self.injector.handle_at(InjectorInput::Tick, now);
        self.injector_effects(effects, now, io);
        let effects = self.push.handle_at(PushInput::Tick, now);
        self.push_effects(effects, now, io);
        self.scan_if_due(now, io);
        self.rewatch_due(now, io);
        let pruned = self.tickets.prune_at(now);
        if !pruned.is_empty() {
            self.ticket_gauges();
        }
        for ticket in pruned {
            self.tasks.remove(&ticket);
            self.replies.remove(&ticket);
            self.waiters.remove(&ticket);
        }
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

    fn injector_effects(&mut self, effects: Vec<InjectorEffect>, now: Timestamp, io: &mut Vec<Io>) {
        for effect in effects {
            match effect {
                InjectorEffect::Type { target, ticket } => {
                    let Some(pane) = self.members.get(&target).map(|m| m.pane.clone()) else {
                        continue;
                    };
                    let task = self
                        .tasks
                        .get(&ticket)
                        .map(String::as_str)
                        .unwrap_or_default();
                    let text = fleetd_core::plan_injection(task, ticket, self.max_inject)
                        .text()
                        .to_owned();
                    io.push(Io::Type {
                        target,
                        ticket,
                        pane,
                        text,
                    });
                }
                InjectorEffect::Resubmit { target, ticket } => {
                    if let Some(pane) = self.members.get(&target).map(|m| m.pane.clone()) {
                        io.push(Io::Enter {
                            target,
                            ticket,
                            pane,
                        });
                    }
                }
                InjectorEffect::RecordFallback { target, ticket } => {
                    match self.members.get(&target) {
                        Some(m) => io.push(Io::Fallback {
                            target,
                            ticket,
                            pane: m.pane.clone(),
                        }),
                        None => {
                            let effects = self
                                .injector
                                .handle_at(InjectorInput::FallbackRecorded { target }, now);
                            self.injector_effects(effects, now, io);
                        }
                    }
                }
                InjectorEffect::Ticket { ticket, event } => {
                    let stalled = event == TicketEvent::Stalled;
                    if self.apply(ticket, event, now) {
                        let settled_waiter = self.settle(ticket, now);
                        if stalled
                            && !settled_waiter
                            && let TicketLookup::Live(r) = self.tickets.get_at(ticket, now)
                        {
                            io.push(Io::Notice {
                                target: r.target.clone(),
                                ticket: Some(ticket),
                                kind: MessageKind::Incident,
                                text: format!("[fleet] ticket {ticket} to {} stalled: the member did not start working after the task was typed and Enter pressed again", r.target),
                            });
                        }
                    }
                }
            }
        }
    }

    fn push_effects(&mut self, effects: Vec<PushEffect>, now: Timestamp, io: &mut Vec<Io>) {
        let mut pending_gone = Vec::new();
        for effect in effects {
            match effect {
                PushEffect::Inject { lead, text } => match self.leads.get(&lead) {
                    Some(l) => io.push(Io::Nudge {
                        lead,
                        pane: l.pane.clone(),
                        terminal: l.terminal.clone(),
                        text,
                    }),
                    None => {
                        // No pane is known for it (never seen, or forgotten): as good as gone,
                        // and the push loop must hear so or it waits on this nudge forever.
                        tracing::debug!(%lead, "nudge for a lead with no known pane");
                        pending_gone.push(lead);
                    }
                },
                PushEffect::ForgetBinding { target, lead } => {
                    tracing::info!(%target, %lead, "forgot delegation binding: the lead is gone");
                }
                PushEffect::Count(metric) => {
                    tracing::debug!(?metric, "push decision");
                    metrics::counter!("fleetd_nudges_total", "outcome" => metric.as_str())
                        .increment(1);
                }
                PushEffect::GaveUp { lead, reminders } => {
                    tracing::warn!(%lead, reminders, "stopped nudging: the lead has not read its mail; it stays in the inbox");
                }
            }
        }
        for lead in pending_gone {
            self.lead_gone(&lead, now, io);
        }
    }
}

fn view(r: &fleetd_core::TicketRecord) -> TicketView {
    TicketView {
        ticket: r.ticket,
        target: r.target.clone(),
        state: r.state,
        cause: r.cause.clone(),
        created_at: r.created_at,
        finished_at: r.finished_at,
    }
}

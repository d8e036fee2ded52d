//! The engine's durable state (SPEC §15): which parts of [`State`] a restart must not forget —
//! members (with their delegating lead), tickets (state, retention clock, task text, who sent
//! them, whether their task was ever typed), open questions (and which of other gateways' were
//! answered here, so a copy delivered again is not a new one), leads and the primary — as keyed
//! records for the `StateStore`. Mutations mark keys dirty; after each input the engine takes
//! the changed records as one batch ([`State::take_ops`]) and commits it before the tool that
//! caused it answers. At start [`State::restore`] rebuilds the state from the records.

use std::collections::BTreeSet;

use fleetd_core::injector::{InjectorInput, TypeOutcome};
use fleetd_core::push::{LeadId, PushInput};
use fleetd_core::{
    QualifiedPaneId, Target, TerminalId, Ticket, TicketEvent, TicketRecord, TicketState,
};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::super::NewMember;
use super::{Io, Lead, Member, Question, State};
use crate::store::{StateOp, StateRecord};

const MEMBER: &str = "member";
const TICKET: &str = "ticket";
const PRUNED: &str = "pruned";
const QUESTION: &str = "question";
const ANSWERED: &str = "answered";
const LEAD: &str = "lead";
const META: &str = "meta";
const PRIMARY: &str = "primary";
const WORKTREE: &str = "worktree";
const SPAWN_WORKTREE: &str = "worktree.spawn";
const OUTBOX: &str = "outbox";
const SPAWN: &str = "spawn";

/// Keys changed since the last batch.
#[derive(Debug, Default)]
pub(super) struct Dirty {
    pub(super) members: BTreeSet<Target>,
    pub(super) tickets: BTreeSet<Ticket>,
    pub(super) questions: BTreeSet<String>,
    /// Other gateways' questions answered here (`State::answered`).
    pub(super) answered: BTreeSet<String>,
    pub(super) leads: BTreeSet<LeadId>,
    pub(super) primary: bool,
    pub(super) worktrees: BTreeSet<Target>,
    /// Worktrees spawns are making.
    pub(super) spawn_worktrees: BTreeSet<Target>,
    pub(super) outbox: BTreeSet<u64>,
    /// Spawns across gateways (`remote_spawns::spawn_key`).
    pub(super) spawns: BTreeSet<String>,
    /// Wakes (MCP tasks), by id.
    pub(super) wakes: BTreeSet<String>,
    /// The lead rule's busy spans.
    pub(super) busy: bool,
    /// Model accounts, by id.
    pub(super) accounts: BTreeSet<u64>,
}

/// A ticket as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct TicketRow {
    pub(super) record: TicketRecord,
    /// The task text, until the ticket is pruned.
    #[serde(default)]
    pub(super) task: Option<String>,
    /// Who sent it: a lead's id, or a delegating member's name.
    #[serde(default)]
    pub(super) by: Option<String>,
    /// Its task was handed to the multiplexer at least once: after a restart it is never typed
    /// again (it may have arrived).
    #[serde(default)]
    pub(super) typed: bool,
    /// The gateway whose lead sent it, for a ticket of a member here that another gateway owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) owner: Option<fleetd_core::gateway::GatewayName>,
}

/// An open question as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuestionRow {
    target: Target,
    question: String,
    /// The gateway it travels with (`Question::peer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer: Option<fleetd_core::gateway::GatewayName>,
}

/// A lead as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeadRow {
    pane: QualifiedPaneId,
    terminal: TerminalId,
    seen_at: Timestamp,
}

/// What the records held, decoded.
#[derive(Debug, Default)]
pub(in crate::engine) struct Restored {
    members: Vec<NewMember>,
    tickets: Vec<TicketRow>,
    pruned: Vec<(Ticket, Timestamp)>,
    questions: Vec<(String, QuestionRow)>,
    answered: Vec<(String, Timestamp)>,
    leads: Vec<(LeadId, LeadRow)>,
    primary: Option<LeadId>,
    /// Released members' worktrees that were not settled yet.
    worktrees: Vec<(Target, crate::worktree::WorktreeInfo)>,
    /// Worktrees spawns were making, their members not registered then.
    spawn_worktrees: Vec<(Target, super::worktrees::SpawnWorktree)>,
    /// Messages for other gateways the broker had not confirmed.
    outbox: Vec<(u64, fleetd_core::gateway::Envelope)>,
    /// Spawns across gateways (key, JSON value).
    spawns: Vec<(String, String)>,
    /// Wakes (id, JSON value).
    wakes: Vec<(String, String)>,
    /// The lead rule's busy spans (JSON value).
    busy: Option<String>,
    /// Model accounts (id, JSON value).
    accounts: Vec<(String, String)>,
}

impl Restored {
    /// Decodes `records`; a record that does not decode is logged and skipped (its loss is
    /// named, never silent).
    pub(in crate::engine) fn decode(records: Vec<StateRecord>) -> Self {
        let mut out = Self::default();
        for record in records {
            let decoded = match record.kind.as_str() {
                MEMBER => serde_json::from_str(&record.value).map(|m| out.members.push(m)),
                TICKET => serde_json::from_str(&record.value).map(|t| out.tickets.push(t)),
                PRUNED => match Ticket::parse(&record.key) {
                    Ok(ticket) => {
                        serde_json::from_str(&record.value).map(|at| out.pruned.push((ticket, at)))
                    }
                    Err(_) => Ok(()),
                },
                QUESTION => serde_json::from_str(&record.value)
                    .map(|q| out.questions.push((record.key.clone(), q))),
                ANSWERED => serde_json::from_str(&record.value)
                    .map(|at| out.answered.push((record.key.clone(), at))),
                LEAD => serde_json::from_str(&record.value)
                    .map(|l| out.leads.push((LeadId(record.key.clone()), l))),
                OUTBOX => match record.key.parse::<u64>() {
                    Ok(seq) => {
                        serde_json::from_str(&record.value).map(|e| out.outbox.push((seq, e)))
                    }
                    Err(_) => Ok(()),
                },
                WORKTREE => match Target::new(record.key.as_str()) {
                    Ok(target) => serde_json::from_str(&record.value)
                        .map(|info| out.worktrees.push((target, info))),
                    Err(_) => Ok(()),
                },
                SPAWN_WORKTREE => match Target::new(record.key.as_str()) {
                    Ok(target) => serde_json::from_str(&record.value)
                        .map(|spawn| out.spawn_worktrees.push((target, spawn))),
                    Err(_) => Ok(()),
                },
                SPAWN => {
                    out.spawns.push((record.key.clone(), record.value.clone()));
                    Ok(())
                }
                super::standing::BUSY => {
                    out.busy = Some(record.value.clone());
                    Ok(())
                }
                super::wakes::WAKE => {
                    out.wakes.push((record.key.clone(), record.value.clone()));
                    Ok(())
                }
                super::spend::ACCOUNT => {
                    out.accounts
                        .push((record.key.clone(), record.value.clone()));
                    Ok(())
                }
                META if record.key == PRIMARY => {
                    serde_json::from_str::<Option<String>>(&record.value)
                        .map(|p| out.primary = p.map(LeadId))
                }
                _ => Ok(()),
            };
            if let Err(e) = decoded {
                tracing::error!(kind = %record.kind, key = %record.key, error = %e, "a fleet state record does not decode; it is skipped");
            }
        }
        out
    }

    /// Members from the legacy registry file (`members.json`), when the store has
    /// none yet: they are re-adopted like any other and written to the store.
    pub(in crate::engine) fn with_legacy_members(mut self, members: Vec<NewMember>) -> Self {
        if self.members.is_empty() {
            self.members = members;
        }
        self
    }

    /// Whether anything was kept.
    pub(in crate::engine) fn is_empty(&self) -> bool {
        self.members.is_empty()
            && self.tickets.is_empty()
            && self.questions.is_empty()
            && self.answered.is_empty()
            && self.leads.is_empty()
            && self.worktrees.is_empty()
            && self.spawn_worktrees.is_empty()
            && self.outbox.is_empty()
            && self.spawns.is_empty()
            && self.wakes.is_empty()
            && self.accounts.is_empty()
            && self.busy.is_none()
    }
}

fn put<T: Serialize>(kind: &str, key: String, value: &T) -> Option<StateOp> {
    match serde_json::to_string(value) {
        Ok(value) => Some(StateOp::Put(StateRecord {
            kind: kind.to_owned(),
            key,
            value,
        })),
        Err(e) => {
            tracing::error!(kind, %key, error = %e, "cannot encode a fleet state record");
            None
        }
    }
}

fn delete(kind: &str, key: String) -> StateOp {
    StateOp::Delete {
        kind: kind.to_owned(),
        key,
    }
}

impl State {
    /// The records changed since the last call, as one batch to commit.
    pub(in crate::engine) fn take_ops(&mut self) -> Vec<StateOp> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut ops = Vec::new();
        for target in dirty.members {
            match self.registry.get(&target) {
                Some(member) => {
                    let lead = self
                        .members
                        .get(&target)
                        .and_then(|m| m.lead.as_ref())
                        .and_then(|id| self.leads.get(id))
                        .map(|l| super::super::LeadRef {
                            pane: l.pane.clone(),
                            terminal: l.terminal.clone(),
                        });
                    let row = NewMember {
                        lead,
                        ..member.clone()
                    };
                    ops.extend(put(MEMBER, target.to_string(), &row));
                }
                None => ops.push(delete(MEMBER, target.to_string())),
            }
        }
        for ticket in dirty.tickets {
            match self.tickets.row(ticket) {
                Some(row) => ops.extend(put(TICKET, ticket.to_string(), &row)),
                None => {
                    ops.push(delete(TICKET, ticket.to_string()));
                    if let Some(at) = self.tickets.book.pruned_at(ticket) {
                        ops.extend(put(PRUNED, ticket.to_string(), &at));
                    }
                }
            }
        }
        for id in dirty.questions {
            match self.questions.get(&id) {
                Some(q) => {
                    let row = QuestionRow {
                        target: q.target.clone(),
                        question: q.text.clone(),
                        peer: q.peer.clone(),
                    };
                    ops.extend(put(QUESTION, id, &row));
                }
                None => ops.push(delete(QUESTION, id)),
            }
        }
        for id in dirty.answered {
            match self.answered.get(&id) {
                Some(at) => ops.extend(put(ANSWERED, id, at)),
                None => ops.push(delete(ANSWERED, id)),
            }
        }
        for id in dirty.leads {
            match self.leads.get(&id) {
                Some(l) => {
                    let row = LeadRow {
                        pane: l.pane.clone(),
                        terminal: l.terminal.clone(),
                        seen_at: l.seen_at,
                    };
                    ops.extend(put(LEAD, id.0, &row));
                }
                None => ops.push(delete(LEAD, id.0)),
            }
        }
        if dirty.primary {
            let primary = self.push.primary().map(|l| l.0.clone());
            ops.extend(put(META, PRIMARY.to_owned(), &primary));
        }
        for seq in dirty.outbox {
            let key = super::gateway::outbox_key(seq);
            match self.outbox.get(&seq) {
                Some(envelope) => ops.extend(put(OUTBOX, key, envelope)),
                None => ops.push(delete(OUTBOX, key)),
            }
        }
        for target in dirty.worktrees {
            match self.pending_worktrees.get(&target) {
                Some(info) => ops.extend(put(WORKTREE, target.to_string(), info)),
                None => ops.push(delete(WORKTREE, target.to_string())),
            }
        }
        for target in dirty.spawn_worktrees {
            match self.spawn_worktrees.get(&target) {
                Some(spawn) => ops.extend(put(SPAWN_WORKTREE, target.to_string(), spawn)),
                None => ops.push(delete(SPAWN_WORKTREE, target.to_string())),
            }
        }
        ops.extend(dirty.wakes.into_iter().filter_map(|id| self.wake_op(id)));
        ops.extend(
            dirty
                .accounts
                .into_iter()
                .filter_map(|id| self.account_op(id)),
        );
        if dirty.busy {
            ops.extend(self.busy_op());
        }
        for key in dirty.spawns {
            match self.spawn_record(&key) {
                Some(Ok(value)) => ops.push(StateOp::Put(StateRecord {
                    kind: SPAWN.to_owned(),
                    key,
                    value,
                })),
                Some(Err(e)) => {
                    tracing::error!(%key, error = %e, "cannot encode a spawn record");
                }
                None => ops.push(delete(SPAWN, key)),
            }
        }
        ops
    }

    /// Rebuilds the state kept before a restart. Leads are watched again (a gone one is found
    /// out as ever); members are checked against their panes (`Io::Adopt`: one that is gone is
    /// released through the one release path, cause `gone`); a queued task is queued again in
    /// its place, and a task typed before the restart is never typed again (its turn becomes
    /// the member's current one); open questions are open again; tickets read their state.
    pub(in crate::engine) fn restore(&mut self, kept: Restored, now: Timestamp, io: &mut Vec<Io>) {
        if kept.is_empty() {
            return;
        }
        tracing::info!(
            members = kept.members.len(),
            tickets = kept.tickets.len(),
            questions = kept.questions.len(),
            leads = kept.leads.len(),
            "restoring the fleet state kept before the restart"
        );
        for (target, info) in kept.worktrees {
            // Released before the restart, its worktree not yet settled: settle it now.
            self.settle_worktree(&target, info, None, io);
        }
        let mut outbox = kept.outbox;
        outbox.sort_by_key(|(seq, _)| *seq);
        for (seq, envelope) in outbox {
            // Not confirmed before the restart: sent again (the receiver takes each once).
            self.outbox_seq = self.outbox_seq.max(seq);
            self.outbox.insert(seq, envelope);
            self.to_forward.push(seq);
        }
        for (key, value) in kept.spawns {
            self.restore_spawn(&key, &value, now);
        }
        for (key, value) in kept.accounts {
            self.restore_account(&key, &value);
        }
        self.publish_all_gauges();
        for (id, value) in kept.wakes {
            self.restore_wake(id, &value);
        }
        if let Some(value) = kept.busy {
            self.restore_busy(&value);
        }
        for (id, row) in kept.leads {
            io.push(Io::Watch {
                pane: row.pane.clone(),
            });
            self.leads.insert(
                id,
                Lead {
                    pane: row.pane,
                    terminal: row.terminal,
                    seen_at: row.seen_at,
                },
            );
        }
        if let Some(primary) = kept.primary.filter(|p| self.leads.contains_key(p)) {
            self.set_primary(Some(primary), now, io);
        }
        for member in kept.members {
            self.restore_member(member, now, io);
        }
        // After the members and leads: whether a member claims each, and whom to tell.
        self.restore_spawn_worktrees(kept.spawn_worktrees, now, io);
        let mut tickets = kept.tickets;
        tickets.sort_by_key(|row| row.record.ticket);
        for row in tickets {
            self.restore_ticket(row, now, io);
        }
        for (ticket, at) in kept.pruned {
            self.tickets.book.restore_pruned(ticket, at);
        }
        self.answered.extend(kept.answered);
        for (id, row) in kept.questions {
            // A question of a member on another host has no member here: it stays open until
            // its lead answers it (the answer goes to that host).
            let remote = row.target.gateway().is_some() && row.peer.is_some();
            if !remote && !self.members.contains_key(&row.target) {
                self.dirty.questions.insert(id);
                continue;
            }
            // A member's question that went to another gateway is that gateway's to nudge about.
            if remote || row.peer.is_none() {
                self.feed_push(
                    PushInput::QuestionOpened {
                        target: row.target.clone(),
                        question_id: id.clone(),
                    },
                    now,
                    io,
                );
            }
            self.questions.insert(
                id,
                Question {
                    target: row.target,
                    text: row.question,
                    waiter: None,
                    peer: row.peer,
                },
            );
        }
        self.ticket_gauges();
        // Replies stored just before the restart may not have settled their tickets yet.
        for target in self.members.keys() {
            let tickets: BTreeSet<Ticket> = self.tickets.open_tickets(target);
            if !tickets.is_empty() {
                io.push(Io::Reconcile {
                    target: target.clone(),
                    tickets,
                });
            }
        }
    }

    /// A member kept before the restart: registered again as it was (present — it was
    /// connected — and bound to its lead when that lead is known), then checked against its pane.
    fn restore_member(&mut self, member: NewMember, now: Timestamp, io: &mut Vec<Io>) {
        let target = member.target.clone();
        let lead = member
            .lead
            .as_ref()
            .map(Self::lead_id)
            .filter(|id| self.leads.contains_key(id));
        self.registry.insert(target.clone(), member.clone());
        self.by_pane.insert(member.pane.clone(), target.clone());
        self.members.insert(
            target.clone(),
            Member {
                profile: member.profile.clone(),
                pane: member.pane.clone(),
                terminal: member.terminal.clone(),
                status: fleetd_core::AgentStatus::Unknown,
                allow_delegation: member.allow_delegation,
                lead: lead.clone(),
                backend: member.backend.clone(),
                unmapped: false,
                joined_at: now,
                idle_since: None,
                idle_timeout: member
                    .idle_timeout_secs
                    .and_then(|s| i64::try_from(s).ok())
                    .map(jiff::SignedDuration::from_secs),
                worktree_state: None,
            },
        );
        if let Some(model) = &member.model {
            self.open_account(&target, &member.profile, model, now);
        }
        self.inspect_worktree(&target, io);
        // Written again: a member imported from the legacy file reaches the store.
        self.dirty.members.insert(target.clone());
        for input in [
            InjectorInput::MemberAdded {
                target: target.clone(),
            },
            InjectorInput::PresenceSeen {
                target: target.clone(),
            },
        ] {
            self.inject(input, now, io);
        }
        if let Some(lead) = lead {
            self.feed_push(PushInput::Bound { target, lead }, now, io);
        }
        io.push(Io::Adopt(Box::new(member)));
    }

    /// A ticket kept before the restart.
    fn restore_ticket(&mut self, row: TicketRow, now: Timestamp, io: &mut Vec<Io>) {
        let ticket = row.record.ticket;
        let target = row.record.target.clone();
        let state = row.record.state;
        let typed = row.typed;
        self.tickets.restore(row);
        if state.is_terminal() || target.gateway().is_some() {
            // (A ticket for a member on another host moves as that host reports.)
            return;
        }
        if !self.members.contains_key(&target) {
            // Its member is not kept (released before the restart): it can never finish.
            self.apply(ticket, TicketEvent::MemberGone("gone".to_owned()), now);
            return;
        }
        match state {
            TicketState::Queued if !typed => {
                self.inject(InjectorInput::Enqueue { target, ticket }, now, io);
            }
            TicketState::Queued => {
                // Handed to the multiplexer, never confirmed: the kill may have come before or
                // after it reached the pane. The pane says which; until it has, nothing else
                // is typed into that member.
                self.injector.restore_typing(&target, ticket);
                if let Some(pane) = self.members.get(&target).map(|m| m.pane.clone()) {
                    let text = self.injection_text(ticket);
                    io.push(Io::FindTyped {
                        target,
                        ticket,
                        pane,
                        text,
                    });
                }
            }
            _ => self.injector.restore_current(&target, ticket),
        }
    }
}

impl State {
    /// What the pane said of a task in doubt after a restart. Not there and the member at rest:
    /// it never arrived, and is typed again, first in its lane. There (or the member busy, or
    /// the pane unreadable): it may have arrived, so it is verified as an uncertain typing —
    /// a busy member is its turn; one still at rest after the grace gets the one Enter retry
    /// (a text left in the input line by a kill between typing and Enter is submitted), then
    /// the ticket is stalled. Nothing happens when the doubt was settled meanwhile (the member
    /// was seen busy, or released).
    pub(in crate::engine) fn typed_found(
        &mut self,
        target: &Target,
        ticket: Ticket,
        arrived: bool,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        if self.injector.typing(target) != Some(ticket) {
            return;
        }
        let outcome = if arrived {
            TypeOutcome::Uncertain
        } else {
            tracing::info!(%target, %ticket, "a task typed just before the restart never reached its pane; typing it again");
            TypeOutcome::Failed
        };
        self.typed(target, ticket, outcome, now, io);
    }
}

//! Delegation trees (SPEC §7): a member whose profile allows delegation acts as the lead of the
//! members it spawns or sends to — their replies, questions and nudges go to it, typed into its
//! own pane and gated by its own status like any lead's — within `maxDelegationDepth` (a lead is
//! depth 0, its members 1, theirs 2) and `maxMembersPerLead`. A delegating member is kept as a
//! lead (`leads`, keyed by its pane) for as long as it is a member; it is never a primary.
//!
//! A member waiting on its own members is not done with its task: while it has delegated work
//! outstanding (tickets it sent still open, its members' replies or questions unread), a turn
//! it ends without a reply gets no fallback ([`InjectorInput::Delegating`]).
//!
//! A delegating member's powers over other members stop at its subtree ([`State::reach`]): it
//! may stop, read, acknowledge and answer only members whose chain of delegating leads includes
//! it. Leads and the operator act on any member.
//!
//! Releasing a delegating member re-parents its members to its own lead (the primary when it
//! had none): they keep working, their open tickets, replies and questions stay where they are
//! and are nudged to that lead from then on, and that lead is told which members it took over.
//! Releasing them too would throw away work in flight that nobody asked to stop.

use fleetd_core::access::Refusal;
use fleetd_core::injector::InjectorInput;
use fleetd_core::push::{LeadId, PushInput};
use fleetd_core::refusal::Code;
use fleetd_core::{MessageKind, Target};
use jiff::Timestamp;

use super::super::LeadRef;
use super::{Io, State};

/// Who is asking for a member: a lead in a pane, a delegating member, or the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegator {
    /// A lead, by its pane.
    Lead(LeadRef),
    /// A member whose profile allows delegation.
    Member(Target),
    /// The operator (the CLI, the token): members it starts belong to no lead.
    Operator,
}

/// How far a tree may grow, as last configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct TreeLimits {
    pub(in crate::engine) max_depth: u64,
    pub(in crate::engine) max_members_per_lead: u64,
}

impl TreeLimits {
    pub(in crate::engine) fn from_config(config: &crate::config::Config) -> Self {
        Self {
            max_depth: config.max_delegation_depth,
            max_members_per_lead: config.max_members_per_lead,
        }
    }
}

/// How long a nudge typed into a delegating member's pane keeps its next task back when the
/// member is not seen busy before (an agent that ignored the nudge).
const NUDGE_HOLD: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// The longest chain walked up a tree: deeper than any configured depth, so a cycle (which
/// nothing should make) cannot hang the engine.
const MAX_WALK: usize = 64;

impl State {
    /// The member `lead` is, when it is a delegating member's pane.
    pub(super) fn member_of_lead(&self, lead: &LeadId) -> Option<Target> {
        self.members
            .iter()
            .find(|(_, m)| m.pane.to_string() == lead.0)
            .map(|(t, _)| t.clone())
    }

    /// The member `target` reports to, when that is a delegating member.
    pub(in crate::engine) fn delegator_of(&self, target: &Target) -> Option<Target> {
        let lead = self.members.get(target)?.lead.as_ref()?;
        self.member_of_lead(lead)
    }

    /// `target`'s depth: 1 under a lead (or the operator), one more per delegating member above.
    pub(in crate::engine) fn depth_of(&self, target: &Target) -> u64 {
        let mut depth = 1;
        let mut at = target.clone();
        for _ in 0..MAX_WALK {
            match self.delegator_of(&at) {
                Some(up) => {
                    depth += 1;
                    at = up;
                }
                None => break,
            }
        }
        depth
    }

    /// How many levels hang below `target` (0 for a member with no members of its own).
    fn height_of(&self, target: &Target, walked: usize) -> u64 {
        if walked >= MAX_WALK {
            return 0;
        }
        self.children_of(&Self::member_lead_id(self, target))
            .iter()
            .map(|c| 1 + self.height_of(c, walked + 1))
            .max()
            .unwrap_or(0)
    }

    /// The lead id a member has as a delegator (its pane).
    fn member_lead_id(&self, target: &Target) -> LeadId {
        LeadId(
            self.members
                .get(target)
                .map(|m| m.pane.to_string())
                .unwrap_or_default(),
        )
    }

    /// The members bound to `lead`.
    fn children_of(&self, lead: &LeadId) -> Vec<Target> {
        self.members
            .iter()
            .filter(|(_, m)| m.lead.as_ref() == Some(lead))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Whether `maybe` is `target` or above it in its tree.
    fn is_ancestor_or_self(&self, maybe: &Target, target: &Target) -> bool {
        let mut at = target.clone();
        for _ in 0..MAX_WALK {
            if at == *maybe {
                return true;
            }
            match self.delegator_of(&at) {
                Some(up) => at = up,
                None => return false,
            }
        }
        false
    }

    /// Whether delegating member `by` may act on `target` (`tool`: what it asked, for the
    /// refusal): only on its subtree — the members whose chain of delegating leads includes
    /// `by`: those it spawned, theirs, and so on down. Not itself, a member above or beside it,
    /// another lead's member, or a member on another host (a tree does not span hosts). A
    /// released member counts while its binding lasts (its inbox holds mail for its lead).
    pub(in crate::engine) fn reach(
        &self,
        by: &Target,
        target: &Target,
        tool: &str,
    ) -> Result<(), Refusal> {
        let first = match self.members.get(target) {
            Some(m) => m.lead.clone(),
            None => self.push.binding(target).cloned(),
        };
        let mut at = first.and_then(|lead| self.member_of_lead(&lead));
        for _ in 0..MAX_WALK {
            match at {
                Some(up) if up == *by => return Ok(()),
                Some(up) => at = self.delegator_of(&up),
                None => break,
            }
        }
        Err(Refusal::new(
            Code::NotYourMember,
            format!(
                "{tool} refused: {target} is not in your delegation tree. You are member {by}, and a delegating member may act only on its subtree, the members it spawned and theirs (fleet_list shows each member's delegator); ask your lead to act on {target}"
            ),
        ))
    }

    /// [`State::reach`] for the member that asked question `id` (an unknown question passes:
    /// answering it says it is unknown).
    pub(in crate::engine) fn reach_question(
        &self,
        by: &Target,
        id: &str,
        tool: &str,
    ) -> Result<(), Refusal> {
        match self.questions.get(id) {
            Some(q) => self.reach(by, &q.target, tool),
            None => Ok(()),
        }
    }

    /// The lead a delegating member is to the members it adopts, checked against the depth
    /// limit: a member at `maxDelegationDepth` may not spawn or send.
    fn member_as_lead(&self, by: &Target, action: &str) -> Result<LeadRef, Refusal> {
        let Some(m) = self.members.get(by) else {
            return Err(Refusal::new(
                Code::UnknownTarget,
                format!("member {by} is gone"),
            ));
        };
        let depth = self.depth_of(by);
        let max = self.tree.max_depth;
        if depth >= max {
            return Err(Refusal::new(
                Code::DelegationTooDeep,
                format!(
                    "you are member {by} at depth {depth} of its delegation tree (the lead is 0), and maxDelegationDepth is {max}: you may not {action}; do the work yourself, or reply and let your lead delegate it"
                ),
            ));
        }
        Ok(LeadRef {
            pane: m.pane.clone(),
            terminal: m.terminal.clone(),
        })
    }

    /// `lead` may take one more member (a spawn): refused at `maxMembersPerLead`, counting the
    /// spawns it has under way.
    fn room_for_one_more(&self, lead: &LeadId, who: &str) -> Result<(), Refusal> {
        let max = self.tree.max_members_per_lead;
        let now = u64::try_from(
            self.children_of(lead).len()
                + self.reserved_for.values().filter(|l| *l == lead).count(),
        )
        .unwrap_or(u64::MAX);
        if now >= max {
            return Err(Refusal::new(
                Code::TooManyMembers,
                format!(
                    "{who} has {now} members already, the most one lead may have (maxMembersPerLead = {max}): stop one (fleet_stop) or hand the work to one you have"
                ),
            ));
        }
        Ok(())
    }

    /// Checks a spawn for `delegator` against the tree's limits; the lead its member will have.
    pub(super) fn spawn_lead(&self, delegator: &Delegator) -> Result<Option<LeadRef>, Refusal> {
        match delegator {
            Delegator::Operator => Ok(None),
            Delegator::Lead(lead) => {
                self.room_for_one_more(&Self::lead_id(lead), "this lead")?;
                Ok(Some(lead.clone()))
            }
            Delegator::Member(by) => {
                let lead = self.member_as_lead(by, "spawn members")?;
                self.room_for_one_more(&Self::lead_id(&lead), &format!("member {by}"))?;
                Ok(Some(lead))
            }
        }
    }

    /// Checks a send by delegating member `by` to `target`: not to itself or above it in its
    /// tree, an existing member only within its subtree ([`State::reach`]), within the depth
    /// limit for `target`'s own subtree too, and within the width limit when `target` is not its
    /// own member yet (a sub-member's). The lead `target` will report to.
    pub(super) fn send_lead(&self, by: &Target, target: &Target) -> Result<LeadRef, Refusal> {
        let lead = self.member_as_lead(by, "hand out tasks")?;
        if self.is_ancestor_or_self(target, by) {
            return Err(Refusal::new(
                Code::DelegationCycle,
                format!(
                    "{target} is you or a member above you in your delegation tree: reply to your task with fleet_reply instead of sending it work"
                ),
            ));
        }
        if self.members.contains_key(target) {
            // Only within its subtree: a member another lead (or the primary) delegated to is
            // not its to take over, as taking its work would hand it that member's replies,
            // nudges and its stop.
            self.reach(by, target, "fleet_send")?;
            let depth = self.depth_of(by) + 1 + self.height_of(target, 0);
            if depth > self.tree.max_depth {
                return Err(Refusal::new(
                    Code::DelegationTooDeep,
                    format!(
                        "{target} has members of its own: under you its tree would reach depth {depth}, past maxDelegationDepth ({})",
                        self.tree.max_depth
                    ),
                ));
            }
            let id = Self::lead_id(&lead);
            if self.members[target].lead.as_ref() != Some(&id) {
                self.room_for_one_more(&id, &format!("member {by}"))?;
            }
        }
        Ok(lead)
    }

    /// `lead` is a delegating member's pane taking a member: it is kept as a lead from now on
    /// (watched as one, nudged like one). Never a primary.
    pub(super) fn adopt_as_lead(&mut self, lead: &LeadRef, now: Timestamp, io: &mut Vec<Io>) {
        if self.by_pane.contains_key(&lead.pane) {
            self.register_lead(lead, now, io);
        }
    }

    /// Whether a nudge may be typed into `lead`'s pane now: yes for a lead, and for a delegating
    /// member unless a task of its own is being (or would now be) typed there; when yes, the
    /// member's next task is held back until the nudge's turn is seen.
    pub(super) fn member_pane_free(
        &mut self,
        lead: &LeadId,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> bool {
        let Some(member) = self.member_of_lead(lead) else {
            return true;
        };
        if self.injector.would_type(&member, now) {
            return false;
        }
        self.inject(
            InjectorInput::Hold {
                target: member,
                until: now.checked_add(NUDGE_HOLD).ok(),
            },
            now,
            io,
        );
        true
    }

    /// A nudge for `lead` was not typed after all: a delegating member's tasks go on.
    pub(super) fn release_hold(&mut self, lead: &LeadId, now: Timestamp, io: &mut Vec<Io>) {
        if let Some(member) = self.member_of_lead(lead) {
            self.inject(
                InjectorInput::Hold {
                    target: member,
                    until: None,
                },
                now,
                io,
            );
        }
    }

    /// Whether `lead` is a delegating member's pane (not a lead a person runs).
    pub(super) fn is_member_lead(&self, lead: &LeadId) -> bool {
        self.member_of_lead(lead).is_some()
    }

    /// Tells the injector, for every delegating member whose answer changed, whether it has
    /// delegated work outstanding. Run after every input, so it costs one pass over the open
    /// tickets and the questions whatever the number of delegating members, and
    /// nothing when none delegates.
    pub(in crate::engine) fn settle_delegation(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let leads: Vec<(Target, LeadId)> = self
            .leads
            .keys()
            .filter_map(|id| self.member_of_lead(id).map(|t| (t, id.clone())))
            .collect();
        if leads.is_empty() {
            return;
        }
        let senders: std::collections::HashSet<&str> = self
            .tickets
            .sent_by
            .iter()
            .filter(|(ticket, _)| {
                matches!(self.tickets.book.get_at(**ticket, now),
                    fleetd_core::TicketLookup::Live(r) if !r.state.is_terminal())
            })
            .map(|(_, by)| by.as_str())
            .collect();
        let asking: std::collections::HashSet<&Target> =
            self.questions.values().map(|q| &q.target).collect();
        let mut changed = Vec::new();
        for (member, id) in leads {
            let outstanding = senders.contains(member.to_string().as_str())
                || self.children_of(&id).iter().any(|c| {
                    self.raw_depth.get(c).copied().unwrap_or(0) > 0
                        || self.depth_pending.contains(c)
                        || asking.contains(c)
                });
            if self.delegating.contains(&member) != outstanding {
                changed.push((member, outstanding));
            }
        }
        for (member, outstanding) in changed {
            if outstanding {
                self.delegating.insert(member.clone());
            } else {
                self.delegating.remove(&member);
            }
            tracing::debug!(%member, outstanding, "delegated work");
            self.inject(
                InjectorInput::Delegating {
                    target: member,
                    outstanding,
                },
                now,
                io,
            );
        }
    }

    /// `gone` was a delegating member: its members now report to its own lead (the primary
    /// when it had none), which is told (whether a notice went to `gone`'s inbox is returned);
    /// the tickets it sent are that lead's to read.
    pub(super) fn reparent(
        &mut self,
        gone: &Target,
        pane: &str,
        heir: Option<&LeadId>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> bool {
        let id = LeadId(pane.to_owned());
        let orphans = self.children_of(&id);
        self.delegating.remove(gone);
        let notified = !orphans.is_empty();
        if notified {
            let heir_by = heir.map(|l| {
                self.member_of_lead(l)
                    .map_or_else(|| l.0.clone(), |t| t.to_string())
            });
            for orphan in &orphans {
                if let Some(m) = self.members.get_mut(orphan) {
                    m.lead = heir.cloned();
                }
                self.dirty.members.insert(orphan.clone());
                let input = match heir {
                    Some(lead) => PushInput::Bound {
                        target: orphan.clone(),
                        lead: lead.clone(),
                    },
                    None => PushInput::Unbound {
                        target: orphan.clone(),
                    },
                };
                self.feed_push(input, now, io);
            }
            let name = gone.to_string();
            for by in self.tickets.sent_by.values_mut().filter(|by| **by == name) {
                match &heir_by {
                    Some(heir) => by.clone_from(heir),
                    None => *by = "operator".to_owned(),
                }
            }
            let list = orphans
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            tracing::info!(member = %gone, members = %list, "a delegating member was released; its members report to its lead now");
            io.push(Io::Notice {
                target: gone.clone(),
                ticket: None,
                kind: MessageKind::Incident,
                text: format!(
                    "[fleet] {gone} was released while it led {list}: they keep working and report to you now (fleet_list shows them; fleet_stop ends them)"
                ),
            });
        }
        if self.leads.contains_key(&id) {
            self.lead_gone(&id, now, io);
        }
        notified
    }
}

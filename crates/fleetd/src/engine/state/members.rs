//! Members: registering, re-adopting and releasing them (the one release path), their statuses,
//! names, presence and backend incidents.

use crate::events::FleetEvent;
use fleetd_core::access::Refusal;
use fleetd_core::injector::{Activity, InjectorInput};
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use fleetd_core::{
    AgentStatus, MessageKind, QualifiedPaneId, Target, TerminalId, Ticket, TicketEvent,
};
use jiff::{SignedDuration, Timestamp};

use tokio::sync::oneshot;

use super::super::{MemberView, NewMember, Readiness};
use super::{Io, Member, NAMES, RESERVATION_TTL, SEEN_PANES, State};

impl State {
    pub(in crate::engine) fn member_at(
        &self,
        pane: &QualifiedPaneId,
        terminal: &TerminalId,
    ) -> Option<(Target, bool)> {
        let target = self.by_pane.get(pane)?;
        let m = self.members.get(target)?;
        (m.terminal == *terminal).then(|| (target.clone(), m.allow_delegation))
    }

    /// The member that runs as user `uid` (`runAs`), if one is here.
    pub(in crate::engine) fn member_of_user(&self, uid: u32) -> Option<(Target, bool)> {
        let (target, _) = self
            .registry
            .iter()
            .find(|(_, new)| new.user.as_ref().is_some_and(|u| u.uid == uid))?;
        let m = self.members.get(target)?;
        Some((target.clone(), m.allow_delegation))
    }

    /// A backend health reading. A transition (up → down, down → up) is an incident in the inbox
    /// of every member on that backend, which nudges their leads; a repeated reading is nothing.
    pub(in crate::engine) fn backend_health(
        &mut self,
        name: &str,
        down: Option<String>,
        io: &mut Vec<Io>,
    ) {
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
        self.incident("backend", |m| m.backend.as_deref() == Some(name), &text, io);
    }

    /// A reload was applied: members whose backend is no longer configured are `unmapped`.
    pub(in crate::engine) fn config_reloaded(
        &mut self,
        config: &crate::config::Config,
        io: &mut Vec<Io>,
    ) {
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
            let text = format!(
                "[fleet] incident: backend {backend} was removed from the configuration; this member keeps running on the settings it was started with — stop it or add the backend back"
            );
            self.incident_to("unmapped", vec![target], &text, io);
        }
        self.emit(FleetEvent::ConfigReloaded);
    }

    /// Publishes `text` as an incident to every member `which` selects.
    pub(super) fn incident(
        &mut self,
        kind: &str,
        which: impl Fn(&Member) -> bool,
        text: &str,
        io: &mut Vec<Io>,
    ) {
        let targets: Vec<Target> = self
            .members
            .iter()
            .filter(|(_, m)| which(m))
            .map(|(t, _)| t.clone())
            .collect();
        self.incident_to(kind, targets, text, io);
    }

    /// Publishes `text` as an incident to `targets` (each an inbox): on `/events` once, when
    /// there are any, and a notice in each inbox.
    pub(super) fn incident_to(
        &mut self,
        kind: &str,
        targets: Vec<Target>,
        text: &str,
        io: &mut Vec<Io>,
    ) {
        if !targets.is_empty() {
            self.emit(FleetEvent::Incident {
                kind: kind.to_owned(),
                targets: targets.iter().map(ToString::to_string).collect(),
                text: text.to_owned(),
            });
        }
        for target in targets {
            io.push(Io::Notice {
                target,
                ticket: None,
                kind: MessageKind::Incident,
                text: text.to_owned(),
            });
        }
    }

    pub(in crate::engine) fn presence(
        &mut self,
        target: &Target,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        self.inject(
            InjectorInput::PresenceSeen {
                target: target.clone(),
            },
            now,
            io,
        );
        self.ready_check(target);
    }

    /// Whether `target` is ready for a task: its agent at rest and its MCP presence seen (what
    /// the injector waits for before it types a task).
    fn is_ready(&self, target: &Target) -> bool {
        self.members
            .get(target)
            .is_some_and(|m| m.status.is_at_rest())
            && self.injector.presence(target)
    }

    /// Answers `reply` once `target` is ready, or gone.
    pub(in crate::engine) fn when_ready(
        &mut self,
        target: Target,
        reply: oneshot::Sender<Readiness>,
    ) {
        if !self.members.contains_key(&target) {
            let _ = reply.send(Readiness::Gone);
        } else if self.is_ready(&target) {
            let _ = reply.send(Readiness::Ready);
        } else {
            let waiters = self.ready_waiters.entry(target).or_default();
            // A waiter that gave up (timed out) is dropped here rather than kept to the end.
            waiters.retain(|w| !w.is_closed());
            waiters.push(reply);
        }
    }

    /// Fires the readiness waiters of `target` if it is ready now.
    fn ready_check(&mut self, target: &Target) {
        if self.is_ready(target)
            && let Some(waiters) = self.ready_waiters.remove(target)
        {
            for waiter in waiters {
                let _ = waiter.send(Readiness::Ready);
            }
        }
    }

    pub(in crate::engine) fn pane_seen(
        &mut self,
        pane: QualifiedPaneId,
        terminal: TerminalId,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        // The member may have been registered between the caller's lookup and this message.
        if let Some((target, _)) = self.member_at(&pane, &terminal) {
            self.presence(&target, now, io);
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

    pub(in crate::engine) fn list(&self) -> Vec<MemberView> {
        self.members
            .iter()
            .map(|(target, m)| self.member_view(target, m))
            .collect()
    }

    pub(super) fn member_view(&self, target: &Target, m: &Member) -> MemberView {
        MemberView {
            target: target.clone(),
            profile: m.profile.clone(),
            backend: m.backend.clone(),
            pane_id: m.pane.clone(),
            terminal_id: m.terminal.clone(),
            status: m.status,
            connected: self.injector.presence(target),
            queued: self.injector.queued(target),
            open_tickets: self.tickets.open_tickets(target),
            lead: m.lead.as_ref().map(|l| l.0.clone()),
            delegator: self.delegator_of(target),
            depth: self.depth_of(target),
            branch: self.worktree_view(target, m).map(|w| w.branch),
            worktree: self.worktree_view(target, m),
            joined_at: m.joined_at,
            usage: self.usage_of(target),
            tree_usage: self.tree_usage_of(target),
            run_as: (self.registry.get(target))
                .and_then(|n| n.user.as_ref().map(|u| u.name.clone())),
        }
    }

    /// Reserves a name for a spawn `delegator` asks for, once the tree's limits allow it; the
    /// lead the member will report to.
    pub(in crate::engine) fn reserve(
        &mut self,
        name: Option<String>,
        delegator: &super::Delegator,
        now: Timestamp,
    ) -> Result<(Target, Option<super::super::LeadRef>), Refusal> {
        let lead = self.spawn_lead(delegator)?;
        let taken = |t: &Target, s: &Self| s.members.contains_key(t) || s.reserved.contains_key(t);
        let target = match name {
            Some(name) => {
                let target = Target::local(name)
                    .map_err(|e| Refusal::new(Code::InvalidName, e.to_string()))?;
                if taken(&target, self) {
                    return Err(Refusal::new(
                        Code::NameTaken,
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
                .ok_or_else(|| Refusal::new(Code::NoName, "no free member name"))?,
        };
        self.reserved.insert(target.clone(), now);
        if let Some(lead) = &lead {
            self.reserved_for
                .insert(target.clone(), Self::lead_id(lead));
        }
        Ok((target, lead))
    }

    /// A spawn gave its name back, after taking back the worktree it made (if any).
    pub(in crate::engine) fn unreserve(&mut self, target: &Target) {
        self.reserved.remove(target);
        self.reserved_for.remove(target);
        self.spawn_worktree_done(target);
    }

    /// When the oldest name reservation expires.
    pub(super) fn reservations_expire(&self) -> Option<Timestamp> {
        let oldest = self.reserved.values().min()?;
        oldest.checked_add(RESERVATION_TTL).ok()
    }

    /// Gives back every name reserved longer than [`RESERVATION_TTL`] ago: its spawn is gone.
    pub(super) fn expire_reservations(&mut self, now: Timestamp) {
        self.reserved.retain(|target, at| {
            let live = at.checked_add(RESERVATION_TTL).is_ok_and(|until| now < until);
            if !live {
                tracing::warn!(%target, reserved_at = %at, "a name reservation outlived its spawn; the name is free again");
            }
            live
        });
        let reserved = &self.reserved;
        self.reserved_for
            .retain(|target, _| reserved.contains_key(target));
    }

    pub(in crate::engine) fn add_member(
        &mut self,
        new: NewMember,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        self.reserved.remove(&new.target);
        self.reserved_for.remove(&new.target);
        // In the batch that writes the member (with its worktree): never a moment on disk with
        // neither record.
        self.spawn_worktree_done(&new.target);
        if let Some(lead) = &new.lead {
            self.adopt_as_lead(lead, now, io);
        }
        self.emit(FleetEvent::MemberSpawned {
            target: new.target.to_string(),
            profile: new.profile.clone(),
            backend: new.backend.clone(),
            pane: new.pane.to_string(),
            lead: new.lead.as_ref().map(|l| Self::lead_id(l).0),
            branch: new.worktree.as_ref().map(|w| w.branch.clone()),
        });
        self.registry.insert(new.target.clone(), new.clone());
        self.dirty.members.insert(new.target.clone());
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
                worktree_state: None,
            },
        );
        if let Some(model) = &new.model
            && let Some(profile) = self.members.get(&new.target).map(|m| m.profile.clone())
        {
            self.open_account(&new.target, &profile, model, now);
        }
        self.inspect_worktree(&new.target, io);
        self.inject(
            InjectorInput::MemberAdded {
                target: new.target.clone(),
            },
            now,
            io,
        );
        let incarnation = (new.pane.clone(), self.members[&new.target].terminal.clone());
        if let Some(i) = self.seen.iter().position(|k| *k == incarnation) {
            // Its agent connected before the member was registered: that was its presence.
            self.seen.remove(i);
            self.presence(&new.target, now, io);
        }
        if let Some(lead) = lead {
            self.feed_push(
                PushInput::Bound {
                    target: new.target,
                    lead,
                },
                now,
                io,
            );
        }
        io.push(Io::Watch { pane: new.pane });
    }

    /// A member kept from before a restart was checked against its pane: still there, it is
    /// watched again; gone (its pane closed or holds another incarnation), it is released
    /// through the one release path, its open tickets failing with cause `gone`.
    pub(in crate::engine) fn adopted(
        &mut self,
        member: &NewMember,
        alive: bool,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let current = self
            .members
            .get(&member.target)
            .is_some_and(|m| m.pane == member.pane && m.terminal == member.terminal);
        if !current {
            return;
        }
        if alive {
            tracing::info!(target = %member.target, pane = %member.pane, "re-adopted a member from before the restart");
            io.push(Io::Watch {
                pane: member.pane.clone(),
            });
        } else {
            tracing::info!(target = %member.target, "a member from before the restart is gone");
            self.release(&member.target, "gone", now, io);
            // Both restarted: herdr may have restored the pane with a fresh shell.
            io.push(Io::CloseRestored {
                pane: member.pane.clone(),
                old: member.terminal.clone(),
            });
        }
    }

    /// The one release path: fails open tickets with `cause`, forgets bindings and the queue,
    /// and tells the lead through the inbox. Returns the pane.
    pub(in crate::engine) fn release(
        &mut self,
        target: &Target,
        cause: &str,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Option<QualifiedPaneId> {
        let member = self.members.remove(target)?;
        let heir = member.lead.clone();
        let worktree = self.registry.get(target).and_then(|m| m.worktree.clone());
        self.emit(FleetEvent::MemberReleased {
            target: target.to_string(),
            cause: cause.to_owned(),
        });
        self.by_pane.remove(&member.pane);
        for waiter in self.ready_waiters.remove(target).unwrap_or_default() {
            let _ = waiter.send(Readiness::Gone);
        }
        self.registry.remove(target);
        self.close_account(target);
        self.dirty.members.insert(target.clone());
        io.push(Io::Unwatch {
            pane: member.pane.clone(),
        });
        let open: Vec<Ticket> = self.tickets.open_tickets(target);
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
        } else {
            // Read again: an empty inbox of a gone member has no depth series.
            io.push(Io::Depth {
                target: target.clone(),
            });
        }
        self.inject(
            InjectorInput::MemberRemoved {
                target: target.clone(),
            },
            now,
            io,
        );
        let notified = self.reparent(target, &member.pane.to_string(), heir.as_ref(), now, io);
        // Its binding stays while its inbox holds mail (its last replies, the notices about it),
        // so its lead is nudged about them; `inbox_depth` drops it once the inbox is empty.
        // (A worktree's notice may come too: it settles first.)
        if let Some(info) = worktree {
            self.settle_worktree(
                target,
                info,
                Some((member.pane.clone(), member.terminal.clone())),
                io,
            );
        } else if open.is_empty()
            && !notified
            && self.raw_depth.get(target).copied().unwrap_or(0) == 0
        {
            self.feed_push(
                PushInput::Unbound {
                    target: target.clone(),
                },
                now,
                io,
            );
        }
        // Questions of a released member can never be answered in its pane.
        let asked: Vec<String> = self
            .questions
            .iter()
            .filter(|(_, q)| q.target == *target)
            .map(|(id, _)| id.clone())
            .collect();
        for id in asked {
            self.questions.remove(&id);
            self.emit(FleetEvent::QuestionClosed {
                question_id: id.clone(),
                target: target.to_string(),
                how: "released".to_owned(),
            });
            self.dirty.questions.insert(id.clone());
            self.feed_push(PushInput::QuestionClosed { question_id: id }, now, io);
        }
        Some(member.pane)
    }

    pub(in crate::engine) fn set_status(
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
        let changed = member.status != status;
        member.status = status;
        member.idle_since = match (status.is_at_rest(), member.idle_since) {
            (true, Some(since)) => Some(since),
            (true, None) => Some(now),
            (false, _) => None,
        };
        self.inject(
            InjectorInput::Activity {
                target: target.clone(),
                activity: activity_of(status),
            },
            now,
            io,
        );
        self.ready_check(target);
        if changed && status.is_at_rest() {
            // Its turn ended: what its worktree holds now.
            self.inspect_worktree(target, io);
        }
        if changed {
            self.emit(FleetEvent::MemberStatus {
                target: target.to_string(),
                status: status.as_str().to_owned(),
            });
        }
    }
}

/// What the injector needs to know of an agent status.
pub(super) fn activity_of(status: AgentStatus) -> Activity {
    match status {
        AgentStatus::Idle | AgentStatus::Done => Activity::AtRest,
        AgentStatus::Working | AgentStatus::Blocked => Activity::Busy,
        AgentStatus::Unknown => Activity::Unknown,
    }
}

//! Leads and the push loop: registering leads, the primary, the lead-tab scanner, watches that
//! must be retried, inbox depths and the nudges the push loop asks for.

use crate::events::FleetEvent;
use fleetd_core::push::{InjectOutcome, LeadId, PushConfig, PushEffect, PushInput, PushMetric};
use fleetd_core::{QualifiedPaneId, Target};
use jiff::{SignedDuration, Timestamp};

use super::super::LeadRef;
use super::super::lead_tabs::{LeadTabs, ScanChange, ScanPane};
use super::{Io, Lead, REWATCH_AFTER, State};

impl State {
    pub(in crate::engine) fn lead_id(lead: &LeadRef) -> LeadId {
        LeadId(lead.pane.to_string())
    }

    /// A lead called a lead tool. Without a pinned primary tab the first lead seen becomes the
    /// primary; with one, a scan decides whether this caller is in it.
    pub(in crate::engine) fn lead_seen(
        &mut self,
        lead: &LeadRef,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
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
    pub(super) fn register_lead(
        &mut self,
        lead: &LeadRef,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> bool {
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
        self.dirty.leads.insert(id.clone());
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

    pub(super) fn set_primary(&mut self, lead: Option<LeadId>, now: Timestamp, io: &mut Vec<Io>) {
        if self.push.primary() == lead.as_ref() {
            return;
        }
        match &lead {
            Some(l) => tracing::info!(lead = %l, "primary lead"),
            None => tracing::info!(
                "no primary lead: mail without a delegating lead waits for fleet_poll"
            ),
        }
        self.dirty.primary = true;
        self.feed_push(PushInput::Primary(lead), now, io);
    }

    /// A lead is affirmatively gone (pane closed, new incarnation, not-found answer): its
    /// bindings go, and mail falls back to the primary; a lost primary is replaced by the pinned
    /// tab's next lead (a scan is due at once) or, unpinned, by the lead seen most recently.
    pub(super) fn lead_gone(&mut self, lead: &LeadId, now: Timestamp, io: &mut Vec<Io>) {
        if self.leads.remove(lead).is_some() {
            tracing::info!(%lead, "lead gone");
            self.dirty.leads.insert(lead.clone());
        }
        // What its waits returned and it never called again to take is mail again.
        self.unhand_stale(Some(&lead.0), now, io);
        for (target, member) in &mut self.members {
            if member.lead.as_ref() == Some(lead) {
                member.lead = None;
                self.dirty.members.insert(target.clone());
            }
        }
        self.feed_push(PushInput::LeadGone { lead: lead.clone() }, now, io);
        if self.push.primary().is_none() {
            if self.lead_tabs.primary_pinned() {
                self.lead_tabs.expire();
            } else {
                // A delegating member's pane is a lead only to its own members.
                let next = self
                    .leads
                    .iter()
                    .filter(|(id, _)| !self.is_member_lead(id))
                    .max_by_key(|(_, l)| l.seen_at)
                    .map(|(id, _)| id.clone());
                self.set_primary(next, now, io);
            }
        }
    }

    /// Watching `pane` failed transiently: try again shortly while a lead or member is there.
    pub(in crate::engine) fn watch_failed(&mut self, pane: QualifiedPaneId, now: Timestamp) {
        if let Ok(at) = now.checked_add(REWATCH_AFTER) {
            self.rewatch.insert(pane, at);
        }
    }

    pub(super) fn rewatch_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
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

    /// A reload was applied: the keys the engine reads take effect now — `tickets`
    /// (retention), `delivery` (verify grace, longest typed text), `limits` (the per-member caps,
    /// for what is asked next), `primary` (the push budget and the pinned tab) and `leads` (the
    /// lead tabs, scanned again at once).
    pub(in crate::engine) fn engine_config_reloaded(
        &mut self,
        config: &crate::config::Config,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        self.tickets
            .book
            .set_ttl(SignedDuration::from_secs(saturating_i64(
                config.tickets.ttl_after_finish_secs,
            )));
        self.injector
            .set_grace(SignedDuration::from_millis(saturating_i64(
                config.delivery.verify_grace_ms,
            )));
        self.max_inject = usize::try_from(config.delivery.max_inject_bytes).unwrap_or(usize::MAX);
        self.limits = config.limits;
        self.tree = super::TreeLimits::from_config(config);
        self.push.set_config(push_config(config));
        let tabs = LeadTabs::from_config(config);
        if !tabs.same_tabs(&self.lead_tabs) {
            tracing::info!("lead tabs changed by a reload; scanning for their leads");
            self.lead_tabs = tabs;
            self.scan_if_due(now, io);
        }
        // A due nudge under the new budget, or an expiry under the new retention, is looked at.
        self.tick(now, io);
    }

    /// Every member's and lead's pane, watched again (after missed events): each watch
    /// publishes the pane's current status, a gone one is found out.
    pub(in crate::engine) fn rewatch_all(&self, io: &mut Vec<Io>) {
        let panes: std::collections::BTreeSet<QualifiedPaneId> = self
            .by_pane
            .keys()
            .cloned()
            .chain(self.leads.values().map(|l| l.pane.clone()))
            .collect();
        for pane in panes {
            io.push(Io::Watch { pane });
        }
    }

    /// Starts a lead-tab scan when one is due.
    pub(super) fn scan_if_due(&mut self, now: Timestamp, io: &mut Vec<Io>) {
        let due = self
            .lead_tabs
            .next_scan(!self.leads.is_empty())
            .is_some_and(|at| at <= now);
        if due && self.lead_tabs.start() {
            io.push(Io::ScanLeads);
        }
    }

    /// The scanner's listing arrived (`None`: the reading failed, every answer stands).
    pub(in crate::engine) fn leads_scanned(
        &mut self,
        panes: Option<Vec<ScanPane>>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        let Some(panes) = panes else {
            self.lead_tabs.failed(now);
            return;
        };
        // Delegating members' panes are no lead tab's business (they may be on the members'
        // daemon, which the scanner does not list).
        let callers = self
            .leads
            .iter()
            .filter(|(id, _)| !self.is_member_lead(id))
            .map(|(id, l)| (id.clone(), l.terminal.clone()))
            .collect();
        let spoke = self.seen.iter().cloned().collect();
        for change in self.lead_tabs.scanned(&panes, &callers, &spoke, now) {
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

    pub(in crate::engine) fn inbox_depth(
        &mut self,
        target: Target,
        pending: u64,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        // A series per inbox that exists: a member's, or a gone member's still holding mail.
        if pending == 0 && !self.members.contains_key(&target) {
            crate::ops::telemetry::forget_inbox_depth(target.as_str());
        } else {
            crate::ops::telemetry::set_inbox_depth(target.as_str(), pending);
        }
        self.depth_pending.remove(&target);
        if pending == 0 && !self.members.contains_key(&target) {
            // A released member's binding outlived it only for its mail (`release`).
            self.feed_push(
                PushInput::Unbound {
                    target: target.clone(),
                },
                now,
                io,
            );
        }
        self.note_mail(&target, pending, now);
        if self.raw_depth.insert(target.clone(), pending) != Some(pending) {
            self.emit(FleetEvent::InboxDepth {
                target: target.to_string(),
                depth: pending,
            });
        }
        self.push_depth(target, now, io);
    }

    /// Keeps when `target`'s lead got mail it was not nudged about yet (`pending` replies now,
    /// against the depth known before), for the nudge's latency.
    fn note_mail(&mut self, target: &Target, pending: u64, now: Timestamp) {
        let Some(lead) = self.push.lead_for(target).cloned() else {
            return;
        };
        let grew = self
            .raw_depth
            .get(target)
            .is_none_or(|known| pending > *known);
        if pending > 0 && grew {
            self.mail_since.entry(lead).or_insert(now);
        } else if pending == 0 {
            // Read before any nudge: unless another of its members' mail still waits.
            let other_mail = self.raw_depth.iter().any(|(t, depth)| {
                t != target && *depth > 0 && self.push.lead_for(t) == Some(&lead)
            });
            if !other_mail {
                self.mail_since.remove(&lead);
            }
        }
    }

    pub(in crate::engine) fn injected(
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
        if matches!(outcome, InjectOutcome::Transient | InjectOutcome::Busy) {
            self.release_hold(&lead, now, io);
        }
        self.feed_push(PushInput::Injected { lead, outcome }, now, io);
    }

    /// Feeds the push state machine one input and carries out what it answers.
    pub(super) fn feed_push(&mut self, input: PushInput, now: Timestamp, io: &mut Vec<Io>) {
        let effects = self.push.handle_at(input, now);
        self.push_effects(effects, now, io);
    }

    fn push_effects(&mut self, effects: Vec<PushEffect>, now: Timestamp, io: &mut Vec<Io>) {
        let mut pending_gone = Vec::new();
        let mut pane_busy = Vec::new();
        for effect in effects {
            match effect {
                PushEffect::Inject { lead, text } => match self.leads.get(&lead).cloned() {
                    // A delegating member's pane also takes its own tasks: a nudge waits while
                    // one is being typed (or would be now), and holds the next one back.
                    Some(_) if !self.member_pane_free(&lead, now, io) => pane_busy.push(lead),
                    Some(l) => {
                        let after_ms = self
                            .mail_since
                            .remove(&lead)
                            .map(|since| millis(now.duration_since(since)));
                        let event = FleetEvent::Nudge {
                            lead: Some(lead.0.clone()),
                            outcome: "nudged".to_owned(),
                            after_ms,
                        };
                        io.push(Io::Nudge {
                            lead,
                            pane: l.pane,
                            terminal: l.terminal,
                            text,
                        });
                        self.emit(event);
                    }
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
                    // `nudged` and `exhausted` are told with their lead (Inject, GaveUp).
                    if !matches!(metric, PushMetric::Nudged | PushMetric::Exhausted) {
                        self.emit(FleetEvent::Nudge {
                            lead: None,
                            outcome: metric.as_str().to_owned(),
                            after_ms: None,
                        });
                    }
                }
                PushEffect::GaveUp { lead, reminders } => {
                    tracing::warn!(%lead, reminders, "stopped nudging: the lead has not read its mail; it stays in the inbox");
                    self.emit(FleetEvent::Nudge {
                        lead: Some(lead.0.clone()),
                        outcome: PushMetric::Exhausted.as_str().to_owned(),
                        after_ms: None,
                    });
                }
            }
        }
        for lead in pending_gone {
            self.lead_gone(&lead, now, io);
        }
        for lead in pane_busy {
            self.injected(lead, InjectOutcome::Busy, now, io);
        }
    }
}

/// Whole milliseconds of a non-negative span (0 for a negative one).
pub(super) fn millis(span: jiff::SignedDuration) -> u64 {
    u64::try_from(span.as_millis()).unwrap_or(0)
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The push loop's settings from `config` (`primary.push*`; defaults without a primary block).
pub(in crate::engine) fn push_config(config: &crate::config::Config) -> PushConfig {
    let (reminders, backoff, max) = match &config.primary {
        Some(p) => (p.push_reminders, p.push_backoff_ms, p.push_backoff_max_ms),
        None => (5, 30_000, 600_000),
    };
    PushConfig {
        reminders,
        backoff: SignedDuration::from_millis(saturating_i64(backoff)),
        backoff_max: SignedDuration::from_millis(saturating_i64(max)),
    }
}

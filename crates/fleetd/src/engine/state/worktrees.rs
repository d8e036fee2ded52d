//! Members' git worktrees as the engine keeps them (SPEC §7): what each one holds, read at each
//! turn's end for `fleet_list`/`fleet_status`; and a released member's, settled — removed with its
//! branch when it holds nothing new, else kept and its lead told where and what. A worktree not
//! settled yet is durable (`pending_worktrees`), so a restart settles it. So is one a spawn is
//! making (`spawn_worktrees`, recorded before `git worktree add` runs and dropped in the batch
//! that registers its member, or once a failed spawn took it back): a kill -9 in between leaves
//! the record, and the next start settles a worktree no member claims the same way. The git
//! work itself is `crate::worktree`'s, run by `effects`.

use fleetd_core::push::PushInput;
use fleetd_core::{MessageKind, QualifiedPaneId, Target, TerminalId};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::super::{LeadRef, WorktreeView};
use super::{Io, Member, State};
use crate::worktree::{Settled, WorktreeInfo, WorktreeState};

/// A worktree a spawn is making, as kept on disk until its member is registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SpawnWorktree {
    /// The worktree as planned.
    pub(super) info: WorktreeInfo,
    /// The lead the member would have reported to: told if the worktree is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lead: Option<LeadRef>,
}

impl State {
    /// `target`'s worktree as tools show it, when it has one.
    pub(super) fn worktree_view(&self, target: &Target, m: &Member) -> Option<WorktreeView> {
        let info = self.registry.get(target)?.worktree.as_ref()?;
        Some(WorktreeView {
            path: info.path.clone(),
            branch: info.branch.clone(),
            base: info.base_name.clone(),
            uncommitted: m.worktree_state.map(|s| s.uncommitted),
            ahead: m.worktree_state.map(|s| s.ahead),
        })
    }

    /// Reads what `target`'s worktree holds, when it has one (it joined, or a turn ended).
    pub(super) fn inspect_worktree(&self, target: &Target, io: &mut Vec<Io>) {
        if let Some(info) = self.registry.get(target).and_then(|m| m.worktree.clone()) {
            io.push(Io::InspectWorktree {
                target: target.clone(),
                info,
            });
        }
    }

    /// What `target`'s worktree held when read (`None`: it could not be read).
    pub(in crate::engine) fn worktree_read(
        &mut self,
        target: &Target,
        state: Option<WorktreeState>,
    ) {
        if let Some(m) = self.members.get_mut(target) {
            m.worktree_state = state;
        }
    }

    /// `target` was released with a worktree: settled once its pane (`pane`, when it had one
    /// that may still run) is closed and seen gone, and kept on disk as pending until it is.
    pub(super) fn settle_worktree(
        &mut self,
        target: &Target,
        info: WorktreeInfo,
        pane: Option<(QualifiedPaneId, TerminalId)>,
        io: &mut Vec<Io>,
    ) {
        self.pending_worktrees.insert(target.clone(), info.clone());
        self.dirty.worktrees.insert(target.clone());
        io.push(Io::SettleWorktree {
            target: target.clone(),
            info,
            orphan: false,
            after_close: pane,
        });
    }

    /// A spawn is about to make `target`'s worktree: recorded first (durable before the spawn
    /// goes on), so a kill before its member is registered leaves a record to settle.
    pub(in crate::engine) fn worktree_making(
        &mut self,
        target: &Target,
        info: WorktreeInfo,
        lead: Option<LeadRef>,
    ) {
        self.spawn_worktrees
            .insert(target.clone(), SpawnWorktree { info, lead });
        self.dirty.spawn_worktrees.insert(target.clone());
    }

    /// `target`'s spawn is over (its member registered, or the spawn given back after taking
    /// its worktree back): the record goes.
    pub(super) fn spawn_worktree_done(&mut self, target: &Target) {
        if self.spawn_worktrees.remove(target).is_some() {
            self.dirty.spawn_worktrees.insert(target.clone());
        }
    }

    /// After a restart: worktrees spawns were making when fleetd stopped. One a member claims
    /// (its record was registered) needs nothing; any other is settled like a released
    /// member's — removed with its branch when it holds nothing new, else kept and the lead that
    /// asked for the spawn told (its record stays until then).
    pub(super) fn restore_spawn_worktrees(
        &mut self,
        kept: Vec<(Target, SpawnWorktree)>,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) {
        for (target, spawn) in kept {
            let claimed = self.registry.values().any(|m| {
                m.worktree
                    .as_ref()
                    .is_some_and(|w| w.path == spawn.info.path)
            });
            if claimed {
                self.dirty.spawn_worktrees.insert(target);
                continue;
            }
            tracing::info!(%target, path = %spawn.info.path.display(), "a spawn cut short by the restart left a worktree no member claims; settling it");
            let lead = spawn
                .lead
                .as_ref()
                .map(Self::lead_id)
                .filter(|id| self.leads.contains_key(id));
            if let Some(lead) = lead
                && !self.members.contains_key(&target)
            {
                // Its notice, if it is kept, is for the lead that asked for the spawn.
                let input = PushInput::Bound {
                    target: target.clone(),
                    lead,
                };
                self.feed_push(input, now, io);
            }
            io.push(Io::SettleWorktree {
                target: target.clone(),
                info: spawn.info.clone(),
                orphan: true,
                after_close: None,
            });
            self.spawn_worktrees.insert(target, spawn);
        }
    }

    /// How a released member's worktree, or one a spawn cut short by a restart left, was
    /// settled: a kept one (or one git could not read) is a notice in the member's inbox, for
    /// its lead.
    pub(in crate::engine) fn worktree_settled(
        &mut self,
        target: &Target,
        info: &WorktreeInfo,
        outcome: Result<Settled, String>,
        io: &mut Vec<Io>,
    ) {
        // Only the record this outcome is for: another of the same name may have come since.
        let orphan = self
            .spawn_worktrees
            .get(target)
            .is_some_and(|s| s.info == *info);
        if orphan {
            self.spawn_worktree_done(target);
        } else if self.pending_worktrees.get(target) == Some(info) {
            self.pending_worktrees.remove(target);
            self.dirty.worktrees.insert(target.clone());
        }
        let (path, branch) = (info.path.display(), &info.branch);
        let whose = if orphan {
            format!("the spawn of {target} was cut short by a restart of fleetd, and its")
        } else {
            format!("{target}'s")
        };
        let text = match outcome {
            Ok(Settled::Removed) => {
                tracing::info!(%target, %branch, orphan, "a worktree held nothing new; removed with its branch");
                None
            }
            Ok(Settled::Missing) => {
                tracing::info!(%target, %path, orphan, "a worktree to settle was gone already");
                None
            }
            Ok(Settled::BranchMoved) => Some(format!(
                "[fleet] {whose} worktree {path} held nothing new and was removed, but its branch {branch} moved while fleetd settled it, so the branch is kept: review it (`git -C {} log {}..{branch}`), then `git branch -D {branch}`",
                info.repo.display(),
                info.base_name,
            )),
            Ok(Settled::Kept(state)) => Some(format!(
                "[fleet] {whose} worktree is kept: {path} on branch {branch} holds {}. Review it (`git -C {path} status`, `git -C {} log {}..{branch}`), merge what you want, then `git worktree remove {path}` and `git branch -D {branch}`",
                state.describe(&info.base_name),
                info.repo.display(),
                info.base_name,
            )),
            Err(e) => Some(format!(
                "[fleet] {whose} worktree {path} (branch {branch}) is kept: git could not tell what it holds ({e})"
            )),
        };
        match text {
            Some(text) => io.push(Io::Notice {
                target: target.clone(),
                ticket: None,
                kind: MessageKind::Incident,
                text,
            }),
            // No notice: the binding kept for one can go once the inbox is read as empty.
            None => io.push(Io::Depth {
                target: target.clone(),
            }),
        }
    }
}

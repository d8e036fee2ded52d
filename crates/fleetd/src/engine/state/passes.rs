//! The model gateway's passes: which member, in which pane incarnation, with which key, may send
//! a request to which backend right now — the `yes` of [`State::model_admit`], computed by the
//! engine and published for the gateway to read without waiting for the engine's turn (eight
//! requests landing together would otherwise queue behind it, and behind whatever else it is
//! doing, before their first byte). The engine stays the one owner: only it writes the passes,
//! from its own state, at the end of a turn that changed a member's account, key or budget —
//! before any reply of that turn is sent, so a release or a budget reached that a caller has
//! been told of is already in them. A pass only ever says yes: a key or pane it does not hold,
//! or a member whose budget is spent, goes to the engine, which refuses it in words and tells
//! the lead once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleetd_core::{QualifiedPaneId, Target, TerminalId};

use super::State;

/// The published passes, shared by the engine (writer) and its handles (readers).
pub(in crate::engine) type PassBoard = Arc<Mutex<Arc<Passes>>>;

/// Every live member with a model account whose budgets allow a request, by its pane (a pane
/// holds one member at a time).
#[derive(Debug, Default)]
pub struct Passes(HashMap<QualifiedPaneId, Pass>);

/// One member's pass.
#[derive(Debug)]
struct Pass {
    /// The incarnation of its pane it runs in.
    terminal: TerminalId,
    target: Target,
    account: u64,
    /// The SHA-256 of its model key, hex.
    key_hash: String,
    backend: String,
}

impl Passes {
    /// The member at `pane` (incarnation `terminal`) and the account to count on, when a
    /// request from there presenting a key hashed `key_hash` for `backend` is admitted as is.
    pub fn admits(
        &self,
        pane: &QualifiedPaneId,
        terminal: &TerminalId,
        key_hash: &str,
        backend: &str,
    ) -> Option<(Target, u64)> {
        let pass = self.0.get(pane)?;
        (pass.terminal == *terminal
            && crate::identity::constant_time_eq(pass.key_hash.as_bytes(), key_hash.as_bytes())
            && pass.backend == backend)
            .then(|| (pass.target.clone(), pass.account))
    }
}

impl State {
    /// The board the passes are published on.
    pub(in crate::engine) fn pass_board(&self) -> PassBoard {
        Arc::clone(&self.ledger.board)
    }

    /// A member's account, key or budget changed: the passes are written again at the turn's end.
    pub(super) fn passes_changed(&mut self) {
        self.ledger.passes_stale = true;
    }

    /// At a turn's end: the passes written again when the turn changed what they hold.
    pub(super) fn publish_passes(&mut self) {
        if !std::mem::take(&mut self.ledger.passes_stale) {
            return;
        }
        let mut passes = HashMap::new();
        for (target, id) in &self.ledger.live {
            let Some(account) = self.ledger.accounts.get(id) else {
                continue;
            };
            let (Some(key_hash), Some(member)) = (&account.key, self.members.get(target)) else {
                continue;
            };
            if self.over_budget(account).is_some() {
                continue;
            }
            passes.insert(
                member.pane.clone(),
                Pass {
                    terminal: member.terminal.clone(),
                    target: target.clone(),
                    account: *id,
                    key_hash: key_hash.clone(),
                    backend: account.backend.clone(),
                },
            );
        }
        *crate::sync::lock(&self.ledger.board) = Arc::new(Passes(passes));
    }
}

//! What members spend on their model backends (SPEC §18): an account for each member whose
//! backend is served through fleetd's model gateway, opened when it is registered. The account
//! holds the hash of the member's model key while the member lives (its release kills the key),
//! the tokens by kind and the cost counted from the backend's responses, and the budgets that
//! stop its next request: its own, and its delegation tree's (held by the tree's top member).
//! Accounts are durable and outlive their member, so totals per profile, tree and lead survive
//! releases and restarts. Crossing a budget's warning fraction, and being stopped by a budget,
//! are each told once to the member's lead as an incident in the member's inbox (one nudge);
//! raising the budget ends the episode.

use std::collections::BTreeMap;

use fleetd_core::access::Refusal;
use fleetd_core::refusal::Code;
use fleetd_core::usage::{self, Spent, Tokens};
use fleetd_core::{MessageKind, Target};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{Io, State};
use crate::config::BudgetSpec;
use crate::events::FleetEvent;
use crate::store::{StateOp, StateRecord};

pub(in crate::engine) const ACCOUNT: &str = "account";

/// One member's account.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Account {
    member: Target,
    profile: String,
    pub(super) backend: String,
    /// The member at the top of the delegation tree it was spawned into (itself under a lead).
    tree: Target,
    /// The lead at the top of that tree (its pane), when a lead spawned the tree.
    lead: Option<String>,
    /// The SHA-256 of its model key (hex) while the member lives; `None` once released.
    pub(super) key: Option<String>,
    spent: Spent,
    budget: Option<BudgetSpec>,
    /// The budget of the tree this member heads (meaningful on a tree's top member).
    tree_budget: Option<BudgetSpec>,
    /// This budget episode's warning / stop were told to the lead.
    #[serde(default)]
    told: Told,
    opened_at: Timestamp,
}

/// A budget that stops an account's next request.
pub(super) enum OverBudget {
    /// The member's own.
    Own(BudgetSpec),
    /// Its tree's, held by account `top`, which the tree's members together spent.
    Tree {
        top: u64,
        spent: Spent,
        budget: BudgetSpec,
    },
}

/// Which notices of the current budget episodes the lead has had.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Told {
    warned: bool,
    stopped: bool,
    tree_warned: bool,
    tree_stopped: bool,
}

/// A member's model spending as tools show it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    /// Tokens by kind.
    pub tokens: Tokens,
    /// Tokens of every kind, together.
    pub total_tokens: u64,
    /// Cost in US dollars.
    pub cost_usd: f64,
    /// Its budget, in words (`None`: none).
    pub budget: Option<String>,
}

/// The accounts, and which live member holds which.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    pub(super) accounts: BTreeMap<u64, Account>,
    pub(super) live: BTreeMap<Target, u64>,
    next: u64,
    /// What every account kept has spent, by member, profile, tree and lead: kept up at each
    /// answer, so neither an answer's gauges nor a budget's check reads every account.
    totals: UsageTotals,
    /// The passes the gateway admits by (`passes`), and whether this turn changed them.
    pub(super) board: super::passes::PassBoard,
    pub(super) passes_stale: bool,
}

/// A member's model key and budgets, as its spawn made them (part of its durable record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberModel {
    /// The backend served to it through fleetd.
    pub backend: String,
    /// The SHA-256 of its model key, hex.
    pub key_hash: String,
    /// Its own budget.
    pub budget: Option<BudgetSpec>,
    /// The budget of the tree it heads.
    pub tree_budget: Option<BudgetSpec>,
}

fn view(spent: &Spent, budget: Option<&BudgetSpec>) -> UsageView {
    UsageView {
        tokens: spent.tokens,
        total_tokens: spent.tokens.total(),
        cost_usd: dollars(spent.cost_micros),
        budget: budget.map(|b| usage::describe(spent, &limit(b))),
    }
}

/// Micro-dollars as dollars (for display; sums are kept in micro-dollars).
pub(super) fn dollars(micros: u64) -> f64 {
    // Exact to the micro-dollar below 2^53 micro-dollars (about nine billion dollars).
    micros as f64 / 1e6
}

fn limit(spec: &BudgetSpec) -> usage::Budget {
    usage::Budget {
        tokens: spec.tokens,
        cost_micros: spec.cost_micros,
    }
}

impl State {
    /// A member served through the model gateway was registered: its account opens (after a
    /// restart, the one it had is found again and nothing opens).
    pub(super) fn open_account(
        &mut self,
        target: &Target,
        profile: &str,
        model: &MemberModel,
        now: Timestamp,
    ) {
        self.passes_changed();
        if let Some((&id, _)) = self
            .ledger
            .accounts
            .iter()
            .find(|(_, a)| a.key.as_deref() == Some(model.key_hash.as_str()))
        {
            self.ledger.live.insert(target.clone(), id);
            return;
        }
        let tree = self.tree_top(target);
        let lead = self
            .members
            .get(&tree)
            .and_then(|m| m.lead.as_ref())
            .map(|l| l.0.clone());
        self.ledger.next += 1;
        let id = self.ledger.next;
        self.ledger.accounts.insert(
            id,
            Account {
                member: target.clone(),
                profile: profile.to_owned(),
                backend: model.backend.clone(),
                tree,
                lead,
                key: Some(model.key_hash.clone()),
                spent: Spent::default(),
                budget: model.budget,
                tree_budget: model.tree_budget,
                told: Told::default(),
                opened_at: now,
            },
        );
        self.ledger.live.insert(target.clone(), id);
        self.dirty.accounts.insert(id);
        // In the totals from the start, as after a restart: a member that spent nothing yet.
        if let Some(account) = self.ledger.accounts.get(&id) {
            self.ledger.totals.count(account, &Tokens::default(), 0);
        }
    }

    /// The member at the top of `target`'s delegation tree.
    fn tree_top(&self, target: &Target) -> Target {
        let mut at = target.clone();
        for _ in 0..64 {
            match self.delegator_of(&at) {
                Some(up) => at = up,
                None => break,
            }
        }
        at
    }

    /// `target` was released: its model key dies with it; its account stays for the totals.
    pub(super) fn close_account(&mut self, target: &Target) {
        self.passes_changed();
        if let Some(id) = self.ledger.live.remove(target)
            && let Some(account) = self.ledger.accounts.get_mut(&id)
        {
            account.key = None;
            self.dirty.accounts.insert(id);
        }
    }

    /// What `tree` spent, every member of it together, released ones included.
    fn tree_spent(&self, tree: &Target) -> Spent {
        self.ledger
            .totals
            .trees
            .get(tree.as_str())
            .copied()
            .unwrap_or_default()
    }

    /// The account of the member at the top of `tree` (its live one, else its newest).
    fn tree_account(&self, tree: &Target) -> Option<u64> {
        self.ledger.live.get(tree).copied().or_else(|| {
            self.ledger
                .accounts
                .iter()
                .rev()
                .find(|(_, a)| &a.member == tree && &a.tree == tree)
                .map(|(id, _)| *id)
        })
    }

    /// May `target`, presenting a key with hash `key_hash`, send a request to `backend`? The
    /// account to count it on, or the refusal (a key that is not this member's, or a budget
    /// reached: then its lead hears once).
    pub(in crate::engine) fn model_admit(
        &mut self,
        target: &Target,
        key_hash: &str,
        backend: &str,
        io: &mut Vec<Io>,
    ) -> Result<u64, Refusal> {
        let id = self.ledger.live.get(target).copied();
        let account = id.and_then(|id| self.ledger.accounts.get(&id));
        let Some((id, account)) = id.zip(account).filter(|(_, a)| {
            a.key.as_deref().is_some_and(|k| {
                crate::identity::constant_time_eq(k.as_bytes(), key_hash.as_bytes())
            })
        }) else {
            return Err(Refusal::new(
                Code::ModelKeyRefused,
                format!(
                    "fleetd refused this model request: the key it presents is not member {target}'s model key. Each member's key works only from its own pane, and only while it lives"
                ),
            ));
        };
        if account.backend != backend {
            return Err(Refusal::new(
                Code::ModelKeyRefused,
                format!(
                    "fleetd refused this model request: member {target} is served backend {}, not {backend}",
                    account.backend
                ),
            ));
        }
        let (tree, own_spent) = (account.tree.clone(), account.spent);
        let Some(over) = self.over_budget(account) else {
            return Ok(id);
        };
        // Either budget is refused the same way: the lead told once per episode (the flag
        // `told` on the account that holds the budget), the member told why and who can lift it.
        let (holder, told, spent, budget, tree_wide): (u64, fn(&mut Told) -> &mut bool, _, _, _) =
            match over {
                OverBudget::Own(b) => (id, |t| &mut t.stopped, own_spent, b, false),
                OverBudget::Tree { top, spent, budget } => {
                    (top, |t| &mut t.tree_stopped, spent, budget, true)
                }
            };
        let words = usage::describe(&spent, &limit(&budget));
        let (incident, refusal) = if tree_wide {
            (
                format!(
                    "[fleet] incident: the delegation tree of {tree} reached its model budget ({words}); its members' model requests are refused until the operator raises it: fleetd budget {tree} --tree --tokens N / --cost-usd X"
                ),
                format!(
                    "fleetd: the model budget of this delegation tree (headed by {tree}) is spent ({words}). Stop here and tell your user; the operator can raise it with `fleetd budget {tree} --tree ...`"
                ),
            )
        } else {
            (
                format!(
                    "[fleet] incident: member {target} reached its model budget ({words}); its model requests are refused until the operator raises it: fleetd budget {target} --tokens N / --cost-usd X"
                ),
                format!(
                    "fleetd: this member's model budget is spent ({words}). Stop here and tell your user; the operator can raise it with `fleetd budget {target} ...`"
                ),
            )
        };
        self.tell_once(holder, target, (told, "budget"), || incident, io);
        Err(Refusal::new(Code::BudgetReached, refusal))
    }

    /// The budget that stops `account`'s next request, if one does: its own first, then its
    /// tree's. The one rule of "spent" — [`State::model_admit`] refuses by it, and the passes
    /// leave out whom it stops.
    pub(super) fn over_budget(&self, account: &Account) -> Option<OverBudget> {
        let over = |spent: &Spent, b: &BudgetSpec| {
            usage::standing(spent, &limit(b), 1.0) == usage::Standing::Over
        };
        if let Some(b) = account.budget.filter(|b| over(&account.spent, b)) {
            return Some(OverBudget::Own(b));
        }
        let top = self.tree_account(&account.tree)?;
        let budget = self.ledger.accounts.get(&top)?.tree_budget?;
        let spent = self.tree_spent(&account.tree);
        over(&spent, &budget).then_some(OverBudget::Tree { top, spent, budget })
    }

    /// Tells `target`'s lead `text` once per budget episode (the flag `which` of account `id`), and
    /// `/events` as an incident of `kind`.
    fn tell_once(
        &mut self,
        id: u64,
        target: &Target,
        (which, kind): (fn(&mut Told) -> &mut bool, &str),
        text: impl FnOnce() -> String,
        io: &mut Vec<Io>,
    ) {
        let Some(account) = self.ledger.accounts.get_mut(&id) else {
            return;
        };
        let flag = which(&mut account.told);
        if *flag {
            return;
        }
        *flag = true;
        self.dirty.accounts.insert(id);
        let text = text();
        // On `/events` too, so a notification sink hears of it (fleetd's sentence, no body).
        self.emit(crate::events::FleetEvent::Incident {
            kind: kind.to_owned(),
            targets: vec![target.to_string()],
            text: text.clone(),
        });
        io.push(Io::Notice {
            target: target.clone(),
            ticket: None,
            kind: MessageKind::Incident,
            text,
        });
    }

    /// A response on account `id` ended, reporting `tokens` costing `cost_micros`.
    pub(in crate::engine) fn model_usage(
        &mut self,
        id: u64,
        tokens: Tokens,
        cost_micros: u64,
        io: &mut Vec<Io>,
    ) {
        let Some(account) = self.ledger.accounts.get_mut(&id) else {
            return;
        };
        account.spent.add(&tokens, cost_micros);
        self.dirty.accounts.insert(id);
        let account = account.clone();
        self.ledger.totals.count(&account, &tokens, cost_micros);
        if self.over_budget(&account).is_some() {
            self.passes_changed();
        }
        self.publish_gauges(&account);
        self.emit(FleetEvent::Usage {
            target: account.member.to_string(),
            profile: account.profile.clone(),
            tree: account.tree.to_string(),
            tokens,
            cost_micros,
            total_tokens: account.spent.tokens.total(),
            total_cost_micros: account.spent.cost_micros,
        });
        let member = account.member.clone();
        if let Some(b) = account.budget
            && usage::standing(&account.spent, &limit(&b), b.warn_at()) != usage::Standing::Under
        {
            let words = usage::describe(&account.spent, &limit(&b));
            self.tell_once(
                id,
                &member,
                (|t| &mut t.warned, "budget_warning"),
                || format!("[fleet] member {member} has used {words} of its model budget"),
                io,
            );
        }
        let tree = account.tree;
        if let Some(top) = self.tree_account(&tree)
            && let Some(b) = self.ledger.accounts.get(&top).and_then(|a| a.tree_budget)
        {
            let spent = self.tree_spent(&tree);
            if usage::standing(&spent, &limit(&b), b.warn_at()) != usage::Standing::Under {
                let words = usage::describe(&spent, &limit(&b));
                self.tell_once(top, &member, (|t| &mut t.tree_warned, "budget_warning"), || {
                    format!("[fleet] the delegation tree of {tree} has used {words} of its model budget")
                }, io);
            }
        }
    }

    /// The operator sets `target`'s budget (`tree`: the budget of the tree it heads). A new
    /// episode begins: the lead is told again when it is reached.
    pub(in crate::engine) fn set_budget(
        &mut self,
        target: &Target,
        tree: bool,
        budget: Option<BudgetSpec>,
    ) -> Result<UsageView, Refusal> {
        let id = if tree {
            self.tree_account(target)
        } else {
            self.ledger.live.get(target).copied()
        };
        // A tree's budget is read on its top member's account only: set anywhere else it
        // would limit nothing.
        if let Some(top) = id
            .and_then(|id| self.ledger.accounts.get(&id))
            .map(|a| &a.tree)
            .filter(|top| tree && *top != target)
        {
            return Err(Refusal::new(
                Code::InvalidArguments,
                format!(
                    "{target} does not head a delegation tree: it is in the tree {top} heads, whose budget is set on {top} (fleetd budget {top} --tree ...)"
                ),
            ));
        }
        let Some(account) = id.and_then(|id| self.ledger.accounts.get_mut(&id)) else {
            return Err(Refusal::new(
                Code::UnknownTarget,
                format!(
                    "{target} has no model account: only a member whose backend is served through fleetd (throughFleetd) has one{}",
                    if tree {
                        ", and a tree's budget is set on the member at its top"
                    } else {
                        ""
                    }
                ),
            ));
        };
        if tree {
            account.tree_budget = budget;
            account.told.tree_warned = false;
            account.told.tree_stopped = false;
        } else {
            account.budget = budget;
            account.told.warned = false;
            account.told.stopped = false;
        }
        let shown = view(&account.spent, budget.as_ref());
        if let Some(id) = id {
            self.dirty.accounts.insert(id);
        }
        self.passes_changed();
        Ok(if tree {
            let spent = self.tree_spent(target);
            view(&spent, budget.as_ref())
        } else {
            shown
        })
    }

    /// What live member `target` spent, for `fleet_list`.
    pub(super) fn usage_of(&self, target: &Target) -> Option<UsageView> {
        let account = self.ledger.accounts.get(self.ledger.live.get(target)?)?;
        Some(view(&account.spent, account.budget.as_ref()))
    }

    /// What the tree `target` heads spent (when it heads one with an account).
    pub(super) fn tree_usage_of(&self, target: &Target) -> Option<UsageView> {
        let top = self.tree_account(target)?;
        let budget = self.ledger.accounts.get(&top)?.tree_budget;
        Some(view(&self.tree_spent(target), budget.as_ref()))
    }

    /// Sets the model gauges of `account`'s member, tree, profile and lead from every account.
    fn publish_gauges(&self, account: &Account) {
        use crate::ops::telemetry::{SpentBy, model_spent};
        let totals = &self.ledger.totals;
        let lead = account
            .lead
            .clone()
            .unwrap_or_else(|| "operator".to_owned());
        for (by, map, key) in [
            (SpentBy::Member, &totals.members, account.member.to_string()),
            (SpentBy::Tree, &totals.trees, account.tree.to_string()),
            (SpentBy::Profile, &totals.profiles, account.profile.clone()),
            (SpentBy::Lead, &totals.leads, lead),
        ] {
            if let Some(spent) = map.get(&key) {
                model_spent(by, &key, spent);
            }
        }
    }

    /// Adds up the totals from every account, and sets every model gauge (after a restart).
    pub(super) fn publish_all_gauges(&mut self) {
        use crate::ops::telemetry::{SpentBy, model_spent};
        let mut totals = UsageTotals::default();
        for a in self.ledger.accounts.values() {
            totals.count(a, &a.spent.tokens, a.spent.cost_micros);
        }
        self.ledger.totals = totals;
        let totals = &self.ledger.totals;
        for (by, map) in [
            (SpentBy::Member, &totals.members),
            (SpentBy::Tree, &totals.trees),
            (SpentBy::Profile, &totals.profiles),
            (SpentBy::Lead, &totals.leads),
        ] {
            for (key, spent) in map {
                model_spent(by, key, spent);
            }
        }
    }

    /// Totals by member, profile, tree and lead, over every account kept.
    pub(in crate::engine) fn usage_totals(&self) -> UsageTotals {
        self.ledger.totals.clone()
    }

    pub(super) fn account_op(&self, id: u64) -> Option<StateOp> {
        match self.ledger.accounts.get(&id) {
            Some(account) => match serde_json::to_string(account) {
                Ok(value) => Some(StateOp::Put(StateRecord {
                    kind: ACCOUNT.to_owned(),
                    key: id.to_string(),
                    value,
                })),
                Err(e) => {
                    tracing::error!(id, error = %e, "cannot encode a model account");
                    None
                }
            },
            None => Some(StateOp::Delete {
                kind: ACCOUNT.to_owned(),
                key: id.to_string(),
            }),
        }
    }

    /// An account from before the restart (its key is live again once its member is).
    pub(super) fn restore_account(&mut self, key: &str, value: &str) {
        let (Ok(id), Ok(account)) = (key.parse::<u64>(), serde_json::from_str::<Account>(value))
        else {
            tracing::error!(key, "a model account does not decode; it is skipped");
            return;
        };
        self.ledger.next = self.ledger.next.max(id);
        self.ledger.accounts.insert(id, account);
    }
}

/// Spending totals, every account kept.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    /// By member name.
    pub members: BTreeMap<String, Spent>,
    /// By profile.
    pub profiles: BTreeMap<String, Spent>,
    /// By delegation tree (its top member).
    pub trees: BTreeMap<String, Spent>,
    /// By lead (its pane; `operator` for trees no lead spawned).
    pub leads: BTreeMap<String, Spent>,
}

impl UsageTotals {
    /// Adds `tokens` costing `cost_micros` on `account` to each of its four totals.
    fn count(&mut self, account: &Account, tokens: &Tokens, cost_micros: u64) {
        let lead = account.lead.as_deref().unwrap_or("operator");
        for (map, key) in [
            (&mut self.members, account.member.as_str()),
            (&mut self.profiles, account.profile.as_str()),
            (&mut self.trees, account.tree.as_str()),
            (&mut self.leads, lead),
        ] {
            match map.get_mut(key) {
                Some(spent) => spent.add(tokens, cost_micros),
                None => {
                    let mut spent = Spent::default();
                    spent.add(tokens, cost_micros);
                    map.insert(key.to_owned(), spent);
                }
            }
        }
    }
}

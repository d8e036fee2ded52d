//! What every real-agent story checks of fleetd's model gateway: the members' backend
//! credential ([`MEMBER_TOKEN`]) reached the members' model on every request and nothing else —
//! each member holds only a model key of its own (`fleetd-mk-…`) and the URL of fleetd's
//! gateway, the lead holds neither — and what fleetd counted a member as having spent is exactly
//! what the members' model served it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use super::rig::{AgentRig, MEMBER_TOKEN};
use crate::fake_model::served::Usage;

/// What a member's model key starts with (`fleetd::model_gateway::key`).
pub const KEY_PREFIX: &str = "fleetd-mk-";

/// How long fleetd and the members' model may take to agree once an answer is under way: the
/// fake logs an answer served when its stream ended, fleetd counts it at its last event.
const SETTLE: Duration = Duration::from_secs(15);

/// Neither the members' token nor any model key is in `text`, found `place` on the lead's side
/// (where neither may go); a failure says where.
fn holds_no_member_secret(text: &str, place: &str) {
    assert!(
        !text.contains(MEMBER_TOKEN),
        "the members' token is {place}"
    );
    assert!(model_keys(text).is_empty(), "a model key is {place}");
}

/// Every model key in `text`: [`KEY_PREFIX`] and the 64 hex digits after it.
pub fn model_keys(text: &str) -> BTreeSet<String> {
    text.match_indices(KEY_PREFIX)
        .map(|(at, _)| {
            let hex: String = text[at + KEY_PREFIX.len()..]
                .chars()
                .take_while(char::is_ascii_hexdigit)
                .collect();
            format!("{KEY_PREFIX}{hex}")
        })
        .collect()
}

/// The pane fleetd names `member`'s, as the multiplexer calls it (fleetd's pane ids are
/// `<daemon>:<pane>`).
fn pane_of(member: &Value) -> String {
    member["paneId"]
        .as_str()
        .and_then(|p| p.split_once(':'))
        .map(|(_, pane)| pane.to_owned())
        .unwrap_or_else(|| panic!("a member's pane: {member}"))
}

/// The token usage in `value` (`{tokens: {input, output, cacheRead, cacheWrite}}`).
fn tokens(value: &Value) -> Option<Usage> {
    serde_json::from_value(value["tokens"].clone()).ok()
}

impl AgentRig {
    /// The live members, as `fleet_list` shows them.
    fn live_members(&self) -> Vec<Value> {
        self.members()["members"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The members' backend token went where fleetd's model gateway puts it and nowhere else,
    /// checked for every live member (at least one) and the lead in pane `lead`:
    /// - every request the members' model got carried the real token, none a model key;
    /// - each member's processes (its pane's process tree) hold one model key, its own and no
    ///   other member's, and fleetd's gateway as their backend URL, and no process nor its pane
    ///   (scrollback included) holds the token; its pane shows no other key;
    /// - nothing of the lead's holds the token or any model key: not its pane, not the
    ///   environment of any process under it (the stdio shim included), not any request its
    ///   model got.
    pub fn assert_member_token_only_with_members(&self, lead: &str) {
        let asked = self.member_model.requests();
        assert!(!asked.is_empty(), "the members' model was never asked");
        for r in &asked {
            assert!(
                r["key"] == MEMBER_TOKEN,
                "request #{} to the members' model ({} {}) came without the members' token: {:?}",
                r["n"],
                r["method"],
                r["path"],
                r["key"]
            );
            let keys = model_keys(&r.to_string());
            assert!(
                keys.is_empty(),
                "request #{} to the members' model carries model keys {keys:?}",
                r["n"]
            );
        }
        let gateway = format!("={}/model/model", self.url());
        let members = self.live_members();
        assert!(!members.is_empty(), "no member to check");
        let mut owners: BTreeMap<String, String> = BTreeMap::new();
        for m in &members {
            let name = m["target"].as_str().unwrap_or("?").to_owned();
            let pane = pane_of(m);
            let envs = self.environments(&pane);
            assert!(!envs.is_empty(), "no process found under {name}'s pane");
            let mut held = BTreeSet::new();
            for env in &envs {
                assert!(
                    !env.contains(MEMBER_TOKEN),
                    "a process under {name}'s pane has the members' token"
                );
                held.extend(model_keys(env));
            }
            assert_eq!(
                held.len(),
                1,
                "{name}'s processes hold one model key: {held:?}"
            );
            let key = held.pop_first().unwrap_or_default();
            assert!(
                envs.iter()
                    .any(|e| e.lines().any(|l| l.ends_with(&gateway))),
                "{name}'s backend URL is fleetd's gateway ({gateway})"
            );
            let history = self.history(&pane);
            assert!(
                !history.contains(MEMBER_TOKEN),
                "the members' token is on {name}'s screen"
            );
            let shown = model_keys(&history);
            assert!(
                shown.iter().all(|k| *k == key),
                "{name}'s pane shows another member's key"
            );
            if let Some(other) = owners.insert(key, name.clone()) {
                panic!("{name} and {other} were given the same model key");
            }
        }

        holds_no_member_secret(&self.history(lead), "on the lead's screen");
        let envs = self.environments(lead);
        assert!(!envs.is_empty(), "no process found under the lead's pane");
        for env in envs {
            holds_no_member_secret(&env, "in the environment of a process under the lead");
        }
        let asked = std::fs::read_to_string(&self.lead_model.log).expect("the lead model's log");
        assert!(!asked.is_empty(), "the lead's model was never asked");
        holds_no_member_secret(&asked, "in a request to the lead's model");
    }

    /// What the members' model served whole so far (every answer it logged `served`), and
    /// whether every request it got that an answer was planned for has its `served` line (no
    /// answer under way).
    fn served_so_far(&self) -> (Usage, bool) {
        let planned: BTreeSet<u64> = self
            .member_model
            .requests()
            .iter()
            .filter(|r| r["api"] != "other")
            .filter_map(|r| r["n"].as_u64())
            .collect();
        let ended: BTreeSet<u64> = self
            .member_model
            .served()
            .iter()
            .filter_map(|l| l["n"].as_u64())
            .collect();
        (
            self.member_model.served_usage(MEMBER_TOKEN),
            planned.is_subset(&ended),
        )
    }

    /// One consistent reading of what was counted and what was served: `fleet_list` (operator
    /// `GET /sessions`) read between two readings of the members' model's log that agree, with
    /// no answer under way. `None` while something moves.
    fn books(&self) -> Option<(Value, Usage)> {
        let (before, ended) = self.served_so_far();
        let listed = self.members();
        let after = self.served_so_far();
        (ended && after == (before, true)).then_some((listed, before))
    }

    /// Waits (up to [`SETTLE`]) for a reading of [`AgentRig::books`] that `agrees`; returns the
    /// last reading (for the caller to assert on, whether it agreed or not). `agrees` must not
    /// panic.
    fn settled(&self, what: &str, agrees: impl Fn(&Value, Usage) -> bool) -> (Value, Usage) {
        let mut last = None;
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::wait_until(what, SETTLE, || {
                let Some((listed, served)) = self.books() else {
                    return false;
                };
                let agreed = agrees(&listed, served);
                last = Some((listed, served));
                agreed
            });
        }));
        if waited.is_err() && last.is_none() {
            self.dump();
            panic!("timed out waiting for the members' model to stop answering, for {what}");
        }
        last.unwrap_or_default()
    }

    /// `member`, the one member of this story that used the members' model (so every answer
    /// that model served was served to it), has spent, as `fleet_list` shows it, exactly the
    /// tokens of each kind the model served it, and no other account spent anything (the
    /// profiles' totals, released members included, are its usage). Waits (up to a few seconds)
    /// for an answer under way to end and for fleetd to agree.
    pub fn assert_usage_is_what_was_served(&self, member: &str) {
        let own = |listed: &Value| {
            listed["members"]
                .as_array()?
                .iter()
                .find(|m| m["target"] == member)
                .and_then(|m| tokens(&m["usage"]))
        };
        let all = |listed: &Value| {
            listed["usage"]["profiles"]
                .as_object()
                .map(|p| {
                    p.values()
                        .filter_map(tokens)
                        .fold(Usage::default(), Usage::plus)
                })
                .unwrap_or_default()
        };
        let (listed, served) = self.settled(
            &format!("{member}'s usage to equal what the members' model served it"),
            |listed, served| own(listed) == Some(served) && all(listed) == served,
        );
        let others: Vec<&Value> = listed["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["target"] != member)
            .collect();
        assert!(
            others.is_empty(),
            "{member} is this story's one member: {others:?}"
        );
        assert_eq!(own(&listed), Some(served), "{member}'s usage");
        assert_eq!(
            all(&listed),
            served,
            "the profiles' totals: {}",
            listed["usage"]
        );
        assert!(
            served.input > 0 && served.output > 0 && served.cache_read > 0,
            "the members' model served {member} something: {served:?}"
        );
    }

    /// After `member` was released, `profile`'s total in `fleet_list` counts exactly what the
    /// members' model served (all of it to `member`, the story's one member).
    pub fn assert_usage_outlives(&self, member: &str, profile: &str) {
        let total = |listed: &Value| tokens(&listed["usage"]["profiles"][profile]);
        let (listed, served) = self.settled(
            &format!("profile {profile}'s total to count what {member} was served"),
            |listed, served| total(listed) == Some(served),
        );
        assert_eq!(
            total(&listed),
            Some(served),
            "profile {profile}'s total after {member} was released: {}",
            listed["usage"]
        );
    }
}

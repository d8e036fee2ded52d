//! What every real-agent story checks of fleetd's model gateway: the members' backend
//! credential ([`MEMBER_TOKEN`]) reached the members' model on every request and nothing else —
//! each member holds only a model key of its own (`fleetd-mk-…`) and the URL of fleetd's
//! gateway, the lead holds neither.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::rig::{AgentRig, MEMBER_TOKEN};

/// What a member's model key starts with (`fleetd::model_gateway::key`).
pub const KEY_PREFIX: &str = "fleetd-mk-";

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

        let history = self.history(lead);
        assert!(
            !history.contains(MEMBER_TOKEN),
            "the members' token is on the lead's screen"
        );
        assert!(
            model_keys(&history).is_empty(),
            "a model key is on the lead's screen"
        );
        let envs = self.environments(lead);
        assert!(!envs.is_empty(), "no process found under the lead's pane");
        for env in envs {
            assert!(
                !env.contains(MEMBER_TOKEN),
                "a process under the lead has the members' token"
            );
            assert!(
                model_keys(&env).is_empty(),
                "a process under the lead has a model key"
            );
        }
        let asked = std::fs::read_to_string(&self.lead_model.log).expect("the lead model's log");
        assert!(!asked.is_empty(), "the lead's model was never asked");
        assert!(
            !asked.contains(MEMBER_TOKEN),
            "a request to the lead's model carries the members' token"
        );
        assert!(
            model_keys(&asked).is_empty(),
            "a request to the lead's model carries a model key"
        );
    }
}

//! What changed between two configurations and whether a running daemon may take the change.
//! Owns the classification of every key (live, boot-only, read by the engine at start) and the
//! short, secret-free summary a reload logs. Pure: compares two `Config` values, nothing more.

use std::collections::BTreeMap;
use std::fmt;

use super::{AmqpUrl, Config, Store};

/// How a key may change while fleetd runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyClass {
    /// Read afresh by every tool call: a reload takes effect for the next call (new spawns).
    Live,
    /// Used to open a socket, store or subscriber at start; a reload that changes it is refused
    /// whole, and the running configuration stays.
    BootOnly,
}

/// Every top-level key of `Config` as it is serialized (camelCase), with its class. A unit test
/// checks this list against the serialized `Config`, so a new key cannot be left unclassified.
///
/// Beyond SPEC §10's boot-only five: `multiplexer` picks the backend that is opened at start;
/// `apiToken` is resolved once into the listener's check; `inbox` sizes the store's and the
/// HTTP transport's limits when they open; `log.format` picks the subscriber installed at start
/// (`log.level` is live). `stateDir` comes from the environment and cannot change in a reload.
const KEYS: &[(&str, KeyClass)] = &[
    ("listen", KeyClass::BootOnly),
    ("apiToken", KeyClass::BootOnly),
    // Read by the HTTP guard on every request.
    ("allowedHosts", KeyClass::Live),
    ("multiplexer", KeyClass::BootOnly),
    ("herdrSocket", KeyClass::BootOnly),
    // Whether `herdrSocket` was written or discovered: informational, never acted on.
    ("herdrSocketExplicit", KeyClass::Live),
    ("memberHerdrSocket", KeyClass::BootOnly),
    // From the environment, read at each spawn.
    ("codexHome", KeyClass::Live),
    ("tmuxSocket", KeyClass::BootOnly),
    ("membersWorkspace", KeyClass::Live),
    // Applied by the engine when a reload arrives (it subscribes).
    ("primary", KeyClass::Live),
    ("leads", KeyClass::Live),
    ("stateDir", KeyClass::BootOnly),
    ("store", KeyClass::BootOnly),
    ("inbox", KeyClass::BootOnly),
    ("tickets", KeyClass::Live),
    ("delivery", KeyClass::Live),
    // Read by the engine on each submit and question; a reload applies to what comes next.
    ("limits", KeyClass::Live),
    // Read by the engine on each spawn and send.
    ("maxDelegationDepth", KeyClass::Live),
    ("maxMembersPerLead", KeyClass::Live),
    // Read by every door as a connection arrives; open connections keep their timeouts.
    ("connections", KeyClass::Live),
    ("profiles", KeyClass::Live),
    ("backends", KeyClass::Live),
    ("secrets", KeyClass::Live),
    ("configReload", KeyClass::Live),
    ("log.format", KeyClass::BootOnly),
    // The broker link and its consumer are set up once, at start.
    ("gateway", KeyClass::BootOnly),
    ("log.level", KeyClass::Live),
    // Read as each approval and each event comes.
    ("approvals", KeyClass::Live),
    ("notify", KeyClass::Live),
];

fn class_of(key: &str) -> KeyClass {
    KEYS.iter()
        .find(|(k, _)| *k == key)
        .map_or(KeyClass::BootOnly, |(_, class)| *class)
}

/// One changed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The key as written in the file, dotted below the top level (`log.level`,
    /// `secrets.api-token`).
    pub key: String,
    /// Whether the running daemon can take it.
    pub class: KeyClass,
    /// For maps (profiles, backends, secrets): which names were added (`+`), removed (`-`) or
    /// changed (`~`). Names only, never values.
    pub detail: Option<String>,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Some(detail) => write!(f, "{} ({detail})", self.key),
            None => f.write_str(&self.key),
        }
    }
}

/// The changes from a running configuration to a newly loaded one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigDiff {
    /// Every changed key, in the file's order of sections.
    pub changes: Vec<Change>,
}

impl ConfigDiff {
    /// Compares the running configuration `old` with the newly loaded `new`.
    pub fn between(old: &Config, new: &Config) -> Self {
        let flat = [
            ("listen", old.listen != new.listen),
            ("apiToken", old.api_token != new.api_token),
            ("allowedHosts", old.allowed_hosts != new.allowed_hosts),
            ("multiplexer", old.multiplexer != new.multiplexer),
            ("herdrSocket", old.herdr_socket != new.herdr_socket),
            (
                "herdrSocketExplicit",
                old.herdr_socket_explicit != new.herdr_socket_explicit,
            ),
            (
                "memberHerdrSocket",
                old.member_herdr_socket != new.member_herdr_socket,
            ),
            ("tmuxSocket", old.tmux_socket != new.tmux_socket),
            ("codexHome", old.codex_home != new.codex_home),
            (
                "membersWorkspace",
                old.members_workspace != new.members_workspace,
            ),
            ("primary", old.primary != new.primary),
            ("leads", old.leads != new.leads),
            ("stateDir", old.state_dir != new.state_dir),
            ("store", old.store != new.store),
            ("inbox", old.inbox != new.inbox),
            ("tickets", old.tickets != new.tickets),
            ("delivery", old.delivery != new.delivery),
            ("limits", old.limits != new.limits),
            (
                "maxDelegationDepth",
                old.max_delegation_depth != new.max_delegation_depth,
            ),
            (
                "maxMembersPerLead",
                old.max_members_per_lead != new.max_members_per_lead,
            ),
            ("connections", old.connections != new.connections),
            ("gateway", old.gateway != new.gateway),
            ("approvals", old.approvals != new.approvals),
            ("notify", old.notify != new.notify),
        ];
        let mut changes: Vec<Change> = flat
            .into_iter()
            .filter(|(_, changed)| *changed)
            .map(|(key, _)| Change {
                key: key.to_owned(),
                class: class_of(key),
                detail: None,
            })
            .collect();
        changes.extend(map_change("profiles", &old.profiles, &new.profiles));
        changes.extend(map_change("backends", &old.backends, &new.backends));
        changes.extend(map_change("secrets", &old.secrets, &new.secrets));
        changes.extend(boot_secrets(old, new));
        if old.config_reload != new.config_reload {
            changes.push(Change {
                key: "configReload".to_owned(),
                class: class_of("configReload"),
                detail: None,
            });
        }
        for (key, changed) in [
            ("log.format", old.log.format != new.log.format),
            ("log.level", old.log.level != new.log.level),
        ] {
            if changed {
                changes.push(Change {
                    key: key.to_owned(),
                    class: class_of(key),
                    detail: None,
                });
            }
        }
        Self { changes }
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The changes a running daemon cannot take; any one refuses the whole reload.
    pub fn boot_only(&self) -> Vec<&Change> {
        self.of_class(KeyClass::BootOnly)
    }

    fn of_class(&self, class: KeyClass) -> Vec<&Change> {
        self.changes.iter().filter(|c| c.class == class).collect()
    }

    /// True when `key` (exactly as in [`Change::key`]) changed.
    pub fn touches(&self, key: &str) -> bool {
        self.changes.iter().any(|c| c.key == key)
    }

    /// One line naming every changed key, with the names added, removed or changed in maps,
    /// e.g. `profiles (+reviewer, ~coder), log.level`. Never contains a value.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self.changes.iter().map(ToString::to_string).collect();
        parts.join(", ")
    }
}

/// The change to a name → value map as `+added, -removed, ~changed`, if any.
fn map_change<V: PartialEq>(
    key: &str,
    old: &BTreeMap<String, V>,
    new: &BTreeMap<String, V>,
) -> Option<Change> {
    let mut names = Vec::new();
    for name in new.keys().filter(|n| !old.contains_key(*n)) {
        names.push(format!("+{name}"));
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        names.push(format!("-{name}"));
    }
    for (name, value) in old {
        if new.get(name).is_some_and(|v| v != value) {
            names.push(format!("~{name}"));
        }
    }
    (!names.is_empty()).then(|| Change {
        key: key.to_owned(),
        class: class_of(key),
        detail: Some(names.join(", ")),
    })
}

/// Secrets the daemon resolved once at start (the API token, the broker URL): changing their
/// source in a reload could not reach the open listener or store, so each is boot-only by name.
fn boot_secrets(old: &Config, new: &Config) -> Vec<Change> {
    let mut used_at_start: Vec<(&str, &str)> = Vec::new();
    if let Some(name) = &old.api_token {
        used_at_start.push((name, "apiToken"));
    }
    if let Store::Amqp {
        url: AmqpUrl::Secret(name),
    } = &old.store
    {
        used_at_start.push((name, "store.url"));
    }
    used_at_start
        .into_iter()
        .filter(|(name, _)| old.secrets.get(*name) != new.secrets.get(*name))
        .map(|(name, user)| Change {
            key: format!("secrets.{name}"),
            class: KeyClass::BootOnly,
            detail: Some(format!("resolved once at start for {user}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::PathBuf;

    use super::*;
    use crate::config::Environment;

    fn parse(text: &str) -> Config {
        let env = Environment {
            home: Some(PathBuf::from("/home/u")),
            ..Environment::default()
        };
        Config::parse(text, "test.yaml", &env).expect("test config is valid")
    }

    /// The diff from `old` to `new` as `class key (detail)` lines, for compact expectations.
    fn check(old: &str, new: &str, expect: &[&str]) {
        let diff = ConfigDiff::between(&parse(old), &parse(new));
        let got: Vec<String> = diff
            .changes
            .iter()
            .map(|c| format!("{:?} {c}", c.class))
            .collect();
        assert_eq!(got, expect, "old:\n{old}\nnew:\n{new}");
    }

    const PROFILES: &str = "profiles:\n  coder: {agent: claude}\n  old: {agent: codex}\n";

    #[test]
    fn every_serialized_key_is_classified() {
        let value = serde_json::to_value(parse("")).expect("config serializes");
        let mut serialized: BTreeSet<String> = BTreeSet::new();
        for (key, v) in value.as_object().expect("an object") {
            if key == "log" {
                for sub in v.as_object().expect("log is an object").keys() {
                    serialized.insert(format!("log.{sub}"));
                }
            } else {
                serialized.insert(key.clone());
            }
        }
        let classified: BTreeSet<String> = KEYS.iter().map(|(k, _)| (*k).to_owned()).collect();
        assert_eq!(serialized, classified);
    }

    #[test]
    fn same_text_is_no_change() {
        check(PROFILES, PROFILES, &[]);
        assert!(ConfigDiff::between(&parse(PROFILES), &parse(PROFILES)).is_empty());
    }

    #[test]
    fn profiles_added_removed_and_changed_are_named() {
        check(
            PROFILES,
            "profiles:\n  coder: {agent: claude, model: opus}\n  reviewer: {agent: pi}\n",
            &["Live profiles (+reviewer, -old, ~coder)"],
        );
    }

    #[test]
    fn boot_only_keys_are_classified_as_such() {
        check("", "listen: 127.0.0.1:9999\n", &["BootOnly listen"]);
        check("", "tmuxSocket: /tmp/t.sock\n", &["BootOnly tmuxSocket"]);
        check(
            "",
            "herdrSocket: /tmp/h.sock\n",
            &["BootOnly herdrSocket", "Live herdrSocketExplicit"],
        );
        check(
            "",
            "memberHerdrSocket: /tmp/m.sock\n",
            &["BootOnly memberHerdrSocket"],
        );
        check("", "multiplexer: tmux\n", &["BootOnly multiplexer"]);
        check("", "store:\n  path: /tmp/other.db\n", &["BootOnly store"]);
        check("", "inbox: {maxMessageBytes: 2048}\n", &["BootOnly inbox"]);
        check("", "log: {format: json}\n", &["BootOnly log.format"]);
    }

    #[test]
    fn live_and_engine_keys_are_classified() {
        check(
            "",
            "membersWorkspace: crew\nconfigReload: true\nlog: {level: debug}\n",
            &[
                "Live membersWorkspace",
                "Live configReload",
                "Live log.level",
            ],
        );
        check(
            "",
            "tickets: {ttlAfterFinishSecs: 5}\ndelivery: {verifyGraceMs: 1}\nlimits: {maxQueuedTasks: 2}\nconnections: {perUid: 3}\n",
            &[
                "Live tickets",
                "Live delivery",
                "Live limits",
                "Live connections",
            ],
        );
    }

    #[test]
    fn a_boot_only_change_is_reported_among_live_ones() {
        let diff = ConfigDiff::between(
            &parse(PROFILES),
            &parse(&format!(
                "listen: 127.0.0.1:1\n{PROFILES}  extra: {{agent: pi}}\n"
            )),
        );
        let refused: Vec<String> = diff.boot_only().iter().map(|c| c.key.clone()).collect();
        assert_eq!(refused, ["listen"]);
        assert!(diff.touches("profiles"));
        assert_eq!(diff.summary(), "listen, profiles (+extra)");
    }

    #[test]
    fn the_secret_behind_the_api_token_is_boot_only_and_no_value_is_shown() {
        let old = "apiToken: tok\nsecrets:\n  tok: {env: TOKEN_A}\n  other: {env: OTHER_A}\n";
        let new = "apiToken: tok\nsecrets:\n  tok: {env: TOKEN_B}\n  other: {env: OTHER_B}\n";
        check(
            old,
            new,
            &[
                "Live secrets (~other, ~tok)",
                "BootOnly secrets.tok (resolved once at start for apiToken)",
            ],
        );
        let summary = ConfigDiff::between(&parse(old), &parse(new)).summary();
        assert!(!summary.contains("TOKEN_B"), "{summary}");
    }
}

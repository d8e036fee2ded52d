//! Pane identity and agent status as pure values: multiplexer daemon names, pane / tab / terminal
//! ids, daemon-qualified pane ids and agent status. Owns parsing and validation only; knows nothing
//! about how a multiplexer is reached (no I/O, no herdr wire format, no tmux).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a string was refused as a pane-related identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaneIdError {
    /// Not a herdr pane id (`w1:p2`) nor a tmux pane id (`%3`).
    #[error(
        "invalid pane id {0:?}: expected a herdr pane id such as w1:p2 or a tmux pane id such as %3"
    )]
    Pane(String),
    /// A daemon prefix other than `lead` or `member`.
    #[error("invalid multiplexer daemon {0:?}: expected `lead` or `member`")]
    Daemon(String),
    /// An empty, over-long or control-character-bearing id.
    #[error("invalid {kind} {value:?}: expected 1 to 128 printable characters without spaces")]
    Opaque {
        /// Which id was being parsed (`terminal id`, `tab id`, ...).
        kind: &'static str,
        /// The refused text.
        value: String,
    },
}

/// Which configured multiplexer daemon a pane lives on: the leads' (`herdrSocket`) or the members'
/// (`memberHerdrSocket`). With a single daemon every pane is on `Lead`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MuxDaemon {
    /// The daemon that hosts the lead tabs (always configured).
    Lead,
    /// The optional second daemon that hosts member panes.
    Member,
}

/// Alias kept for readers who think of the daemon by its config name.
pub type DaemonName = MuxDaemon;

impl MuxDaemon {
    /// Both daemons, lead first.
    pub const ALL: [MuxDaemon; 2] = [MuxDaemon::Lead, MuxDaemon::Member];

    /// The prefix used in qualified pane ids.
    pub fn as_str(self) -> &'static str {
        match self {
            MuxDaemon::Lead => "lead",
            MuxDaemon::Member => "member",
        }
    }
}

crate::text_impls::named_enum_impls!(MuxDaemon, PaneIdError, |text| {
    PaneIdError::Daemon(text.to_owned())
});

/// Longest id accepted anywhere in this module, in bytes.
const MAX_ID_LEN: usize = 128;

fn is_opaque_ok(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_ID_LEN
        && value.chars().all(|c| !c.is_control() && !c.is_whitespace())
}

/// A pane id as its multiplexer names it: herdr `w1:p2` (also herdr's legacy `w653bd-3` form) or
/// tmux `%3`. A layout address: the same id can host a new occupant later (see [`TerminalId`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PaneId(String);

impl PaneId {
    /// Validates `id` as a herdr or tmux pane id.
    pub fn new(id: impl Into<String>) -> Result<Self, PaneIdError> {
        let id = id.into();
        if Self::is_tmux(&id) || Self::is_herdr(&id) {
            Ok(Self(id))
        } else {
            Err(PaneIdError::Pane(id))
        }
    }

    fn is_tmux(id: &str) -> bool {
        id.strip_prefix('%').is_some_and(|n| {
            !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit())
        })
    }

    fn is_herdr(id: &str) -> bool {
        // herdr ids start with the workspace part `w<base32>`; the rest is `:p<base32>` (current)
        // or `-<n>` (legacy). Accept the character set loosely so a newer herdr form still parses.
        id.len() <= MAX_ID_LEN
            && id.starts_with('w')
            && id.len() > 1
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_'))
            && (id.contains(":p") || id.contains('-'))
    }

    /// True for tmux's `%N` form.
    pub fn is_tmux_form(&self) -> bool {
        Self::is_tmux(&self.0)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

crate::text_impls::string_newtype_impls!(PaneId, PaneIdError);

impl FromStr for PaneId {
    type Err = PaneIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A pane id with the daemon it lives on: `lead:w1:p2`, `member:w1:p2`, `lead:%3`. This is the
/// only form fleetd shows, so two daemons' `w1:p1` never collide.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QualifiedPaneId {
    /// The daemon.
    pub daemon: MuxDaemon,
    /// The daemon's own pane id.
    pub pane: PaneId,
}

impl QualifiedPaneId {
    /// Joins a daemon and a pane id.
    pub fn new(daemon: MuxDaemon, pane: PaneId) -> Self {
        Self { daemon, pane }
    }

    /// Parses `daemon:pane`; a bare pane id is refused (see [`PaneRef`] for input that may be bare).
    pub fn parse(text: &str) -> Result<Self, PaneIdError> {
        match PaneRef::parse(text)? {
            PaneRef::Qualified(q) => Ok(q),
            PaneRef::Bare(_) => Err(PaneIdError::Daemon(String::new())),
        }
    }
}

impl fmt::Display for QualifiedPaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.daemon, self.pane)
    }
}

impl TryFrom<String> for QualifiedPaneId {
    type Error = PaneIdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<QualifiedPaneId> for String {
    fn from(value: QualifiedPaneId) -> Self {
        value.to_string()
    }
}

impl FromStr for QualifiedPaneId {
    type Err = PaneIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A pane id as a user or tool supplied it: qualified, or bare (to be resolved against every
/// daemon; refused as ambiguous when it exists on more than one).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PaneRef {
    /// `lead:w1:p2`.
    Qualified(QualifiedPaneId),
    /// `w1:p2` or `%3`.
    Bare(PaneId),
}

impl PaneRef {
    /// Parses either form. A leading `lead:`/`member:` makes it qualified.
    pub fn parse(text: &str) -> Result<Self, PaneIdError> {
        let text = text.trim();
        if let Some((prefix, rest)) = text.split_once(':')
            && let Ok(daemon) = prefix.parse::<MuxDaemon>()
        {
            return Ok(PaneRef::Qualified(QualifiedPaneId::new(
                daemon,
                PaneId::new(rest)?,
            )));
        }
        PaneId::new(text).map(PaneRef::Bare)
    }
}

impl fmt::Display for PaneRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PaneRef::Qualified(q) => q.fmt(f),
            PaneRef::Bare(p) => p.fmt(f),
        }
    }
}

macro_rules! opaque_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value`: 1 to 128 printable characters, no whitespace.
            pub fn new(value: impl Into<String>) -> Result<Self, PaneIdError> {
                let value = value.into();
                if is_opaque_ok(&value) {
                    Ok(Self(value))
                } else {
                    Err(PaneIdError::Opaque { kind: $kind, value })
                }
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        crate::text_impls::string_newtype_impls!($name, PaneIdError);
    };
}

opaque_id!(
    /// A terminal incarnation: herdr's `term_<hex>` or the tmux backend's `%3@<pane pid>`. When
    /// a pane gets a new occupant (herdr restart, respawn) its terminal id changes, so this — not the
    /// pane id — is what bindings pin.
    TerminalId,
    "terminal id"
);
opaque_id!(
    /// A tab: herdr `w1:t1`, or tmux `session:window_index`.
    TabId,
    "tab id"
);
opaque_id!(
    /// A workspace: herdr `w1`, or a tmux session name.
    WorkspaceId,
    "workspace id"
);

/// What an agent in a pane is doing, as the multiplexer reports it (herdr's five values; tmux
/// derives them from the title and screen, less reliably).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AgentStatus {
    /// Waiting for input.
    Idle,
    /// In a turn.
    Working,
    /// Waiting on an approval or question UI.
    Blocked,
    /// Finished a turn nobody has looked at yet (herdr headless reports finished agents this way);
    /// treat as idle.
    Done,
    /// No agent, or the state cannot be classified.
    #[default]
    Unknown,
}

impl AgentStatus {
    /// All values, in herdr's order.
    pub const ALL: [AgentStatus; 5] = [
        AgentStatus::Idle,
        AgentStatus::Working,
        AgentStatus::Blocked,
        AgentStatus::Done,
        AgentStatus::Unknown,
    ];

    /// The wire / display name.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Idle => "idle",
            AgentStatus::Working => "working",
            AgentStatus::Blocked => "blocked",
            AgentStatus::Done => "done",
            AgentStatus::Unknown => "unknown",
        }
    }

    /// Idle or done: the agent will take a new prompt.
    pub fn is_at_rest(self) -> bool {
        matches!(self, AgentStatus::Idle | AgentStatus::Done)
    }
}

crate::text_impls::named_enum_impls!(AgentStatus, PaneIdError, |text| {
    PaneIdError::Opaque {
        kind: "agent status",
        value: text.to_owned(),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    fn check_pane_ref(input: &str, expect: Result<&str, ()>) {
        let got = PaneRef::parse(input).map(|r| match r {
            PaneRef::Qualified(q) => format!("Q {q}"),
            PaneRef::Bare(p) => format!("B {p}"),
        });
        assert_eq!(
            got.map_err(|_| ()),
            expect.map(str::to_owned),
            "input {input:?}"
        );
    }

    #[test]
    fn pane_refs_parse_qualified_and_bare() {
        check_pane_ref("lead:w1:p2", Ok("Q lead:w1:p2"));
        check_pane_ref("member:w1:p2", Ok("Q member:w1:p2"));
        check_pane_ref("member:%3", Ok("Q member:%3"));
        check_pane_ref(" w1:p2 ", Ok("B w1:p2"));
        check_pane_ref("wA:pZ", Ok("B wA:pZ"));
        check_pane_ref("w653bd239a39073-3", Ok("B w653bd239a39073-3"));
        check_pane_ref("%12", Ok("B %12"));
        for bad in [
            "",
            "lead:",
            "boss:w1:p2",
            "lead:x",
            "%",
            "%x",
            "w1",
            "w1:p 2",
            "p2",
            "lead:lead:w1:p2",
        ] {
            check_pane_ref(bad, Err(()));
        }
    }

    #[test]
    fn qualified_ids_round_trip_through_serde() {
        let q = QualifiedPaneId::parse("member:w2:p7").expect("valid");
        assert_eq!(q.daemon, MuxDaemon::Member);
        assert_eq!(q.pane.as_str(), "w2:p7");
        let json = serde_json::to_string(&q).expect("serialize");
        assert_eq!(json, "\"member:w2:p7\"");
        let back: QualifiedPaneId = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, q);
        assert!(
            QualifiedPaneId::parse("w2:p7").is_err(),
            "a bare id is not qualified"
        );
    }

    #[test]
    fn statuses_and_opaque_ids() {
        for status in AgentStatus::ALL {
            assert_eq!(status.as_str().parse::<AgentStatus>(), Ok(status));
        }
        assert!(AgentStatus::Done.is_at_rest() && !AgentStatus::Working.is_at_rest());
        assert!(TerminalId::new("term_66170cfcd31911").is_ok());
        assert!(TerminalId::new("").is_err());
        assert!(TerminalId::new("a b").is_err());
        assert!(TabId::new("w1:t1").is_ok());
    }
}

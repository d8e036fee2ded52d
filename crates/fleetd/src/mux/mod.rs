//! The multiplexer seam: the `Multiplexer` trait, its backend-neutral types and `MuxError`, plus
//! the herdr and tmux backends and the two-daemon router. Only `mux::herdr` knows herdr's wire
//! format and only `mux::tmux` runs `tmux`; nothing here decides policy (delivery verification,
//! retries of whole deliveries, bindings) — callers do.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use fleetd_core::{AgentStatus, PaneId, TabId, TerminalId, WorkspaceId};
use tokio::sync::broadcast;

#[cfg(test)]
pub(crate) mod fake;
pub mod herdr;
pub mod router;
pub(crate) mod screen_status;
pub mod tmux;

pub use router::{MuxRouter, RoutedEvent, RoutedPane, RoutedTab};

/// Capacity of every backend's pane-event broadcast. Status changes are rare (a few per turn per
/// pane); 1024 covers a burst from hundreds of panes after a daemon restart. A receiver that lags
/// gets `RecvError::Lagged` and must re-read statuses with `Multiplexer::pane`.
pub const PANE_EVENT_CAPACITY: usize = 1024;

/// The boxed future every trait method returns, so the trait stays usable as `dyn Multiplexer`.
pub type MuxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, MuxError>> + Send + 'a>>;

/// Which kind of multiplexer a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// herdr over its socket API.
    Herdr,
    /// tmux through its CLI.
    Tmux,
}

/// A failed multiplexer call. Two splits matter. [`MuxError::NotFound`] is an affirmative answer
/// that the pane or agent is gone; everything else — transient failures (timeouts, socket errors,
/// decode errors, a restarting server) and uncertain ones — must never be read as "gone". And a
/// call that types into a pane either wrote nothing (`Transient`, `Rejected`, `NotFound`, ...) or
/// may have typed before it failed ([`MuxError::Uncertain`]); only the first may be repeated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// The multiplexer answered that the pane, agent, tab or workspace does not exist.
    #[error("{what} not found ({code}): {message}")]
    NotFound {
        /// What was looked up (`pane w1:p2`, `agent w1:p2`, ...).
        what: String,
        /// The multiplexer's code (`pane_not_found`, `agent_not_found`, `tmux_no_such_pane`).
        code: String,
        /// Its message.
        message: String,
    },
    /// The call may succeed later: timeout, socket or I/O error, undecodable answer, server
    /// restarting. Says nothing about whether the pane exists.
    #[error("transient multiplexer failure during {op}: {reason}")]
    Transient {
        /// The operation (`pane.get`, `tmux list-panes`, ...).
        op: String,
        /// Why.
        reason: String,
    },
    /// A call that types into a pane ([`Multiplexer::submit`], [`Multiplexer::press_enter`])
    /// failed after its input may have reached the pane: the request was out when it timed out
    /// or broke, or herdr answered its own `timeout` after typing. The text must be treated as
    /// possibly typed — read the pane's status, never type it again blind (SPEC §8, §13.7).
    /// Says nothing about whether the pane exists; no other call returns it.
    #[error("{op} may have typed into the pane before it failed: {reason}")]
    Uncertain {
        /// The operation (`agent.prompt`, `tmux send-keys`, ...).
        op: String,
        /// Why.
        reason: String,
    },
    /// The multiplexer refused the request for a reason that retrying will not fix (bad params,
    /// agent not ready, invalid key, ...).
    #[error("{op} refused ({code}): {message}")]
    Rejected {
        /// The operation.
        op: String,
        /// The multiplexer's code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The multiplexer speaks a protocol this fleetd cannot use.
    #[error("unsupported multiplexer protocol: {0}")]
    Protocol(String),
    /// A bare pane id exists on more than one daemon; the caller must qualify it.
    #[error("pane id {pane} is ambiguous: it exists on {daemons}; qualify it (e.g. lead:{pane})")]
    Ambiguous {
        /// The bare id.
        pane: String,
        /// The daemons it was found on, comma-separated.
        daemons: String,
    },
    /// The pane id names a daemon that is not configured (e.g. `member:` with one daemon).
    #[error("no multiplexer daemon {0} is configured")]
    NoSuchDaemon(String),
    /// The backend cannot do this at all (e.g. a feature tmux lacks).
    #[error("{0} is not supported by this multiplexer backend")]
    Unsupported(String),
}

/// Refusals that mean "the agent is busy, nothing was typed" (herdr 0.8.2 `agent_blocked`).
const BUSY_CODES: &[&str] = &["agent_blocked"];

impl MuxError {
    /// True only for an affirmative not-found answer (pane/agent gone). Later code forgets
    /// bindings on this and on nothing else.
    pub fn is_not_found(&self) -> bool {
        matches!(self, MuxError::NotFound { .. })
    }

    /// True for failures that may go away by themselves and did nothing.
    pub fn is_transient(&self) -> bool {
        matches!(self, MuxError::Transient { .. })
    }

    /// True when the multiplexer refused to type because the agent is busy (herdr's
    /// `agent_blocked`: a dialog is up): nothing was typed, and trying again once the agent is
    /// idle will do.
    pub fn is_busy(&self) -> bool {
        matches!(self, MuxError::Rejected { code, .. } if BUSY_CODES.contains(&code.as_str()))
    }

    /// True when a call that types may have typed before it failed.
    pub fn is_uncertain(&self) -> bool {
        matches!(self, MuxError::Uncertain { .. })
    }

    /// Builds a transient error.
    pub fn transient(op: impl Into<String>, reason: impl fmt::Display) -> Self {
        MuxError::Transient {
            op: op.into(),
            reason: reason.to_string(),
        }
    }

    /// Builds an uncertain error.
    pub fn uncertain(op: impl Into<String>, reason: impl fmt::Display) -> Self {
        MuxError::Uncertain {
            op: op.into(),
            reason: reason.to_string(),
        }
    }
}

/// What `ping` learned about the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Which backend.
    pub backend: BackendKind,
    /// The server's version text (`0.8.0`, `tmux 3.3a`).
    pub version: String,
    /// herdr's socket protocol number; `None` for tmux.
    pub protocol: Option<u32>,
}

/// One pane as fleetd sees it, on any backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaneInfo {
    /// The backend's pane id (a layout address).
    pub pane: PaneId,
    /// The incarnation key.
    pub terminal: TerminalId,
    /// The tab (herdr tab / tmux window) holding it.
    pub tab: TabId,
    /// The workspace (herdr workspace / tmux session).
    pub workspace: WorkspaceId,
    /// The workspace's label (herdr) or session name (tmux), as `membersWorkspace` names it.
    /// Listings carry it on every backend; a single herdr `pane.get` does not (`None`).
    pub workspace_label: Option<String>,
    /// The pane's label (herdr) or window name (tmux).
    pub label: Option<String>,
    /// The terminal title the program set.
    pub title: Option<String>,
    /// The detected agent kind (`claude`, `codex`, ...); `None` when none is detected.
    pub agent: Option<String>,
    /// The agent status.
    pub status: AgentStatus,
    /// The pane's first process (session leader), when the listing carries it (tmux does;
    /// herdr needs a `process_info` call).
    pub shell_pid: Option<u32>,
}

/// One tab (herdr tab / tmux window).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TabInfo {
    /// Its id.
    pub tab: TabId,
    /// The workspace (herdr) or session (tmux) it belongs to.
    pub workspace: WorkspaceId,
    /// Its label or window name.
    pub label: String,
    /// How many panes it holds.
    pub pane_count: usize,
}

/// Process facts about a pane: the shell (session leader) pid the caller locator keys on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The pane.
    pub pane: PaneId,
    /// The pane's first process (its shell or command): the session leader of everything started
    /// in the pane. `None` when the multiplexer does not know it (yet).
    pub shell_pid: Option<u32>,
    /// The pids of the foreground process group, when the backend reports them.
    pub foreground_pids: Vec<u32>,
}

/// Where a new member pane goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A new tab (herdr) / window (tmux) in the workspace (herdr label) / session (tmux name);
    /// created when it does not exist.
    NewTab {
        /// The herdr workspace label or tmux session name.
        workspace: String,
    },
    /// A split of an existing pane.
    Split {
        /// The pane to split.
        of: PaneId,
        /// Side by side (`right`) or stacked (`down`).
        direction: SplitDirection,
    },
}

/// How a split divides its pane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitDirection {
    /// The new pane to the right.
    Right,
    /// The new pane below.
    Down,
}

/// What a new pane runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    /// An agent of kind `kind` (`claude`, `codex`, ...) without a command of its own, named
    /// `name`. The backend starts it its own way: herdr, for a kind it knows, opens the tab with a
    /// shell and runs `agent.start` in it (so herdr knows it launched that agent); otherwise, and
    /// on tmux, the pane runs the kind's canonical executable with `args`.
    Agent {
        /// The agent's name, where the multiplexer names agents (the member's name).
        name: String,
        /// The agent kind.
        kind: String,
        /// Arguments after the executable.
        args: Vec<String>,
    },
    /// This argv. Empty runs the multiplexer's default shell.
    Argv(Vec<String>),
}

impl Launch {
    /// The argv that runs it where the backend has no agent launcher of its own: the kind's
    /// canonical executable (named like the kind) with its arguments, or the argv itself.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Launch::Agent { kind, args, .. } => std::iter::once(kind.clone())
                .chain(args.iter().cloned())
                .collect(),
            Launch::Argv(argv) => argv.clone(),
        }
    }
}

/// A request to open a member pane running `launch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPane {
    /// Where.
    pub placement: Placement,
    /// The tab / pane label (herdr) or window name (tmux).
    pub label: Option<String>,
    /// Working directory; `None` leaves it to the multiplexer.
    pub cwd: Option<PathBuf>,
    /// Extra environment for the pane's process only (herdr's own `HERDR_*` values win).
    pub env: BTreeMap<String, String>,
    /// What the pane runs.
    pub launch: Launch,
}

/// How a submitted text was handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitPath {
    /// herdr `agent.prompt` (paste, then Enter after a delay) for a known agent kind.
    AgentPrompt,
    /// herdr `pane.send_input` with `enter`, for shells and custom agents.
    PaneInput,
    /// tmux `paste-buffer -p`, then a separate `Enter` once the screen shows the paste.
    TmuxPaste,
}

/// The outcome of [`Multiplexer::submit`]: the text and its Enter were written. Whether a turn
/// started is `started`, when the backend could observe it; callers verify delivery themselves
/// otherwise. A backend never presses Enter again of its own accord: the one Enter retry of a
/// delivery is the caller's ([`Multiplexer::press_enter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// Which path was used.
    pub path: SubmitPath,
    /// `Some(true)` when the backend saw the agent reach `working` (proof the turn started);
    /// `Some(false)` when it watched and saw no change (herdr's `agent_prompt_stalled`: typed,
    /// not picked up yet); `None` when it could not tell.
    pub started: Option<bool>,
}

/// A change the backend observed on a watched pane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaneEvent {
    /// The agent status of a pane incarnation changed (consecutive duplicates are suppressed).
    StatusChanged {
        /// The pane.
        pane: PaneId,
        /// Its incarnation when the status was read.
        terminal: TerminalId,
        /// The new status.
        status: AgentStatus,
    },
    /// The incarnation is gone: the pane closed, its process exited, or the server restarted and
    /// the pane came back with a different terminal id (a `StatusChanged` for the new one follows).
    Gone {
        /// The pane.
        pane: PaneId,
        /// The incarnation that ended; `None` when the pane vanished before it was first read.
        terminal: Option<TerminalId>,
    },
}

impl PaneEvent {
    /// The pane the event is about.
    pub fn pane(&self) -> &PaneId {
        match self {
            PaneEvent::StatusChanged { pane, .. } | PaneEvent::Gone { pane, .. } => pane,
        }
    }
}

/// The [`Multiplexer`] methods that read panes and tabs and open a pane, each the backend's
/// inherent `*_inner` method of the same name, boxed: herdr and tmux implement them alike (the
/// fake answers from its table instead).
macro_rules! reading_methods {
    () => {
        fn list_panes(&self) -> $crate::mux::MuxFuture<'_, Vec<$crate::mux::PaneInfo>> {
            Box::pin(self.list_panes_inner())
        }

        fn list_tabs(&self) -> $crate::mux::MuxFuture<'_, Vec<$crate::mux::TabInfo>> {
            Box::pin(self.list_tabs_inner())
        }

        fn pane<'a>(
            &'a self,
            pane: &'a fleetd_core::PaneId,
        ) -> $crate::mux::MuxFuture<'a, $crate::mux::PaneInfo> {
            Box::pin(self.pane_inner(pane))
        }

        fn process_info<'a>(
            &'a self,
            pane: &'a fleetd_core::PaneId,
        ) -> $crate::mux::MuxFuture<'a, $crate::mux::ProcessInfo> {
            Box::pin(self.process_info_inner(pane))
        }

        fn open_pane(
            &self,
            req: $crate::mux::OpenPane,
        ) -> $crate::mux::MuxFuture<'_, $crate::mux::PaneInfo> {
            Box::pin(self.open_pane_inner(req))
        }
    };
}
use reading_methods;

/// What fleetd needs from a terminal multiplexer. Every method is one bounded-time call (each
/// backend applies its own per-call timeout); none retries a non-idempotent operation.
pub trait Multiplexer: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Checks the server answers and reports its version.
    fn ping(&self) -> MuxFuture<'_, ServerInfo>;

    /// Every pane on the server.
    fn list_panes(&self) -> MuxFuture<'_, Vec<PaneInfo>>;

    /// Every tab / window on the server.
    fn list_tabs(&self) -> MuxFuture<'_, Vec<TabInfo>>;

    /// One pane, with its current terminal id and agent status.
    fn pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, PaneInfo>;

    /// The pane's shell pid and foreground processes.
    fn process_info<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ProcessInfo>;

    /// Opens a member pane running `req.launch` with `req.env`, and returns it. A pane whose
    /// launch failed after it opened is closed again before the error is returned.
    fn open_pane(&self, req: OpenPane) -> MuxFuture<'_, PaneInfo>;

    /// Types `text` into the pane's agent and submits it (Enter). The caller sanitises `text`.
    /// A failure after the text may have reached the pane is [`MuxError::Uncertain`]; any other
    /// error means nothing was typed.
    fn submit<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted>;

    /// Types a nudge into a lead's pane and submits it, as [`Multiplexer::submit`] does, but
    /// returns once it is typed: nothing waits to see the lead's turn start (the push loop reads
    /// the lead's status anyway, and a wait would hold the lead's next nudge behind it).
    fn nudge<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted> {
        self.submit(pane, text)
    }

    /// Presses Enter once in the pane (the retry of a submit the agent did not pick up). A
    /// failure after the key may have been sent is [`MuxError::Uncertain`].
    fn press_enter<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()>;

    /// Types `keys` into the pane exactly as given, with no Enter and no paste wrapping: a
    /// dialog's choice (`1`, `y`). The caller has made sure `keys` holds no control character.
    /// A failure after the keys may have been sent is [`MuxError::Uncertain`].
    fn type_keys<'a>(&'a self, pane: &'a PaneId, keys: &'a str) -> MuxFuture<'a, ()>;

    /// The last `lines` lines of the pane's output, as plain text.
    fn read_tail<'a>(&'a self, pane: &'a PaneId, lines: u32) -> MuxFuture<'a, String>;

    /// Closes the pane (and so ends its processes).
    fn close_pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()>;

    /// Starts watching the pane's agent status; changes arrive on [`Multiplexer::events`].
    /// Either way — a new watch, or a pane watched already — the pane's current status is then
    /// published on the event stream by the watch itself, in order with every other event of
    /// that pane (a stale reading never overtakes a newer one).
    fn watch<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()>;

    /// Stops watching the pane.
    fn unwatch(&self, pane: &PaneId);

    /// A receiver of [`PaneEvent`]s for watched panes.
    fn events(&self) -> broadcast::Receiver<PaneEvent>;
}

/// POSIX single-quote quoting of an argv, for typing a command into a shell.
pub(crate) fn shell_quote_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| {
            let safe = !arg.is_empty()
                && arg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
            if safe {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

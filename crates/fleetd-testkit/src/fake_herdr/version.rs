//! Which herdr fake-herdr behaves as: 0.8.2 (protocol 20, the default and the behaviour the rest
//! of the fake documents with herdr v0.8.2 file:line references) or 0.9 (protocol 22). Chosen by
//! `Options::with_herdr` in process, and for the `fake-herdr` binary by the `FAKE_HERDR_VERSION`
//! environment variable (`0.8` or `0.9`, read by `serve`): tests pick it with
//! `FakeHerdrProcess::start_as` / `HerdrRig::start_as`, and exporting it points every other
//! herdr test of a run at that version.
//!
//! The herdr 0.9 source was not available when this was written: each 0.9 behaviour is modelled
//! on the text of fleetd issue 34, which quotes herdr 0.9's documentation, and on assumptions
//! where that text is silent. What each one is modelled on, and what was assumed:
//!
//! - **ping** — "capabilities gain fields (parse loosely)". Assumed: `protocol: 22`,
//!   `version: "0.9.0"`, and the 0.8 capabilities plus fields a 0.8 client does not know
//!   (`events_lost`, `close_group`, and an object-valued `something_new`).
//! - **events_lost** — "`events_lost` ends a subscription (resubscribe, then resync)". Assumed:
//!   the server drops events it could not deliver, then writes one line framed like every other
//!   pushed event, `{"event":"events_lost","data":{"type":"events_lost","dropped":N}}`, and ends
//!   the subscription by closing its connection. Whether it closes at once is not said, so the
//!   control fault that triggers it (`events_lost`, see the server's module doc) can hold the
//!   connection open (`linger_ms`) after the event: a client must take the event itself as the
//!   end, not wait for EOF. 0.8.2 has no such event; the fault is refused there.
//! - **lifecycle subscriptions** — "lifecycle subscriptions start at the live edge (subscribe
//!   before the snapshot — keep it so)". Modelled: a lifecycle subscription gets only events
//!   newer than its subscribe; 0.8.2 replays its whole 512-event ring from sequence 0
//!   (src/api/subscriptions.rs:117-185 start every lifecycle kind at `last_sequence: 0`).
//! - **agent.prompt** — "`agent.prompt` answers after its Enter". Modelled: the text is pasted,
//!   the Enter written 300 ms later, and only then is the request answered (or its wait begun;
//!   assumed: the 5 s stall window then starts after the Enter). Assumed: an Enter that cannot be
//!   written is answered `agent_prompt_failed`, the code 0.8.2 answers for a prompt whose text
//!   cannot be written (src/app/api/agents.rs:123-125) — on 0.9 it comes after the text was
//!   typed. On 0.8.2 the answer comes right after the paste and a lost Enter is nobody's answer.
//! - **pane.read `recent`** — "`recent` reads include on-screen output". herdr 0.8.2's `recent`
//!   already reads screen rows: the last `lines` rows of scrollback plus the whole screen, blank
//!   rows below the output included, counted before they are trimmed
//!   (src/pane/terminal.rs:2727-2739, 3284-3298), so a small read of a tall pane with short output
//!   answers "". Assumed for 0.9: trailing blank rows are trimmed before the `lines` are counted,
//!   so the on-screen output is always in the read. (fleetd asks for 400 rows more than it wants
//!   and keeps the last ones itself, which is right with either.)
//! - **workspace.close** — "`workspace.close` may need `close_group`". herdr 0.8.2 closes any
//!   workspace (src/app/api/workspaces.rs:298-330) and knows groups only as worktree groups, for
//!   which closing a workspace's last pane is refused with `confirmation_required` while the UI's
//!   close confirmation is on (src/app/api/panes.rs:1561-1570, src/app/actions.rs:1987-2012).
//!   Assumed for 0.9: `workspace.close` on a workspace that belongs to such a group is refused
//!   with `confirmation_required` unless `close_group: true` is passed. A workspace is put in a
//!   group with the control command `{"fault":"group","workspace_id":ID}` (the fake has no
//!   worktrees). As in 0.8.2, the close emits `workspace_closed` only, no `pane_closed`.

use std::str::FromStr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::api::{Outcome, str_param};
use super::{Server, lock};

/// The environment variable that picks the herdr the `fake-herdr` binary behaves as.
pub const ENV: &str = "FAKE_HERDR_VERSION";

/// The herdr release fake-herdr behaves as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HerdrVersion {
    /// herdr 0.8.2, protocol 20 (the default).
    #[default]
    V0_8,
    /// herdr 0.9, protocol 22 (see the module doc for what is modelled and assumed).
    V0_9,
}

impl FromStr for HerdrVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "0.8" | "0.8.0" | "0.8.2" => Ok(Self::V0_8),
            "0.9" | "0.9.0" => Ok(Self::V0_9),
            other => Err(format!(
                "unknown herdr version {other:?}: fake-herdr behaves as 0.8 or 0.9"
            )),
        }
    }
}

impl HerdrVersion {
    /// Both versions, oldest first (for tests that run against each).
    pub const ALL: [Self; 2] = [Self::V0_8, Self::V0_9];

    /// Its `FAKE_HERDR_VERSION` value.
    pub fn arg(self) -> &'static str {
        match self {
            Self::V0_8 => "0.8",
            Self::V0_9 => "0.9",
        }
    }

    /// The version `ping` reports by default.
    pub fn version(self) -> &'static str {
        match self {
            Self::V0_8 => super::VERSION,
            Self::V0_9 => "0.9.0",
        }
    }

    /// The protocol `ping` reports by default.
    pub fn protocol(self) -> u32 {
        match self {
            Self::V0_8 => super::PROTOCOL,
            Self::V0_9 => 22,
        }
    }

    /// `ping`'s `capabilities`.
    pub(super) fn capabilities(self) -> Value {
        match self {
            Self::V0_8 => json!({ "live_handoff": false, "detached_server_daemon": true }),
            Self::V0_9 => json!({
                "live_handoff": false, "detached_server_daemon": true,
                "events_lost": true, "close_group": true,
                "something_new": { "nested": [1, 2], "enabled": "sometimes" },
            }),
        }
    }

    /// Lifecycle subscriptions start at the live edge instead of replaying the ring.
    pub(super) fn lifecycle_from_live_edge(self) -> bool {
        self == Self::V0_9
    }

    /// The server can end a subscription with `events_lost`.
    pub(super) fn has_events_lost(self) -> bool {
        self == Self::V0_9
    }

    /// `agent.prompt` answers once its Enter is written.
    pub(super) fn prompt_answers_after_enter(self) -> bool {
        self == Self::V0_9
    }

    /// `pane.read` `recent` counts its lines after trailing blank rows are trimmed.
    pub(super) fn recent_counts_output_only(self) -> bool {
        self == Self::V0_9
    }

    /// `workspace.close` refuses a grouped workspace without `close_group: true`.
    pub(super) fn close_needs_close_group(self) -> bool {
        self == Self::V0_9
    }
}

/// `workspace.close {workspace_id, close_group?}`: kills every pane of the workspace and removes
/// it; on 0.9 a workspace in a group needs `close_group: true`.
pub(super) fn workspace_close(server: &Arc<Server>, p: &Value) -> Outcome {
    let id = str_param(p, "workspace_id")?;
    let close_group = p.get("close_group").and_then(Value::as_bool) == Some(true);
    let (workspace, panes) = {
        let mut topo = lock(&server.topo);
        let index = topo
            .workspace_index(id)
            .ok_or(("workspace_not_found", format!("workspace {id} not found")))?;
        if server.opts.herdr.close_needs_close_group()
            && topo.workspaces[index].grouped
            && !close_group
        {
            return Err((
                "confirmation_required",
                format!("closing workspace {id} would close a worktree group; pass close_group"),
            ));
        }
        let ws = topo.workspaces.remove(index);
        let panes: Vec<_> = ws
            .tabs
            .iter()
            .flat_map(|t| t.panes.iter())
            .filter_map(|pane| topo.panes.remove(pane))
            .collect();
        if topo
            .focused_pane
            .as_deref()
            .is_some_and(|f| panes.iter().any(|p| p.identity.pane_id == f))
        {
            topo.focused_pane = topo.pane_ids().into_iter().next();
        }
        (ws, panes)
    };
    for pane in panes {
        pane.kill();
    }
    server.push_event(
        "workspace_closed",
        json!({ "workspace_id": workspace.id, "workspace": {
            "workspace_id": workspace.id, "number": workspace.number, "label": workspace.label } }),
    );
    Ok(json!({ "type": "ok" }))
}

/// The `group` control command: puts workspace `id` in a (worktree) group.
pub(super) fn group(server: &Server, id: &str) -> Result<(), String> {
    let mut topo = lock(&server.topo);
    let index = topo
        .workspace_index(id)
        .ok_or_else(|| format!("workspace {id} not found"))?;
    topo.workspaces[index].grouped = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_their_names() {
        assert_eq!("0.8".parse(), Ok(HerdrVersion::V0_8));
        assert_eq!("0.8.2".parse(), Ok(HerdrVersion::V0_8));
        assert_eq!(" 0.9 ".parse(), Ok(HerdrVersion::V0_9));
        assert!("1.0".parse::<HerdrVersion>().is_err());
        for v in HerdrVersion::ALL {
            assert_eq!(v.arg().parse(), Ok(v));
        }
    }
}

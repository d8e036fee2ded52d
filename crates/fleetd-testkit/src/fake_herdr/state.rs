//! fake-herdr's model: workspaces, tabs and panes with herdr's id scheme (bijective base-32
//! numbers, per-workspace tab/pane counters never reused), and the event hub (a 512-event ring
//! that lifecycle subscriptions replay from sequence 0). Pure bookkeeping: no sockets, no PTYs.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};

use super::pane::PaneRt;

/// herdr's alphabet for id numbers (no I, L, O, U).
const ALPHABET: &[u8; 32] = b"123456789ABCDEFGHJKMNPQRSTVWXYZ0";
/// Events kept for replay, as herdr keeps.
const RING: usize = 512;

/// Encodes `n >= 1` in herdr's bijective base-32.
pub(crate) fn encode_number(mut n: u64) -> String {
    let mut out = Vec::new();
    while n > 0 {
        n -= 1;
        out.push(ALPHABET[usize::try_from(n % 32).unwrap_or(0)]);
        n /= 32;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// A workspace.
#[derive(Debug)]
pub(crate) struct Workspace {
    pub(crate) id: String,
    pub(crate) number: u64,
    pub(crate) label: String,
    pub(crate) next_tab: u64,
    pub(crate) next_pane: u64,
    pub(crate) tabs: Vec<Tab>,
    /// Belongs to a (worktree) group: a 0.9 `workspace.close` needs `close_group`.
    pub(crate) grouped: bool,
}

/// A tab.
#[derive(Debug)]
pub(crate) struct Tab {
    pub(crate) id: String,
    pub(crate) number: u64,
    pub(crate) label: String,
    pub(crate) panes: Vec<String>,
}

/// The whole layout plus running panes.
#[derive(Debug, Default)]
pub(crate) struct Topology {
    pub(crate) next_workspace: u64,
    pub(crate) workspaces: Vec<Workspace>,
    pub(crate) panes: HashMap<String, Arc<PaneRt>>,
    pub(crate) focused_pane: Option<String>,
}

impl Topology {
    /// Adds a workspace and returns its index.
    pub(crate) fn add_workspace(&mut self, label: Option<String>) -> usize {
        self.next_workspace += 1;
        let number = self.next_workspace;
        let id = format!("w{}", encode_number(number));
        self.workspaces.push(Workspace {
            label: label.unwrap_or_else(|| id.clone()),
            id,
            number,
            next_tab: 0,
            next_pane: 0,
            tabs: Vec::new(),
            grouped: false,
        });
        self.workspaces.len() - 1
    }

    /// Adds a tab to workspace `ws` and returns its index.
    pub(crate) fn add_tab(&mut self, ws: usize, label: Option<String>) -> usize {
        let workspace = &mut self.workspaces[ws];
        workspace.next_tab += 1;
        let number = workspace.next_tab;
        let id = format!("{}:t{}", workspace.id, encode_number(number));
        workspace.tabs.push(Tab {
            id,
            number,
            label: label.unwrap_or_else(|| number.to_string()),
            panes: Vec::new(),
        });
        workspace.tabs.len() - 1
    }

    /// Allocates the next pane id of workspace `ws`.
    pub(crate) fn next_pane_id(&mut self, ws: usize) -> String {
        let workspace = &mut self.workspaces[ws];
        workspace.next_pane += 1;
        format!("{}:p{}", workspace.id, encode_number(workspace.next_pane))
    }

    /// Workspace index by id.
    pub(crate) fn workspace_index(&self, id: &str) -> Option<usize> {
        self.workspaces.iter().position(|w| w.id == id)
    }

    /// (workspace, tab) indexes by tab id.
    pub(crate) fn tab_index(&self, id: &str) -> Option<(usize, usize)> {
        self.workspaces
            .iter()
            .enumerate()
            .find_map(|(wi, w)| w.tabs.iter().position(|t| t.id == id).map(|ti| (wi, ti)))
    }

    /// (workspace, tab) indexes holding pane `id`.
    pub(crate) fn pane_location(&self, id: &str) -> Option<(usize, usize)> {
        self.workspaces.iter().enumerate().find_map(|(wi, w)| {
            w.tabs
                .iter()
                .position(|t| t.panes.iter().any(|p| p == id))
                .map(|ti| (wi, ti))
        })
    }

    /// Every pane id in layout order.
    pub(crate) fn pane_ids(&self) -> Vec<String> {
        self.workspaces
            .iter()
            .flat_map(|w| w.tabs.iter().flat_map(|t| t.panes.iter().cloned()))
            .collect()
    }

    /// Removes pane `id` from the layout; returns the events that follow (pane, tab, workspace
    /// closed) as (kind, data) pairs.
    pub(crate) fn remove_pane(&mut self, id: &str) -> Vec<(&'static str, Value)> {
        let mut events = Vec::new();
        self.panes.remove(id);
        let Some((wi, ti)) = self.pane_location(id) else {
            return events;
        };
        let ws_id = self.workspaces[wi].id.clone();
        let tab = &mut self.workspaces[wi].tabs[ti];
        tab.panes.retain(|p| p != id);
        events.push((
            "pane_closed",
            json!({ "pane_id": id, "workspace_id": ws_id }),
        ));
        if tab.panes.is_empty() {
            let tab_id = tab.id.clone();
            self.workspaces[wi].tabs.remove(ti);
            events.push((
                "tab_closed",
                json!({ "tab_id": tab_id, "workspace_id": ws_id }),
            ));
            if self.workspaces[wi].tabs.is_empty() {
                self.workspaces.remove(wi);
                events.push(("workspace_closed", json!({ "workspace_id": ws_id })));
            }
        }
        if self.focused_pane.as_deref() == Some(id) {
            self.focused_pane = self.pane_ids().into_iter().next();
        }
        events
    }
}

/// The in-memory event ring every lifecycle subscription replays.
#[derive(Debug, Default)]
pub(crate) struct EventHub {
    next_seq: u64,
    ring: VecDeque<(u64, Value)>,
}

impl EventHub {
    /// Records an event `{"event": kind, "data": {"type": kind, ..data}}`.
    pub(crate) fn push(&mut self, kind: &str, mut data: Value) {
        if let Value::Object(map) = &mut data {
            map.insert("type".to_owned(), Value::String(kind.to_owned()));
        }
        self.next_seq += 1;
        if self.ring.len() == RING {
            self.ring.pop_front();
        }
        self.ring
            .push_back((self.next_seq, json!({ "event": kind, "data": data })));
    }

    /// The sequence of the newest event.
    pub(crate) fn current(&self) -> u64 {
        self.next_seq
    }

    /// Events newer than `seq`, oldest first.
    pub(crate) fn after(&self, seq: u64) -> Vec<(u64, Value)> {
        self.ring
            .iter()
            .filter(|(s, _)| *s > seq)
            .cloned()
            .collect()
    }

    /// Forgets every event (a restarted server starts with an empty ring).
    pub(crate) fn clear(&mut self) {
        self.ring.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_use_herdrs_bijective_base32() {
        assert_eq!(encode_number(1), "1");
        assert_eq!(encode_number(9), "9");
        assert_eq!(encode_number(10), "A");
        assert_eq!(encode_number(32), "0");
        assert_eq!(encode_number(33), "11");
    }

    #[test]
    fn hub_keeps_a_bounded_ring() {
        let mut hub = EventHub::default();
        for i in 0..600 {
            hub.push("pane_created", json!({ "i": i }));
        }
        let all = hub.after(0);
        assert_eq!(all.len(), RING);
        assert_eq!(all[0].1["data"]["type"], "pane_created");
        assert_eq!(hub.after(599).len(), 1);
    }
}

//! How the locator found the socket holders of new TCP callers, counted: the benchmark prints
//! it, and tests check which step answered.

use std::sync::atomic::{AtomicU64, Ordering};

use super::process::FoundBy;

/// How the socket holders of new TCP callers were found, counted since the locator was made:
/// the benchmark prints it, and tests check which step answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchCounts {
    /// Found among the pids tried first (the socket's previous holder, recent callers).
    pub first: u64,
    /// Found in a known pane's process tree.
    pub pane_tree: u64,
    /// Found only by the full scan.
    pub full_scan: u64,
    /// Found nowhere (the connection closed, or its holder's fds are unreadable).
    pub not_found: u64,
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    first: AtomicU64,
    pane_tree: AtomicU64,
    full_scan: AtomicU64,
    not_found: AtomicU64,
}

impl Counters {
    pub(super) fn count(&self, found: Option<FoundBy>) {
        let slot = match found {
            Some(FoundBy::First) => &self.first,
            Some(FoundBy::PaneTree { .. }) => &self.pane_tree,
            Some(FoundBy::FullScan) => &self.full_scan,
            None => &self.not_found,
        };
        slot.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn read(&self) -> SearchCounts {
        SearchCounts {
            first: self.first.load(Ordering::Relaxed),
            pane_tree: self.pane_tree.load(Ordering::Relaxed),
            full_scan: self.full_scan.load(Ordering::Relaxed),
            not_found: self.not_found.load(Ordering::Relaxed),
        }
    }
}

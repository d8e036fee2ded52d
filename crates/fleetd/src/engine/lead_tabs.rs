//! The lead-tab scanner's decisions (SPEC §6): which live pane in each configured lead tab
//! (`primary.tab`, `leads[].tab`) holds the lead, from one listing of every pane. Pure: a listing
//! and the callers the registry knows go in, changes come out; `state` applies them and `run`
//! does the listing. A failed listing never reaches this module, so one bad reading keeps every
//! previous answer.

use std::collections::BTreeMap;

use fleetd_core::push::LeadId;
use fleetd_core::{QualifiedPaneId, TerminalId};
use jiff::{SignedDuration, Timestamp};

use super::LeadRef;
use crate::config::Config;

/// How long one scan's answer is trusted before the tabs are listed again. Lead changes that
/// matter sooner arrive as pane events (gone, new incarnation) and trigger a scan at once.
pub(super) const LEAD_SCAN_TTL: SignedDuration = SignedDuration::from_secs(2);

/// One pane of a listing, reduced to what the scanner needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ScanPane {
    /// The pane, daemon-qualified.
    pub pane: QualifiedPaneId,
    /// Its incarnation.
    pub terminal: TerminalId,
    /// Its tab id (`w1:t1`, tmux `session:index`).
    pub tab: String,
    /// The tab by name (`workspace:label`, tmux `session:window-name`), so a config may name a
    /// tmux window instead of its index.
    pub tab_by_name: Option<String>,
    /// The multiplexer detected an agent in it.
    pub agent: bool,
}

/// A configured lead tab and what it resolved to.
#[derive(Debug, Clone)]
struct LeadTab {
    tab: String,
    name: Option<String>,
    primary: bool,
    resolved: Option<LeadRef>,
    /// The tab's only pane at the last scan, when it held exactly one.
    only: Option<LeadRef>,
}

/// What one scan changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ScanChange {
    /// A lead tab now resolves to `lead` (newly, or to a new pane or incarnation).
    Resolved {
        /// The lead.
        lead: LeadRef,
        /// It is the primary tab.
        primary: bool,
        /// The tab's configured name.
        name: Option<String>,
    },
    /// A known lead's pane is absent from the listing, or holds a new incarnation: it is gone.
    Gone {
        /// The lead.
        lead: LeadId,
    },
}

/// The configured lead tabs and the last scan's answers.
#[derive(Debug, Clone, Default)]
pub(super) struct LeadTabs {
    tabs: Vec<LeadTab>,
    scanned_at: Option<Timestamp>,
    scanning: bool,
}

impl LeadTabs {
    /// The tabs `config` names: the primary tab first, then `leads`.
    pub(super) fn from_config(config: &Config) -> Self {
        let primary = config.primary.iter().map(|p| LeadTab {
            tab: p.tab.clone(),
            name: None,
            primary: true,
            resolved: None,
            only: None,
        });
        let extra = config.leads.iter().map(|l| LeadTab {
            tab: l.tab.clone(),
            name: Some(l.name.clone()),
            primary: false,
            resolved: None,
            only: None,
        });
        Self {
            tabs: primary.chain(extra).collect(),
            scanned_at: None,
            scanning: false,
        }
    }

    /// Whether `other` names the same tabs (and names and primary pin) as this.
    pub(super) fn same_tabs(&self, other: &Self) -> bool {
        let key = |t: &LeadTab| (t.tab.clone(), t.name.clone(), t.primary);
        self.tabs.iter().map(key).eq(other.tabs.iter().map(key))
    }

    /// Whether `pane`/`terminal` is a configured tab's lead: the pane the last scan resolved
    /// there, or the tab's only pane then (the lead rule, `state::standing`).
    pub(super) fn holds(&self, pane: &QualifiedPaneId, terminal: &TerminalId) -> bool {
        let is = |l: &Option<LeadRef>| {
            l.as_ref()
                .is_some_and(|l| l.pane == *pane && l.terminal == *terminal)
        };
        self.tabs.iter().any(|t| is(&t.resolved) || is(&t.only))
    }

    /// Whether a primary tab is pinned (then only its lead is ever the primary).
    pub(super) fn primary_pinned(&self) -> bool {
        self.tabs.iter().any(|t| t.primary)
    }

    /// When the next scan is due: now when none ran yet, else a TTL after the last one. `None`
    /// while a scan is under way, or when there is nothing to scan for.
    pub(super) fn next_scan(&self, leads_known: bool) -> Option<Timestamp> {
        if self.scanning || (self.tabs.is_empty() && !leads_known) {
            return None;
        }
        match self.scanned_at {
            None => Some(Timestamp::MIN),
            Some(at) => at.checked_add(LEAD_SCAN_TTL).ok(),
        }
    }

    /// Marks a scan started; `false` when one is under way already.
    pub(super) fn start(&mut self) -> bool {
        !std::mem::replace(&mut self.scanning, true)
    }

    /// A scan failed: every previous answer stands; the next try waits a TTL.
    pub(super) fn failed(&mut self, now: Timestamp) {
        self.scanning = false;
        self.scanned_at = Some(now);
    }

    /// Forces the next scan to run as soon as possible.
    pub(super) fn expire(&mut self) {
        self.scanned_at = None;
    }

    /// Applies a successful listing of every pane. `callers` are the leads the registry knows
    /// (from MCP calls and earlier scans), by id with their incarnation; `spoke`, pane
    /// incarnations whose processes spoke MCP without being known as leads (a stray's).
    pub(super) fn scanned(
        &mut self,
        panes: &[ScanPane],
        callers: &BTreeMap<LeadId, TerminalId>,
        spoke: &std::collections::HashSet<(QualifiedPaneId, TerminalId)>,
        now: Timestamp,
    ) -> Vec<ScanChange> {
        self.scanning = false;
        self.scanned_at = Some(now);
        let mut out = Vec::new();
        // Any known lead whose pane is gone from the listing, or holds another incarnation.
        for (lead, terminal) in callers {
            let alive = panes
                .iter()
                .any(|p| p.pane.to_string() == lead.0 && p.terminal == *terminal);
            if !alive {
                out.push(ScanChange::Gone { lead: lead.clone() });
            }
        }
        let mut resolved = Vec::new();
        for tab in &mut self.tabs {
            let in_tab: Vec<&ScanPane> = panes
                .iter()
                .filter(|p| p.tab == tab.tab || p.tab_by_name.as_deref() == Some(&tab.tab))
                .collect();
            let is_caller = |p: &ScanPane| {
                callers
                    .get(&LeadId(p.pane.to_string()))
                    .is_some_and(|t| *t == p.terminal)
            };
            let current = tab.resolved.as_ref().and_then(|r| {
                in_tab
                    .iter()
                    .find(|p| p.pane == r.pane && p.terminal == r.terminal)
                    .copied()
            });
            tab.only = match in_tab.as_slice() {
                [p] => Some(LeadRef {
                    pane: p.pane.clone(),
                    terminal: p.terminal.clone(),
                }),
                _ => None,
            };
            // Stable while it lives; else an agent that called us, any agent, any caller; else
            // the tab's only pane if its process spoke MCP (an agent the multiplexer does not
            // name, started again after a herdr restart).
            let alone_and_spoke = match in_tab.as_slice() {
                [p] if spoke.contains(&(p.pane.clone(), p.terminal.clone())) => Some(*p),
                _ => None,
            };
            let pick = current
                .or_else(|| in_tab.iter().find(|p| p.agent && is_caller(p)).copied())
                .or_else(|| in_tab.iter().find(|p| p.agent).copied())
                .or_else(|| in_tab.iter().find(|p| is_caller(p)).copied())
                .or(alone_and_spoke);
            let lead = pick.map(|p| LeadRef {
                pane: p.pane.clone(),
                terminal: p.terminal.clone(),
            });
            if lead != tab.resolved {
                if let Some(lead) = &lead {
                    resolved.push(ScanChange::Resolved {
                        lead: lead.clone(),
                        primary: tab.primary,
                        name: tab.name.clone(),
                    });
                }
                tab.resolved = lead;
            }
        }
        // Gone first: a pane that holds a new incarnation is forgotten, then registered anew.
        out.extend(resolved);
        out
    }
}

#[cfg(test)]
mod tests {
    use fleetd_core::{MuxDaemon, PaneId};

    use super::*;

    fn pane(id: &str, terminal: &str, tab: &str, agent: bool) -> ScanPane {
        ScanPane {
            pane: QualifiedPaneId::new(MuxDaemon::Lead, PaneId::new(id).expect("pane id")),
            terminal: TerminalId::new(terminal).expect("terminal id"),
            tab: tab.to_owned(),
            tab_by_name: None,
            agent,
        }
    }

    fn tabs(primary: &str, extra: &[(&str, &str)]) -> LeadTabs {
        LeadTabs {
            tabs: std::iter::once(LeadTab {
                tab: primary.to_owned(),
                name: None,
                primary: true,
                resolved: None,
                only: None,
            })
            .chain(extra.iter().map(|(tab, name)| LeadTab {
                tab: (*tab).to_owned(),
                name: Some((*name).to_owned()),
                primary: false,
                resolved: None,
                only: None,
            }))
            .collect(),
            scanned_at: None,
            scanning: false,
        }
    }

    fn now() -> Timestamp {
        Timestamp::UNIX_EPOCH
    }

    /// What a scan of `panes` at [`now`] changes, the leads in `callers` (lead id, terminal)
    /// having called fleetd from their panes.
    fn scan(t: &mut LeadTabs, panes: &[ScanPane], callers: &[(&str, &str)]) -> Vec<ScanChange> {
        let callers = callers
            .iter()
            .map(|&(lead, terminal)| {
                let terminal = TerminalId::new(terminal).expect("terminal id");
                (LeadId(lead.to_owned()), terminal)
            })
            .collect();
        t.scanned(panes, &callers, &Default::default(), now())
    }

    fn resolved(changes: &[ScanChange]) -> Vec<(String, bool)> {
        changes
            .iter()
            .filter_map(|c| match c {
                ScanChange::Resolved { lead, primary, .. } => {
                    Some((format!("{}@{}", lead.pane, lead.terminal), *primary))
                }
                ScanChange::Gone { .. } => None,
            })
            .collect()
    }

    #[test]
    fn each_tab_resolves_to_the_agent_in_it_and_stays_put() {
        let mut t = tabs("w1:t1", &[("w1:t2", "reviewer")]);
        let panes = [
            pane("w1:p1", "t-shell", "w1:t1", false),
            pane("w1:p2", "t-claude", "w1:t1", true),
            pane("w1:p3", "t-codex", "w1:t2", true),
            pane("w2:p1", "t-member", "w2:t1", true),
        ];
        assert_eq!(
            resolved(&scan(&mut t, &panes, &[])),
            [
                ("lead:w1:p2@t-claude".to_owned(), true),
                ("lead:w1:p3@t-codex".to_owned(), false)
            ]
        );
        // The same listing again changes nothing.
        assert!(scan(&mut t, &panes, &[]).is_empty());
    }

    #[test]
    fn a_caller_in_the_tab_wins_over_an_agent_that_never_called() {
        let mut t = tabs("w1:t1", &[]);
        let panes = [
            pane("w1:p1", "t-a", "w1:t1", true),
            pane("w1:p2", "t-b", "w1:t1", true),
        ];
        assert_eq!(
            resolved(&scan(&mut t, &panes, &[("lead:w1:p2", "t-b")])),
            [("lead:w1:p2@t-b".to_owned(), true)]
        );
    }

    #[test]
    fn a_shell_lead_that_called_is_found_without_agent_detection() {
        let mut t = tabs("base:0", &[]);
        let panes = [pane("%1", "t-bash", "base:0", false)];
        assert!(scan(&mut t, &panes, &[]).is_empty());
        assert_eq!(
            resolved(&scan(&mut t, &panes, &[("lead:%1", "t-bash")])),
            [("lead:%1@t-bash".to_owned(), true)]
        );
    }

    #[test]
    fn a_tmux_window_may_be_named_instead_of_numbered() {
        let mut t = tabs("base:boss", &[]);
        let mut p = pane("%4", "t-x", "base:3", true);
        p.tab_by_name = Some("base:boss".into());
        assert_eq!(
            resolved(&scan(&mut t, &[p], &[])),
            [("lead:%4@t-x".to_owned(), true)]
        );
    }

    #[test]
    fn a_lead_whose_pane_vanished_or_changed_incarnation_is_gone() {
        let mut t = tabs("w1:t1", &[]);
        let panes = [pane("w1:p1", "t-new", "w1:t1", true)];
        let callers = [("lead:w1:p1", "t-old"), ("lead:w9:p9", "t-x")];
        assert_eq!(
            scan(&mut t, &panes, &callers),
            [
                ScanChange::Gone {
                    lead: LeadId("lead:w1:p1".into())
                },
                ScanChange::Gone {
                    lead: LeadId("lead:w9:p9".into())
                },
                ScanChange::Resolved {
                    lead: LeadRef {
                        pane: panes[0].pane.clone(),
                        terminal: TerminalId::new("t-new").unwrap()
                    },
                    primary: true,
                    name: None
                }
            ]
        );
    }

    #[test]
    fn scans_are_due_on_a_ttl_and_never_overlap() {
        let mut t = tabs("w1:t1", &[]);
        assert_eq!(t.next_scan(false), Some(Timestamp::MIN));
        assert!(t.start());
        assert!(!t.start(), "a second scan while one runs");
        assert_eq!(t.next_scan(false), None);
        t.failed(now());
        assert_eq!(t.next_scan(false), now().checked_add(LEAD_SCAN_TTL).ok());
        assert_eq!(LeadTabs::default().next_scan(false), None);
        assert_eq!(LeadTabs::default().next_scan(true), Some(Timestamp::MIN));
    }
}

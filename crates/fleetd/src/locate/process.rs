//! The process tree as the locator walks it, built on the platform seam (`locate::platform`) and
//! free of any platform call of its own: a process's ancestry, and the index that orders an fd
//! scan's candidates. Blocking (each step reads the kernel): call from `spawn_blocking`.

use std::collections::{HashMap, HashSet};
use std::io;

use super::platform::{self, ProcStat};

/// How far up the parent chain [`ancestry`] goes. Real chains are a handful deep (agent →
/// shell → pane); the bound only stops a pathological one.
pub const MAX_ANCESTRY: usize = 128;

/// The process and its ancestors, the process first, up to init (pid 1) or [`MAX_ANCESTRY`]
/// entries. A parent that cannot be read (it exited meanwhile) ends the chain there.
pub fn ancestry(pid: u32) -> io::Result<Vec<ProcStat>> {
    let first = platform::read_stat(pid)?;
    let mut chain = vec![first];
    let mut next = first.ppid;
    while next > 1 && chain.len() < MAX_ANCESTRY {
        let Ok(stat) = platform::read_stat(next) else {
            break;
        };
        next = stat.ppid;
        chain.push(stat);
    }
    Ok(chain)
}

/// A cache of pid → session id, refreshed incrementally: only pids not seen before are read.
/// Used to order fd-scan candidates; every final answer is re-read fresh, so a stale entry can
/// cost time but never a wrong identity.
#[derive(Debug, Default)]
pub struct ProcessIndex {
    sessions: HashMap<u32, u32>,
}

impl ProcessIndex {
    /// Re-lists the processes, drops vanished pids and reads the stat of new ones.
    pub fn refresh(&mut self) -> io::Result<()> {
        let mut live = HashSet::new();
        for pid in platform::pids()? {
            live.insert(pid);
            if !self.sessions.contains_key(&pid)
                && let Ok(stat) = platform::read_stat(pid)
            {
                self.sessions.insert(pid, stat.session);
            }
        }
        self.sessions.retain(|pid, _| live.contains(pid));
        Ok(())
    }

    /// Pids to scan for a socket: `first` (recent callers), then processes in the sessions
    /// `sessions` (pane shells), newest pid first, then everything else.
    pub fn candidates(&self, first: &[u32], sessions: &HashSet<u32>) -> Vec<u32> {
        let mut in_panes: Vec<u32> = Vec::new();
        let mut others: Vec<u32> = Vec::new();
        for (&pid, sid) in &self.sessions {
            if first.contains(&pid) {
                continue;
            }
            if sessions.contains(sid) {
                in_panes.push(pid);
            } else {
                others.push(pid);
            }
        }
        in_panes.sort_unstable_by(|a, b| b.cmp(a));
        others.sort_unstable_by(|a, b| b.cmp(a));
        first
            .iter()
            .copied()
            .chain(in_panes)
            .chain(others)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        let stat = platform::read_stat(me).expect("own stat");
        assert_eq!(stat.pid, me);
        let mut index = ProcessIndex::default();
        index.refresh().expect("index");
        let sessions = HashSet::from([stat.session]);
        let order = index.candidates(&[1], &sessions);
        assert_eq!(order.first(), Some(&1), "recent callers come first");
        let mine = order.iter().position(|p| *p == me).expect("own pid listed");
        let outsider = order.iter().position(|p| {
            *p != 1 && platform::read_stat(*p).is_ok_and(|s| s.session != stat.session)
        });
        if let Some(outsider) = outsider {
            assert!(
                mine < outsider,
                "processes in pane sessions come before others"
            );
        }
    }

    #[test]
    fn the_ancestry_of_a_child_reaches_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let chain = ancestry(child.id()).expect("chain");
        let _ = child.kill();
        let _ = child.wait();
        let me = std::process::id();
        assert_eq!(chain.first().map(|s| s.pid), Some(child.id()));
        assert_eq!(chain.get(1).map(|s| s.pid), Some(me), "{chain:?}");
        assert!(chain.len() <= MAX_ANCESTRY);
    }
}

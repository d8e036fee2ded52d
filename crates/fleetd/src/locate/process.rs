//! The process tree as the locator walks it, built on the platform seam (`locate::platform`) and
//! free of any platform call of its own: a process's ancestry, and the search for the process
//! holding a socket (the known panes' process trees first, the full scan only after them).
//! Blocking (each step reads the kernel): call from `spawn_blocking`.

use std::collections::HashSet;
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

/// Most processes walked in the pane trees before the search falls back to the full scan: a
/// bound against a pathological tree (a fork bomb in a pane), far above a real fleet's count.
pub const MAX_TREE: usize = 16_384;

/// Which step of [`find_holder`] found the socket's holder: the benchmark prints how many each
/// step answered, and the tests check that a caller outside every pane is still found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoundBy {
    /// One of the pids tried first (the last holder of this socket, recent callers).
    First,
    /// A process in a known pane's process tree, `depth` levels below the pane's process.
    PaneTree {
        /// 0 for a pane's own process, 1 for its children, and so on.
        depth: usize,
    },
    /// The full scan of every process, after the pane trees did not hold it.
    FullScan,
}

/// Which process holds the socket `inode`, looked for in the order it is most likely found:
/// `first` (the pid that held this socket before, then recent callers), then the process trees
/// of the known panes breadth first from `roots` (the panes' own processes: a caller is almost
/// always an agent in a pane, or a tool it started), and only then every other process, newest
/// pid first. Each step skips what an earlier one tried. The answer only says who holds the
/// socket: the pane is decided afterwards from that process's own ancestry, so this order can
/// cost time but never change an identity. Blocking.
pub fn find_holder(inode: u64, first: &[u32], roots: &[u32]) -> io::Result<Option<(u32, FoundBy)>> {
    let mut tried: HashSet<u32> = HashSet::with_capacity(first.len() + roots.len() * 4);
    let first: Vec<u32> = first.iter().copied().filter(|p| tried.insert(*p)).collect();
    if let Some(pid) = platform::find_socket_owner(inode, &first) {
        return Ok(Some((pid, FoundBy::First)));
    }
    let mut level: Vec<u32> = roots.iter().copied().filter(|p| *p > 1).collect();
    level.sort_unstable();
    level.dedup();
    let mut walked = 0;
    for depth in 0..MAX_ANCESTRY {
        if level.is_empty() || walked >= MAX_TREE {
            break;
        }
        walked += level.len();
        let fresh: Vec<u32> = level.iter().copied().filter(|p| tried.insert(*p)).collect();
        if let Some(pid) = platform::find_socket_owner(inode, &fresh) {
            return Ok(Some((pid, FoundBy::PaneTree { depth })));
        }
        let mut next = Vec::new();
        for pid in &level {
            match platform::children(*pid) {
                Ok(children) => next.extend(children.into_iter().filter(|c| !tried.contains(c))),
                // No way to walk the trees here: the full scan below finds the holder.
                Err(_) => {
                    next.clear();
                    break;
                }
            }
        }
        level = next;
    }
    let mut rest: Vec<u32> = platform::pids()?
        .into_iter()
        .filter(|p| !tried.contains(p))
        .collect();
    rest.sort_unstable_by(|a, b| b.cmp(a));
    Ok(platform::find_socket_owner(inode, &rest).map(|pid| (pid, FoundBy::FullScan)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client side of a loopback connection, held by this process alone, and its inode.
    fn listener_pair() -> (std::net::TcpStream, u64) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let local = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(local).expect("connect");
        let (_server, peer) = listener.accept().expect("accept");
        let inode = platform::client_socket(peer, local)
            .expect("tables")
            .expect("listed")
            .inode;
        (client, inode)
    }

    #[test]
    fn a_holder_in_a_pane_tree_is_found_at_its_depth() {
        let (_client, inode) = listener_pair();
        let me = std::process::id();
        let parent = platform::read_stat(me).expect("own stat").ppid;
        // This process as a pane's own process, and as its parent's child.
        assert_eq!(
            find_holder(inode, &[], &[me]).expect("search"),
            Some((me, FoundBy::PaneTree { depth: 0 }))
        );
        assert_eq!(
            find_holder(inode, &[], &[parent]).expect("search"),
            Some((me, FoundBy::PaneTree { depth: 1 }))
        );
        // A pid tried first wins before any tree is walked.
        assert_eq!(
            find_holder(inode, &[me], &[parent]).expect("search"),
            Some((me, FoundBy::First))
        );
    }

    #[test]
    fn a_holder_outside_every_pane_tree_is_found_by_the_full_scan() {
        let (_client, inode) = listener_pair();
        let mut unrelated = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        // The only "pane" is a child of this process: its tree does not hold the socket.
        let found = find_holder(inode, &[unrelated.id()], &[unrelated.id()]);
        let _ = unrelated.kill();
        let _ = unrelated.wait();
        assert_eq!(
            found.expect("search"),
            Some((std::process::id(), FoundBy::FullScan))
        );
    }

    #[test]
    fn a_socket_nobody_holds_is_found_nowhere() {
        let (client, inode) = listener_pair();
        drop(client);
        assert_eq!(
            find_holder(inode, &[std::process::id()], &[1]).expect("search"),
            None
        );
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

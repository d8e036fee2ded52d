//! The process tree as the locator walks it, built on the platform seam (`locate::platform`) and
//! free of any platform call of its own: a process's ancestry, and the search for the process
//! holding a socket (the known panes' process trees first, reading first only the fds that can
//! hold a new connection, the full scan only after them).
//! Blocking (each step reads the kernel): call from `spawn_blocking`.

use std::collections::{HashMap, HashSet};
use std::io;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use super::lanes::{self, Step};
use super::platform::{self, FdFile, ProcStat};
use crate::sync::lock;

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

/// The pid of the shared agent daemon in `chain` (a process and its ancestors), if any: Codex's
/// `codex app-server`, which a Codex TUI starts in a session of its own (`--managed-daemon`, one
/// per HOME + CODEX_HOME), which every later Codex of that home joins and runs its threads —
/// MCP calls included — in, and which outlives the pane that started it
/// (`../shared/research/codex-cli.md`, finding 4). Only session leaders are read: a daemon
/// detaches into a session of its own, so the pane's shell and the daemon are the chain's only
/// candidates, and a caller outside any daemon costs one or two reads.
pub fn shared_daemon(chain: &[ProcStat]) -> Option<u32> {
    chain
        .iter()
        .filter(|s| s.pid == s.session)
        .find(|s| platform::read_cmdline(s.pid).is_ok_and(|argv| is_shared_daemon(&argv)))
        .map(|s| s.pid)
}

/// Whether `argv` is Codex's app-server: a program named `codex` whose first argument is
/// `app-server` (`…/bin/codex app-server --listen unix:// --managed-daemon`).
fn is_shared_daemon(argv: &[String]) -> bool {
    let program = argv.first().map(|p| p.rsplit('/').next().unwrap_or(p));
    program == Some("codex") && argv.get(1).is_some_and(|a| a == "app-server")
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

/// What the search last saw of the fd tables of the processes it looked at (the pids tried first
/// and the pane trees'): each fd number and whether it was a socket. A later search reads, on its
/// first pass, only the fds of such a process that can hold a new connection — those that were
/// sockets (a closed connection's number is the one the next gets) and the lowest numbers that
/// were free (the kernel gives a new fd the lowest free number) — with no listing of the table;
/// every fd is read only on a second pass, when no process held the socket on the first. It only ever orders the
/// reading: a holder is always found by reading its link, so a stale table (a pid reused) costs
/// time, never an identity. Bounded: cleared when it holds [`FdMemory::MAX_PROCESSES`].
#[derive(Debug, Default)]
pub struct FdMemory {
    tables: HashMap<u32, Vec<(u32, bool)>>,
}

impl FdMemory {
    /// Most processes remembered.
    pub const MAX_PROCESSES: usize = 16_384;
}

/// How much of a process's fd table a check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Only fds that can hold a new connection, by the remembered table (all of an unknown one).
    Likely,
    /// Every fd.
    All,
}

/// How one process's check went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checked {
    /// It holds the socket.
    Holds,
    /// It does not, and every fd was read.
    NotHeld,
    /// It does not hold it in the fds read; some were left for a second pass.
    Partly,
}

/// How many of the lowest fd numbers free in a remembered table a first pass tries: where the
/// kernel puts the next fd a process opens (the lowest free number), allowing for one other
/// file opened meanwhile.
const FREE_PROBES: usize = 2;

/// The numbers a first pass reads in a remembered `table` (sorted by number): every fd that was
/// a socket, and the [`FREE_PROBES`] lowest numbers that were free.
fn likely_fds(table: &[(u32, bool)]) -> Vec<u32> {
    let mut probes: Vec<u32> = table.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect();
    let (mut free, mut taken) = (0u32, table.iter().map(|(n, _)| *n).peekable());
    let mut found = 0;
    while found < FREE_PROBES {
        if taken.peek() == Some(&free) {
            taken.next();
        } else {
            probes.push(free);
            found += 1;
        }
        free = free.saturating_add(1);
    }
    probes
}

/// Whether `pid` holds socket `inode`, reading its fds as `read` says and remembering its table
/// in `memory` (when given). A remembered process is not even listed on a first pass: only its
/// [`likely_fds`] are read. A process whose fds cannot be read is forgotten and not held.
fn check(pid: u32, inode: u64, read: Read, memory: Option<&Mutex<FdMemory>>) -> Checked {
    let forget = || {
        if let Some(memory) = memory {
            lock(memory).tables.remove(&pid);
        }
    };
    let Ok(fds) = platform::Fds::open(pid) else {
        forget();
        return Checked::NotHeld;
    };
    // Taken out while it is read and put back after (a concurrent search of the same pid in
    // the meantime lists it: slower, never wrong).
    let known = match (read, memory) {
        (Read::Likely, Some(memory)) => lock(memory).tables.remove(&pid),
        _ => None,
    };
    if let (Some(mut table), Some(memory)) = (known, memory) {
        for fd in likely_fds(&table) {
            let file = fds.file(fd);
            let at = table.binary_search_by_key(&fd, |(n, _)| *n);
            if file == FdFile::Socket(inode) {
                match at {
                    Ok(i) => table[i].1 = true,
                    Err(i) => table.insert(i, (fd, true)),
                }
                remember(memory, pid, table);
                return Checked::Holds;
            }
            match (file, at) {
                (FdFile::Closed, Ok(i)) => {
                    table.remove(i);
                }
                (FdFile::Closed, Err(_)) => {}
                (_, Ok(i)) => table[i].1 = matches!(file, FdFile::Socket(_)),
                (_, Err(i)) => table.insert(i, (fd, matches!(file, FdFile::Socket(_)))),
            }
        }
        remember(memory, pid, table);
        return Checked::Partly;
    }
    let mut table = Vec::with_capacity(8);
    let mut holds = false;
    let listed = fds.each(|fd| {
        let socket = fds.socket(fd);
        table.push((fd, socket.is_some()));
        holds = socket == Some(inode);
        if holds {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    if listed.is_err() {
        forget();
        return Checked::NotHeld;
    }
    if holds {
        // A table cut short by the hit is not kept: the next search lists this process again.
        forget();
        return Checked::Holds;
    }
    if let Some(memory) = memory {
        table.sort_unstable_by_key(|(n, _)| *n);
        remember(memory, pid, table);
    }
    Checked::NotHeld
}

/// Keeps `pid`'s fd table, within [`FdMemory::MAX_PROCESSES`].
fn remember(memory: &Mutex<FdMemory>, pid: u32, table: Vec<(u32, bool)>) {
    let mut memory = lock(memory);
    if memory.tables.len() >= FdMemory::MAX_PROCESSES && !memory.tables.contains_key(&pid) {
        memory.tables.clear();
    }
    memory.tables.insert(pid, table);
}

/// The first of `candidates` found holding `inode` (earlier ones preferred), and those checked
/// only partly, read on two lanes ([`lanes::first_hit`]) for a long list.
fn scan(
    inode: u64,
    candidates: &[u32],
    read: Read,
    memory: Option<&Arc<Mutex<FdMemory>>>,
) -> (Option<u32>, Vec<u32>) {
    let pids: Arc<[u32]> = candidates.into();
    let memory = memory.cloned();
    let work_pids = Arc::clone(&pids);
    let found = lanes::first_hit(
        pids.len(),
        Arc::new(
            move |i| match check(work_pids[i], inode, read, memory.as_deref()) {
                Checked::Holds => Step::Hit,
                Checked::NotHeld => Step::Miss,
                Checked::Partly => Step::Partly,
            },
        ),
    );
    (
        found.hit.map(|i| pids[i]),
        found.partly.into_iter().map(|i| pids[i]).collect(),
    )
}

/// A process among `candidates` holding an fd on socket `inode`, preferring earlier ones, every
/// fd of each read (nothing remembered). Processes whose fds cannot be read are skipped.
pub fn find_socket_owner(inode: u64, candidates: &[u32]) -> Option<u32> {
    scan(inode, candidates, Read::All, None).0
}

/// Which process holds the socket `inode`, looked for in the order it is most likely found:
/// `first` (the pid that held this socket before, then recent callers), then the process trees
/// of the known panes breadth first from `roots` (the panes' own processes: a caller is almost
/// always an agent in a pane, or a tool it started), and only then every other process, newest
/// pid first. The first two steps read only the fds `memory` says can hold a new connection,
/// and the rest of those processes' fds after both missed. Each step skips what an earlier one
/// tried. The answer only says who holds the socket: the pane is decided afterwards from that
/// process's own ancestry, so this order can cost time but never change an identity. Blocking.
pub fn find_holder(
    inode: u64,
    first: &[u32],
    roots: &[u32],
    memory: &Arc<Mutex<FdMemory>>,
) -> io::Result<Option<(u32, FoundBy)>> {
    let mut tried: HashSet<u32> = HashSet::with_capacity(first.len() + roots.len() * 4);
    let first: Vec<u32> = first.iter().copied().filter(|p| tried.insert(*p)).collect();
    // The processes read only partly, with the step that would have found them.
    let mut second: Vec<(Vec<u32>, FoundBy)> = Vec::new();
    let (found, partly) = scan(inode, &first, Read::Likely, Some(memory));
    if let Some(pid) = found {
        return Ok(Some((pid, FoundBy::First)));
    }
    second.push((partly, FoundBy::First));
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
        let by = FoundBy::PaneTree { depth };
        let (found, partly) = scan(inode, &fresh, Read::Likely, Some(memory));
        if let Some(pid) = found {
            return Ok(Some((pid, by)));
        }
        second.push((partly, by));
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
    for (partly, by) in second {
        if let (Some(pid), _) = scan(inode, &partly, Read::All, Some(memory)) {
            return Ok(Some((pid, by)));
        }
    }
    let mut rest: Vec<u32> = platform::pids()?
        .into_iter()
        .filter(|p| !tried.contains(p))
        .collect();
    rest.sort_unstable_by(|a, b| b.cmp(a));
    Ok(find_socket_owner(inode, &rest).map(|pid| (pid, FoundBy::FullScan)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client side of a loopback connection, held by this process alone, and its inode.
    fn listener_pair() -> (std::net::TcpStream, u64) {
        let conn = crate::test_support::loopback();
        let inode = platform::client_socket(conn.peer, conn.local)
            .expect("tables")
            .expect("listed")
            .inode;
        (conn.client, inode)
    }

    #[test]
    fn a_holder_in_a_pane_tree_is_found_at_its_depth() {
        let (_client, inode) = listener_pair();
        let me = std::process::id();
        let parent = platform::read_stat(me).expect("own stat").ppid;
        let memory = Arc::default();
        // This process as a pane's own process, and as its parent's child.
        assert_eq!(
            find_holder(inode, &[], &[me], &memory).expect("search"),
            Some((me, FoundBy::PaneTree { depth: 0 }))
        );
        assert_eq!(
            find_holder(inode, &[], &[parent], &memory).expect("search"),
            Some((me, FoundBy::PaneTree { depth: 1 }))
        );
        // A pid tried first wins before any tree is walked.
        assert_eq!(
            find_holder(inode, &[me], &[parent], &memory).expect("search"),
            Some((me, FoundBy::First))
        );
    }

    /// This process's fd numbers that are sockets, and its others.
    fn own_fds() -> (Vec<u32>, Vec<u32>) {
        let fds = platform::Fds::open(std::process::id()).expect("own fds");
        let (mut sockets, mut others) = (Vec::new(), Vec::new());
        fds.each(|fd| {
            if fds.socket(fd).is_some() {
                sockets.push(fd);
            } else {
                others.push(fd);
            }
            ControlFlow::Continue(())
        })
        .expect("listed");
        (sockets, others)
    }

    #[test]
    fn a_first_pass_reads_the_sockets_and_lowest_free_numbers_of_a_remembered_table() {
        assert_eq!(likely_fds(&[]), vec![0, 1]);
        assert_eq!(
            likely_fds(&[(0, false), (1, false), (2, false), (3, true), (5, false)]),
            vec![3, 4, 6]
        );
        assert_eq!(likely_fds(&[(1, true), (2, true)]), vec![1, 2, 0, 3]);
    }

    #[test]
    fn a_first_pass_finds_a_new_connection_where_the_kernel_puts_it_and_leaves_the_rest() {
        let me = std::process::id();
        let memory = Arc::<Mutex<FdMemory>>::default();
        let (_client, inode) = listener_pair();
        let fd = own_fds()
            .0
            .into_iter()
            .find(|fd| platform::Fds::open(me).expect("own fds").socket(*fd) == Some(inode))
            .expect("the client socket's fd");
        let set = |table: Vec<(u32, bool)>| lock(&memory).tables.insert(me, table);
        // Never seen: listed, every fd read.
        assert_eq!(
            check(me, inode, Read::Likely, Some(&*memory)),
            Checked::Holds
        );
        // Its number was a socket: read again.
        set(vec![(fd, true)]);
        assert_eq!(
            check(me, inode, Read::Likely, Some(&*memory)),
            Checked::Holds
        );
        // Its number was the lowest free one: where the kernel puts a new fd.
        set((0..fd).map(|n| (n, false)).collect());
        assert_eq!(
            check(me, inode, Read::Likely, Some(&*memory)),
            Checked::Holds
        );
        // Its number was another kind of file (closed and reused since): the first pass does
        // not read it and says so; the second reads every fd and finds the holder.
        set((0..=fd).map(|n| (n, false)).collect());
        assert_eq!(
            check(me, inode, Read::Likely, Some(&*memory)),
            Checked::Partly
        );
        assert_eq!(check(me, inode, Read::All, Some(&*memory)), Checked::Holds);
        set((0..=fd).map(|n| (n, false)).collect());
        assert_eq!(
            find_holder(inode, &[], &[me], &memory).expect("search"),
            Some((me, FoundBy::PaneTree { depth: 0 }))
        );
        // A process that is gone is forgotten.
        lock(&memory).tables.insert(u32::MAX, Vec::new());
        assert_eq!(
            check(u32::MAX, inode, Read::Likely, Some(&*memory)),
            Checked::NotHeld
        );
        assert!(!lock(&memory).tables.contains_key(&u32::MAX));
    }

    #[test]
    fn a_holder_outside_every_pane_tree_is_found_by_the_full_scan() {
        let (_client, inode) = listener_pair();
        let mut unrelated = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        // The only "pane" is a child of this process: its tree does not hold the socket.
        let found = find_holder(inode, &[unrelated.id()], &[unrelated.id()], &Arc::default());
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
            find_holder(inode, &[std::process::id()], &[1], &Arc::default()).expect("search"),
            None
        );
    }

    #[test]
    fn codex_app_server_is_a_shared_daemon_and_other_codex_processes_are_not() {
        let argv = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert!(is_shared_daemon(&argv(
            "/h/.codex/packages/app-server-daemon/releases/0.171.0/bin/codex app-server --listen unix:// --managed-daemon"
        )));
        assert!(is_shared_daemon(&argv(
            "codex app-server daemon pid-update-loop"
        )));
        for other in [
            "codex",
            "/usr/bin/codex --no-daemon",
            "node /x/.bin/codex",
            "codex exec app-server",
            "/bin/sh -c codex app-server",
        ] {
            assert!(!is_shared_daemon(&argv(other)), "{other}");
        }
        // This test's own process tree runs under no daemon.
        let me = ancestry(std::process::id()).expect("ancestry");
        assert_eq!(shared_daemon(&me), None);
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

//! Blocking `/proc` readers for caller identity: a process's session id and start time, the
//! identity variables in its environment, the socket inode of a loopback TCP connection
//! (`/proc/net/tcp` and `tcp6`), and the process holding a socket inode (an fd scan restricted to
//! an ordered candidate list). Call these from `spawn_blocking`; they must not touch a multiplexer.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};

/// What `/proc/<pid>/stat` says about identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The process.
    pub pid: u32,
    /// Field 4: the parent's pid (0 for the kernel's own processes).
    pub ppid: u32,
    /// Field 6: the session id (the pid of the session leader, i.e. the pane's shell).
    pub session: u32,
    /// Field 22: start time in clock ticks since boot; with the pid it names one process.
    pub start_time: u64,
}

/// How far up the parent chain [`ancestry`] goes. Real chains are a handful deep (agent →
/// shell → pane); the bound only stops a pathological one.
pub const MAX_ANCESTRY: usize = 128;

/// The process and its ancestors, the process first, up to init (pid 1) or [`MAX_ANCESTRY`]
/// entries. A parent that cannot be read (it exited meanwhile) ends the chain there.
pub fn ancestry(pid: u32) -> io::Result<Vec<ProcStat>> {
    let first = read_stat(pid)?;
    let mut chain = vec![first];
    let mut next = first.ppid;
    while next > 1 && chain.len() < MAX_ANCESTRY {
        let Ok(stat) = read_stat(next) else { break };
        next = stat.ppid;
        chain.push(stat);
    }
    Ok(chain)
}

/// Reads and parses `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(pid, &text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat line"))
}

/// Parses a stat line. The command name (field 2) may contain spaces and parentheses, so fields
/// are counted from the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4 → index 1; session field 6 → index 3;
    // starttime field 22 → index 19.
    Some(ProcStat {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Identity hints from a process's environment. Hints only: a process can set them itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvHints {
    /// `HERDR_PANE_ID`.
    pub herdr_pane_id: Option<String>,
    /// `HERDR_SOCKET_PATH`.
    pub herdr_socket: Option<String>,
    /// `TMUX_PANE`.
    pub tmux_pane: Option<String>,
    /// `FLEETD_TARGET`: fleetd puts it in a member's environment only, so a process carrying it
    /// was started from a member (or says so, which can only lower what it may do).
    pub fleetd_target: Option<String>,
}

/// Reads the identity hints from `/proc/<pid>/environ` (empty when unreadable).
pub fn read_env_hints(pid: u32) -> EnvHints {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return EnvHints::default();
    };
    let mut hints = EnvHints::default();
    for record in bytes.split(|&b| b == 0) {
        let text = String::from_utf8_lossy(record);
        if let Some((key, value)) = text.split_once('=') {
            let slot = match key {
                "HERDR_PANE_ID" => &mut hints.herdr_pane_id,
                "HERDR_SOCKET_PATH" => &mut hints.herdr_socket,
                "TMUX_PANE" => &mut hints.tmux_pane,
                "FLEETD_TARGET" => &mut hints.fleetd_target,
                _ => continue,
            };
            *slot = Some(value.to_owned());
        }
    }
    hints
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The client side of a loopback connection: its socket's inode and the uid that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOwner {
    /// The socket's inode (what `/proc/<pid>/fd/*` links name).
    pub inode: u64,
    /// The user that created the socket, as the kernel recorded it.
    pub uid: u32,
}

/// The client-side socket of a connection we accepted: the `/proc/net/tcp{,6}` entry whose
/// local address is the peer and whose remote address is our listening address. IPv4-mapped
/// entries in `tcp6` are matched too. `None` when the connection is gone.
pub fn client_socket(peer: SocketAddr, local: SocketAddr) -> io::Result<Option<SocketOwner>> {
    let (peer, local) = (canonical(peer), canonical(local));
    let tables = [procfs::net::tcp(), procfs::net::tcp6()];
    let mut any_ok = false;
    for table in tables {
        let Ok(entries) = table else { continue };
        any_ok = true;
        for entry in entries {
            if canonical(entry.local_address) == peer
                && canonical(entry.remote_address) == local
                && entry.inode != 0
            {
                return Ok(Some(SocketOwner {
                    inode: entry.inode,
                    uid: entry.uid,
                }));
            }
        }
    }
    if any_ok {
        Ok(None)
    } else {
        Err(io::Error::other(
            "neither /proc/net/tcp nor /proc/net/tcp6 is readable",
        ))
    }
}

/// Whether `addr` is a loopback address (after unmapping IPv4-in-IPv6).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr.ip().to_canonical() {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

/// A cache of pid → (start time, session id), refreshed incrementally: only pids not seen
/// before are read. Used to order fd-scan candidates; every final answer is re-read fresh, so a
/// stale entry can cost time but never a wrong identity.
#[derive(Debug, Default)]
pub struct ProcessIndex {
    sessions: HashMap<u32, u32>,
}

impl ProcessIndex {
    /// Re-lists `/proc`, drops vanished pids and reads the stat of new ones.
    pub fn refresh(&mut self) -> io::Result<()> {
        let mut live = HashSet::new();
        for entry in std::fs::read_dir("/proc")? {
            let Ok(entry) = entry else { continue };
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            live.insert(pid);
            if !self.sessions.contains_key(&pid)
                && let Ok(stat) = read_stat(pid)
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

/// Whether process `pid` has an fd on `target` (a link text such as `socket:[123]`). Reads
/// the links relative to the open `fd` directory, so each costs one `readlinkat` and no path walk.
fn holds_link(pid: u32, target: &[u8]) -> bool {
    use rustix::fs::{Dir, Mode, OFlags};
    let Ok(fd) = rustix::fs::open(
        format!("/proc/{pid}/fd"),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let Ok(dir) = Dir::new(fd) else {
        return false;
    };
    let Ok(dirfd) = dir.fd() else {
        return false;
    };
    let mut buf = [0u8; 64];
    let mut entries = Dir::read_from(dirfd).into_iter().flatten().flatten();
    entries.any(|entry| {
        let name = entry.file_name();
        name.to_bytes().first() != Some(&b'.')
            && match rustix::fs::readlinkat_raw(dirfd, name, &mut buf[..]) {
                Ok(n) => buf.get(..n) == Some(target),
                Err(_) => false,
            }
    })
}

/// Below this many candidates one thread scans; above it the scan is split across threads.
const PARALLEL_SCAN_MIN: usize = 64;
/// Threads for a large scan (the daemon's machines have two cores).
const SCAN_THREADS: usize = 2;

/// A process holding an fd on `socket:[inode]`, preferring earlier `candidates`. Processes whose
/// fds cannot be read (another user's, or gone) are skipped. A large list is scanned by
/// [`SCAN_THREADS`] threads, each taking every n-th candidate, so the candidate order still
/// decides what is looked at first.
pub fn find_socket_owner(inode: u64, candidates: &[u32]) -> Option<u32> {
    let target = format!("socket:[{inode}]");
    let target = target.as_bytes();
    if candidates.len() < PARALLEL_SCAN_MIN {
        return candidates
            .iter()
            .copied()
            .find(|pid| holds_link(*pid, target));
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..SCAN_THREADS)
            .map(|lane| {
                let done = &done;
                scope.spawn(move || {
                    let found = candidates
                        .iter()
                        .skip(lane)
                        .step_by(SCAN_THREADS)
                        .take_while(|_| !done.load(std::sync::atomic::Ordering::Relaxed))
                        .copied()
                        .find(|pid| holds_link(*pid, target));
                    if found.is_some() {
                        done.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    found
                })
            })
            .collect();
        workers.into_iter().find_map(|w| w.join().ok().flatten())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "4242 (sim agent) (x)) S 1 4240 4100 34816 4242 4194304 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let stat = parse_stat(4242, line).expect("parses");
        assert_eq!(stat.ppid, 1);
        assert_eq!(stat.session, 4100);
        assert_eq!(stat.start_time, 987654);
        assert!(parse_stat(1, "garbage").is_none());
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        let stat = read_stat(me).expect("own stat");
        assert_eq!(stat.pid, me);
        let mut index = ProcessIndex::default();
        index.refresh().expect("index");
        let sessions = HashSet::from([stat.session]);
        let order = index.candidates(&[1], &sessions);
        assert_eq!(order.first(), Some(&1), "recent callers come first");
        let mine = order.iter().position(|p| *p == me).expect("own pid listed");
        let outsider = order
            .iter()
            .position(|p| *p != 1 && read_stat(*p).is_ok_and(|s| s.session != stat.session));
        if let Some(outsider) = outsider {
            assert!(
                mine < outsider,
                "processes in pane sessions come before others"
            );
        }
    }

    #[test]
    fn a_local_connection_is_traced_to_this_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let local = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(local).expect("connect");
        let (_server_side, peer) = listener.accept().expect("accept");
        assert_eq!(peer, client.local_addr().expect("client addr"));
        let socket = client_socket(peer, local).expect("tables").expect("found");
        let me = std::process::id();
        assert_eq!(find_socket_owner(socket.inode, &[me]), Some(me));
        assert_eq!(socket.uid, rustix::process::geteuid().as_raw());
        assert!(is_loopback(&peer));
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

//! Linux's `/proc` readers for caller identity: a process's parent, session and start time, the
//! identity variables in its environment, the pid list, the socket inode of a loopback TCP
//! connection (`/proc/net/tcp` and `tcp6`), a process's children (`/proc/<pid>/task/*/children`),
//! and the process holding a socket inode (an fd scan restricted to an ordered candidate list). Blocking: the locator calls them from
//! `spawn_blocking`; they must not touch a multiplexer.

use std::io;
use std::net::SocketAddr;

use crate::locate::platform::{EnvHints, ProcStat, SocketOwner};

/// Reads and parses `/proc/<pid>/stat`.
pub fn read_stat(pid: u32) -> io::Result<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(pid, &text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat line"))
}

/// Parses a stat line. The command name (field 2) may contain spaces and parentheses, so fields
/// are counted from the last `)`.
fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
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

/// Now, in the unit of [`ProcStat::start_time`]: clock ticks since boot, from `/proc/uptime`
/// (the boot clock that start times count on), rounded down.
pub fn start_clock_now() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    parse_uptime(&text, procfs::ticks_per_second())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad /proc/uptime"))
}

/// `secs.hundredths ...` in clock ticks of `hz` per second.
fn parse_uptime(text: &str, hz: u64) -> Option<u64> {
    let first = text.split_whitespace().next()?;
    let (secs, frac) = first.split_once('.').unwrap_or((first, "0"));
    let secs: u64 = secs.parse().ok()?;
    let digits = frac.len().min(9);
    let frac: u64 = frac.get(..digits)?.parse().ok()?;
    let scale = 10u64.checked_pow(u32::try_from(digits).ok()?)?;
    secs.checked_mul(hz)?
        .checked_add(frac.checked_mul(hz)? / scale)
}

/// A process's working directory (`/proc/<pid>/cwd`).
pub fn read_cwd(pid: u32) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/cwd"))
}

/// Reads the identity hints from `/proc/<pid>/environ` (empty when unreadable).
pub fn read_env_hints(pid: u32) -> EnvHints {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|bytes| EnvHints::from_records(&bytes))
        .unwrap_or_default()
}

fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The client-side socket of a connection we accepted: the `/proc/net/tcp{,6}` entry whose
/// local address is the peer and whose remote address is our listening address. IPv4-mapped
/// entries in `tcp6` are matched too. `None` when the connection is gone.
pub(super) fn client_socket(
    peer: SocketAddr,
    local: SocketAddr,
) -> io::Result<Option<SocketOwner>> {
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

/// Every live pid: the numeric entries of `/proc`.
pub fn pids() -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// The children of every thread of `pid`, from `/proc/<pid>/task/*/children` (a child is listed
/// under the thread that forked it). Empty for a process that is gone; an error only when the
/// kernel offers no `children` file at all (built without `CONFIG_PROC_CHILDREN`), which the
/// caller answers with its full scan.
pub fn children(pid: u32) -> io::Result<Vec<u32>> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut buf = String::new();
    for task in tasks {
        let Ok(task) = task else { continue };
        let mut path = task.path();
        path.push("children");
        buf.clear();
        match std::fs::File::open(&path).and_then(|mut f| {
            use std::io::Read as _;
            f.read_to_string(&mut buf)
        }) {
            Ok(_) => out.extend(
                buf.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            // No `children` file in a thread directory that is still there: the kernel has none.
            Err(e) if e.kind() == io::ErrorKind::NotFound && task.path().exists() => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "this kernel lists no /proc/<pid>/task/<tid>/children",
                ));
            }
            // The thread ended between the listing and the read.
            Err(_) => {}
        }
    }
    Ok(out)
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
    let lane = |lane: usize| {
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
    };
    std::thread::scope(|scope| {
        // The calling thread takes the first lane: one thread started per scan, not one a lane.
        let others: Vec<_> = (1..SCAN_THREADS)
            .map(|n| scope.spawn(move || lane(n)))
            .collect();
        let mine = lane(0);
        let theirs = others.into_iter().find_map(|w| w.join().ok().flatten());
        mine.or(theirs)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn uptime_is_read_in_clock_ticks() {
        assert_eq!(parse_uptime("3600.42 7000.12\n", 100), Some(360_042));
        assert_eq!(parse_uptime("12.5 1.0", 100), Some(1250));
        assert_eq!(parse_uptime("7 1", 250), Some(1750));
        assert_eq!(parse_uptime("", 100), None);
        assert_eq!(parse_uptime("x.1", 100), None);
        // The live clock agrees with a process started just now (this one ran for less than
        // the whole uptime, and not in the future).
        let now = start_clock_now().expect("uptime");
        let me = read_stat(std::process::id()).expect("stat");
        assert!(me.start_time <= now, "{} <= {now}", me.start_time);
    }

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
    }

    #[test]
    fn a_child_is_listed_under_its_parent() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep runs");
        let listed = children(std::process::id()).expect("children files");
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed.contains(&child.id()), "{listed:?}");
        assert_eq!(children(u32::MAX).expect("a gone pid"), Vec::<u32>::new());
    }
}

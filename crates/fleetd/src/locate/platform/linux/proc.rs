//! Linux's `/proc` readers for caller identity: a process's parent, session and start time, the
//! identity variables in its environment, the pid list, the socket inode of a loopback TCP
//! connection (`/proc/net/tcp` and `tcp6`), a process's children (`/proc/<pid>/task/*/children`),
//! and a process's fd table with the socket each fd names ([`Fds`]). Blocking: the locator
//! calls them from `spawn_blocking`; they must not touch a multiplexer.

use std::io;
use std::net::SocketAddr;

use crate::locate::platform::{EnvHints, FdFile, ProcStat, SocketOwner};

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

/// How long ago a process that started at `start_time` ([`ProcStat::start_time`]) started.
pub fn age_of(start_time: u64) -> io::Result<std::time::Duration> {
    let ticks = start_clock_now()?.saturating_sub(start_time);
    let hz = procfs::ticks_per_second().max(1);
    Ok(std::time::Duration::from_millis(
        ticks.saturating_mul(1000) / hz,
    ))
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

/// A process's arguments (`/proc/<pid>/cmdline`), argv[0] first.
pub fn read_cmdline(pid: u32) -> io::Result<Vec<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect())
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

/// `/proc`, opened once: each process's fd directory is opened relative to it, so no lookup
/// walks from the root again. `None` where `/proc` cannot be opened (every read then fails).
fn proc_dir() -> Option<rustix::fd::BorrowedFd<'static>> {
    use rustix::fd::AsFd as _;
    use rustix::fs::{Mode, OFlags};
    static PROC: std::sync::OnceLock<Option<rustix::fd::OwnedFd>> = std::sync::OnceLock::new();
    PROC.get_or_init(|| {
        rustix::fs::open(
            "/proc",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()
    })
    .as_ref()
    .map(|fd| fd.as_fd())
}

/// A process's open-file table, opened for reading: its `/proc/<pid>/fd` directory. Listing it
/// costs one `getdents64` per ~170 fds; each [`Fds::socket`] one `readlinkat` relative to it.
#[derive(Debug)]
pub struct Fds {
    dir: rustix::fd::OwnedFd,
}

impl Fds {
    /// Opens `pid`'s fd table: fails when the process is gone or its fds are not readable
    /// (another user's).
    pub fn open(pid: u32) -> io::Result<Self> {
        use rustix::fs::{Mode, OFlags};
        let proc = proc_dir().ok_or_else(|| io::Error::other("/proc cannot be opened"))?;
        let dir = rustix::fs::openat(
            proc,
            format!("{pid}/fd"),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { dir })
    }

    /// Calls `each` with every open fd number, in the kernel's order, until it breaks.
    pub fn each(&self, mut each: impl FnMut(u32) -> std::ops::ControlFlow<()>) -> io::Result<()> {
        use rustix::fd::AsFd as _;
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut dir = rustix::fs::RawDir::new(self.dir.as_fd(), &mut buf);
        while let Some(entry) = dir.next() {
            let entry = entry?;
            let Some(fd) = std::str::from_utf8(entry.file_name().to_bytes())
                .ok()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue; // `.` and `..`
            };
            if each(fd).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// What `fd` is: a socket (its inode), another kind of file, or no open fd. A link that
    /// cannot be read for any other reason is [`FdFile::Other`]: no socket found there.
    pub fn file(&self, fd: u32) -> FdFile {
        let mut buf = [0u8; 64];
        match rustix::fs::readlinkat_raw(&self.dir, fd.to_string(), &mut buf[..]) {
            Ok(n) => buf
                .get(..n)
                .and_then(socket_inode)
                .map_or(FdFile::Other, FdFile::Socket),
            Err(rustix::io::Errno::NOENT) => FdFile::Closed,
            Err(_) => FdFile::Other,
        }
    }

    /// The inode of the socket `fd` names: `None` for any other kind of file, or an fd closed.
    pub fn socket(&self, fd: u32) -> Option<u64> {
        match self.file(fd) {
            FdFile::Socket(inode) => Some(inode),
            FdFile::Other | FdFile::Closed => None,
        }
    }
}

/// The inode in a link text `socket:[123]`.
fn socket_inode(link: &[u8]) -> Option<u64> {
    std::str::from_utf8(link.strip_prefix(b"socket:[")?.strip_suffix(b"]")?)
        .ok()?
        .parse()
        .ok()
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
        let conn = crate::test_support::loopback();
        assert_eq!(conn.peer, conn.client.local_addr().expect("client addr"));
        let socket = client_socket(conn.peer, conn.local)
            .expect("tables")
            .expect("found");
        let me = std::process::id();
        let fds = Fds::open(me).expect("own fds");
        let mut sockets = Vec::new();
        fds.each(|fd| {
            sockets.extend(fds.socket(fd));
            std::ops::ControlFlow::Continue(())
        })
        .expect("listed");
        assert!(sockets.contains(&socket.inode), "{sockets:?}");
        assert_eq!(socket.uid, rustix::process::geteuid().as_raw());
    }

    #[test]
    fn only_socket_links_name_an_inode() {
        assert_eq!(socket_inode(b"socket:[4242]"), Some(4242));
        assert_eq!(socket_inode(b"pipe:[4242]"), None);
        assert_eq!(socket_inode(b"/dev/pts/3"), None);
        assert_eq!(socket_inode(b"socket:[42"), None);
        // A stdio fd of this process is listed, and is no socket of the test's making.
        let fds = Fds::open(std::process::id()).expect("own fds");
        let mut listed = Vec::new();
        fds.each(|fd| {
            listed.push(fd);
            std::ops::ControlFlow::Continue(())
        })
        .expect("listed");
        assert!(listed.len() >= 3, "{listed:?}");
        assert!(Fds::open(u32::MAX).is_err(), "a gone pid");
        assert_eq!(fds.file(u32::MAX - 1), FdFile::Closed);
        assert_ne!(fds.file(listed[0]), FdFile::Closed);
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

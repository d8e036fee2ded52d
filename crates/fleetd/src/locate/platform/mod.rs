//! The caller locator's one platform seam: what the kernel says about a connection and a process.
//! The rest of `locate` (the pane map, the ancestry walk, the caches, the order of an fd scan) is
//! portable and reaches the operating system only through these nine functions and one handle:
//!
//! - [`client_socket`]: the client side of an accepted loopback TCP connection — its socket's
//!   inode and the uid that owns it;
//! - [`Fds`]: a process's open-file table — its fd numbers, and the socket an fd names (how
//!   the process holding a connection's socket is found);
//! - [`pids`]: every live pid;
//! - [`children`]: a process's children (how the pane trees are walked before any full scan);
//! - [`read_stat`]: a process's parent, session and start time;
//! - [`read_env_hints`]: the identity variables in a process's environment;
//! - [`read_cmdline`]: a process's arguments (how a shared agent daemon is recognised);
//! - [`read_cwd`]: a process's working directory (where a lead's worktree members branch from);
//! - [`start_clock_now`]: the clock start times count on, now (so a pane listing can be dated
//!   against a caller's ancestors).
//!
//! Unix-socket peers need nothing here: tokio's `UnixStream::peer_cred` already asks the kernel
//! (`SO_PEERCRED` on Linux, `getpeereid` and `LOCAL_PEEREPID` on macOS).
//!
//! Linux is the only implementation (`linux`: `/proc` and netlink `sock_diag`). On any other
//! target the build stops here with a message naming what a port has to supply, instead of
//! compiling a daemon that cannot tell who is calling.

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::{
    Fds, age_of, children, client_socket, pids, read_cmdline, read_cwd, read_env_hints, read_stat,
    start_clock_now,
};

#[cfg(not(target_os = "linux"))]
compile_error!(
    "fleetd: caller location (locate::platform) is implemented for Linux only. \
     A macOS port must supply these (Linux's source; the likely macOS one): \
     client_socket, the uid and socket id of a loopback TCP connection (netlink sock_diag \
     or /proc/net/tcp; sysctl net.inet.tcp.pcblist_n); Fds, a process's fd numbers and \
     the socket each names (/proc/<pid>/fd; proc_pidinfo PROC_PIDLISTFDS + proc_pidfdinfo \
     PROC_PIDFDSOCKETINFO); pids, every live pid (/proc; proc_listallpids); children, a \
     process's children (/proc/<pid>/task/*/children; proc_listchildpids); read_stat, a \
     process's parent, session and start time (/proc/<pid>/stat; proc_pidinfo \
     PROC_PIDTBSDINFO + getsid); read_env_hints, its environment (/proc/<pid>/environ; \
     sysctl KERN_PROCARGS2); read_cmdline, its arguments (/proc/<pid>/cmdline; sysctl \
     KERN_PROCARGS2); read_cwd, its working directory (/proc/<pid>/cwd; proc_pidinfo \
     PROC_PIDVNODEPATHINFO); start_clock_now, the clock start times are counted on, now \
     (/proc/uptime in clock ticks; mach_absolute_time or the boot time from sysctl kern.boottime)."
);

/// What the kernel says about a process's identity and place in the process tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The process.
    pub pid: u32,
    /// Its parent's pid (0 for the kernel's own processes).
    pub ppid: u32,
    /// Its session id (the pid of the session leader, i.e. the pane's shell).
    pub session: u32,
    /// When it started, in the platform's unit (clock ticks since boot on Linux). Only ever
    /// compared with another reading for the same pid: with the pid it names one process.
    pub start_time: u64,
}

/// What a process's open fd is, as far as finding a socket's holder goes ([`Fds::file`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdFile {
    /// A socket, and its inode.
    Socket(u64),
    /// Another kind of file (or one whose link cannot be read).
    Other,
    /// No fd open under that number.
    Closed,
}

/// The client side of a loopback connection: its socket's inode and the uid that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOwner {
    /// The socket's inode (what `/proc/<pid>/fd/*` links name on Linux): the id
    /// [`Fds::socket`] answers with.
    pub inode: u64,
    /// The user that created the socket, as the kernel recorded it.
    pub uid: u32,
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

impl EnvHints {
    /// The hints among `NUL`-separated `KEY=value` records (the layout of a process's
    /// environment block).
    pub fn from_records(bytes: &[u8]) -> Self {
        let mut hints = Self::default();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_hints_are_picked_from_the_records() {
        let block = b"PATH=/bin\0TMUX_PANE=%3\0FLEETD_TARGET=alice\0HERDR_PANE_ID=w1:p2=x\0\0junk";
        let hints = EnvHints::from_records(block);
        assert_eq!(hints.tmux_pane.as_deref(), Some("%3"));
        assert_eq!(hints.fleetd_target.as_deref(), Some("alice"));
        assert_eq!(
            hints.herdr_pane_id.as_deref(),
            Some("w1:p2=x"),
            "split at the first ="
        );
        assert_eq!(hints.herdr_socket, None);
        assert_eq!(EnvHints::from_records(b""), EnvHints::default());
    }
}

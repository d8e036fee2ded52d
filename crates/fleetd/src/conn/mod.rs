//! Connection limits for every door (SPEC §9): the open-file limit raised at start,
//! the admission gate (`gate`: a cap over all doors, a reserve for the daemon's own user, a cap
//! per other user, an idle connection closed to make room), each member's share of the calls
//! under way (`calls`), and each connection's
//! header-read and idle timers (`watchdog`). The doors themselves (`http::listen`, `shim`) ask
//! these; this module knows no protocol and words no refusal.

pub mod calls;
pub mod gate;
pub mod watchdog;

use std::net::SocketAddr;

pub use calls::{CallSlot, MemberCalls};
pub use gate::{Admission, Caps, Gate, Peer, Refusal};
pub use watchdog::{Activity, Expired, Timeouts, Tracked};

/// File descriptors kept for everything that is not an admitted connection: connections still
/// being looked up or lingering after a refusal (each HTTP door bounds those at 128 + 128, so
/// 512 for the two), and the daemon's own files — the store, the multiplexer sockets, the config
/// watcher, logs.
const FD_HEADROOM: u64 = 1_024;

/// The open-file limit after start-up: the soft limit raised to the hard one where allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit fleetd was started with (`None`: unlimited).
    pub was: Option<u64>,
    /// The soft limit now.
    pub now: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

impl OpenFiles {
    /// The most client connections this limit leaves room for: all but a headroom (at most
    /// half the limit) for the daemon's own files.
    pub fn connection_ceiling(&self) -> usize {
        let Some(limit) = self.now else {
            return usize::MAX;
        };
        let room = limit.saturating_sub(FD_HEADROOM.min(limit / 2));
        usize::try_from(room).unwrap_or(usize::MAX)
    }
}

/// Raises this process's soft open-file limit to its hard limit (a daemon started from a shell
/// or a unit that left the soft limit at 1024 would otherwise refuse sockets long before any
/// cap), logging both numbers at info. A refusal to raise is logged and the old limit kept:
/// fleetd then caps connections below it.
pub fn raise_open_file_limit() -> OpenFiles {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let old = getrlimit(Resource::Nofile);
    let mut now = old.current;
    if old.current.is_some() && old.current != old.maximum {
        let wanted = Rlimit {
            current: old.maximum,
            maximum: old.maximum,
        };
        match setrlimit(Resource::Nofile, wanted) {
            Ok(()) => now = getrlimit(Resource::Nofile).current,
            Err(e) => tracing::warn!(
                soft = ?old.current, hard = ?old.maximum, error = %e,
                "could not raise the open-file limit to the hard limit; keeping the soft limit"
            ),
        }
    }
    let limits = OpenFiles {
        was: old.current,
        now,
        hard: old.maximum,
    };
    tracing::info!(
        soft_was = %show(limits.was),
        soft = %show(limits.now),
        hard = %show(limits.hard),
        connections_at_most = limits.connection_ceiling(),
        "open-file limit"
    );
    limits
}

/// The open-file limit as it is now, without changing it.
pub fn open_files_now() -> OpenFiles {
    let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    OpenFiles {
        was: now.current,
        now: now.current,
        hard: now.maximum,
    }
}

fn show(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

/// The listen backlog asked for: connections the kernel completes before fleetd accepts them.
/// tokio's default (1024) overflowed under a flood of thousands of connects, and a client whose
/// handshake is dropped retries after 1 s, then 3 s — the outliers a flood left in replies. The
/// kernel caps it at `net.core.somaxconn` (4096 on current Linux).
pub const LISTEN_BACKLOG: u32 = 4_096;

/// Binds the daemon's TCP listener at `addr` with [`LISTEN_BACKLOG`] (and, as tokio's own
/// `bind` does, `SO_REUSEADDR`, so a restart need not wait for old connections' TIME_WAIT).
pub fn listen_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Who holds a TCP connection, for admission: the daemon's own user, another local user, or
/// (not on this machine, or its owner unreadable) an unknown one.
pub async fn tcp_peer(peer: SocketAddr, local: SocketAddr) -> Peer {
    match crate::locate::tcp_peer_uid(peer, local).await {
        Some(uid) if uid == crate::locate::own_uid() => Peer::Owner,
        uid => Peer::Other(uid),
    }
}

/// Who holds a unix-socket connection, from the credentials the kernel gave for it.
pub fn unix_peer(uid: Option<u32>) -> Peer {
    match uid {
        Some(uid) if uid == crate::locate::own_uid() => Peer::Owner,
        uid => Peer::Other(uid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_ceiling_leaves_room_for_the_daemons_own_files() {
        let at = |now| OpenFiles {
            was: now,
            now,
            hard: now,
        };
        assert_eq!(at(Some(20_000)).connection_ceiling(), 18_976);
        assert_eq!(
            at(Some(1_024)).connection_ceiling(),
            512,
            "half of a small limit"
        );
        assert_eq!(at(None).connection_ceiling(), usize::MAX);
    }
}

//! Caller locator: from a connection (loopback TCP peer or unix-socket peer) to the OS user and
//! process, and from the process to the pane it runs in — the nearest pane whose process (its
//! shell, or the command it runs) is the caller itself or one of its ancestors, cross-checked
//! with `HERDR_PANE_ID` / `TMUX_PANE` from its environment. Only this module asks the kernel
//! about identity, and only through `platform`, its one seam to the operating system (Linux's
//! `/proc` and netlink today; any other target fails to compile there, naming what it lacks).
//! It never trusts what a caller claims: environment variables are hints that can raise a
//! warning or mark a process as a member's, never lift what it may do.
//!
//! Ancestry, not the session id, decides the pane (SPEC §2): a member's child that calls
//! `setsid` and whose parent lives on is still found through its parent, and one re-parented
//! out of the pane's process tree is in no pane (a pid recycled as a session id can never make
//! an orphan look like another pane's process). A peer of another user is not traced at all:
//! the socket's owner ([`platform::client_socket`]) or the unix peer's credentials say who it is.
//!
//! Finding which process holds a TCP connection's socket has no direct kernel answer: it is
//! looked for in the processes most likely to hold it first — the pid that held it before, recent
//! callers, then the known panes' process trees breadth first from each pane's own process — and
//! the full scan of every process only after those (`process::find_holder`). Of the first two,
//! only the fds that can hold a new connection are read at first (numbers not seen in that
//! process before, or that were sockets when it was last looked at); the rest only if that misses.
//!
//! The pane map (pane process pid → pane incarnation) is a snapshot lookups read without waiting
//! for a refresh in flight (`panes`): refreshed in the background when older than `pane_ttl`, on
//! a miss (at most every `miss_refresh`: that lookup alone waits for it), at once after fleetd
//! opens a pane ([`Locator::invalidate`]); a pane the router reports `Gone` leaves it at once.
//! Pane pids are fetched only for pane incarnations not seen before, and every match is checked
//! against the process's start time, so a recycled pid is never mistaken for the old pane process.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::{QualifiedPaneId, TerminalId};
use tokio::net::UnixStream;

use crate::mux::{MuxError, MuxRouter, PaneEvent};
use crate::sync::lock;

mod counts;
mod lanes;
mod panes;
pub mod platform;
pub mod process;

use panes::{PaneMap, Panes};
use process::FoundBy;

use counts::Counters;
pub use counts::SearchCounts;

/// How many recent callers are tried first in an fd scan.
const RECENT_CALLERS: usize = 32;
/// Bound on the socket-inode → pid cache; cleared when full (connections are short-lived).
const SOCKET_CACHE: usize = 4096;

/// The user this daemon runs as: peers of any other user are never traced into a pane.
pub fn own_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The user that holds the client side of a TCP connection, when it is on this machine and the
/// kernel still lists it: the socket's owner, one exact lookup (no process is traced). For the
/// connection gate, which needs a user before anything else is asked.
pub async fn tcp_peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    if !is_loopback(&peer) {
        return None;
    }
    match tokio::task::spawn_blocking(move || platform::client_socket(peer, local)).await {
        Ok(Ok(Some(owner))) => Some(owner.uid),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "the connection's owner could not be read");
            None
        }
        Err(e) => {
            tracing::debug!(%peer, error = %e, "the owner lookup failed");
            None
        }
    }
}

/// Why a caller could not be located. Not being in a pane is not an error (see [`Located`]).
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    /// The kernel no longer lists the connection's socket (it closed), or no readable process
    /// holds it.
    #[error("no process holds the connection from {peer}; it may have closed")]
    NoOwner {
        /// The peer address.
        peer: SocketAddr,
    },
    /// Only loopback peers can be traced to a local process.
    #[error("peer {0} is not on loopback; identify it by API token instead")]
    NotLoopback(SocketAddr),
    /// The unix-socket peer's credentials carry no pid.
    #[error("the unix-socket peer has no pid")]
    NoPeerPid,
    /// The kernel's process or socket tables could not be read (`/proc` on Linux).
    #[error("failed to read the kernel's process tables: {0}")]
    Proc(#[from] std::io::Error),
    /// The multiplexer could not list panes, and no earlier list is cached.
    #[error("failed to list panes: {0}")]
    Mux(#[from] MuxError),
}

/// The pane a caller's process runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerPane {
    /// The pane, daemon-qualified.
    pub pane: QualifiedPaneId,
    /// Its incarnation at lookup time.
    pub terminal: TerminalId,
    /// The pane's process (its shell or command): the caller or its nearest such ancestor.
    pub shell_pid: u32,
    /// The pane's workspace label (herdr) or session name (tmux), when the listing said.
    pub workspace_label: Option<String>,
    /// When the pane's process started, in [`platform::ProcStat::start_time`]'s unit: the
    /// pane's birth, which the lead rule compares with when members were here.
    pub started: u64,
}

impl CallerPane {
    /// How long ago the pane was born (`None`: the clock could not be read).
    pub fn age(&self) -> Option<std::time::Duration> {
        platform::age_of(self.started).ok()
    }
}

/// Who a caller is, as far as the kernel and the multiplexer say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The caller's process; `None` for a peer of another user (not traced).
    pub pid: Option<u32>,
    /// The user the peer runs as; `None` when unknown.
    pub uid: Option<u32>,
    /// Its pane; `None` for a process in no known pane (anonymous), or of another user.
    pub pane: Option<CallerPane>,
    /// The pane id the process's environment claims (`HERDR_PANE_ID`, else `TMUX_PANE`).
    pub env_pane_id: Option<String>,
    /// True when that claim disagrees with `pane` (stale after a move, or spoofed). The answer
    /// is still `pane`: identity comes from the process tree, not from the environment.
    pub env_mismatch: bool,
    /// `FLEETD_TARGET` from the environment: the process was started from that member. Only
    /// ever used to lower a caller's role (a member's child outside its pane is anonymous).
    pub member_env: Option<String>,
    /// The shared agent daemon (Codex's `app-server`) the process runs under: then it is in no
    /// pane, and a refusal says why.
    pub via_daemon: Option<u32>,
}

impl Located {
    /// A peer of user `uid` that is not traced further.
    fn untraced(uid: u32, pid: Option<u32>) -> Self {
        Self {
            pid,
            uid: Some(uid),
            pane: None,
            env_pane_id: None,
            env_mismatch: false,
            member_env: None,
            via_daemon: None,
        }
    }

    /// Whether the peer runs as this daemon's user.
    pub fn same_uid(&self) -> bool {
        self.uid == Some(own_uid())
    }
}

/// Locator tuning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocatorConfig {
    /// Refresh the pane map when it is older than this.
    pub pane_ttl: Duration,
    /// Refresh on a miss at most this often (anonymous callers must not hammer the mux).
    pub miss_refresh: Duration,
}

impl Default for LocatorConfig {
    fn default() -> Self {
        Self {
            pane_ttl: Duration::from_secs(5),
            miss_refresh: Duration::from_millis(250),
        }
    }
}

/// Finds which pane a connection comes from.
#[derive(Debug, Clone)]
pub struct Locator {
    panes: Arc<Panes>,
    counters: Arc<Counters>,
    recent: Arc<Mutex<Vec<u32>>>,
    /// Socket inode → the pid found holding it. An inode names one live socket, so a hit only
    /// needs the pid re-checked (one fd listing), not a scan.
    sockets: Arc<Mutex<HashMap<u64, u32>>>,
    /// What the socket searches saw of the candidates' fd tables, so the next reads first only
    /// the fds that can hold a new connection (`process::FdMemory`).
    fds: Arc<Mutex<process::FdMemory>>,
}

impl Locator {
    /// A locator over `router`'s panes. Spawns a task that invalidates the pane map when a pane
    /// goes away, so it must be called inside a tokio runtime.
    pub fn new(router: MuxRouter, config: LocatorConfig) -> Self {
        let mut events = router.events();
        let panes = Arc::new(Panes::new(router, config));
        let weak = Arc::downgrade(&panes);
        tokio::spawn(async move {
            loop {
                let event = events.recv().await;
                let Some(panes) = weak.upgrade() else { return };
                match event {
                    // A status change keeps the pane and its process: only an ended
                    // incarnation leaves the map (at once, with no listing).
                    Ok(routed) => {
                        if let PaneEvent::Gone { terminal, .. } = &routed.event {
                            panes.gone(routed.pane(), terminal.clone());
                        }
                    }
                    // Missed events may have been `Gone`s: read the panes again first.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        panes.mark_stale();
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Self {
            panes,
            counters: Arc::default(),
            recent: Arc::new(Mutex::new(Vec::new())),
            sockets: Arc::new(Mutex::new(HashMap::new())),
            fds: Arc::default(),
        }
    }

    /// fleetd opened a pane: the next caller found in no pane has the panes read again at once,
    /// without waiting for `miss_refresh`. Lookups that find their pane are not held up.
    pub fn invalidate(&self) {
        self.panes.mark_grown();
    }

    /// The working directory of process `pid` (a caller's pane process), when it can be read.
    pub async fn cwd_of(&self, pid: u32) -> Option<std::path::PathBuf> {
        tokio::task::spawn_blocking(move || platform::read_cwd(pid).ok())
            .await
            .ok()
            .flatten()
    }

    /// How the socket holders of new TCP callers were found so far.
    pub fn search_counts(&self) -> SearchCounts {
        self.counters.read()
    }

    /// Locates the process at the other end of an accepted loopback TCP connection: `peer` is
    /// the client's address, `local` the address we accepted it on. Look up while the
    /// connection is open. The HTTP layer, which knows when a connection closes, should cache the
    /// answer per connection; a peer address alone is not cached here because ports are reused.
    /// A connection owned by another user is answered from the socket's owner alone.
    pub async fn locate_tcp(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<Located, LocateError> {
        self.tcp(peer, local, Miss::Wait).await
    }

    /// [`Locator::locate_tcp`] for a connection already found in no pane, looked up again: a
    /// miss now does not wait for the panes to be read (its first lookup did); it starts that
    /// reading in the background, for the next time. So a caller in no pane never makes a call
    /// wait on the multiplexer more than once per connection.
    pub async fn relocate_tcp(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Result<Located, LocateError> {
        self.tcp(peer, local, Miss::Background).await
    }

    async fn tcp(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        miss: Miss,
    ) -> Result<Located, LocateError> {
        if !is_loopback(&peer) {
            return Err(LocateError::NotLoopback(peer));
        }
        let looked_at = tokio::time::Instant::now();
        // The snapshot as it is: a refresh in flight is not waited for (a pane it would add is
        // still found, by the full scan). Only a map never read yet is waited for.
        let map = self.panes.current().await;
        let roots = match &map {
            Ok(map) => map.shells(),
            Err(e) => {
                tracing::debug!(error = %e, "no pane list to order the socket search by");
                Vec::new()
            }
        };
        let recent = lock(&self.recent).clone();
        let (sockets, fds) = (Arc::clone(&self.sockets), Arc::clone(&self.fds));
        // Every blocking step in one hand-off to the blocking pool: on a busy machine each
        // hand-off is a wait for a thread, and there used to be three.
        let search = tokio::task::spawn_blocking(move || {
            search_tcp(peer, local, &roots, recent, (&sockets, &fds))
        })
        .await
        .map_err(|e| LocateError::Proc(std::io::Error::other(e)))??;
        let (pid, uid, lineage) = match search {
            TcpSearch::OtherUser(uid) => return Ok(Located::untraced(uid, None)),
            TcpSearch::NotHeld => {
                self.counters.count(None);
                return Err(LocateError::NoOwner { peer });
            }
            TcpSearch::Found {
                pid,
                uid,
                by,
                lineage,
            } => {
                self.counters.count(Some(by));
                (pid, uid, lineage)
            }
        };
        {
            let mut recent = lock(&self.recent);
            recent.retain(|p| *p != pid);
            recent.insert(0, pid);
            recent.truncate(RECENT_CALLERS);
        }
        self.place(pid, uid, lineage, map, miss, looked_at).await
    }

    /// Locates the process at the other end of a unix-socket connection from the credentials the
    /// kernel recorded for it (tokio's `peer_cred`: `SO_PEERCRED` on Linux).
    pub async fn locate_unix(&self, stream: &UnixStream) -> Result<Located, LocateError> {
        let cred = stream.peer_cred()?;
        let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
        self.locate_peer(cred.uid(), pid).await
    }

    /// Locates a unix-socket peer from the credentials the kernel gave for it: a peer of another
    /// user is answered from its uid alone.
    pub async fn locate_peer(&self, uid: u32, pid: Option<u32>) -> Result<Located, LocateError> {
        if uid != own_uid() {
            return Ok(Located::untraced(uid, pid));
        }
        let pid = pid.ok_or(LocateError::NoPeerPid)?;
        self.locate_process(pid, uid, Miss::Wait).await
    }

    /// Locates a known process of this daemon's user (the benchmark's warm path).
    pub async fn locate_pid(&self, pid: u32) -> Result<Located, LocateError> {
        self.locate_process(pid, own_uid(), Miss::Wait).await
    }

    /// Locates process `pid`, which runs as `uid`: its nearest ancestor that is a pane's process.
    async fn locate_process(&self, pid: u32, uid: u32, miss: Miss) -> Result<Located, LocateError> {
        let looked_at = tokio::time::Instant::now();
        let lineage = tokio::task::spawn_blocking(move || Lineage::of(pid))
            .await
            .map_err(|e| LocateError::Proc(std::io::Error::other(e)))??;
        let map = self.panes.current().await;
        self.place(pid, uid, lineage, map, miss, looked_at).await
    }

    /// The pane of process `pid` (where its `lineage` says it runs) in `map`, read again after a
    /// miss as `miss` says. A process under a shared agent daemon is in no pane: the daemon runs
    /// the threads of every agent of its kind and home, started from whichever pane, and its own
    /// place says nothing about which one called.
    async fn place(
        &self,
        pid: u32,
        uid: u32,
        Lineage {
            chain,
            hints,
            daemon,
        }: Lineage,
        map: Result<Arc<PaneMap>, LocateError>,
        miss: Miss,
        looked_at: tokio::time::Instant,
    ) -> Result<Located, LocateError> {
        let mut pane = None;
        if let Some(daemon) = daemon {
            tracing::warn!(
                pid,
                daemon,
                "a call came through Codex's shared app-server daemon, which serves every Codex of its home: it is placed in no pane (start Codex with --no-daemon)"
            );
        } else if let Some(map) = no_panes_is_none(map)? {
            pane = map.find(&chain);
            if pane.is_none() && miss == Miss::Background {
                self.panes.refresh_in_background(self.panes.miss_refresh());
            } else if pane.is_none() {
                // A miss is often a pane opened a moment ago (a member connects at start-up), so
                // the panes are read again — no more often than `miss_refresh`, so anonymous
                // callers cannot turn every request into a multiplexer listing — unless the
                // miss is final (the map was listed after the caller and its ancestors started).
                // Only this lookup waits for that reading.
                pane = no_panes_is_none(self.panes.after_miss(&map, &chain, looked_at).await)?
                    .and_then(|map| map.find(&chain));
            }
        }
        let env_pane_id = hints.herdr_pane_id.or(hints.tmux_pane);
        let env_mismatch = match (&pane, &env_pane_id) {
            (Some(p), Some(claim)) => p.pane.pane.as_str() != claim,
            _ => false,
        };
        if env_mismatch {
            tracing::warn!(
                pid,
                pane = %pane.as_ref().map(|p| p.pane.to_string()).unwrap_or_default(),
                claimed = env_pane_id.as_deref().unwrap_or(""),
                "caller's environment names a different pane than its process tree; trusting the process tree"
            );
        }
        Ok(Located {
            pid: Some(pid),
            uid: Some(uid),
            pane,
            env_pane_id,
            env_mismatch,
            member_env: hints.fleetd_target,
            via_daemon: daemon,
        })
    }

    /// Pane `pane` as a listing read now has it, when it exists: what the operator names when
    /// admitting a pane as a lead.
    pub async fn pane(&self, pane: &QualifiedPaneId) -> Result<Option<CallerPane>, LocateError> {
        let map = self.panes.read_now().await?;
        Ok(map.pane(pane))
    }

    /// Whether `pane` still holds incarnation `terminal`, as far as the pane map says (a gone
    /// incarnation leaves it as soon as the router reports it): a caller cached in a pane is
    /// looked up again once it does not. A failed reading keeps the previous map, so a
    /// multiplexer blip never drops a caller.
    pub async fn is_current(&self, pane: &QualifiedPaneId, terminal: &TerminalId) -> bool {
        match self.panes.current().await {
            Ok(map) => map.holds(pane, terminal),
            Err(_) => true,
        }
    }
}

/// What the blocking part of a TCP lookup found.
enum TcpSearch {
    /// The socket is another user's: never traced further.
    OtherUser(u32),
    /// Nobody holds it (the connection closed, or its holder's fds are unreadable).
    NotHeld,
    /// Its holder, how it was found, and where it runs.
    Found {
        pid: u32,
        uid: u32,
        by: FoundBy,
        lineage: Lineage,
    },
}

/// The blocking steps of a TCP lookup, in one go: the socket and its owner, who holds it (its
/// previous holder and `recent` callers first, then the trees of the panes whose processes are
/// `roots`, then everyone), and that process's ancestry and environment.
fn search_tcp(
    peer: SocketAddr,
    local: SocketAddr,
    roots: &[u32],
    recent: Vec<u32>,
    (sockets, fds): (&Mutex<HashMap<u64, u32>>, &Arc<Mutex<process::FdMemory>>),
) -> Result<TcpSearch, LocateError> {
    let owner = platform::client_socket(peer, local)?.ok_or(LocateError::NoOwner { peer })?;
    if owner.uid != own_uid() {
        return Ok(TcpSearch::OtherUser(owner.uid));
    }
    let mut first: Vec<u32> = lock(sockets)
        .get(&owner.inode)
        .copied()
        .into_iter()
        .collect();
    first.extend(recent);
    let Some((pid, by)) = process::find_holder(owner.inode, &first, roots, fds)? else {
        return Ok(TcpSearch::NotHeld);
    };
    {
        let mut sockets = lock(sockets);
        if sockets.len() >= SOCKET_CACHE {
            sockets.clear();
        }
        sockets.insert(owner.inode, pid);
    }
    Ok(TcpSearch::Found {
        pid,
        uid: owner.uid,
        by,
        lineage: Lineage::of(pid)?,
    })
}

/// What a caller's process says about where it runs: its ancestry, its environment's identity
/// hints and the shared agent daemon it runs under, if any. Blocking.
struct Lineage {
    chain: Vec<platform::ProcStat>,
    hints: platform::EnvHints,
    daemon: Option<u32>,
}

impl Lineage {
    fn of(pid: u32) -> std::io::Result<Self> {
        let chain = process::ancestry(pid)?;
        Ok(Self {
            daemon: process::shared_daemon(&chain),
            hints: platform::read_env_hints(pid),
            chain,
        })
    }
}

/// What a lookup whose caller is in no pane of the map does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Miss {
    /// Waits for the panes to be read again (no sooner than `miss_refresh`).
    Wait,
    /// Answers now and has the panes read in the background.
    Background,
}

/// A pane map, where a multiplexer that cannot list its panes (and never could) means none: the
/// caller's user and environment are still known, and a caller in no known pane is never more
/// than anonymous over TCP or the shim.
fn no_panes_is_none(
    map: Result<Arc<PaneMap>, LocateError>,
) -> Result<Option<Arc<PaneMap>>, LocateError> {
    match map {
        Ok(map) => Ok(Some(map)),
        Err(LocateError::Mux(e)) => {
            tracing::debug!(error = %e, "no pane list to place the caller in");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Whether `addr` is a loopback address (after unmapping IPv4-in-IPv6).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr.ip().to_canonical() {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

#[cfg(test)]
mod tests;

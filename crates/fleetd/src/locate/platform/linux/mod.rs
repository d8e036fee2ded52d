//! Linux's side of the locator's platform seam: `/proc` (`proc`) and netlink `sock_diag`
//! (`diag`). Nothing outside `locate::platform` names these modules, so every Linux-only call
//! fleetd makes for identity is in this directory.

use std::io;
use std::net::SocketAddr;

use super::SocketOwner;

mod diag;
mod proc;

pub use proc::{
    Fds, age_of, children, pids, read_cmdline, read_cwd, read_env_hints, read_stat, start_clock_now,
};

/// The client side of an accepted loopback connection, its inode and owner: an exact netlink
/// `sock_diag` lookup, falling back to scanning `/proc/net/tcp{,6}` where netlink is unavailable.
/// Blocking.
pub fn client_socket(peer: SocketAddr, local: SocketAddr) -> io::Result<Option<SocketOwner>> {
    match diag::tcp_socket(peer, local) {
        Ok(found) => Ok(found),
        Err(e) => {
            tracing::debug!(error = %e, "sock_diag lookup failed; reading /proc/net/tcp instead");
            proc::client_socket(peer, local)
        }
    }
}

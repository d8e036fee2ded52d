//! The stdio shim's two ends. In the daemon: a unix socket (`<state dir>/fleetd.sock`) where each
//! connection is one MCP session whose caller is identified by `SO_PEERCRED`. In `fleetd mcp`: a
//! relay that copies stdin to that socket and the socket to stdout, for agents that only speak
//! stdio MCP. Owns the socket file; knows no MCP itself beyond handing the stream to `mcp`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

use fleetd_core::access::Door;

use crate::identity::ConnInfo;
use crate::mcp::{Fleet, FleetMcp};

/// The socket's file name inside the state directory.
pub const SOCKET_NAME: &str = "fleetd.sock";

/// The running accept loop.
#[derive(Debug)]
pub struct ShimListener {
    task: JoinHandle<()>,
    path: PathBuf,
}

impl ShimListener {
    /// Stops accepting and removes the socket file.
    pub fn stop(self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The shim socket's path for a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_NAME)
}

/// Binds a unix socket at `path` that only this user can connect to (0600, in the 0700 state
/// directory), replacing a stale file: the store lock already made this daemon the state
/// directory's only owner.
pub fn bind_private(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode(crate::state_dir::FILE_MODE),
    )?;
    Ok(listener)
}

/// Binds the shim socket and serves each connection as one MCP session, its caller resolved
/// on each call from `SO_PEERCRED` exactly as a TCP caller is from its connection. Each session
/// takes a slot of `gate` for as long as it lasts. It counts as idle unless a tool call or a task
/// poll is under way, so on a full gate it is closed to make room like an idle HTTP connection
/// (attack C3: idle sessions held every slot); the relay (`fleetd mcp`) connects again when its
/// agent next calls. A connection the gate refuses reads one JSON-RPC error naming the cap, and
/// is closed. There is no idle or header timer: an agent may be quiet for hours.
pub async fn listen(
    state_dir: &Path,
    fleet: Arc<Fleet>,
    gate: Arc<crate::conn::Gate>,
) -> std::io::Result<ShimListener> {
    crate::state_dir::private_dir(state_dir)?;
    let path = socket_path(state_dir);
    let listener = bind_private(&path)?;
    if let Err(e) = crate::sandbox::link_door(state_dir, &path) {
        tracing::warn!(error = %e, "cannot give the shim's socket its second name in <state>/door: sandboxed members cannot use the stdio shim");
    }
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "shim socket accept failed");
                    continue;
                }
            };
            let fleet = Arc::clone(&fleet);
            let gate = Arc::clone(&gate);
            tokio::spawn(async move {
                let cred = stream.peer_cred().ok();
                let peer = crate::conn::unix_peer(cred.map(|c| c.uid()));
                let caps = crate::conn::Caps::of(&fleet.config.current().connections);
                let admission = match gate.admit(peer, caps) {
                    Ok(admission) => Arc::new(admission),
                    Err(refusal) => {
                        crate::ops::telemetry::connection_closed(refusal.code());
                        tracing::warn!(
                            reason = refusal.code(),
                            "refusing a stdio shim session: {}",
                            refusal.message()
                        );
                        let line = crate::mcp::refusal_line(refusal.code(), &refusal.message());
                        let mut stream = stream;
                        let _ =
                            tokio::io::AsyncWriteExt::write_all(&mut stream, line.as_bytes()).await;
                        return;
                    }
                };
                crate::ops::telemetry::connections_open(gate.open());
                let conn = ConnInfo::unix(Door::Shim, cred);
                let server = FleetMcp::for_connection(fleet, conn, Arc::clone(&admission));
                // Idle until its handshake is done too: a session that never finishes it holds
                // its slot only until someone needs it.
                let served = tokio::select! {
                    served = server.serve(stream) => served,
                    () = admission.evicted() => {
                        tracing::debug!("closing a stdio shim session that never finished its handshake to make room");
                        crate::ops::telemetry::connection_closed("evicted");
                        drop(admission);
                        crate::ops::telemetry::connections_open(gate.open());
                        return;
                    }
                };
                match served {
                    Ok(running) => {
                        let stop = running.cancellation_token();
                        tokio::select! {
                            _ = running.waiting() => {}
                            () = admission.evicted() => {
                                // Idle (no tool call or task poll under way): closed to make
                                // room; the relay reconnects when its agent next calls.
                                tracing::debug!("closing an idle stdio shim session to make room");
                                crate::ops::telemetry::connection_closed("evicted");
                                stop.cancel();
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "shim session ended during start"),
                }
                drop(admission);
                crate::ops::telemetry::connections_open(gate.open());
            });
        }
    });
    Ok(ShimListener { task, path })
}

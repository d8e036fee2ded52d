//! Caller identity for MCP calls (SPEC §2): from the connection to a process, a pane and a role.
//! Owns the per-connection cache and the member/lead/anonymous decision; never reads tool
//! arguments. A bearer token only turns an anonymous caller into a lead — it never makes a
//! caller a member, and never overrides a pane.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use fleetd_core::access::Role;
use rmcp::RoleServer;
use rmcp::service::RequestContext;
use tokio::net::TcpListener;

use super::Fleet;
use crate::engine::LeadRef;
use crate::locate::{CallerPane, Located};

/// How long a connection found in no pane keeps that answer before it is looked up again.
const ANONYMOUS_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// One accepted HTTP connection: its addresses and, once looked up, who holds it. axum makes one
/// per connection and clones it into every request on that connection, so the lookup runs once.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// Our address it connected to.
    pub local: SocketAddr,
    located: Arc<std::sync::Mutex<Option<(Located, tokio::time::Instant)>>>,
}

impl Connected<IncomingStream<'_, TcpListener>> for ConnInfo {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        let peer = *stream.remote_addr();
        let local = stream.io().local_addr().unwrap_or(peer);
        Self {
            peer,
            local,
            located: Arc::default(),
        }
    }
}

/// Where a request came from.
#[derive(Debug, Clone)]
pub enum Peer {
    /// An HTTP connection, with the bearer token it presented (if any).
    Http {
        /// The connection.
        conn: ConnInfo,
        /// `Authorization: Bearer ...`.
        bearer: Option<String>,
    },
    /// A unix-socket connection (the stdio shim), already located by `SO_PEERCRED`.
    Unix(Option<Located>),
}

/// Who is calling, as fleetd decided it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The role.
    pub role: Role,
    /// The caller's pane, when it runs in one.
    pub pane: Option<CallerPane>,
    /// Cancelled when the request is abandoned (the client went away or cancelled it): a
    /// waiting tool stops waiting, so a reply is never handed to a waiter nobody reads.
    pub cancel: tokio_util::sync::CancellationToken,
}

impl Caller {
    /// The lead this caller is, when it is one in a pane.
    pub fn lead(&self) -> Option<LeadRef> {
        match (&self.role, &self.pane) {
            (Role::Lead, Some(p)) => Some(LeadRef {
                pane: p.pane.clone(),
                terminal: p.terminal.clone(),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.role, &self.pane) {
            (Role::Member { target, .. }, _) => write!(f, "member {target}"),
            (Role::Lead, Some(p)) => write!(f, "lead {}", p.pane),
            (Role::Lead, None) => f.write_str("lead"),
            (Role::Anonymous { token: true }, _) => f.write_str("token holder"),
            (Role::Anonymous { token: false }, _) => f.write_str("anonymous"),
        }
    }
}

/// The peer of an HTTP request, from the `http::request::Parts` rmcp passes along.
pub(super) fn peer_of(ctx: &RequestContext<RoleServer>) -> Option<Peer> {
    let parts = ctx.extensions.get::<http::request::Parts>()?;
    let conn = parts
        .extensions
        .get::<axum::extract::ConnectInfo<ConnInfo>>()?
        .0
        .clone();
    let bearer = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    Some(Peer::Http { conn, bearer })
}

/// Decides the caller's role from its peer.
pub(super) async fn resolve(
    fleet: &Fleet,
    peer: Option<Peer>,
    cancel: tokio_util::sync::CancellationToken,
) -> Caller {
    let (located, bearer) = match peer {
        Some(Peer::Http { conn, bearer }) => {
            // A caller found in a pane is cached for the connection's life; one found in no
            // pane is looked up again after a moment (its pane may be brand new).
            let cached = conn
                .located
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
                .filter(|(l, at)| l.pane.is_some() || at.elapsed() < ANONYMOUS_RECHECK)
                .map(|(l, _)| l);
            let located = match cached {
                Some(located) => Some(located),
                None => match fleet.locator.locate_tcp(conn.peer, conn.local).await {
                    Ok(located) => {
                        *conn
                            .located
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) =
                            Some((located.clone(), tokio::time::Instant::now()));
                        Some(located)
                    }
                    Err(e) => {
                        tracing::debug!(peer = %conn.peer, error = %e, "caller not located");
                        None
                    }
                },
            };
            (located, bearer)
        }
        Some(Peer::Unix(located)) => (located, None),
        None => (None, None),
    };
    let token = match (&fleet.api_token, &bearer) {
        (Some(expected), Some(given)) => constant_time_eq(expected.as_bytes(), given.as_bytes()),
        _ => false,
    };
    let pane = located.and_then(|l| l.pane);
    let role = match &pane {
        Some(p) => match fleet
            .engine
            .member_at(p.pane.clone(), p.terminal.clone())
            .await
        {
            Ok(Some((target, allow_delegation))) => Role::Member {
                target,
                allow_delegation,
            },
            _ => Role::Lead,
        },
        None => Role::Anonymous { token },
    };
    Caller { role, pane, cancel }
}

/// A member that speaks MCP is present; a lead that does is remembered.
pub(super) async fn note_presence(fleet: &Fleet, caller: &Caller) {
    match (&caller.role, &caller.pane) {
        (Role::Member { target, .. }, _) => {
            let _ = fleet.engine.presence(target.clone()).await;
        }
        (_, Some(pane)) => {
            let _ = fleet
                .engine
                .pane_seen(pane.pane.clone(), pane.terminal.clone())
                .await;
        }
        _ => {}
    }
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

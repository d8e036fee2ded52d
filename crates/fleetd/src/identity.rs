//! Caller identity for every door (SPEC §2, §9): MCP over HTTP, the REST API, the stdio shim's
//! socket and the operator's socket all resolve a caller here, the same way, from the connection
//! alone: the peer's user and process (the locator), the pane that process descends from, and
//! whether that pane is a registered member's. The role itself is the core's pure decision
//! (`fleetd_core::access::role_of`); this module gathers its facts and owns the per-connection
//! cache. It never reads tool arguments or request bodies, and a header only ever matters as the
//! API token, which never lifts a caller in a pane.

use fleetd_core::refusal::Code;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use fleetd_core::MuxDaemon;
use fleetd_core::access::{CallerFacts, Door, Place, Refusal, Role, ToolClass, authorize, role_of};

use crate::config::Config;
use crate::engine::{LeadRef, Standing};
use crate::locate::{CallerPane, Located};
use crate::mcp::Fleet;

/// How long a connection found in no pane keeps that answer before it is looked up again.
const ANONYMOUS_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Where a connection's peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP connection: the client's address and ours.
    Tcp {
        /// The client's address.
        peer: SocketAddr,
        /// Our address it connected to.
        local: SocketAddr,
    },
    /// A unix-socket connection, with the credentials the kernel gave at accept
    /// (`SO_PEERCRED`); `uid` is `None` when they could not be read.
    Unix {
        /// The peer's user.
        uid: Option<u32>,
        /// The peer's process.
        pid: Option<u32>,
    },
}

/// One accepted connection: the door, the peer and, once looked up, who holds it. Cloned into
/// every request on the connection, so the lookup runs once per connection (and again only when
/// the pane it found ends, or after a moment for a caller found in no pane).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The door it came through.
    pub door: Door,
    /// The peer.
    pub endpoint: Endpoint,
    located: Arc<std::sync::Mutex<Option<(Located, tokio::time::Instant)>>>,
}

impl ConnInfo {
    /// A connection through `door` from `endpoint`, not looked up yet.
    pub fn new(door: Door, endpoint: Endpoint) -> Self {
        Self {
            door,
            endpoint,
            located: Arc::default(),
        }
    }

    /// A unix-socket connection through `door`, from the credentials the kernel gave for its
    /// peer (`SO_PEERCRED`; `None` when they could not be read).
    pub fn unix(door: Door, cred: Option<tokio::net::unix::UCred>) -> Self {
        Self::new(
            door,
            Endpoint::Unix {
                uid: cred.map(|c| c.uid()),
                pid: cred
                    .and_then(|c| c.pid())
                    .and_then(|p| u32::try_from(p).ok()),
            },
        )
    }

    /// The client's address, for a TCP connection.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match self.endpoint {
            Endpoint::Tcp { peer, .. } => Some(peer),
            Endpoint::Unix { .. } => None,
        }
    }

    fn cached(&self) -> Option<(Located, tokio::time::Instant)> {
        crate::sync::lock(&self.located).clone()
    }

    fn remember(&self, located: Option<Located>) {
        *crate::sync::lock(&self.located) = located.map(|l| (l, tokio::time::Instant::now()));
    }
}

/// Who is calling, as fleetd decided it.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The role.
    pub role: Role,
    /// The caller's pane, for a member or a lead (never for nobody: such a pane is nothing).
    pub pane: Option<CallerPane>,
    /// For nobody only: the pane in the members' space it called from, which holds no member
    /// (yet). Never an identity; only remembered as that pane incarnation's MCP presence
    /// ([`note_presence`]), because a spawned member's agent may connect before fleetd has
    /// registered the member, and it connects only once.
    pub unregistered: Option<CallerPane>,
    /// The shared agent daemon the call came through (Codex's `app-server`), which places it in
    /// no pane: a refusal names it and says what to do.
    pub via_daemon: Option<u32>,
    /// For nobody only: the stray pane it called from (outside the members' workspace, opened
    /// while members ran, never admitted), which a refusal names with the way to admit it. Its
    /// MCP presence is remembered too: alone in a configured lead tab, it is that tab's lead.
    pub stray: Option<CallerPane>,
    /// For anonymous only: the `runAs` user it runs as, given to a member being spawned that is
    /// not registered yet. Never an identity; only remembered as that member's MCP presence,
    /// as `unregistered` is for a pane.
    pub spawning_user: Option<u32>,
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

impl Caller {
    /// Whether this caller may perform an operation of `class` named `tool` (the one policy,
    /// `fleetd_core::access::authorize`), a refusal told in its terms ([`Caller::explain`]).
    pub fn authorize(&self, class: ToolClass, tool: &str) -> Result<(), Refusal> {
        authorize(&self.role, class, tool).map_err(|e| self.explain(e))
    }

    /// `refusal`, told in this caller's terms: an anonymous call that came through Codex's
    /// shared daemon is refused as `shared_daemon`, naming it and the way out, rather than as a
    /// process in no pane it cannot make sense of.
    pub fn explain(&self, refusal: Refusal) -> Refusal {
        if let (Role::Nobody, Some(CallerPane { pane, .. })) = (&self.role, &self.stray) {
            return Refusal::new(
                Code::StrayPane,
                format!(
                    "refused: pane {pane} is outside the members' workspace but was opened while members were running, so fleetd cannot tell it from a pane a member opened (docs/SECURITY.md, \"Who is a lead\"). If it is yours, admit it as a lead: run `fleetd admit {pane}` from a lead's pane or a shell outside the multiplexer"
                ),
            );
        }
        match (&self.role, self.via_daemon) {
            (Role::Anonymous, Some(daemon)) => Refusal::new(
                Code::SharedDaemon,
                format!(
                    "{} — this call came through Codex's shared app-server daemon (pid {daemon}), which runs the threads of every Codex of this home whichever pane started it, so fleetd cannot tell who is calling: start Codex with `codex --no-daemon` (`fleetd install codex` turns its automatic start off), then stop the daemon with `kill {daemon}`",
                    refusal.message
                ),
            ),
            _ => refusal,
        }
    }

    /// Who receives replies a waiting `fleet_send` returns, so its next call acknowledges them:
    /// a lead by its pane, the operator, or a delegating member. `None` for a caller that cannot
    /// wait for a reply.
    pub fn holder(&self) -> Option<String> {
        match (&self.role, &self.pane) {
            (Role::Lead, Some(p)) => Some(p.pane.to_string()),
            (Role::Operator, _) => Some("operator".to_owned()),
            (Role::Member { target, .. }, _) => Some(format!("member:{target}")),
            _ => None,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.role, &self.pane) {
            (Role::Member { target, .. }, _) => write!(f, "member {target}"),
            (Role::Lead, Some(p)) => write!(f, "lead {}", p.pane),
            (role, _) => f.write_str(role.as_str()),
        }
    }
}

/// Whether `pane` is in the members' space: on a separate members' multiplexer daemon, or in
/// the workspace (herdr label / tmux session) `membersWorkspace` names.
pub fn in_members_space(config: &Config, pane: &CallerPane) -> bool {
    pane.pane.daemon == MuxDaemon::Member
        || pane.workspace_label.as_deref() == Some(config.members_workspace.as_str())
}

/// Decides who holds `conn` (`None`: a request with no connection facts at all, which is
/// anonymous), given the bearer token it presented.
pub async fn resolve(
    fleet: &Fleet,
    conn: Option<&ConnInfo>,
    bearer: Option<&str>,
    cancel: tokio_util::sync::CancellationToken,
) -> Caller {
    let token = bearer.is_some_and(|given| fleet.token_matches(given));
    resolve_with(fleet, conn, token, cancel).await
}

/// [`resolve`] for a request whose credential was already checked: `token` is whether it
/// presented the API token (or what counts as it, a signed-in dashboard's session).
pub async fn resolve_with(
    fleet: &Fleet,
    conn: Option<&ConnInfo>,
    token: bool,
    cancel: tokio_util::sync::CancellationToken,
) -> Caller {
    let located = match conn {
        Some(conn) => locate(fleet, conn).await,
        None => None,
    };
    let mut same_uid = located.as_ref().is_some_and(Located::same_uid);
    let pane = located.as_ref().and_then(|l| l.pane.clone());
    // A member's own user (`runAs`) is that member, wherever its process is: every process of
    // a user can read and signal every other, and fleetd cannot trace another user's sockets.
    let other_uid = located.as_ref().and_then(|l| l.uid).filter(|_| !same_uid);
    let own_user = match other_uid {
        Some(uid) => fleet.engine.member_of_user(uid).await.ok().flatten(),
        None => None,
    };
    same_uid |= own_user.is_some();
    let place = match (own_user, &pane) {
        (Some((target, allow_delegation)), _) => Place::Member {
            target,
            allow_delegation,
        },
        (None, Some(p)) => match fleet
            .engine
            .standing(p.pane.clone(), p.terminal.clone(), p.age())
            .await
        {
            Ok(Standing::Member(target, allow_delegation)) => Place::Member {
                target,
                allow_delegation,
            },
            _ if in_members_space(&fleet.config.current(), p) => Place::MembersSpace,
            Ok(Standing::Lead) => Place::OtherPane,
            // A stray, or the engine is gone and cannot say: never more than nobody.
            Ok(Standing::Stray) | Err(_) => Place::StrayPane,
        },
        (None, None) if located.as_ref().is_some_and(|l| l.member_env.is_some()) => {
            Place::LeftMember
        }
        (None, None) => Place::Nowhere,
    };
    let facts = CallerFacts {
        door: conn.map_or(Door::Tcp, |c| c.door),
        same_uid,
        token,
        place,
    };
    let stray = (facts.place == Place::StrayPane)
        .then(|| pane.clone())
        .flatten();
    let role = role_of(&facts);
    let spawning_user = other_uid
        .filter(|uid| role == Role::Anonymous && crate::sandbox::user::being_spawned(*uid));
    let (pane, unregistered) = match role {
        Role::Member { .. } | Role::Lead => (pane, None),
        Role::Nobody if stray.is_none() => (None, pane),
        _ => (None, None),
    };
    if !same_uid && located.is_some() {
        tracing::debug!(uid = ?located.as_ref().and_then(|l| l.uid), role = role.as_str(), "caller of another user");
    }
    Caller {
        role,
        pane,
        unregistered,
        via_daemon: located.as_ref().and_then(|l| l.via_daemon),
        stray,
        spawning_user,
        cancel,
    }
}

/// The pane `conn`'s process runs in, when it is of fleetd's own user and in one (the
/// place a member is found at; whose it is, the engine says).
pub async fn own_users_pane(fleet: &Fleet, conn: &ConnInfo) -> Option<CallerPane> {
    locate(fleet, conn)
        .await
        .filter(Located::same_uid)
        .and_then(|l| l.pane)
}

/// The connection's located peer: the cached answer while it holds (its pane still has the same
/// incarnation; or, in no pane, for [`ANONYMOUS_RECHECK`]), else a fresh lookup.
async fn locate(fleet: &Fleet, conn: &ConnInfo) -> Option<Located> {
    let mut again_in_no_pane = false;
    if let Some((located, at)) = conn.cached() {
        let holds = match &located.pane {
            // A stopped member's leftover connection is looked up again (SPEC §2).
            Some(p) => fleet.locator.is_current(&p.pane, &p.terminal).await,
            None => at.elapsed() < ANONYMOUS_RECHECK,
        };
        if holds {
            return Some(located);
        }
        again_in_no_pane = located.pane.is_none();
    }
    let found = match &conn.endpoint {
        // Its first lookup already waited for the panes to be read: this one does not.
        Endpoint::Tcp { peer, local } if again_in_no_pane => {
            fleet.locator.relocate_tcp(*peer, *local).await
        }
        Endpoint::Tcp { peer, local } => fleet.locator.locate_tcp(*peer, *local).await,
        Endpoint::Unix {
            uid: Some(uid),
            pid,
        } => fleet.locator.locate_peer(*uid, *pid).await,
        Endpoint::Unix { uid: None, .. } => return None,
    };
    match found {
        Ok(located) => {
            conn.remember(Some(located.clone()));
            Some(located)
        }
        Err(e) => {
            tracing::debug!(endpoint = ?conn.endpoint, error = %e, "caller not located");
            conn.remember(None);
            None
        }
    }
}

/// A member that speaks MCP is present; a lead that does is registered as a lead (so the lead
/// scanner finds an agent the multiplexer does not name, as after a herdr restart); a process in
/// a members'-space pane that holds no member yet is remembered by its pane incarnation.
pub async fn note_presence(fleet: &Fleet, caller: &Caller) {
    match (&caller.role, &caller.pane) {
        (Role::Member { target, .. }, _) => {
            let _ = fleet.engine.presence(target.clone()).await;
        }
        (Role::Lead, Some(_)) => {
            if let Some(lead) = caller.lead() {
                let _ = fleet.engine.lead_seen(lead).await;
            }
        }
        // A members'-space pane that holds no member yet (a spawned agent that connected before
        // its member was registered): the engine remembers the incarnation, so a member
        // registered there counts as present. A stray's too, for the lead-tab scanner.
        (Role::Nobody, _) => {
            if let Some(pane) = caller.unregistered.as_ref().or(caller.stray.as_ref()) {
                let _ = fleet
                    .engine
                    .pane_seen(pane.pane.clone(), pane.terminal.clone())
                    .await;
            }
        }
        (Role::Anonymous, _) => {
            if let Some(uid) = caller.spawning_user {
                crate::sandbox::user::seen(uid);
                // Registered meanwhile: then the spawn may have looked already.
                if let Ok(Some((target, _))) = fleet.engine.member_of_user(uid).await {
                    let _ = fleet.engine.presence(target).await;
                }
            }
        }
        _ => {}
    }
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

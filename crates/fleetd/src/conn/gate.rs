//! The admission gate every door asks before it serves a connection (SPEC §9): one count over all
//! doors, capped at `connections.max`; a reserve of `connections.ownerReserve` that only the
//! daemon's own user may take (its leads, members and operator all run as that user); and a cap
//! of `connections.perUid` for each other user. When the gate is full, a newcomer of the
//! daemon's own user closes a connection with no request in flight (idle, or still sending its
//! request head) instead of being refused, so a flood of idle sockets can hold a slot only until
//! someone who needs it arrives: first the one idle longest among those that never completed a
//! request (what a flood's sockets are), then the one idle longest among the rest (a real
//! client's kept-alive connection is reused within moments and so is closed last). Other users
//! never close anyone's connection. Owns the counts and the choice; knows no protocol, reads no clock (the order in
//! which connections fell idle is a sequence number), and its refusal is a value the door words.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Who holds a connection, as far as admission cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The daemon's own user.
    Owner,
    /// Another user: its uid, or `None` for a peer whose user is unknown (not on this machine,
    /// or its socket's owner could not be read) — all such peers count as one user.
    Other(Option<u32>),
}

/// The gate's caps, as the configuration gives them (the gate bounds `max` by the open-file
/// limit itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// `connections.max`.
    pub max: usize,
    /// `connections.perUid`.
    pub per_uid: usize,
    /// `connections.ownerReserve`.
    pub owner_reserve: usize,
}

impl Caps {
    /// The caps of a `connections:` section.
    pub fn of(c: &crate::config::Connections) -> Self {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Self {
            max: size(c.max),
            per_uid: size(c.per_uid),
            owner_reserve: size(c.owner_reserve),
        }
    }
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken and none is idle.
    Full {
        /// The cap in force.
        max: usize,
    },
    /// This user holds its share already.
    PerUid {
        /// The cap in force.
        per_uid: usize,
    },
    /// Users other than the daemon's hold everything but the owner's reserve.
    OthersShare {
        /// What other users may hold together.
        share: usize,
    },
}

impl Refusal {
    /// A stable code for logs, metrics and the refusal's body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Full { .. } => "too_many_connections",
            Self::PerUid { .. } => "too_many_connections_for_user",
            Self::OthersShare { .. } => "connections_reserved",
        }
    }

    /// The sentence a refused client reads: what the cap is, its key, and what to do.
    pub fn message(&self) -> String {
        match self {
            Self::Full { max } => format!(
                "fleetd holds its maximum of {max} connections (connections.max) and none of them is idle: retry shortly, close connections you do not use, or raise connections.max"
            ),
            Self::PerUid { per_uid } => format!(
                "your user already holds {per_uid} connections to fleetd, the most one user other than fleetd's own may hold (connections.perUid): close some, or raise connections.perUid"
            ),
            Self::OthersShare { share } => format!(
                "users other than fleetd's own already hold {share} connections, all but the reserve kept for fleetd's own user (connections.max minus connections.ownerReserve): retry later, or change those keys"
            ),
        }
    }
}

#[derive(Debug)]
struct Entry {
    peer: Peer,
    /// Requests in flight; a connection with none is idle (evictable).
    active: usize,
    /// Its place in `State::idle` while idle.
    idle_seq: Option<IdleKey>,
    /// Whether a request ever started on it.
    served: bool,
    close: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    next_seq: u64,
    total: usize,
    others: usize,
    per_uid: HashMap<Option<u32>, usize>,
    conns: HashMap<u64, Entry>,
    /// Idle connections, in the order they are closed to make room: those that never served a
    /// request first, each kind by the order in which it fell idle (oldest first).
    idle: BTreeMap<IdleKey, u64>,
}

/// Where an idle connection stands in the order of closing: (served a request before, when it
/// fell idle).
type IdleKey = (bool, u64);

impl State {
    fn count(&mut self, peer: Peer, up: bool) {
        let step = |n: &mut usize| {
            if up {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        };
        step(&mut self.total);
        if let Peer::Other(uid) = peer {
            step(&mut self.others);
            let n = self.per_uid.entry(uid).or_default();
            step(n);
            if *n == 0 {
                self.per_uid.remove(&uid);
            }
        }
    }

    /// Takes `id` out of the gate (its counts freed), returning its entry.
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        if let Some(seq) = entry.idle_seq {
            self.idle.remove(&seq);
        }
        self.count(entry.peer, false);
        Some(entry)
    }

    fn mark_idle(&mut self, id: u64) {
        let seq = self.next_seq;
        if let Some(entry) = self.conns.get_mut(&id)
            && entry.idle_seq.is_none()
        {
            self.next_seq += 1;
            let key = (entry.served, seq);
            entry.idle_seq = Some(key);
            self.idle.insert(key, id);
        }
    }
}

/// The gate: shared by every door of one daemon.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    /// The most connections the open-file limit leaves room for (see `conn::fd_ceiling`).
    fd_ceiling: usize,
}

impl Gate {
    /// An empty gate that never admits more than `fd_ceiling` connections, whatever `max` says.
    pub fn new(fd_ceiling: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            fd_ceiling: fd_ceiling.max(1),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Connections admitted and not yet closed.
    pub fn open(&self) -> usize {
        self.state().total
    }

    /// Admits a connection of `peer` under `caps`, closing an idle connection (see the module
    /// header for which) when the gate is full and `peer` is the daemon's own user; else says
    /// why not. The connection
    /// starts idle (it has sent no request yet).
    pub fn admit(self: &Arc<Self>, peer: Peer, caps: Caps) -> Result<Admission, Refusal> {
        let max = caps.max.min(self.fd_ceiling);
        let mut state = self.state();
        match peer {
            Peer::Other(uid) => {
                let share = max.saturating_sub(caps.owner_reserve);
                if state.per_uid.get(&uid).copied().unwrap_or(0) >= caps.per_uid {
                    return Err(Refusal::PerUid {
                        per_uid: caps.per_uid,
                    });
                }
                if state.others >= share {
                    return Err(Refusal::OthersShare { share });
                }
                if state.total >= max {
                    return Err(Refusal::Full { max });
                }
            }
            Peer::Owner => {
                while state.total >= max {
                    let Some((_, oldest)) = state.idle.pop_first() else {
                        return Err(Refusal::Full { max });
                    };
                    // Freed now, so the newcomer's slot exists before the closed connection's
                    // task has even woken up.
                    if let Some(evicted) = state.remove(oldest) {
                        evicted.close.cancel();
                    }
                }
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let close = CancellationToken::new();
        state.conns.insert(
            id,
            Entry {
                peer,
                active: 0,
                idle_seq: None,
                served: false,
                close: close.clone(),
            },
        );
        state.count(peer, true);
        state.mark_idle(id);
        Ok(Admission {
            gate: Arc::clone(self),
            id,
            close,
        })
    }
}

/// An admitted connection's slot, given back when dropped.
#[derive(Debug)]
pub struct Admission {
    gate: Arc<Gate>,
    id: u64,
    close: CancellationToken,
}

impl Admission {
    /// A request started on the connection: it is not idle until every request ends. False
    /// when the connection was already closed to make room (the request must not run).
    pub fn request_started(&self) -> bool {
        let mut state = self.gate.state();
        let Some(entry) = state.conns.get_mut(&self.id) else {
            return false;
        };
        entry.active += 1;
        entry.served = true;
        if let Some(seq) = entry.idle_seq.take() {
            state.idle.remove(&seq);
        }
        true
    }

    /// A request ended (its response was written, or it was abandoned).
    pub fn request_finished(&self) {
        let mut state = self.gate.state();
        let Some(entry) = state.conns.get_mut(&self.id) else {
            return;
        };
        entry.active = entry.active.saturating_sub(1);
        if entry.active == 0 {
            state.mark_idle(self.id);
        }
    }

    /// Completes when the gate closed this connection to make room for another.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gate.state().remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: Caps = Caps {
        max: 10,
        per_uid: 3,
        owner_reserve: 4,
    };

    fn admit_n(gate: &Arc<Gate>, peer: Peer, n: usize) -> Vec<Admission> {
        (0..n)
            .map(|i| {
                gate.admit(peer, CAPS)
                    .unwrap_or_else(|r| panic!("admission {i} of {peer:?}: {r:?}"))
            })
            .collect()
    }

    #[test]
    fn another_user_gets_its_share_and_a_clear_refusal_beyond() {
        let gate = Gate::new(1000);
        let held = admit_n(&gate, Peer::Other(Some(65534)), 3);
        let refused = gate.admit(Peer::Other(Some(65534)), CAPS).unwrap_err();
        assert_eq!(refused, Refusal::PerUid { per_uid: 3 });
        assert!(refused.message().contains("connections.perUid"));
        // Another user has its own share.
        let _other = admit_n(&gate, Peer::Other(Some(1000)), 3);
        drop(held);
        assert_eq!(gate.open(), 3, "dropping frees the slots");
        let _again = admit_n(&gate, Peer::Other(Some(65534)), 3);
    }

    #[test]
    fn other_users_together_never_take_the_owners_reserve() {
        let gate = Gate::new(1000);
        let mut held = admit_n(&gate, Peer::Other(Some(1)), 3);
        held.extend(admit_n(&gate, Peer::Other(Some(2)), 3));
        // 6 = max - ownerReserve: a third user is refused although it holds nothing.
        let refused = gate.admit(Peer::Other(Some(3)), CAPS).unwrap_err();
        assert_eq!(refused, Refusal::OthersShare { share: 6 });
        assert!(refused.message().contains("connections.ownerReserve"));
        // The reserve is the owner's, idle others or not: nobody else's is closed for it.
        let owners = admit_n(&gate, Peer::Owner, 4);
        assert!(held.iter().all(|a| !a.close.is_cancelled()));
        drop(owners);
    }

    #[test]
    fn a_full_gate_closes_a_connection_that_never_served_before_one_that_did() {
        let gate = Gate::new(1000);
        let held = admit_n(&gate, Peer::Owner, 10);
        // The first served a request and fell idle before the others, which never sent one.
        assert!(held[0].request_started());
        held[0].request_finished();
        let _newcomers = admit_n(&gate, Peer::Owner, 9);
        assert!(held[1..].iter().all(|a| a.close.is_cancelled()));
        assert!(
            !held[0].close.is_cancelled(),
            "the kept-alive one is closed last"
        );
        let _next = gate.admit(Peer::Owner, CAPS).expect("room is made");
        assert!(
            !held[0].close.is_cancelled(),
            "still: newcomers never served"
        );
    }

    #[test]
    fn a_full_gate_closes_the_longest_idle_connection_for_the_owner() {
        let gate = Gate::new(1000);
        let held = admit_n(&gate, Peer::Owner, 10);
        // The first three are busy; the fourth fell idle first of the rest.
        for a in &held[..3] {
            assert!(a.request_started());
        }
        let newcomer = gate.admit(Peer::Owner, CAPS).expect("room is made");
        assert!(
            held[3].close.is_cancelled(),
            "the oldest idle one is closed"
        );
        assert!(held[..3].iter().all(|a| !a.close.is_cancelled()));
        assert!(
            !held[3].request_started(),
            "a closed connection runs nothing"
        );
        assert_eq!(gate.open(), 10);
        // A connection that finished a request is idle again.
        held[0].request_finished();
        let more = admit_n(&gate, Peer::Owner, 6);
        assert!(held[4..].iter().all(|a| a.close.is_cancelled()));
        assert!(!held[0].close.is_cancelled(), "fell idle last, closed last");
        let _next = gate.admit(Peer::Owner, CAPS).expect("room is made");
        assert!(newcomer.close.is_cancelled(), "idle before held[0] was");
        assert!(!held[0].close.is_cancelled());
        let _last = gate.admit(Peer::Owner, CAPS).expect("room is made");
        assert!(more[0].close.is_cancelled(), "never served: closed first");
        assert!(!held[0].close.is_cancelled());
    }

    #[test]
    fn a_full_gate_with_nothing_idle_refuses_naming_the_cap() {
        let gate = Gate::new(1000);
        let held = admit_n(&gate, Peer::Owner, 10);
        for a in &held {
            assert!(a.request_started());
        }
        let refused = gate.admit(Peer::Owner, CAPS).unwrap_err();
        assert_eq!(refused, Refusal::Full { max: 10 });
        assert!(refused.message().contains("connections.max"));
        // Other users never close anyone's connection.
        held[0].request_finished();
        assert!(gate.admit(Peer::Other(None), CAPS).is_err());
        assert!(!held[0].close.is_cancelled());
    }

    #[test]
    fn a_session_with_a_call_under_way_is_never_closed_and_the_fd_ceiling_bounds_max() {
        let gate = Gate::new(2);
        let a = gate.admit(Peer::Owner, CAPS).expect("admitted");
        assert!(a.request_started());
        let b = gate.admit(Peer::Owner, CAPS).expect("admitted");
        let _c = gate.admit(Peer::Owner, CAPS).expect("b is closed for it");
        assert!(b.close.is_cancelled());
        assert!(!a.close.is_cancelled());
        let _d = gate.admit(Peer::Owner, CAPS).expect("c was idle");
        assert_eq!(gate.open(), 2);
    }
}

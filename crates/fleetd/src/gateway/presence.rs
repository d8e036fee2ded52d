//! Presence (SPEC §12): which members and profiles every gateway has, as soft state. Each
//! gateway broadcasts its inventory on `fleet.presence` every `gateway.presenceIntervalSecs`, at
//! once when it links, shortly after one of its members joins or leaves, and a second after one
//! changes status; each keeps the latest inventory of every other, stamped with when it arrived,
//! and shows a peer silent for three of its intervals as unreachable. Nothing here is durable or decides
//! anything: `fleet_list` and `fleet_profiles` read it to show the fleet across hosts, and a
//! broadcast is taken only from the gateway the broker says sent it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::gateway::{GatewayName, PROTOCOL};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Live;
use crate::engine::EngineHandle;
use crate::store::gateway_link::{Link, PresenceSink};
use crate::sync::lock;

/// A peer silent for this many of its intervals is shown unreachable.
const MISSED_BEATS: u32 = 3;
/// How long after a member joins or leaves the next broadcast goes out (events come in bursts).
const SETTLE: Duration = Duration::from_millis(200);
/// How long after a member's status changes the next broadcast goes out. Busy members change
/// status several times a second, and every broadcast (the whole inventory) goes to every
/// gateway: at [`SETTLE`] a busy gateway broadcast five times a second, which across 10
/// gateways of 50 members was 200 KiB/s into every presence queue (`fleetd-bench scale`).
/// Another gateway sees a status at most this much later.
const STATUS_SETTLE: Duration = Duration::from_secs(1);

/// One gateway's inventory, as broadcast.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    /// The envelope version.
    pub v: u32,
    /// The gateway it describes.
    pub src: String,
    /// Counts up with each broadcast of one daemon run.
    pub seq: u64,
    /// How often it broadcasts, in seconds.
    pub interval_secs: u64,
    /// Its members.
    pub members: Vec<PeerMember>,
    /// Its profiles.
    pub profiles: Vec<PeerProfile>,
}

/// A member as its gateway reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerMember {
    /// Its name there (`alice`; here it is `alice@<gateway>`).
    pub name: String,
    /// Its profile.
    pub profile: String,
    /// `idle`, `working`, `blocked`, `done`, `unknown`.
    pub status: String,
    /// Its pane, as its gateway names it.
    pub pane: String,
    /// Its open tickets, whoever sent them.
    pub open_tickets: usize,
}

/// A profile as its gateway reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerProfile {
    /// Its name there.
    pub name: String,
    /// Its agent kind.
    pub agent: Option<String>,
    /// Whether it can be spawned now.
    pub ready: bool,
}

#[derive(Debug)]
struct Heard {
    inventory: Inventory,
    at: Instant,
}

/// What this gateway last heard from every other. Cheap to clone; empty on a fleet of one host.
#[derive(Debug, Clone, Default)]
pub struct Peers {
    me: Option<GatewayName>,
    heard: Arc<Mutex<BTreeMap<String, Heard>>>,
    /// Woken when a broadcast is taken (the event watcher reads what changed).
    taken: Arc<tokio::sync::Notify>,
}

impl Peers {
    /// The peers of gateway `me`.
    pub fn new(me: GatewayName) -> Self {
        Self {
            me: Some(me),
            heard: Arc::default(),
            taken: Arc::default(),
        }
    }

    /// Takes a broadcast carrying the broker-validated `user_id`; why not, when it is refused.
    pub fn take(&self, user_id: Option<&str>, body: &[u8]) -> Result<(), String> {
        let inventory: Inventory =
            serde_json::from_slice(body).map_err(|e| format!("not a presence broadcast: {e}"))?;
        if inventory.v != PROTOCOL {
            return Err(format!(
                "presence version {} is not {PROTOCOL}",
                inventory.v
            ));
        }
        if user_id != Some(inventory.src.as_str()) {
            return Err(format!(
                "presence of {:?} published by {user_id:?}",
                inventory.src
            ));
        }
        GatewayName::new(inventory.src.clone()).map_err(|e| e.to_string())?;
        if self
            .me
            .as_ref()
            .is_some_and(|me| me.as_str() == inventory.src)
        {
            return Ok(()); // its own broadcast
        }
        lock(&self.heard).insert(
            inventory.src.clone(),
            Heard {
                inventory,
                at: Instant::now(),
            },
        );
        self.taken.notify_one();
        Ok(())
    }

    /// A member gateway `gw` just answered it spawned: shown in `fleet_list` at once (read your
    /// own writes), not only after `gw`'s next broadcast, which then replaces this entry. The
    /// answer came through the broker, so `gw` counts as heard from now.
    pub fn spawned(&self, gw: &str, member: PeerMember, interval_secs: u64) {
        if self.me.as_ref().is_some_and(|me| me.as_str() == gw) {
            return;
        }
        let mut heard = lock(&self.heard);
        let entry = heard.entry(gw.to_owned()).or_insert_with(|| Heard {
            inventory: Inventory {
                v: PROTOCOL,
                src: gw.to_owned(),
                seq: 0,
                interval_secs,
                members: Vec::new(),
                profiles: Vec::new(),
            },
            at: Instant::now(),
        });
        if !entry
            .inventory
            .members
            .iter()
            .any(|m| m.name == member.name)
        {
            entry.inventory.members.push(member);
        }
        drop(heard);
        self.taken.notify_one();
    }

    /// How gateway `gw` was last heard from: `None` when never (since this daemon started),
    /// else whether it is silent past three of its intervals, and how many seconds ago.
    pub fn heard_from(&self, gw: &str) -> Option<(bool, u64)> {
        lock(&self.heard).get(gw).map(staleness)
    }

    /// Every gateway heard from since this daemon started.
    pub fn heard(&self) -> Vec<String> {
        lock(&self.heard).keys().cloned().collect()
    }

    /// The sink the broker link hands presence broadcasts to.
    pub fn sink(&self) -> PresenceSink {
        let peers = self.clone();
        Arc::new(move |user_id, body| {
            if let Err(why) = peers.take(user_id, body) {
                metrics::counter!("fleetd_gateway_refused_total", "reason" => "presence")
                    .increment(1);
                tracing::debug!(reason = %why, "a presence broadcast was refused");
            }
        })
    }

    /// Every other gateway's members as `fleet_list` shows them (`target` is `name@gateway`),
    /// each with `gateway`, `stale` and `seenSecsAgo`; a stale one's status is `unreachable`.
    pub fn members(&self) -> Vec<Value> {
        self.listing(
            |inventory| &inventory.members,
            |&Seen { gw, stale, ago }, m| {
                json!({
                    "target": format!("{}@{gw}", m.name),
                    "gateway": gw,
                    "profile": m.profile,
                    "paneId": format!("{gw}/{}", m.pane),
                    "status": if stale { "unreachable" } else { m.status.as_str() },
                    "remoteOpenTickets": m.open_tickets,
                    "stale": stale,
                    "seenSecsAgo": ago,
                    "depth": 1,
                })
            },
        )
    }

    /// Every other gateway's profiles as `fleet_profiles` shows them (`name` is
    /// `profile@gateway`; a stale gateway's are not ready).
    pub fn profiles(&self) -> Vec<Value> {
        self.listing(
            |inventory| &inventory.profiles,
            |&Seen { gw, stale, ago }, p| {
                json!({
                    "name": format!("{}@{gw}", p.name),
                    "gateway": gw,
                    "agent": p.agent,
                    "ready": p.ready && !stale,
                    "notReadyBecause": if stale {
                        Some(format!("gateway {gw} has not been heard from for {ago} s"))
                    } else if p.ready {
                        None
                    } else {
                        Some(format!("not ready on gateway {gw}"))
                    },
                    "stale": stale,
                    "seenSecsAgo": ago,
                })
            },
        )
    }

    /// `show` of every entry `entries` picks from each other gateway's inventory, told how that
    /// gateway was last heard.
    fn listing<T>(
        &self,
        entries: impl Fn(&Inventory) -> &[T],
        show: impl Fn(&Seen<'_>, &T) -> Value,
    ) -> Vec<Value> {
        let heard = lock(&self.heard);
        let mut out = Vec::new();
        for (gw, h) in heard.iter() {
            let (stale, ago) = staleness(h);
            let seen = Seen { gw, stale, ago };
            out.extend(entries(&h.inventory).iter().map(|e| show(&seen, e)));
        }
        out
    }
}

/// How another gateway was last heard, for what is listed of it.
struct Seen<'a> {
    /// Its name.
    gw: &'a str,
    /// Not heard for several of its broadcast intervals.
    stale: bool,
    /// Seconds since it was last heard.
    ago: u64,
}

/// What the fleet's event stream has been told of one remote member.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Told {
    profile: String,
    pane: String,
    status: String,
}

/// Every remote member as the event stream should know it now.
fn remote_view(peers: &Peers) -> BTreeMap<String, Told> {
    peers
        .members()
        .into_iter()
        .filter_map(|m| {
            Some((
                m["target"].as_str()?.to_owned(),
                Told {
                    profile: m["profile"].as_str().unwrap_or_default().to_owned(),
                    pane: m["paneId"].as_str().unwrap_or_default().to_owned(),
                    status: m["status"].as_str().unwrap_or_default().to_owned(),
                },
            ))
        })
        .collect()
}

/// The events that take the stream from `before` to `now`: a member first heard of joined, a
/// status changed (`unreachable` once its gateway went quiet), a member no longer listed left.
fn remote_events(
    before: &BTreeMap<String, Told>,
    now: &BTreeMap<String, Told>,
) -> Vec<crate::events::FleetEvent> {
    use crate::events::FleetEvent;
    let mut events = Vec::new();
    for (target, told) in now {
        match before.get(target) {
            None => {
                events.push(FleetEvent::MemberSpawned {
                    target: target.clone(),
                    profile: told.profile.clone(),
                    backend: None,
                    pane: told.pane.clone(),
                    lead: None,
                    branch: None,
                });
                events.push(FleetEvent::MemberStatus {
                    target: target.clone(),
                    status: told.status.clone(),
                });
            }
            Some(old) if old.status != told.status => events.push(FleetEvent::MemberStatus {
                target: target.clone(),
                status: told.status.clone(),
            }),
            Some(_) => {}
        }
    }
    for target in before.keys().filter(|t| !now.contains_key(*t)) {
        events.push(FleetEvent::MemberReleased {
            target: target.clone(),
            cause: "gone from its gateway's presence".to_owned(),
        });
    }
    events
}

/// Tells the fleet's event stream (the dashboard, `fleetd watch`) what presence says of other
/// gateways' members as it changes — joined, status, unreachable, gone — until `stop`: read
/// when a broadcast is taken, and every second for a gateway going quiet. Soft state, like
/// presence itself: a restart starts from nothing and tells every remote member again.
pub fn tell_events(peers: Peers, engine: EngineHandle, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut told = BTreeMap::new();
        loop {
            let now = remote_view(&peers);
            for event in remote_events(&told, &now) {
                engine.publish_event(&event);
            }
            told = now;
            tokio::select! {
                () = peers.taken.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = stop.cancelled() => return,
            }
        }
    });
}

/// Whether `h` is stale, and how many seconds ago it arrived.
fn staleness(h: &Heard) -> (bool, u64) {
    let age = h.at.elapsed();
    let beat = Duration::from_secs(h.inventory.interval_secs.max(1));
    (age > beat * MISSED_BEATS, age.as_secs())
}

/// Broadcasts this gateway's inventory until `stop`: every interval, once the link is up, and
/// shortly after a member event.
pub fn broadcast(link: Link, engine: EngineHandle, config: Live, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut events = engine.events().subscribe(None).live;
        let mut seq = 0u64;
        loop {
            link.until_up().await;
            let current = config.current();
            let Some(gw) = current.gateway.as_ref() else {
                return;
            };
            let interval = Duration::from_secs(gw.presence_interval_secs);
            seq += 1;
            if let Ok(inventory) = inventory(&engine, &config, seq).await {
                let body = serde_json::to_vec(&inventory).unwrap_or_default();
                if !link.publish_presence(&body).await {
                    tracing::debug!("presence not broadcast: the link is down");
                }
            }
            let settle = tokio::select! {
                () = tokio::time::sleep(interval) => None,
                settle = next_member_event(&mut events) => Some(settle),
                () = stop.cancelled() => return,
            };
            if let Some(settle) = settle {
                tokio::time::sleep(settle).await;
            }
        }
    });
}

/// Waits for an event that changes what a broadcast says (a member joining, leaving or
/// changing status) and answers how long to let the next ones gather before broadcasting:
/// [`SETTLE`] after a join or a leave, [`STATUS_SETTLE`] after a status change. When the hub is
/// gone it never answers.
async fn next_member_event(
    events: &mut tokio::sync::broadcast::Receiver<Arc<crate::events::Published>>,
) -> Duration {
    loop {
        match events.recv().await {
            // Another gateway's member (told from presence) changes nothing this one says.
            Ok(event) if event.kind.starts_with("member.") && !is_remote(&event) => {
                return if event.kind == "member.status" {
                    STATUS_SETTLE
                } else {
                    SETTLE
                };
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return SETTLE,
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                // Never again: wait out the interval instead.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Whether a member event is about another gateway's member (`name@gateway`).
fn is_remote(event: &crate::events::Published) -> bool {
    serde_json::from_str::<Value>(&event.json)
        .ok()
        .and_then(|v| v["target"].as_str().map(|t| t.contains('@')))
        .unwrap_or(false)
}

/// This gateway's inventory now.
async fn inventory(
    engine: &EngineHandle,
    config: &Live,
    seq: u64,
) -> Result<Inventory, crate::engine::EngineGone> {
    let config = config.current();
    let members = engine.list().await?;
    let Some(gw) = config.gateway.as_ref() else {
        return Err(crate::engine::EngineGone);
    };
    Ok(Inventory {
        v: PROTOCOL,
        src: gw.name.to_string(),
        seq,
        interval_secs: gw.presence_interval_secs,
        members: members
            .into_iter()
            .map(|m| PeerMember {
                name: m.target.to_string(),
                profile: m.profile,
                status: m.status.as_str().to_owned(),
                pane: m.pane_id.to_string(),
                open_tickets: m.open_tickets.len(),
            })
            .collect(),
        profiles: config
            .profiles
            .iter()
            .map(|(name, p)| PeerProfile {
                name: name.clone(),
                agent: serde_json::to_value(&p.agent)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned)),
                ready: crate::members::missing_secret(&config, p).is_none(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(src: &str) -> Vec<u8> {
        serde_json::to_vec(&Inventory {
            v: PROTOCOL,
            src: src.to_owned(),
            seq: 1,
            interval_secs: 10,
            members: vec![PeerMember {
                name: "alice".to_owned(),
                profile: "sim".to_owned(),
                status: "idle".to_owned(),
                pane: "member:w1:p3".to_owned(),
                open_tickets: 2,
            }],
            profiles: vec![PeerProfile {
                name: "sim".to_owned(),
                agent: Some("custom".to_owned()),
                ready: true,
            }],
        })
        .expect("json")
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_is_listed_under_its_own_name_until_it_goes_quiet() {
        let peers = Peers::new(GatewayName::new("a").expect("a"));
        peers.take(Some("b"), &inventory("b")).expect("b's own");
        let members = peers.members();
        assert_eq!(members[0]["target"], "alice@b");
        assert_eq!(members[0]["paneId"], "b/member:w1:p3");
        assert_eq!(members[0]["status"], "idle");
        assert_eq!(peers.profiles()[0]["name"], "sim@b");
        assert_eq!(peers.profiles()[0]["ready"], true);
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(peers.members()[0]["status"], "unreachable");
        assert_eq!(peers.members()[0]["stale"], true);
        assert_eq!(peers.profiles()[0]["ready"], false);
    }

    #[tokio::test(start_paused = true)]
    async fn the_event_stream_is_told_who_joined_changed_went_quiet_and_left() {
        use crate::events::FleetEvent;
        let peers = Peers::new(GatewayName::new("a").expect("a"));
        let empty = BTreeMap::new();
        peers.take(Some("b"), &inventory("b")).expect("b's own");
        let first = remote_view(&peers);
        assert_eq!(
            remote_events(&empty, &first),
            vec![
                FleetEvent::MemberSpawned {
                    target: "alice@b".into(),
                    profile: "sim".into(),
                    backend: None,
                    pane: "b/member:w1:p3".into(),
                    lead: None,
                    branch: None,
                },
                FleetEvent::MemberStatus {
                    target: "alice@b".into(),
                    status: "idle".into(),
                },
            ]
        );
        // The same broadcast again: nothing to tell.
        peers.take(Some("b"), &inventory("b")).expect("again");
        assert!(remote_events(&first, &remote_view(&peers)).is_empty());
        // b goes quiet: alice is unreachable.
        tokio::time::advance(Duration::from_secs(31)).await;
        let quiet = remote_view(&peers);
        assert_eq!(
            remote_events(&first, &quiet),
            vec![FleetEvent::MemberStatus {
                target: "alice@b".into(),
                status: "unreachable".into(),
            }]
        );
        // b is heard again without alice: she left.
        let mut without = serde_json::from_slice::<Inventory>(&inventory("b")).expect("json");
        without.members.clear();
        peers
            .take(Some("b"), &serde_json::to_vec(&without).expect("json"))
            .expect("b without alice");
        assert_eq!(
            remote_events(&quiet, &remote_view(&peers)),
            vec![FleetEvent::MemberReleased {
                target: "alice@b".into(),
                cause: "gone from its gateway's presence".into(),
            }]
        );
    }

    #[test]
    fn a_broadcast_is_taken_only_from_the_gateway_it_describes() {
        let peers = Peers::new(GatewayName::new("a").expect("a"));
        assert!(
            peers.take(Some("c"), &inventory("b")).is_err(),
            "c claiming b"
        );
        assert!(peers.take(None, &inventory("b")).is_err(), "no user_id");
        assert!(peers.take(Some("b"), b"{not json").is_err());
        peers
            .take(Some("a"), &inventory("a"))
            .expect("its own, ignored");
        assert!(peers.members().is_empty());
    }
}

//! Driver tests of the engine on paused tokio time against the in-process fake multiplexer and
//! the memory store: the push loop's spacing and give-up as the real task schedules them, the
//! status gate, liveness self-heal of bindings, and the lead-tab scanner.

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::{AgentStatus, Message, MessageKind, MessageLimits, MsgId, Target};
use jiff::Timestamp;
use tokio::time::{Instant, sleep};

use super::{EngineHandle, EngineParts, LeadRef, NewMember, Readiness, spawn};
use crate::clock::TokioClock;
use crate::config::{Config, Environment};
use crate::mux::MuxRouter;
use crate::mux::fake::{FakeMux, Fault, Typed};
use crate::store::{InboxStore, MemoryStore};

struct Rig {
    engine: EngineHandle,
    store: Arc<MemoryStore>,
    fake: FakeMux,
    router: MuxRouter,
}

/// Primary tab `w1:t1`; three reminders spaced 1 s, 2 s (cap 3 s).
const CONFIG: &str =
    "primary:\n  tab: w1:t1\n  pushReminders: 3\n  pushBackoffMs: 1000\n  pushBackoffMaxMs: 3000\n";

fn rig(fake: &FakeMux) -> Rig {
    let config = Config::parse(CONFIG, "test", &Environment::default()).expect("config");
    let store = Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: 1 << 20,
    }));
    let router = MuxRouter::new(Arc::new(fake.clone()), None);
    let engine = spawn(EngineParts {
        members_file: None,
        config: crate::config::Live::fixed(config),
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: router.clone(),
        redactor: crate::secrets::Redactor::empty(),
    });
    Rig {
        engine,
        store,
        fake: fake.clone(),
        router,
    }
}

impl Rig {
    async fn mail(&self, target: &str) -> MsgId {
        let target = Target::new(target).expect("target");
        let message = Message {
            msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
            target: target.clone(),
            ticket: None,
            kind: MessageKind::Reply,
            text: "the secret payload".to_owned(),
            from: target.to_string(),
            created_at: Timestamp::UNIX_EPOCH,
        };
        let id = message.msg_id;
        self.store.publish(message).await.expect("publish");
        self.engine.inbox_changed(target).await.expect("engine");
        id
    }

    async fn ack(&self, target: &str, id: MsgId) {
        let target = Target::new(target).expect("target");
        assert!(self.store.ack(&target, id).await.expect("ack"));
        self.engine.inbox_changed(target).await.expect("engine");
        sleep(Duration::from_millis(10)).await; // the depth re-read lands
    }

    fn nudges_into(&self, pane: &str) -> Vec<Typed> {
        self.fake
            .typed()
            .into_iter()
            .filter(|t| t.pane.as_str() == pane)
            .collect()
    }

    async fn lead(&self, pane: &str, terminal: &str) -> LeadRef {
        let lead = LeadRef {
            pane: self.router.resolve(pane).await.expect("pane"),
            terminal: fleetd_core::TerminalId::new(terminal).expect("terminal"),
        };
        self.engine.lead_seen(lead.clone()).await.expect("engine");
        lead
    }
}

fn spacing(typed: &[Typed]) -> Vec<u64> {
    typed
        .windows(2)
        .map(|w| {
            let gap = w[1].at - w[0].at;
            u64::try_from(gap.as_millis()).unwrap_or(u64::MAX)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn reminders_back_off_then_give_up_and_the_mail_stays() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await; // the first scan resolves the pinned primary
    rig.mail("alice").await;
    sleep(Duration::from_secs(120)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 3, "the budget is three: {nudges:?}");
    // 1 s, then 2 s (doubling; the 3 s cap is not reached).
    assert_eq!(spacing(&nudges), [1000, 2000]);
    assert!(nudges.iter().all(|n| !n.text.contains("payload")));
    assert!(nudges[0].text.contains("1 message from alice"));
    let alice = Target::new("alice").expect("target");
    assert_eq!(
        rig.store.depth(&alice).await.expect("depth"),
        1,
        "given up, kept"
    );
    // New mail after giving up starts a new batch.
    rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.nudges_into("w1:p1").len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_working_lead_is_nudged_the_moment_it_goes_idle_and_reading_stops_it() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Working);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await;
    let id = rig.mail("alice").await;
    sleep(Duration::from_secs(600)).await;
    assert!(rig.nudges_into("w1:p1").is_empty(), "never while working");
    let idle_at = Instant::now();
    fake.set_status("w1:p1", AgentStatus::Idle);
    sleep(Duration::from_millis(50)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 1);
    assert!(
        nudges[0].at - idle_at < Duration::from_millis(5),
        "event-driven, not the next tick: {:?}",
        nudges[0].at - idle_at
    );
    // Busy again, then the mail is read: nothing more, even when idle later.
    fake.set_status("w1:p1", AgentStatus::Working);
    rig.ack("alice", id).await;
    fake.set_status("w1:p1", AgentStatus::Idle);
    sleep(Duration::from_secs(600)).await;
    assert_eq!(rig.nudges_into("w1:p1").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_blip_keeps_the_delegating_lead_and_a_closed_one_falls_back_to_the_primary() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-primary", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w1:p5", "t-delegator", "w1:t9", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-alice", "w2:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await;
    let delegator = rig.lead("w1:p5", "t-delegator").await;
    rig.engine
        .add_member(NewMember {
            lead: Some(delegator),
            ..member("alice", "w2:p1", "t-alice", None)
        })
        .await
        .expect("engine");
    // The delegating lead's pane cannot be read for a while: the binding holds.
    fake.fault("w1:p5", Some(Fault::Transient));
    let id = rig.mail("alice").await;
    sleep(Duration::from_secs(10)).await;
    assert!(rig.nudges_into("w1:p5").is_empty());
    assert!(
        rig.nudges_into("w1:p1").is_empty(),
        "a blip never moves mail to the primary"
    );
    fake.fault("w1:p5", None);
    sleep(Duration::from_secs(2)).await;
    let answered = rig.nudges_into("w1:p5").len();
    assert!(answered >= 1, "retried once it answers");
    rig.ack("alice", id).await;
    // The delegating lead's pane closes: its binding is forgotten, the primary gets the mail.
    fake.close("w1:p5");
    sleep(Duration::from_millis(10)).await;
    rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.nudges_into("w1:p1").len(), 1);
    assert_eq!(rig.nudges_into("w1:p5").len(), answered);
}

#[tokio::test(start_paused = true)]
async fn failed_scans_keep_the_primary_and_a_vanished_one_is_replaced() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-first", "w1:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await;
    fake.listing_fails(true);
    sleep(Duration::from_secs(10)).await; // several failed readings
    let id = rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.nudges_into("w1:p1").len(), 1, "the primary was kept");
    rig.ack("alice", id).await;
    // The primary's pane disappears without an event; a new agent opens in the tab.
    fake.listing_fails(false);
    fake.vanish("w1:p1");
    fake.add_pane("w1:p2", "t-second", "w1:t1", AgentStatus::Idle);
    sleep(Duration::from_secs(3)).await; // one TTL
    rig.mail("bob").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.nudges_into("w1:p2").len(), 1, "the tab's new lead");
    assert_eq!(rig.nudges_into("w1:p1").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_no_lead_the_mail_waits_for_a_poll() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-x", "w2:t1", AgentStatus::Idle); // not a lead tab
    let rig = rig(&fake);
    rig.mail("alice").await;
    sleep(Duration::from_secs(60)).await;
    assert!(fake.typed().is_empty());
    let alice = Target::new("alice").expect("target");
    assert_eq!(rig.store.depth(&alice).await.expect("depth"), 1);
}

#[tokio::test(start_paused = true)]
async fn mail_from_before_a_restart_is_nudged_once_the_lead_is_known() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    let store = Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: 1 << 20,
    }));
    // The mail is in the store before the engine starts (a daemon restarted).
    let target = Target::new("alice").expect("target");
    store
        .publish(Message {
            msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
            target: target.clone(),
            ticket: None,
            kind: MessageKind::Reply,
            text: "done".to_owned(),
            from: "alice".to_owned(),
            created_at: Timestamp::UNIX_EPOCH,
        })
        .await
        .expect("publish");
    let config = Config::parse(CONFIG, "test", &Environment::default()).expect("config");
    let _engine = spawn(EngineParts {
        members_file: None,
        config: crate::config::Live::fixed(config),
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
    });
    sleep(Duration::from_millis(100)).await;
    let nudges: Vec<Typed> = fake.typed();
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(nudges[0].text.contains("1 message from alice"));
}

fn qualified(pane: &str) -> fleetd_core::QualifiedPaneId {
    fleetd_core::QualifiedPaneId::new(
        fleetd_core::MuxDaemon::Lead,
        fleetd_core::PaneId::new(pane).expect("pane"),
    )
}

fn member(name: &str, pane: &str, terminal: &str, idle_secs: Option<u64>) -> NewMember {
    NewMember {
        target: Target::new(name).expect("target"),
        profile: "p".to_owned(),
        agent: "claude".to_owned(),
        pane: qualified(pane),
        terminal: fleetd_core::TerminalId::new(terminal).expect("terminal"),
        allow_delegation: false,
        idle_timeout_secs: idle_secs,
        backend: None,
        lead: None,
    }
}

async fn listed(rig: &Rig, name: &str) -> bool {
    rig.engine
        .list()
        .await
        .expect("engine")
        .iter()
        .any(|m| m.target.as_str() == name)
}

#[tokio::test(start_paused = true)]
async fn the_idle_reaper_releases_exactly_after_the_timeout_and_never_while_working() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-idle", "w2:t1", AgentStatus::Idle);
    fake.add_pane("w2:p2", "t-busy", "w2:t2", AgentStatus::Working);
    let rig = rig(&fake);
    for new in [
        member("idler", "w2:p1", "t-idle", Some(60)),
        member("worker", "w2:p2", "t-busy", Some(60)),
    ] {
        rig.engine.add_member(new).await.expect("engine");
    }
    sleep(Duration::from_millis(59_900)).await;
    assert!(listed(&rig, "idler").await, "not before idleTimeoutSecs");
    sleep(Duration::from_millis(200)).await;
    assert!(!listed(&rig, "idler").await, "released at idleTimeoutSecs");
    let closed = rig.router.pane(&qualified("w2:p1")).await;
    assert!(
        closed.is_err_and(|e| e.is_not_found()),
        "the idle member's pane was closed"
    );
    // The working member is never reaped while it works, however long.
    sleep(Duration::from_secs(600)).await;
    assert!(listed(&rig, "worker").await, "never while working");
    // Once at rest, its own idle clock starts.
    fake.set_status("w2:p2", AgentStatus::Done);
    sleep(Duration::from_secs(59)).await;
    assert!(listed(&rig, "worker").await);
    sleep(Duration::from_secs(2)).await;
    assert!(!listed(&rig, "worker").await);
}

async fn inbox(rig: &Rig, target: &str) -> Vec<Message> {
    rig.store
        .peek(&Target::new(target).expect("target"), 100)
        .await
        .expect("peek")
}

#[tokio::test(start_paused = true)]
async fn a_backend_going_down_and_up_is_one_incident_each_for_its_members_only() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    fake.add_pane("w2:p2", "t-b", "w2:t2", AgentStatus::Idle);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await;
    rig.engine
        .add_member(NewMember {
            backend: Some("lab".to_owned()),
            ..member("alice", "w2:p1", "t-a", None)
        })
        .await
        .expect("engine");
    rig.engine
        .add_member(member("bob", "w2:p2", "t-b", None))
        .await
        .expect("engine");
    for _ in 0..3 {
        rig.engine
            .backend_health("lab".to_owned(), Some("HTTP 503".to_owned()))
            .await
            .expect("engine");
        sleep(Duration::from_millis(100)).await; // repeated readings, within one backoff step
    }
    let alice = inbox(&rig, "alice").await;
    assert_eq!(alice.len(), 1, "one incident per transition: {alice:?}");
    assert_eq!(alice[0].kind, MessageKind::Incident);
    assert!(alice[0].text.contains("backend lab is down (HTTP 503)"));
    assert!(inbox(&rig, "bob").await.is_empty(), "bob is not on lab");
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 1, "the lead is nudged once");
    assert!(nudges[0].text.contains("1 message from alice"));
    rig.engine
        .backend_health("lab".to_owned(), None)
        .await
        .expect("engine");
    rig.engine
        .backend_health("lab".to_owned(), None)
        .await
        .expect("engine");
    sleep(Duration::from_millis(10)).await;
    let alice = inbox(&rig, "alice").await;
    assert_eq!(alice.len(), 2);
    assert!(alice[1].text.contains("backend lab is up again"));
}

#[tokio::test(start_paused = true)]
async fn a_reload_that_removes_a_members_backend_raises_one_unmapped_incident() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    let with_lab = format!("{CONFIG}backends:\n  lab:\n    baseUrl: http://127.0.0.1:9\n");
    let env = Environment::default();
    let (publisher, live) =
        crate::config::channel(Config::parse(&with_lab, "test", &env).expect("config"));
    let store = Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: 1 << 20,
    }));
    let engine = spawn(EngineParts {
        members_file: None,
        config: live,
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
    });
    engine
        .add_member(NewMember {
            backend: Some("lab".to_owned()),
            ..member("alice", "w2:p1", "t-a", None)
        })
        .await
        .expect("engine");
    let alice = Target::new("alice").expect("target");
    // A reload that keeps the backend changes nothing.
    publisher.publish(Config::parse(&with_lab, "test", &env).expect("config"));
    sleep(Duration::from_millis(10)).await;
    assert!(store.peek(&alice, 10).await.expect("peek").is_empty());
    for _ in 0..2 {
        publisher.publish(Config::parse(CONFIG, "test", &env).expect("config"));
        sleep(Duration::from_millis(10)).await;
    }
    let messages = store.peek(&alice, 10).await.expect("peek");
    assert_eq!(messages.len(), 1, "once per member: {messages:?}");
    assert!(messages[0].text.contains("backend lab was removed"));
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_members_and_stores_their_failed_tickets_first() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Working);
    let rig = rig(&fake);
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    let ticket = rig
        .engine
        .submit(
            None,
            Target::new("alice").expect("target"),
            "job".to_owned(),
        )
        .await
        .expect("engine")
        .expect("queued");
    rig.engine.shutdown().await.expect("engine");
    let notices = inbox(&rig, "alice").await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].ticket, Some(ticket));
    assert!(notices[0].text.contains("released (shutdown)"));
    assert!(rig.engine.list().await.is_err(), "the engine stopped");
    assert!(
        rig.router.pane(&qualified("w2:p1")).await.is_ok(),
        "a member's pane keeps running across a daemon restart"
    );
}

#[tokio::test(start_paused = true)]
async fn a_restarted_engine_re_adopts_members_still_in_their_panes() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    fake.add_pane("w2:p2", "t-b", "w2:t2", AgentStatus::Idle);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("members.json");
    let start = |fake: &FakeMux| {
        spawn(EngineParts {
            members_file: Some(file.clone()),
            config: crate::config::Live::fixed(
                Config::parse(CONFIG, "test", &Environment::default()).expect("config"),
            ),
            clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
            store: Arc::new(MemoryStore::new(MessageLimits {
                max_message_bytes: 1 << 20,
            })),
            mux: MuxRouter::new(Arc::new(fake.clone()), None),
            redactor: crate::secrets::Redactor::empty(),
        })
    };
    let first = start(&fake);
    for new in [
        member("ann", "w2:p1", "t-a", None),
        member("bo", "w2:p2", "t-b", None),
    ] {
        first.add_member(new).await.expect("engine");
    }
    // The registry reaches the disk (a blocking write on its own thread).
    for _ in 0..100 {
        if super::registry::load(&file).len() == 2 {
            break;
        }
        tokio::task::yield_now().await;
        std::thread::yield_now();
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(super::registry::load(&file).len(), 2);
    drop(first); // as after a kill -9: no release ran
    // While fleetd was down, bo's pane got a new occupant.
    fake.vanish("w2:p2");
    fake.add_pane("w2:p2", "t-other", "w2:t2", AgentStatus::Idle);
    let second = start(&fake);
    let mut names = Vec::new();
    for _ in 0..100 {
        names = second
            .list()
            .await
            .expect("engine")
            .iter()
            .map(|m| m.target.to_string())
            .collect::<Vec<_>>();
        if !names.is_empty() {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        names,
        ["ann"],
        "ann re-adopted, bo's pane holds someone else"
    );
    let ann = second.list().await.expect("engine");
    assert!(ann[0].connected, "a re-adopted member counts as present");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_engine_is_seen_dead_and_healthz_says_degraded() {
    let fake = FakeMux::new();
    let rig = rig(&fake);
    let probe = crate::health::Probe {
        store: Arc::clone(&rig.store) as Arc<dyn InboxStore>,
        mux: rig.router.clone(),
        endpoints: Vec::new(),
        engine: rig.engine.clone(),
    };
    assert!(rig.engine.is_alive());
    assert!(probe.report().await.engine.alive);
    rig.engine.inject_panic().await.expect("sent");
    tokio::time::timeout(Duration::from_secs(5), rig.engine.stopped())
        .await
        .expect("the supervisor saw it stop");
    assert!(!rig.engine.is_alive());
    let report = probe.report().await;
    assert!(!report.engine.alive);
    assert_eq!(report.status, crate::health::HealthStatus::Degraded);
    // Callers get a clear error, not a hang.
    assert!(rig.engine.list().await.is_err());
}

#[tokio::test(start_paused = true)]
async fn the_engine_ends_when_every_handle_is_dropped() {
    let fake = FakeMux::new();
    let rig = rig(&fake);
    let weak = rig.engine.downgrade();
    let watcher = rig.engine.downgrade().upgrade().expect("alive");
    let stopped = {
        let watcher = watcher.downgrade();
        async move {
            // A weak handle's view: it cannot keep the engine alive.
            while weak.upgrade().is_some() {
                sleep(Duration::from_millis(10)).await;
            }
            drop(watcher);
        }
    };
    drop(watcher);
    drop(rig);
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the engine ended once no strong handle was left");
}

#[tokio::test(start_paused = true)]
async fn a_name_reservation_that_outlives_its_spawn_expires() {
    let fake = FakeMux::new();
    let rig = rig(&fake);
    let reserve = || rig.engine.reserve(Some("ann".to_owned()));
    reserve().await.expect("engine").expect("free");
    sleep(Duration::from_secs(119)).await;
    let taken = reserve()
        .await
        .expect("engine")
        .expect_err("still reserved");
    assert_eq!(taken.code, "name_taken");
    // Past the ready timeout plus a margin: no saga can still be using it.
    sleep(Duration::from_secs(2)).await;
    reserve()
        .await
        .expect("engine")
        .expect("expired, free again");
}

#[tokio::test(start_paused = true)]
async fn readiness_fires_on_the_status_and_presence_that_complete_it_never_on_a_poll() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-ann", "w2:t1", AgentStatus::Unknown);
    fake.add_pane("w2:p2", "t-bo", "w2:t2", AgentStatus::Working);
    fake.add_pane("w2:p3", "t-cy", "w2:t3", AgentStatus::Unknown);
    let rig = rig(&fake);
    let when_ready = |name: &str| rig.engine.when_ready(Target::new(name).expect("target"));
    assert_eq!(
        when_ready("ann").await.expect("engine").await,
        Ok(Readiness::Gone),
        "no such member: gone at once"
    );
    for (name, pane, terminal) in [
        ("ann", "w2:p1", "t-ann"),
        ("bo", "w2:p2", "t-bo"),
        ("cy", "w2:p3", "t-cy"),
    ] {
        rig.engine
            .add_member(member(name, pane, terminal, None))
            .await
            .expect("engine");
    }
    // ann: at rest first, its MCP session last.
    let mut ann = when_ready("ann").await.expect("engine");
    sleep(Duration::from_secs(60)).await;
    assert!(ann.try_recv().is_err(), "no status, no presence: not ready");
    fake.set_status("w2:p1", AgentStatus::Idle);
    sleep(Duration::from_secs(60)).await;
    assert!(
        ann.try_recv().is_err(),
        "at rest, never connected: not ready"
    );
    let at = Instant::now();
    rig.engine
        .presence(Target::new("ann").expect("target"))
        .await
        .expect("engine");
    assert_eq!(ann.await, Ok(Readiness::Ready));
    assert_eq!(at.elapsed(), Duration::ZERO, "fired by the presence itself");
    assert_eq!(
        when_ready("ann").await.expect("engine").await,
        Ok(Readiness::Ready),
        "ready already: at once"
    );
    // bo: connected while working; ready the moment its turn ends.
    let bo = when_ready("bo").await.expect("engine");
    rig.engine
        .presence(Target::new("bo").expect("target"))
        .await
        .expect("engine");
    sleep(Duration::from_secs(60)).await;
    let at = Instant::now();
    fake.set_status("w2:p2", AgentStatus::Done);
    assert_eq!(bo.await, Ok(Readiness::Ready));
    assert_eq!(
        at.elapsed(),
        Duration::ZERO,
        "fired by the status event itself"
    );
    // cy: its pane closes first.
    let cy = when_ready("cy").await.expect("engine");
    fake.close("w2:p3");
    assert_eq!(cy.await, Ok(Readiness::Gone));
}

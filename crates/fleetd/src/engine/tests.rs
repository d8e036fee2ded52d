//! Driver tests of the engine on paused tokio time against the in-process fake multiplexer and
//! the memory store: the push loop's spacing and give-up as the real task schedules them, the
//! status gate, liveness self-heal of bindings, the lead-tab scanner, and delivery when a typing
//! may have typed (never typed twice).

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::{
    AgentStatus, Message, MessageKind, MessageLimits, MsgId, Target, Ticket, TicketState,
};
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
        durable: None,
        config: crate::config::Live::fixed(config),
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: router.clone(),
        redactor: crate::secrets::Redactor::empty(),
        gateway: None,
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
            msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
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
    let mut events = rig.engine.events().subscribe(None).live;
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
    // The nudge's event says how long after the mail landed it went: the ten busy minutes.
    let mut after_ms = None;
    while let Ok(published) = events.try_recv() {
        let event: serde_json::Value = serde_json::from_str(&published.json).expect("json");
        if event["type"] == "nudge" && event["outcome"] == "nudged" {
            after_ms = event["after_ms"].as_u64();
        }
    }
    let after_ms = after_ms.expect("a nudged event with after_ms");
    assert!(
        (599_000..=601_000).contains(&after_ms),
        "mail → nudge: {after_ms} ms"
    );
    assert_eq!(rig.engine.latency().nudge.len(), 1);
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
            msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
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
        durable: None,
        config: crate::config::Live::fixed(config),
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
        gateway: None,
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
        worktree: None,
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

/// Adds member `alice` in pane `w2:p1` (incarnation `t-a`), marks it present, and sends it
/// the task `job`; returns the ticket.
async fn alice_with_a_task(rig: &Rig) -> Ticket {
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    let alice = Target::new("alice").expect("target");
    rig.engine.presence(alice.clone()).await.expect("engine");
    rig.engine
        .submit(None, alice, "job".to_owned())
        .await
        .expect("engine")
        .expect("queued")
}

async fn state_of(rig: &Rig, ticket: Ticket) -> TicketState {
    match rig.engine.ticket(ticket).await.expect("engine") {
        super::TicketAnswer::Live(view) => view.state,
        other => panic!("ticket {ticket} is not live: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_task_that_may_have_been_typed_is_verified_and_never_typed_again() {
    // Every typing into alice's pane goes in and then loses its answer.
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    fake.fault("w2:p1", Some(Fault::LostAnswer));
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    let settled = rig.engine.wait(ticket).await.expect("engine");
    sleep(Duration::from_secs(30)).await;
    assert_eq!(rig.nudges_into("w2:p1").len(), 1, "typed once");
    assert_eq!(fake.enters("w2:p1"), 1, "then one Enter retry");
    let settled = settled.await.expect("settled");
    assert_eq!(settled.state, TicketState::Stalled);
}

#[tokio::test(start_paused = true)]
async fn a_task_that_may_have_been_typed_and_started_is_working() {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    fake.fault("w2:p1", Some(Fault::LostAnswer));
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    sleep(Duration::from_millis(1500)).await;
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_secs(30)).await;
    assert_eq!(state_of(&rig, ticket).await, TicketState::Working);
    assert_eq!(rig.nudges_into("w2:p1").len(), 1, "typed once");
    assert_eq!(fake.enters("w2:p1"), 0, "its turn started: no retry");
}

#[tokio::test(start_paused = true)]
async fn a_submit_the_multiplexer_saw_start_is_the_turn_and_gets_no_enter_retry() {
    // herdr's agent.prompt saw alice reach working; its status event has not come (yet).
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    fake.reports_start("w2:p1");
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(state_of(&rig, ticket).await, TicketState::Working);
    assert_eq!(
        fake.enters("w2:p1"),
        0,
        "a started turn needs no Enter retry"
    );
    assert_eq!(rig.nudges_into("w2:p1").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn nudges_that_may_have_been_typed_spend_the_budget() {
    // Every nudge goes in and then loses its answer: each one counts, three in all.
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.fault("w1:p1", Some(Fault::LostAnswer));
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await;
    rig.mail("alice").await;
    sleep(Duration::from_secs(120)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 3, "the budget is three: {nudges:?}");
    assert_eq!(spacing(&nudges), [1000, 2000], "each waits its backoff");
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
        durable: None,
        config: live,
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
        gateway: None,
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
async fn a_panicking_engine_is_seen_dead_and_healthz_says_degraded() {
    let fake = FakeMux::new();
    let rig = rig(&fake);
    let probe = crate::health::Probe {
        store: Arc::clone(&rig.store) as Arc<dyn InboxStore>,
        mux: rig.router.clone(),
        endpoints: Vec::new(),
        engine: rig.engine.clone(),
        gateway: None,
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
async fn a_reply_returned_by_a_waiter_is_kept_until_its_caller_calls_again_and_a_lost_one_is_nudged()
 {
    // Review M3: the waiter acknowledged the reply before its answer was written, and a waiter
    // cancelled after being handed the reply left it un-nudged forever.
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Working);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await; // the pinned primary is resolved
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    let alice = Target::new("alice").expect("target");
    let mut handed = Vec::new();
    for round in 0..2 {
        let ticket = rig
            .engine
            .submit(None, alice.clone(), format!("job {round}"))
            .await
            .expect("engine")
            .expect("queued");
        let waiter = rig.engine.wait(ticket).await.expect("engine");
        let reply = Message {
            msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
            target: alice.clone(),
            ticket: Some(ticket),
            kind: MessageKind::Reply,
            text: format!("done {round}"),
            from: "alice".to_owned(),
            created_at: Timestamp::UNIX_EPOCH,
        };
        rig.store.publish(reply.clone()).await.expect("publish");
        let delivered = rig.engine.reply_stored(reply).await.expect("engine");
        assert_eq!(delivered, super::Delivered::Waiter);
        assert!(waiter.await.is_ok(), "the waiter got it");
        handed.push(ticket);
    }
    // The first waiter returned its reply to the lead; the second failed before it could.
    rig.engine
        .handed_to(handed[0], "lead:w1:p1".to_owned())
        .await
        .expect("engine");
    sleep(Duration::from_secs(60)).await;
    assert!(
        rig.nudges_into("w1:p1").is_empty(),
        "replies in a waiter's hands are not nudged about"
    );
    assert_eq!(
        rig.store.depth(&alice).await.expect("depth"),
        2,
        "nor acknowledged"
    );
    rig.engine.unhand_now(handed[1]);
    sleep(Duration::from_millis(100)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 1, "the lost one is mail again: {nudges:?}");
    assert!(
        nudges[0].text.contains("1 message from alice"),
        "{nudges:?}"
    );
    // The lead's next call takes what its waiter returned: exactly the first one.
    let taken = rig
        .engine
        .take_handed("lead:w1:p1".to_owned())
        .await
        .expect("engine");
    assert_eq!(taken.len(), 1);
    assert!(
        rig.engine
            .take_handed("lead:w1:p1".to_owned())
            .await
            .expect("engine")
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn missed_pane_events_make_the_engine_read_every_pane_again() {
    // Review M5: a lagged event stream was only logged, so a Gone lost in the burst left its
    // member listed forever.
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await; // the pinned lead is resolved and watched
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    sleep(Duration::from_millis(100)).await;
    assert!(listed(&rig, "alice").await);
    // alice's pane goes without a word, and a burst of events (more than any receiver holds)
    // arrives before anyone can read them.
    fake.vanish("w2:p1");
    for i in 0..(crate::mux::PANE_EVENT_CAPACITY + 100) {
        let status = if i % 2 == 0 {
            AgentStatus::Working
        } else {
            AgentStatus::Idle
        };
        fake.set_status("w1:p1", status);
    }
    sleep(Duration::from_millis(100)).await;
    assert!(
        !listed(&rig, "alice").await,
        "the re-read found alice's pane gone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_moves_the_primary_tab_and_the_push_budget_at_once() {
    // Issue 14 item 6: primary, leads, tickets and delivery took effect only at the next start.
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-one", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w3:p1", "t-three", "w3:t1", AgentStatus::Idle);
    let env = Environment::default();
    let (publisher, live) =
        crate::config::channel(Config::parse(CONFIG, "test", &env).expect("config"));
    let store = Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: 1 << 20,
    }));
    let engine = spawn(EngineParts {
        durable: None,
        config: live,
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(&store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
        gateway: None,
    });
    sleep(Duration::from_millis(100)).await; // w1:t1's lead is the primary
    let moved = "primary:\n  tab: w3:t1\n  pushReminders: 1\n  pushBackoffMs: 1000\n";
    publisher.publish(Config::parse(moved, "test", &env).expect("config"));
    sleep(Duration::from_millis(100)).await;
    let alice = Target::new("alice").expect("target");
    store
        .publish(Message {
            msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
            target: alice.clone(),
            ticket: None,
            kind: MessageKind::Reply,
            text: "mail".to_owned(),
            from: "alice".to_owned(),
            created_at: Timestamp::UNIX_EPOCH,
        })
        .await
        .expect("publish");
    engine.inbox_changed(alice).await.expect("engine");
    sleep(Duration::from_secs(30)).await;
    let into = |pane: &str| {
        fake.typed()
            .into_iter()
            .filter(|t| t.pane.as_str() == pane)
            .count()
    };
    assert_eq!(into("w1:p1"), 0, "the old primary tab hears nothing");
    assert_eq!(
        into("w3:p1"),
        1,
        "the new one, once: the reloaded budget is one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_name_reservation_that_outlives_its_spawn_expires() {
    let fake = FakeMux::new();
    let rig = rig(&fake);
    let reserve = || {
        rig.engine
            .reserve(Some("ann".to_owned()), crate::engine::Delegator::Operator)
    };
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

#[tokio::test(start_paused = true)]
async fn each_input_is_handled_at_the_time_it_arrives() {
    // Review M1: the loop read the time before it waited for an input, so a command that came
    // after a quiet spell was handled up to an idle tick in the past (its ticket opened then,
    // its deadlines counted from then).
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Working);
    let rig = rig(&fake);
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    sleep(Duration::from_millis(4500)).await;
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
    let super::TicketAnswer::Live(view) = rig.engine.ticket(ticket).await.expect("engine") else {
        panic!("ticket {ticket} is live");
    };
    let opened = view.created_at.duration_since(Timestamp::UNIX_EPOCH);
    assert!(
        opened >= jiff::SignedDuration::from_millis(4500),
        "opened when it was sent (4.5 s), not when the loop last woke: {opened:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_turn_whose_fallback_cannot_be_stored_still_ends_its_ticket() {
    // Review M7: a failed fallback publish only cleared the recording flag, so the ticket stayed
    // working forever and a waiting fleet_send hung to its timeout.
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    let settled = rig.engine.wait(ticket).await.expect("engine");
    sleep(Duration::from_millis(500)).await;
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(state_of(&rig, ticket).await, TicketState::Working);
    rig.store.set_writes_fail(true);
    fake.set_status("w2:p1", AgentStatus::Idle);
    let settled = tokio::time::timeout(Duration::from_secs(30), settled)
        .await
        .expect("the ticket ends without waiting for a timeout")
        .expect("settled");
    assert_eq!(settled.state, TicketState::EndedWithoutReply);
    assert!(
        inbox(&rig, "alice").await.is_empty(),
        "the store took nothing"
    );
    // The member takes its next task.
    rig.store.set_writes_fail(false);
    let next = rig
        .engine
        .submit(
            None,
            Target::new("alice").expect("target"),
            "next".to_owned(),
        )
        .await
        .expect("engine")
        .expect("queued");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(state_of(&rig, next).await, TicketState::Delivered);
}

#[tokio::test(start_paused = true)]
async fn a_status_blip_before_the_task_was_submitted_records_no_fallback() {
    // Issue 40 #2: Codex's spinner at the end of its start-up read busy after the task was
    // typed, then at rest, while the text still sat unsent in its composer; the ticket ended
    // without a reply and the task was lost.
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Idle);
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    sleep(Duration::from_millis(500)).await;
    let enters = fake.enters("w2:p1");
    fake.set_input("w2:p1", Some("› job"));
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_millis(200)).await;
    fake.set_status("w2:p1", AgentStatus::Idle);
    sleep(Duration::from_millis(500)).await;
    assert!(inbox(&rig, "alice").await.is_empty(), "no fallback stored");
    assert_ne!(state_of(&rig, ticket).await, TicketState::EndedWithoutReply);
    assert_eq!(fake.enters("w2:p1"), enters + 1, "Enter pressed once more");
    // That Enter submits it: the composer empties and the task's own turn runs and ends.
    let settled = rig.engine.wait(ticket).await.expect("engine");
    fake.set_input("w2:p1", Some("› "));
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_millis(500)).await;
    fake.set_status("w2:p1", AgentStatus::Idle);
    let settled = tokio::time::timeout(Duration::from_secs(30), settled)
        .await
        .expect("the turn ends")
        .expect("settled");
    assert_eq!(settled.state, TicketState::EndedWithoutReply);
    assert_eq!(
        inbox(&rig, "alice").await.len(),
        1,
        "its own turn's fallback"
    );
}

/// alice's reply to `ticket`, stored and told to the engine.
async fn reply_to(rig: &Rig, ticket: Ticket, text: &str) {
    let alice = Target::new("alice").expect("target");
    let reply = Message {
        msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
        target: alice,
        ticket: Some(ticket),
        kind: MessageKind::Reply,
        text: text.to_owned(),
        from: "alice".to_owned(),
        created_at: Timestamp::UNIX_EPOCH,
    };
    rig.store.publish(reply.clone()).await.expect("publish");
    rig.engine.reply_stored(reply).await.expect("engine");
}

#[tokio::test(start_paused = true)]
async fn a_wake_holds_its_reply_from_the_nudge_until_read_cancelled_or_lapsed() {
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Working);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await; // the pinned primary is resolved
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    let owner = "lead:w1:p1".to_owned();
    let mut wakes = Vec::new();
    for round in 0..3 {
        let ticket = alice_with_a_task(&rig).await;
        let id = rig
            .engine
            .arm_wake(ticket, owner.clone())
            .await
            .expect("engine")
            .expect("armed");
        assert!(
            rig.engine
                .wake(id.clone(), "lead:w9:p9".to_owned())
                .await
                .expect("engine")
                .is_none(),
            "another caller sees no such wake"
        );
        reply_to(&rig, ticket, &format!("done {round}")).await;
        let view = rig
            .engine
            .wake(id.clone(), owner.clone())
            .await
            .expect("engine")
            .expect("the owner's wake");
        assert_eq!(view.state, Some(TicketState::Replied));
        assert_eq!(view.reply.map(|r| r.text), Some(format!("done {round}")));
        wakes.push(id);
    }
    sleep(Duration::from_secs(30)).await;
    assert!(
        rig.nudges_into("w1:p1").is_empty(),
        "replies live wakes carry are not nudged about"
    );
    // The first is read (its reply is the owner's: its next call acknowledges it), the second
    // cancelled (the nudge takes over at once), the third never polled (it lapses).
    rig.engine
        .wake_read(wakes[0].clone(), owner.clone())
        .await
        .expect("engine");
    assert!(
        rig.engine
            .cancel_wake(wakes[1].clone(), owner.clone())
            .await
            .expect("engine")
    );
    sleep(Duration::from_millis(100)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(
        nudges[0].text.contains("1 message from alice"),
        "{nudges:?}"
    );
    sleep(Duration::try_from(super::state::WAKE_GRACE).expect("positive")).await;
    let nudges = rig.nudges_into("w1:p1");
    assert!(
        nudges
            .iter()
            .any(|n| n.text.contains("2 messages from alice")),
        "the lapsed wake's reply is mail again: {nudges:?}"
    );
    let taken = rig.engine.take_handed(owner).await.expect("engine");
    assert_eq!(taken.len(), 1, "exactly the read wake's reply: {taken:?}");
}

#[tokio::test(start_paused = true)]
async fn a_handed_reply_goes_back_to_the_nudge_when_its_holder_goes_or_never_calls_again() {
    // Review M2: a reply handed to a waiter was uncounted by the push loop until its holder's
    // next call; a holder that closed, or never called again, left it un-nudged for good.
    let fake = FakeMux::new();
    fake.add_pane("w1:p1", "t-lead", "w1:t1", AgentStatus::Idle);
    fake.add_pane("w3:p1", "t-other", "w3:t1", AgentStatus::Idle);
    fake.add_pane("w2:p1", "t-a", "w2:t1", AgentStatus::Working);
    let rig = rig(&fake);
    sleep(Duration::from_millis(100)).await; // the pinned primary is resolved
    rig.lead("w3:p1", "t-other").await;
    rig.engine
        .add_member(member("alice", "w2:p1", "t-a", None))
        .await
        .expect("engine");
    let mut handed = Vec::new();
    for round in 0..2 {
        let ticket = alice_with_a_task(&rig).await;
        let waiter = rig.engine.wait(ticket).await.expect("engine");
        reply_to(&rig, ticket, &format!("done {round}")).await;
        assert!(waiter.await.is_ok(), "the waiter got it");
        handed.push(ticket);
    }
    for (ticket, holder) in handed.iter().zip(["lead:w3:p1", "lead:w1:p1"]) {
        rig.engine
            .handed_to(*ticket, holder.to_owned())
            .await
            .expect("engine");
    }
    sleep(Duration::from_secs(60)).await;
    assert!(rig.nudges_into("w1:p1").is_empty(), "handed: not nudged");
    // The first holder's pane closes before its next call: that reply is mail again.
    fake.close("w3:p1");
    sleep(Duration::from_millis(100)).await;
    let nudges = rig.nudges_into("w1:p1");
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(
        nudges[0].text.contains("1 message from alice"),
        "{nudges:?}"
    );
    // The second holder never calls again: after the TTL its reply is counted too.
    sleep(Duration::try_from(super::state::HANDED_TTL).expect("positive")).await;
    let nudges = rig.nudges_into("w1:p1");
    assert!(
        nudges
            .iter()
            .any(|n| n.text.contains("2 messages from alice")),
        "{nudges:?}"
    );
}

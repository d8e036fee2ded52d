//! Driver tests of the engine on paused tokio time against the in-process fake multiplexer and
//! the memory store: the push loop's spacing and give-up as the real task schedules them, the
//! status gate, liveness self-heal of bindings, the lead-tab scanner, and delivery when a typing
//! may have typed (never typed twice).

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::{AgentStatus, Message, MessageKind, MsgId, Target, Ticket, TicketState};
use jiff::Timestamp;
use tokio::time::{Instant, sleep};

use super::tests_steps::{LEAD, MEMBER, SECOND_MEMBER, fake_with, task};
use super::{EngineHandle, LeadRef, NewMember, Readiness, spawn};
use crate::mux::MuxRouter;
use crate::mux::fake::{FakeMux, Fault, Typed};
use crate::store::{InboxStore, MemoryStore};
use crate::test_support::{config, engine_parts, memory_store, new_member, qualified, reply_from};

mod push;

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
    let config = config(CONFIG);
    let store = memory_store();
    let parts = engine_parts(fake, &store, crate::config::Live::fixed(config));
    let router = parts.mux.clone();
    let engine = spawn(parts);
    Rig {
        engine,
        store,
        fake: fake.clone(),
        router,
    }
}

/// [`rig`], once its first scan has resolved the pinned primary (the lead in tab `w1:t1`).
async fn rig_with_primary(fake: &FakeMux) -> Rig {
    let rig = rig(fake);
    sleep(Duration::from_millis(100)).await;
    rig
}

/// A fake multiplexer with an idle lead (pane `w1:p1`, incarnation `t-lead`) in the pinned
/// primary tab `w1:t1`.
fn lead_idle() -> FakeMux {
    fake_with(&[(LEAD, AgentStatus::Idle)])
}

/// [`lead_idle`] and member alice's pane (`w2:p1`, incarnation `t-a`) in `status`; a
/// [`rig_with_primary`] on them with alice registered.
async fn primary_and_alice(status: AgentStatus) -> Rig {
    let fake = fake_with(&[(LEAD, AgentStatus::Idle), (MEMBER, status)]);
    let rig = rig_with_primary(&fake).await;
    rig.add(new_member("alice", "w2:p1", "t-a")).await;
    rig
}

impl Rig {
    async fn add(&self, new: NewMember) {
        self.engine.add_member(new).await.expect("engine");
    }

    async fn mail(&self, target: &str) -> MsgId {
        let message = reply_from(target, None, "the secret payload");
        let target = message.target.clone();
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

    /// Asserts the nudges typed into `pane` so far are exactly one, saying `says`.
    fn one_nudge(&self, pane: &str, says: &str) {
        let nudges = self.fake.typed_into(pane);
        assert_eq!(nudges.len(), 1, "{nudges:?}");
        assert!(nudges[0].text.contains(says), "{says:?}: {nudges:?}");
    }

    /// Asserts nothing has been typed into `pane` so far: no nudge, for the reason `why`.
    fn no_nudge(&self, pane: &str, why: &str) {
        let nudges = self.fake.typed_into(pane);
        assert!(nudges.is_empty(), "{why}: {nudges:?}");
    }

    /// Asserts some nudge typed into `pane` so far says `says`.
    fn some_nudge(&self, pane: &str, says: &str) {
        let nudges = self.fake.typed_into(pane);
        assert!(
            nudges.iter().any(|n| n.text.contains(says)),
            "{says:?}: {nudges:?}"
        );
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
    let fake = fake_with(&[
        (("w2:p1", "t-idle", "w2:t1"), AgentStatus::Idle),
        (("w2:p2", "t-busy", "w2:t2"), AgentStatus::Working),
    ]);
    let rig = rig(&fake);
    for new in [
        NewMember {
            idle_timeout_secs: Some(60),
            ..new_member("idler", "w2:p1", "t-idle")
        },
        NewMember {
            idle_timeout_secs: Some(60),
            ..new_member("worker", "w2:p2", "t-busy")
        },
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
    rig.add(new_member("alice", "w2:p1", "t-a")).await;
    let alice = Target::new("alice").expect("target");
    rig.engine.presence(alice).await.expect("engine");
    task(&rig.engine, "alice", "job").await
}

/// Asserts the wait `settled` ends, within 30 s and so by the turn's own end rather than a
/// timeout (`why`), with its ticket in `state`.
async fn assert_settles(
    settled: tokio::sync::oneshot::Receiver<super::Settled>,
    state: TicketState,
    why: &str,
) {
    let settled = tokio::time::timeout(Duration::from_secs(30), settled)
        .await
        .expect(why)
        .expect("settled");
    assert_eq!(settled.state, state);
}

async fn state_of(rig: &Rig, ticket: Ticket) -> TicketState {
    match rig.engine.ticket(ticket).await.expect("engine") {
        super::TicketAnswer::Live(view) => view.state,
        other => panic!("ticket {ticket} is not live: {other:?}"),
    }
}

/// Idle member alice, every typing into whose pane goes in and then loses its answer, sent
/// [`alice_with_a_task`]: the rig and the task's ticket.
async fn alice_losing_answers() -> (Rig, Ticket) {
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]);
    fake.fault("w2:p1", Some(Fault::LostAnswer));
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    (rig, ticket)
}

#[tokio::test(start_paused = true)]
async fn a_task_that_may_have_been_typed_is_verified_and_never_typed_again() {
    let (rig, ticket) = alice_losing_answers().await;
    let fake = &rig.fake;
    let settled = rig.engine.wait(ticket).await.expect("engine");
    sleep(Duration::from_secs(30)).await;
    assert_eq!(rig.fake.typed_into("w2:p1").len(), 1, "typed once");
    assert_eq!(fake.enters("w2:p1"), 1, "then one Enter retry");
    let settled = settled.await.expect("settled");
    assert_eq!(settled.state, TicketState::Stalled);
}

#[tokio::test(start_paused = true)]
async fn a_task_that_may_have_been_typed_and_started_is_working() {
    let (rig, ticket) = alice_losing_answers().await;
    let fake = &rig.fake;
    sleep(Duration::from_millis(1500)).await;
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_secs(30)).await;
    assert_eq!(state_of(&rig, ticket).await, TicketState::Working);
    assert_eq!(rig.fake.typed_into("w2:p1").len(), 1, "typed once");
    assert_eq!(fake.enters("w2:p1"), 0, "its turn started: no retry");
}

#[tokio::test(start_paused = true)]
async fn a_submit_the_multiplexer_saw_start_is_the_turn_and_gets_no_enter_retry() {
    // herdr's agent.prompt saw alice reach working; its status event has not come (yet).
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]);
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
    assert_eq!(rig.fake.typed_into("w2:p1").len(), 1);
}

async fn inbox(rig: &Rig, target: &str) -> Vec<Message> {
    rig.store
        .peek(&Target::new(target).expect("target"), 100)
        .await
        .expect("peek")
}

#[tokio::test(start_paused = true)]
async fn a_backend_going_down_and_up_is_one_incident_each_for_its_members_only() {
    let fake = fake_with(&[
        (LEAD, AgentStatus::Idle),
        (MEMBER, AgentStatus::Idle),
        (SECOND_MEMBER, AgentStatus::Idle),
    ]);
    let rig = rig_with_primary(&fake).await;
    rig.add(NewMember {
        backend: Some("lab".to_owned()),
        ..new_member("alice", "w2:p1", "t-a")
    })
    .await;
    rig.add(new_member("bob", "w2:p2", "t-b")).await;
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
    let nudges = rig.fake.typed_into("w1:p1");
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
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]);
    let with_lab = format!("{CONFIG}backends:\n  lab:\n    baseUrl: http://127.0.0.1:9\n");
    let (publisher, live) = crate::config::channel(config(&with_lab));
    let store = memory_store();
    let engine = spawn(engine_parts(&fake, &store, live));
    engine
        .add_member(NewMember {
            backend: Some("lab".to_owned()),
            ..new_member("alice", "w2:p1", "t-a")
        })
        .await
        .expect("engine");
    let alice = Target::new("alice").expect("target");
    // A reload that keeps the backend changes nothing.
    publisher.publish(config(&with_lab));
    sleep(Duration::from_millis(10)).await;
    assert!(store.peek(&alice, 10).await.expect("peek").is_empty());
    for _ in 0..2 {
        publisher.publish(config(CONFIG));
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
async fn missed_pane_events_make_the_engine_read_every_pane_again() {
    // Review M5: a lagged event stream was only logged, so a Gone lost in the burst left its
    // member listed forever.
    let rig = primary_and_alice(AgentStatus::Idle).await;
    let fake = &rig.fake;
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
    let fake = fake_with(&[
        (("w2:p1", "t-ann", "w2:t1"), AgentStatus::Unknown),
        (("w2:p2", "t-bo", "w2:t2"), AgentStatus::Working),
        (("w2:p3", "t-cy", "w2:t3"), AgentStatus::Unknown),
    ]);
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
        rig.add(new_member(name, pane, terminal)).await;
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
    let fake = fake_with(&[(MEMBER, AgentStatus::Working)]);
    let rig = rig(&fake);
    rig.add(new_member("alice", "w2:p1", "t-a")).await;
    sleep(Duration::from_millis(4500)).await;
    let ticket = task(&rig.engine, "alice", "job").await;
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
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]);
    let rig = rig(&fake);
    let ticket = alice_with_a_task(&rig).await;
    let settled = rig.engine.wait(ticket).await.expect("engine");
    sleep(Duration::from_millis(500)).await;
    fake.set_status("w2:p1", AgentStatus::Working);
    sleep(Duration::from_millis(500)).await;
    assert_eq!(state_of(&rig, ticket).await, TicketState::Working);
    rig.store.set_writes_fail(true);
    fake.set_status("w2:p1", AgentStatus::Idle);
    assert_settles(
        settled,
        TicketState::EndedWithoutReply,
        "the ticket ends without waiting for a timeout",
    )
    .await;
    assert!(
        inbox(&rig, "alice").await.is_empty(),
        "the store took nothing"
    );
    // The member takes its next task.
    rig.store.set_writes_fail(false);
    let next = task(&rig.engine, "alice", "next").await;
    sleep(Duration::from_secs(1)).await;
    assert_eq!(state_of(&rig, next).await, TicketState::Delivered);
}

#[tokio::test(start_paused = true)]
async fn a_status_blip_before_the_task_was_submitted_records_no_fallback() {
    // Issue 40 #2: Codex's spinner at the end of its start-up read busy after the task was
    // typed, then at rest, while the text still sat unsent in its composer; the ticket ended
    // without a reply and the task was lost.
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]);
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
    assert_settles(settled, TicketState::EndedWithoutReply, "the turn ends").await;
    assert_eq!(
        inbox(&rig, "alice").await.len(),
        1,
        "its own turn's fallback"
    );
}

/// alice's reply to `ticket`, stored and told to the engine.
async fn reply_to(rig: &Rig, ticket: Ticket, text: &str) {
    let reply = reply_from("alice", Some(ticket), text);
    rig.store.publish(reply.clone()).await.expect("publish");
    rig.engine.reply_stored(reply).await.expect("engine");
}

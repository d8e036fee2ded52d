//! Driver tests of the engine as one gateway, on paused tokio time against the fake multiplexer
//! and the memory store (the inbox and the fleet state): another gateway's refused messages are
//! incidents to this gateway's primary lead, in its own inbox (`gateway@<me>`), bounded per
//! sender and reason, and never with a body; a question delivered again after its answer is
//! not asked again, and a spawn's answer delivered again is a copy, across a restart too; tasks
//! from another gateway obey `limits.maxQueuedTasks` like local ones.

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::gateway::{Envelope, GatewayName, Kind, PROTOCOL};
use fleetd_core::{AgentStatus, MessageKind, Target};
use tokio::time::sleep;

use super::state::REFUSAL_WINDOW;
use super::tests_steps::{LEAD, fake_with, send_task, task, task_refused};
use super::{Durable, EngineHandle, EngineParts, GatewayOutcome, GatewayParts, PeerRefusal, spawn};
use crate::mux::fake::FakeMux;
use crate::store::{InboxStore, MemoryStore, StateStore};
use crate::test_support::{config, engine_parts, memory_store, new_member};

/// The primary lead's tab is `w1:t1`; one nudge a batch, so the test counts notices, not
/// reminders.
const CONFIG: &str = "primary:\n  tab: w1:t1\n  pushReminders: 1\n  pushBackoffMs: 1000\n";

struct Rig {
    engine: EngineHandle,
    store: Arc<MemoryStore>,
    fake: FakeMux,
    /// The forwarder's end of the outbox, kept open.
    outbox: tokio::sync::mpsc::UnboundedReceiver<(u64, Box<Envelope>)>,
}

fn gateway_rig(fake: &FakeMux) -> Rig {
    gateway_rig_on(fake, &memory_store())
}

/// Gateway `a` on `store` (its inbox and its fleet state: a second rig on the same store is the
/// same gateway after a restart).
fn gateway_rig_on(fake: &FakeMux, store: &Arc<MemoryStore>) -> Rig {
    gateway_rig_with(fake, store, "", std::collections::BTreeMap::new())
}

/// [`gateway_rig_on`] with `extra` config and what each peer may ask.
fn gateway_rig_with(
    fake: &FakeMux,
    store: &Arc<MemoryStore>,
    extra: &str,
    peers: std::collections::BTreeMap<String, Vec<crate::config::PeerRight>>,
) -> Rig {
    let config = config(&format!("{CONFIG}{extra}"));
    let store = Arc::clone(store);
    let (forward, outbox) = tokio::sync::mpsc::unbounded_channel();
    let engine = spawn(EngineParts {
        durable: Some(Durable {
            store: Arc::clone(&store) as Arc<dyn StateStore>,
            legacy_members_file: None,
        }),
        gateway: Some(GatewayParts {
            me: GatewayName::new("a").expect("name"),
            peers,
            forward,
            outbox_max: 3,
            peer_backlog_max: 5,
        }),
        ..engine_parts(fake, &store, crate::config::Live::fixed(config))
    });
    Rig {
        engine,
        store,
        fake: fake.clone(),
        outbox,
    }
}

impl Rig {
    /// The incidents in gateway a's own inbox, oldest first.
    async fn incidents(&self) -> Vec<String> {
        let inbox = Target::new("gateway@a").expect("target");
        let messages = self.store.peek(&inbox, 100).await.expect("peek");
        assert!(messages.iter().all(|m| m.kind == MessageKind::Incident));
        messages.into_iter().map(|m| m.text).collect()
    }

    /// Hands the engine `envelope` as the broker delivered it: what it made of it.
    async fn deliver(&self, envelope: Envelope) -> Result<GatewayOutcome, String> {
        self.engine.gateway_in(envelope).await.expect("engine")
    }

    /// Asserts the engine takes `envelope` (done, or a copy of one done): it is acked.
    async fn assert_taken(&self, envelope: Envelope) {
        assert_eq!(self.deliver(envelope).await, Ok(GatewayOutcome::Taken));
    }

    /// What went into the outbox for other gateways since last asked, in order.
    fn sent(&mut self) -> Vec<Envelope> {
        let mut sent = Vec::new();
        while let Ok((_, envelope)) = self.outbox.try_recv() {
            sent.push(*envelope);
        }
        sent
    }

    async fn refused(&self, from: &str, reason: &'static str, why: &str) {
        self.engine
            .gateway_refused(PeerRefusal {
                from: Some(from.to_owned()),
                reason,
                why: why.to_owned(),
                parked: true,
            })
            .await
            .expect("engine");
    }
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_an_incident_to_the_primary_and_repeats_are_folded_into_one_count() {
    let fake = fake_with(&[(LEAD, AgentStatus::Idle)]);
    let rig = gateway_rig(&fake);
    sleep(Duration::from_millis(100)).await; // the first scan resolves the pinned primary

    // Five forged messages from b within a moment: one notice now, naming b, why and where.
    for n in 0..5 {
        let why = format!("sender mismatch: user b, key from b, envelope from c (copy {n})");
        rig.refused("b", "impersonation", &why).await;
    }
    sleep(Duration::from_millis(50)).await;
    let incidents = rig.incidents().await;
    assert_eq!(incidents.len(), 1, "{incidents:#?}");
    for words in [
        "gateway a refused a message from gateway b",
        "impersonation",
        "envelope from c (copy 0)",
        "fleet.gw.a.dead",
    ] {
        assert!(incidents[0].contains(words), "{words:?}: {}", incidents[0]);
    }
    // The primary lead is nudged about gateway a's inbox, with no text of the notice.
    let nudges: Vec<String> = rig.fake.typed().into_iter().map(|t| t.text).collect();
    assert!(
        nudges.iter().any(|n| n.contains("from gateway@a")),
        "{nudges:?}"
    );
    assert!(nudges.iter().all(|n| !n.contains("mismatch")), "{nudges:?}");

    // Another reason, or another sender, is a notice of its own at once.
    rig.refused(
        "b",
        "never_sent",
        "a reply for ticket T, which was never sent to gateway b",
    )
    .await;
    rig.refused("c", "impersonation", "sender mismatch: user c")
        .await;
    sleep(Duration::from_millis(50)).await;
    assert_eq!(rig.incidents().await.len(), 3);

    // The window closes: the four folded impersonations are counted in one notice, the last's
    // reason with it; the windows with nothing folded say nothing more.
    sleep(Duration::try_from(REFUSAL_WINDOW).expect("window") + Duration::from_secs(1)).await;
    let incidents = rig.incidents().await;
    assert_eq!(incidents.len(), 4, "{incidents:#?}");
    for words in [
        "refused 4 more messages from gateway b (impersonation) in the last 60s",
        "(copy 4)",
    ] {
        assert!(incidents[3].contains(words), "{words:?}: {}", incidents[3]);
    }

    // b keeps on: a notice a window, never one a message.
    for _ in 0..3 {
        for _ in 0..20 {
            rig.refused("b", "impersonation", "sender mismatch").await;
        }
        sleep(Duration::try_from(REFUSAL_WINDOW).expect("window")).await;
    }
    sleep(Duration::from_secs(1)).await;
    let incidents = rig.incidents().await;
    assert_eq!(incidents.len(), 7, "{incidents:#?}");
    assert!(
        incidents[4..]
            .iter()
            .all(|i| i.contains("refused 20 more messages from gateway b")),
        "{incidents:#?}"
    );
    // A quiet window is forgotten: the next refusal is news again, said at once.
    sleep(Duration::try_from(REFUSAL_WINDOW * 2).expect("window")).await;
    rig.refused("b", "impersonation", "sender mismatch: again")
        .await;
    sleep(Duration::from_millis(50)).await;
    let incidents = rig.incidents().await;
    assert_eq!(incidents.len(), 8, "{incidents:#?}");
    assert!(incidents[7].contains("refused a message from gateway b"));
}

/// An envelope from gateway b to gateway a.
fn envelope(kind: Kind, body: serde_json::Value) -> Envelope {
    Envelope {
        v: PROTOCOL,
        kind,
        src: GatewayName::new("b").expect("b"),
        dst: GatewayName::new("a").expect("a"),
        msg_id: "01a23300-0000-7000-8000-000000000001".to_owned(),
        body,
    }
}

#[tokio::test(start_paused = true)]
async fn a_question_delivered_again_after_its_answer_is_not_asked_again_even_after_a_restart() {
    let fake = FakeMux::new();
    let store = memory_store();
    let rig = gateway_rig_on(&fake, &store);
    let alice = Target::new("alice@b").expect("target");
    let ticket = task(&rig.engine, "alice@b", "ship it").await;
    let question = envelope(
        Kind::Question,
        serde_json::json!({
            "questionId": "01a23300-0000-7000-8000-0000000000a1",
            "member": "alice", "ticket": ticket, "question": "which environment?",
        }),
    );
    let open = |engine: &EngineHandle| {
        let engine = engine.clone();
        let alice = alice.clone();
        async move { engine.questions(Some(alice)).await.expect("engine").len() }
    };
    rig.assert_taken(question.clone()).await;
    assert_eq!(open(&rig.engine).await, 1);
    let id = rig.engine.questions(None).await.expect("engine")[0]
        .question_id
        .clone();
    rig.engine
        .answer(None, id, "staging".to_owned())
        .await
        .expect("engine")
        .expect("answered");
    assert_eq!(open(&rig.engine).await, 0);
    // The broker delivers it again (its ack was lost with the link): a copy, not a question.
    rig.assert_taken(question.clone()).await;
    assert_eq!(open(&rig.engine).await, 0, "asked again");
    // And after a restart on the same state.
    drop(rig);
    sleep(Duration::from_millis(100)).await;
    let rig = gateway_rig_on(&fake, &store);
    rig.assert_taken(question).await;
    assert_eq!(open(&rig.engine).await, 0, "asked again after a restart");
}

#[tokio::test(start_paused = true)]
async fn a_spawn_answer_delivered_again_is_a_copy_not_a_refusal() {
    let fake = FakeMux::new();
    let store = memory_store();
    let rig = gateway_rig_on(&fake, &store);
    let (req, answer) = rig
        .engine
        .spawn_remote(super::SpawnRemote {
            gateway: "b".to_owned(),
            profile: "sim".to_owned(),
            name: Some("rem".to_owned()),
            task: None,
            lead: None,
            by: None,
        })
        .await
        .expect("engine")
        .expect("asked");
    let spawned = envelope(
        Kind::Spawned,
        serde_json::json!({ "req": req, "target": "rem", "pane": "member:w1:p2", "profile": "sim" }),
    );
    rig.assert_taken(spawned.clone()).await;
    let done = answer.await.expect("answered").expect("spawned");
    assert_eq!(done.target.to_string(), "rem@b");
    // The broker delivers the answer again (its ack was lost), before and after a restart.
    rig.assert_taken(spawned.clone()).await;
    drop(rig);
    sleep(Duration::from_millis(100)).await;
    let rig = gateway_rig_on(&fake, &store);
    rig.assert_taken(spawned).await;
    sleep(Duration::from_millis(50)).await;
    assert!(
        rig.incidents().await.is_empty(),
        "a copy raised an incident"
    );
    // One for a request never sent to b is still refused.
    let forged = envelope(
        Kind::Spawned,
        serde_json::json!({ "req": "01a23300-0000-7000-8000-0000000000f1", "target": "x" }),
    );
    let refused = rig.deliver(forged).await;
    assert!(
        matches!(
            refused,
            Ok(GatewayOutcome::Refused {
                reason: "never_sent",
                ..
            })
        ),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn what_the_engine_refuses_is_labelled_and_raised_without_its_body() {
    let fake = fake_with(&[(LEAD, AgentStatus::Idle)]);
    let rig = gateway_rig(&fake);
    sleep(Duration::from_millis(100)).await;
    // A reply for a ticket a never sent to b: its own reason, not "not allowed".
    let reply = envelope(
        Kind::Reply,
        serde_json::json!({ "message": {
            "msgId": "01a23300-0000-7000-8000-000000000002", "target": "alice@b",
            "ticket": "01a23300-0000-7000-8000-00000000beef", "kind": "reply",
            "text": "the forged body", "from": "alice", "createdAt": "2026-12-01T00:00:00Z",
        }}),
    );
    let outcome = rig.deliver(reply).await;
    assert!(
        matches!(&outcome, Ok(GatewayOutcome::Refused { reason: "never_sent", why }) if why.contains("never sent to gateway b")),
        "{outcome:?}"
    );
    // A task b may not send (a's peers give it nothing).
    let task = envelope(
        Kind::Task,
        serde_json::json!({
            "ticket": "01a23300-0000-7000-8000-00000000cafe", "member": "x",
            "task": "rm -rf /", "by": "x",
        }),
    );
    let outcome = rig.deliver(task).await;
    assert!(
        matches!(
            &outcome,
            Ok(GatewayOutcome::Refused {
                reason: "not_allowed",
                ..
            })
        ),
        "{outcome:?}"
    );
    sleep(Duration::from_millis(50)).await;
    let incidents = rig.incidents().await;
    assert_eq!(incidents.len(), 2, "{incidents:#?}");
    assert!(incidents[0].contains("(never_sent: "), "{}", incidents[0]);
    assert!(incidents[1].contains("(not_allowed: "), "{}", incidents[1]);
    assert!(
        incidents
            .iter()
            .all(|i| !i.contains("forged body") && !i.contains("rm -rf")),
        "{incidents:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn tasks_from_another_gateway_obey_max_queued_tasks_like_local_ones() {
    let fake = fake_with(&[(("w2:p1", "t-z", "w2:t1"), AgentStatus::Working)]);
    let store = memory_store();
    let peers = [("b".to_owned(), vec![crate::config::PeerRight::Send])].into();
    let mut rig = gateway_rig_with(&fake, &store, "limits:\n  maxQueuedTasks: 2\n", peers);
    let zed = Target::new("zed").expect("target");
    rig.engine
        .add_member(new_member("zed", "w2:p1", "t-z"))
        .await
        .expect("engine");
    // Attack G8: gateway b fills zed's queue. zed is working, so every task waits.
    for i in 1..=3 {
        let task = envelope(
            Kind::Task,
            serde_json::json!({
                "ticket": format!("01a23300-0000-7000-8000-00000000b00{i}"),
                "member": "zed", "task": format!("job {i}"), "by": "lead",
            }),
        );
        rig.assert_taken(task).await;
    }
    sleep(Duration::from_millis(50)).await;
    let answers = rig.sent();
    assert_eq!(
        answers.len(),
        1,
        "only the third is answered at once: {answers:?}"
    );
    assert_eq!(answers[0].kind, Kind::Ticket);
    let body = answers[0].body.to_string();
    assert!(
        body.contains("00000000b003")
            && body.contains("queue_full")
            && body.contains("limits.maxQueuedTasks = 2"),
        "{body}"
    );
    let tickets = rig.engine.recent(zed).await.expect("engine");
    assert_eq!(tickets.len(), 2, "two queued: {tickets:?}");
    // The cap holds for this host's own lead as for b: the same refusal, by the same rule.
    let local = send_task(&rig.engine, "zed", "mine").await;
    assert!(
        matches!(&local, Err(r) if r.code == "queue_full"),
        "{local:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn new_requests_to_other_gateways_are_refused_at_the_outbox_bound_and_answers_still_go() {
    let fake = FakeMux::new();
    let store = memory_store();
    let peers = [("b".to_owned(), vec![crate::config::PeerRight::Send])].into();
    let mut rig = gateway_rig_with(&fake, &store, "", peers);
    // Review L1: the broker takes nothing (the forwarder never confirms), so the outbox grows;
    // at its bound (3 here) a new task or spawn for another gateway is refused, and nothing of
    // it is recorded.
    for n in 1..=3 {
        task(&rig.engine, "alice@b", format!("job {n}")).await;
    }
    task_refused(
        &rig.engine,
        "alice@b",
        "job 4",
        ("gateway_backlog", "gateway.outboxMax = 3"),
    )
    .await;
    assert_eq!(spawn_on_b(&rig.engine).await, Some("gateway_backlog"));
    sleep(Duration::from_millis(50)).await;
    let kinds: Vec<Kind> = rig.sent().into_iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [Kind::Task; 3],
        "the refused ones left nothing in the outbox"
    );
    // An answer owed to another gateway still goes in past the bound: b's task for a member
    // this host does not have ends at once, and its ticket's end goes back to b.
    rig.assert_taken(envelope(
        Kind::Task,
        serde_json::json!({
            "ticket": "01a23300-0000-7000-8000-00000000b0ff",
            "member": "nobody", "task": "x", "by": "lead",
        }),
    ))
    .await;
    sleep(Duration::from_millis(50)).await;
    let (_, answer) = rig.outbox.try_recv().expect("the answer is in the outbox");
    assert_eq!(answer.kind, Kind::Ticket);
}

#[tokio::test(start_paused = true)]
async fn new_requests_to_a_gateway_that_is_behind_are_refused_and_others_still_go() {
    let fake = FakeMux::new();
    let rig = gateway_rig(&fake);
    let b = GatewayName::new("b").expect("name");
    // The probe read 4 messages waiting in b's queue on the broker; one task more for b in
    // this outbox reaches the bound (5 here).
    rig.engine.peer_queued(b.clone(), 4).await.expect("engine");
    task(&rig.engine, "alice@b", "job 1").await;
    task_refused(
        &rig.engine,
        "alice@b",
        "job 2",
        (
            "gateway_busy",
            "gateway b is behind: 5 messages wait for it (4 in its queue on the broker, 1 in this gateway's outbox; gateway.peerBacklogMax = 5)",
        ),
    )
    .await;
    assert_eq!(spawn_on_b(&rig.engine).await, Some("gateway_busy"));
    // Another gateway is not held back by b.
    task(&rig.engine, "carol@c", "job for c").await;
    // b's queue drained: b takes tasks again.
    rig.engine.peer_queued(b, 0).await.expect("engine");
    task(&rig.engine, "alice@b", "job 3").await;
}

#[tokio::test(start_paused = true)]
async fn a_task_for_a_gateway_that_is_behind_waits_for_room_then_goes_or_is_refused_after_the_hold()
{
    let fake = FakeMux::new();
    let mut rig = gateway_rig(&fake);
    let b = GatewayName::new("b").expect("name");
    rig.engine.peer_queued(b.clone(), 5).await.expect("engine");
    let engine = rig.engine.clone();
    let held = tokio::spawn(async move { send_task(&engine, "alice@b", "held").await });
    sleep(Duration::from_secs(2)).await;
    assert!(!held.is_finished(), "b is behind: the task waits");
    rig.engine.peer_queued(b.clone(), 0).await.expect("engine");
    held.await.expect("joined").expect("taken once b has room");
    // b stays behind past the hold: the refusal stands, saying it waited.
    rig.engine.peer_queued(b, 5).await.expect("engine");
    let started = tokio::time::Instant::now();
    task_refused(
        &rig.engine,
        "alice@b",
        "too late",
        ("gateway_busy", "(this request waited 10 s for room)"),
    )
    .await;
    assert!(
        started.elapsed() >= super::busy::HOLD,
        "{:?}",
        started.elapsed()
    );
    let kinds: Vec<Kind> = rig.sent().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [Kind::Task], "only the task taken went out");
}

/// Asks gateway b for a member of its `sim` profile: the refusal's code, `None` when asked.
async fn spawn_on_b(engine: &EngineHandle) -> Option<&'static str> {
    let spawn = engine
        .spawn_remote(super::SpawnRemote {
            gateway: "b".to_owned(),
            profile: "sim".to_owned(),
            name: None,
            task: None,
            lead: None,
            by: None,
        })
        .await
        .expect("engine");
    spawn.err().map(|r| r.code.as_str())
}

#[tokio::test(start_paused = true)]
async fn a_reply_from_another_gateway_goes_on_to_be_stored_without_waiting_for_others_commits() {
    // Issue 36: under 64 senders' load a reply from b waited for the commit of their tasks (up
    // to 25 ms a round) before it was stored, though it changes nothing here until then.
    let fake = FakeMux::new();
    let store = memory_store();
    let rig = gateway_rig_on(&fake, &store);
    let ticket = task(&rig.engine, "alice@b", "ship it").await;
    store.set_state_commit_delay(Duration::from_secs(5));
    let engine = rig.engine.clone();
    let slow = tokio::spawn(async move { send_task(&engine, "alice@b", "meanwhile").await });
    sleep(Duration::from_millis(10)).await;
    let reply = envelope(
        Kind::Reply,
        serde_json::json!({ "message": {
            "msgId": "01a23300-0000-7000-8000-000000000002", "target": "alice@b",
            "ticket": ticket, "kind": "reply",
            "text": "shipped", "from": "alice", "createdAt": "2026-12-01T00:00:00Z",
        }}),
    );
    let started = tokio::time::Instant::now();
    let outcome = rig.deliver(reply).await;
    assert!(
        matches!(&outcome, Ok(GatewayOutcome::PublishReply(m)) if m.text == "shipped"),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the reply waited {:?} for the other task's commit",
        started.elapsed()
    );
    slow.await
        .expect("joined")
        .expect("the other task is still taken");
}

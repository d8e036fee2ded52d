//! Tool-level tests on paused tokio time, through `tools::call` as the MCP and REST doors call
//! it, against the memory store and the fake multiplexer: `fleet_poll`'s pages (`limit`,
//! `after`, `more`, the byte budget, bad arguments) and the per-member caps on queued tasks and
//! open questions (`limits:`), refused naming the cap and its config key, and live on reload.

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::access::Role;
use fleetd_core::{AgentStatus, MessageLimits, MsgId, Target, Ticket};
use serde_json::{Value, json};

use super::poll::{MAX_LIMIT, PAGE_BYTES};
use crate::config::Publisher;
use crate::mcp::{Caller, Fleet};
use crate::mux::fake::FakeMux;
use crate::store::{InboxStore, MemoryStore};
use crate::test_support::{caller, config, engine_parts, fleet, new_member, reply_from};

/// Messages up to 2 MiB, so a reply larger than a page's budget can be stored.
const MAX_MESSAGE: usize = 2 << 20;

pub(super) struct Setup {
    pub(super) fleet: Fleet,
    pub(super) store: Arc<MemoryStore>,
    config: Publisher,
    /// The multiplexer, to add panes to.
    pub(super) fake: FakeMux,
}

pub(super) fn setup(yaml: &str) -> Setup {
    let fake = FakeMux::new();
    fake.add_pane("w2:p1", "t-ann", "w2:t1", AgentStatus::Idle);
    let (config, live) = crate::config::channel(config(yaml));
    let store = Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: MAX_MESSAGE,
    }));
    let fleet = fleet(engine_parts(&fake, &store, live));
    Setup {
        fleet,
        store,
        config,
        fake,
    }
}

fn ann() -> Target {
    Target::new("ann").expect("target")
}

fn as_ann() -> Caller {
    caller(Role::Member {
        target: ann(),
        allow_delegation: false,
    })
}

/// Runs tool `name` as the operator (or `as`); the answer's value, or (code, message).
pub(super) async fn call_as(
    fleet: &Fleet,
    who: &Caller,
    name: &str,
    args: Value,
) -> Result<Value, (String, String)> {
    super::call(fleet, who, name, args)
        .await
        .map(|out| out.value)
        .map_err(|e| (e.code.as_str().to_owned(), e.message))
}

async fn call(fleet: &Fleet, name: &str, args: Value) -> Result<Value, (String, String)> {
    call_as(fleet, &caller(Role::Operator), name, args).await
}

/// Registers member `ann` in an idle pane. Its agent has not spoken MCP yet, so nothing is typed
/// into it and every task sent waits in its queue until [`present`].
async fn add_ann(fleet: &Fleet) {
    fleet
        .engine
        .add_member(new_member("ann", "w2:p1", "t-ann"))
        .await
        .expect("engine");
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Stores `n` replies from ann of `len` bytes each (the i-th starts with its number); their ids.
async fn mail(store: &MemoryStore, n: usize, len: usize) -> Vec<MsgId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let mut text = format!("{i:04} ");
        text.push_str(&"x".repeat(len.saturating_sub(text.len())));
        ids.push(publish(store, text, None).await);
    }
    ids
}

async fn publish(store: &MemoryStore, text: String, ticket: Option<Ticket>) -> MsgId {
    let message = reply_from("ann", ticket, text);
    let id = message.msg_id;
    store.publish(message).await.expect("publish");
    id
}

fn reply_ids(page: &Value) -> Vec<MsgId> {
    page["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .map(|r| MsgId::parse(r["msgId"].as_str().expect("msgId")).expect("a msgId"))
        .collect()
}

async fn poll(fleet: &Fleet, args: Value) -> Value {
    call(fleet, "fleet_poll", args).await.expect("poll")
}

/// Every page of ann's replies, `limit` at a time, each asked for after the last reply of the
/// one before, until one says no `more` follow.
async fn poll_every_page(fleet: &Fleet, limit: u64) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut after: Option<MsgId> = None;
    loop {
        let mut args = json!({ "target": "ann", "limit": limit });
        if let Some(after) = after {
            args["after"] = json!(after.to_string());
        }
        let page = poll(fleet, args).await;
        after = reply_ids(&page).last().copied();
        let last = page["more"] == false;
        pages.push(page);
        if last {
            return pages;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn poll_pages_by_limit_and_after_until_more_is_false() {
    let s = setup("");
    let ids = mail(&s.store, 25, 10).await;
    // The default page: 20 replies, and more follow.
    let first = poll(&s.fleet, json!({ "target": "ann" })).await;
    assert_eq!(reply_ids(&first), ids[..20]);
    assert_eq!(first["more"], true);
    assert!(first["questions"].is_array(), "{first}");
    assert!(first.get("afterNotPending").is_none(), "{first}");
    let rest = poll(
        &s.fleet,
        json!({ "target": "ann", "after": ids[19].to_string() }),
    )
    .await;
    assert_eq!(reply_ids(&rest), ids[20..]);
    assert_eq!(rest["more"], false);
    // A small limit pages through everything exactly once, in order.
    let mut seen = Vec::new();
    for page in poll_every_page(&s.fleet, 7).await {
        let got = reply_ids(&page);
        assert!(got.len() <= 7);
        seen.extend(got);
    }
    assert_eq!(seen, ids);
    // Nothing was removed.
    assert_eq!(s.store.depth(&ann()).await.expect("depth"), 25);
    let most = poll(&s.fleet, json!({ "target": "ann", "limit": MAX_LIMIT })).await;
    assert_eq!(reply_ids(&most), ids, "up to the largest limit");
}

#[tokio::test(start_paused = true)]
async fn poll_keeps_an_answer_to_about_a_mebibyte_and_always_shows_one_reply() {
    let s = setup("");
    let kib = 1024;
    let mut ids = mail(&s.store, 3, 400 * kib).await;
    ids.extend(mail(&s.store, 1, 1536 * kib).await);
    ids.extend(mail(&s.store, 1, 10).await);
    let mut pages = Vec::new();
    for page in poll_every_page(&s.fleet, 100).await {
        let texts: usize = page["replies"]
            .as_array()
            .expect("replies")
            .iter()
            .map(|r| r["text"].as_str().expect("text").len())
            .sum();
        let got = reply_ids(&page);
        assert!(
            texts <= PAGE_BYTES || got.len() == 1,
            "{texts} bytes in {} replies",
            got.len()
        );
        pages.push(got);
    }
    // 400 + 400 KiB fit in 1 MiB, a third does not; 1.5 MiB is over the budget alone and is
    // still shown, on a page of its own.
    assert_eq!(
        pages,
        vec![
            ids[..2].to_vec(),
            ids[2..3].to_vec(),
            ids[3..4].to_vec(),
            ids[4..].to_vec()
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn poll_refuses_bad_paging_arguments_naming_them() {
    let s = setup("");
    mail(&s.store, 3, 10).await;
    let ticket = Ticket::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock));
    let bad_limits = [json!(0), json!(101), json!(-1), json!(2.5), json!("20")].map(|limit| {
        let says: &[&str] = &["`limit`", "1 to 100"];
        (json!({ "target": "ann", "limit": limit }), says)
    });
    let others: [(Value, &[&str]); 2] = [
        (
            json!({ "target": "ann", "after": "not-a-msg-id" }),
            &["`after`"],
        ),
        (
            json!({ "ticket": ticket.to_string(), "limit": 5 }),
            &["with `target`"],
        ),
    ];
    for (args, says) in bad_limits.into_iter().chain(others) {
        let (code, message) = call(&s.fleet, "fleet_poll", args.clone())
            .await
            .expect_err("refused");
        assert_eq!(code, "invalid_arguments", "{args}");
        for fragment in says {
            assert!(message.contains(fragment), "{args}: {message}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn poll_after_an_acknowledged_reply_starts_from_the_oldest_and_says_so() {
    let s = setup("");
    let ids = mail(&s.store, 3, 10).await;
    let first = poll(&s.fleet, json!({ "target": "ann", "limit": 2 })).await;
    assert_eq!(reply_ids(&first), ids[..2]);
    // Someone acknowledges the last reply seen before the next page is asked for.
    call(
        &s.fleet,
        "fleet_ack",
        json!({ "target": "ann", "msgId": ids[1].to_string() }),
    )
    .await
    .expect("ack");
    let next = poll(
        &s.fleet,
        json!({ "target": "ann", "limit": 2, "after": ids[1].to_string() }),
    )
    .await;
    assert_eq!(next["afterNotPending"], true, "{next}");
    assert_eq!(
        reply_ids(&next),
        [ids[0], ids[2]],
        "seen again, never missed"
    );
    assert_eq!(next["more"], false);
}

#[tokio::test(start_paused = true)]
async fn poll_of_a_ticket_finds_its_reply_past_the_first_page() {
    let s = setup("");
    add_ann(&s.fleet).await;
    let sent = call(
        &s.fleet,
        "fleet_send",
        json!({ "target": "ann", "task": "t", "wait": false }),
    )
    .await
    .expect("sent");
    let ticket = Ticket::parse(sent["ticket"].as_str().expect("ticket")).expect("ticket");
    // Twelve 100 KiB replies of other work come first: more than one page of text.
    mail(&s.store, 12, 100 * 1024).await;
    let id = publish(&s.store, "the answer".to_owned(), Some(ticket)).await;
    let polled = poll(&s.fleet, json!({ "ticket": ticket.to_string() })).await;
    assert_eq!(polled["reply"]["msgId"], json!(id.to_string()), "{polled}");
    assert_eq!(polled["reply"]["text"], "the answer");
}

/// Sends `ann` a task without waiting; the ticket, or (code, message).
async fn send(fleet: &Fleet, task: &str) -> Result<Value, (String, String)> {
    call(
        fleet,
        "fleet_send",
        json!({ "target": "ann", "task": task, "wait": false }),
    )
    .await
}

/// Sends `task` to ann and asserts it is refused because her queue is full.
async fn assert_queue_full(fleet: &Fleet, task: &str) {
    let refused = send(fleet, task).await.expect_err("the queue is full");
    assert_eq!(refused.0, "queue_full", "{task}: {}", refused.1);
}

#[tokio::test(start_paused = true)]
async fn a_task_beyond_max_queued_tasks_is_refused_naming_the_cap_and_its_key() {
    let s = setup("limits:\n  maxQueuedTasks: 2\n");
    add_ann(&s.fleet).await;
    send(&s.fleet, "one").await.expect("under the cap");
    send(&s.fleet, "two").await.expect("at the cap");
    let (code, message) = send(&s.fleet, "three").await.expect_err("over the cap");
    assert_eq!(code, "queue_full");
    assert!(
        message.contains("limits.maxQueuedTasks = 2") && message.contains("ann"),
        "{message}"
    );
    // The member's agent connects: the first task is typed, which frees a place in the queue.
    s.fleet.engine.presence(ann()).await.expect("engine");
    tokio::time::sleep(Duration::from_millis(10)).await;
    send(&s.fleet, "three").await.expect("a place was freed");
    assert_queue_full(&s.fleet, "four").await;
}

#[tokio::test(start_paused = true)]
async fn the_queue_cap_follows_a_reload_and_drops_nothing_already_queued() {
    let s = setup("limits:\n  maxQueuedTasks: 1\n");
    add_ann(&s.fleet).await;
    send(&s.fleet, "one").await.expect("under the cap");
    assert_queue_full(&s.fleet, "two").await;
    s.config.publish(config("limits:\n  maxQueuedTasks: 3\n"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    send(&s.fleet, "two").await.expect("the new cap applies");
    send(&s.fleet, "three").await.expect("the new cap applies");
    assert_queue_full(&s.fleet, "four").await;
    s.config.publish(config("limits:\n  maxQueuedTasks: 1\n"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let listed = call(&s.fleet, "fleet_list", json!({})).await.expect("list");
    assert_eq!(
        listed["members"][0]["openTickets"].as_array().map(Vec::len),
        Some(3),
        "a lower cap drops nothing: {listed}"
    );
}

/// `fleet_ask` from ann that stops waiting after a second; its answer.
async fn ask(fleet: &Fleet, question: &str) -> Result<Value, (String, String)> {
    call_as(
        fleet,
        &as_ann(),
        "fleet_ask",
        json!({ "question": question, "waitSecs": 1 }),
    )
    .await
}

#[tokio::test(start_paused = true)]
async fn a_question_beyond_max_open_questions_is_refused_naming_the_cap_and_its_key() {
    let s = setup("limits:\n  maxOpenQuestions: 2\n  maxQueuedTasks: 1\n");
    add_ann(&s.fleet).await;
    let first = ask(&s.fleet, "which branch?").await.expect("asked");
    assert_eq!(first["status"], "pending");
    ask(&s.fleet, "which test?").await.expect("asked");
    let (code, message) = ask(&s.fleet, "which file?")
        .await
        .expect_err("over the cap");
    assert_eq!(code, "too_many_questions");
    assert!(message.contains("limits.maxOpenQuestions = 2"), "{message}");
    // The member's queue is full as well; the lead's answer still reaches it as a task (the
    // question is closed by then, so refusing the task would lose the answer).
    send(&s.fleet, "work").await.expect("under the queue cap");
    let answered = call(
        &s.fleet,
        "fleet_answer",
        json!({ "questionId": first["questionId"], "answer": "main" }),
    )
    .await
    .expect("answered");
    assert_eq!(answered["deliveredTo"], "task");
    ask(&s.fleet, "which file?")
        .await
        .expect("an answered question frees a place");
}

#[tokio::test(start_paused = true)]
async fn a_gateway_nobody_runs_is_refused_naming_the_known_ones_and_a_silent_known_one_is_noted() {
    let mut s = setup(
        "gateway:\n  name: a\n  broker:\n    urls: [amqp://rmq:5672/fleet]\n    passwordSecret: gw\n  peers:\n    c:\n      allow: [send]\nsecrets:\n  gw:\n    file: /run/gw\n",
    );
    s.fleet.peers = crate::gateway::presence::Peers::new(
        fleetd_core::gateway::GatewayName::new("a".to_owned()).expect("name"),
    );
    // b answered a spawn: heard from, and its member listed at once.
    s.fleet.peers.spawned(
        "b",
        crate::gateway::presence::PeerMember {
            name: "rem".to_owned(),
            profile: "sim".to_owned(),
            status: "idle".to_owned(),
            pane: "w1:p2".to_owned(),
            open_tickets: 0,
        },
        10,
    );
    assert!(
        s.fleet
            .peers
            .members()
            .iter()
            .any(|m| m["target"] == "rem@b" && m["stale"] == false),
        "{:?}",
        s.fleet.peers.members()
    );
    // A typo: refused before anything is queued, naming the gateways that exist.
    let (code, message) = call(
        &s.fleet,
        "fleet_send",
        json!({ "target": "ann@zed", "task": "work", "wait": false }),
    )
    .await
    .expect_err("unknown gateway");
    assert_eq!(code, "unknown_gateway");
    assert!(message.contains("known: b, c"), "{message}");
    assert!(message.contains("this one is a"), "{message}");
    let (code, _) = call(
        &s.fleet,
        "fleet_spawn",
        json!({ "profile": "sim", "gateway": "zed" }),
    )
    .await
    .expect_err("unknown gateway");
    assert_eq!(code, "unknown_gateway");
    // Known: itself and a live peer pass silently; a configured peer never heard from, and one
    // silent past three of its beats, pass with a note.
    assert_eq!(super::gateway_known(&s.fleet, "a").ok(), Some(None));
    assert_eq!(super::gateway_known(&s.fleet, "b").ok(), Some(None));
    let note = super::gateway_known(&s.fleet, "c")
        .ok()
        .flatten()
        .expect("a note");
    assert!(
        note.contains("not been heard from since this fleetd started"),
        "{note}"
    );
    tokio::time::advance(std::time::Duration::from_secs(31)).await;
    let note = super::gateway_known(&s.fleet, "b")
        .ok()
        .flatten()
        .expect("a note");
    assert!(note.contains("not been heard from for 31 s"), "{note}");
}

#[tokio::test(start_paused = true)]
async fn a_member_past_its_share_of_calls_under_way_is_refused_and_others_are_not() {
    let s = setup("connections:\n  max: 16\n  perMember: 2\n");
    add_ann(&s.fleet).await;
    // Attack C2: ann holds two waiting calls (questions nobody answers yet).
    let waiting: Vec<_> = (0..2)
        .map(|n| {
            let fleet = s.fleet.clone();
            tokio::spawn(async move {
                call_as(
                    &fleet,
                    &as_ann(),
                    "fleet_ask",
                    json!({ "question": format!("q{n}?"), "waitSecs": 30 }),
                )
                .await
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(s.fleet.calls.under_way(&ann()), 2);
    let (code, message) = ask(&s.fleet, "a third?").await.expect_err("past its share");
    assert_eq!(code, "too_many_calls");
    assert!(message.contains("connections.perMember = 2"), "{message}");
    // The lead (here the operator) is not held up, and answers one question.
    let questions = call(&s.fleet, "fleet_poll", json!({ "target": "ann" }))
        .await
        .expect("the lead polls");
    let id = questions["questions"][0]["questionId"]
        .as_str()
        .expect("a question")
        .to_owned();
    call(
        &s.fleet,
        "fleet_answer",
        json!({ "questionId": id, "answer": "yes" }),
    )
    .await
    .expect("answered");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        s.fleet.calls.under_way(&ann()),
        1,
        "the answered call ended"
    );
    call_as(
        &s.fleet,
        &as_ann(),
        "fleet_reply",
        json!({ "text": "done" }),
    )
    .await
    .map(|_| ())
    .or_else(|(code, _)| {
        if code == "too_many_calls" {
            Err(code)
        } else {
            Ok(())
        }
    })
    .expect("a place is free again");
    for call in waiting {
        call.abort();
    }
}

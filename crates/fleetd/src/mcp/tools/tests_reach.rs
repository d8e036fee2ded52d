//! A delegating member's reach, through `tools::call` as the MCP and REST doors call
//! it: `fleet_stop`, `fleet_ack`, `fleet_answer` and `fleet_poll{target}` act only on members of
//! its subtree (those whose chain of delegating leads includes it), and refuse any other with
//! `not_your_member`, changing nothing; the operator keeps its full powers.

use std::time::Duration;

use fleetd_core::access::Role;
use fleetd_core::{AgentStatus, MsgId, Target};
use serde_json::{Value, json};

use super::tests::{Setup, call_as, setup};
use crate::engine::{LeadRef, NewMember};
use crate::mcp::Caller;
use crate::store::InboxStore;
use crate::test_support::{caller, member_names, new_member, qualified};

fn t(name: &str) -> Target {
    Target::new(name).expect("target")
}

/// Member `name` in pane `w3:pN` (all delegating), reporting to member `lead`'s pane if given.
async fn add(s: &Setup, name: &str, n: u32, lead: Option<(&str, u32)>) {
    let p = format!("w3:p{n}");
    s.fake.add_pane(
        &p,
        &format!("t-{name}"),
        &format!("w3:t{n}"),
        AgentStatus::Idle,
    );
    s.fleet
        .engine
        .add_member(NewMember {
            allow_delegation: true,
            lead: lead.map(|(lead, n)| LeadRef {
                pane: qualified(&format!("w3:p{n}")),
                terminal: fleetd_core::TerminalId::new(format!("t-{lead}")).expect("terminal"),
            }),
            ..new_member(name, &p, &format!("t-{name}"))
        })
        .await
        .expect("engine");
}

/// mid → sub → deep (each the delegating lead of the next), and sib beside mid.
async fn tree() -> Setup {
    let s = setup("");
    add(&s, "mid", 1, None).await;
    add(&s, "sub", 2, Some(("mid", 1))).await;
    add(&s, "deep", 3, Some(("sub", 2))).await;
    add(&s, "sib", 4, None).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    s
}

fn member(name: &str) -> Caller {
    caller(Role::Member {
        target: t(name),
        allow_delegation: true,
    })
}

fn operator() -> Caller {
    caller(Role::Operator)
}

/// A reply from `target`, stored and made known to the engine as a reply is.
async fn reply_from(s: &Setup, target: &str, text: &str) -> MsgId {
    let message = crate::test_support::reply_from(target, None, text);
    let id = message.msg_id;
    s.store.publish(message).await.expect("publish");
    s.fleet
        .engine
        .inbox_changed(t(target))
        .await
        .expect("engine");
    tokio::time::sleep(Duration::from_millis(10)).await;
    id
}

fn refused(outcome: Result<Value, (String, String)>, target: &str) {
    let (code, message) = outcome.expect_err("refused");
    assert_eq!(code, "not_your_member", "{message}");
    assert!(
        message.contains(&format!("{target} is not in your delegation tree")),
        "{message}"
    );
    assert!(message.contains("subtree"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_delegating_member_stops_only_members_of_its_subtree() {
    let s = tree().await;
    let stop = |who: Caller, target: &str| {
        let fleet = s.fleet.clone();
        let args = json!({ "target": target });
        async move { call_as(&fleet, &who, "fleet_stop", args).await }
    };
    refused(stop(member("mid"), "sib").await, "sib");
    refused(stop(member("mid"), "mid").await, "mid");
    refused(stop(member("sub"), "mid").await, "mid");
    refused(stop(member("sib"), "sub").await, "sub");
    refused(stop(member("mid"), "nobody").await, "nobody");
    assert_eq!(
        member_names(&s.fleet.engine).await,
        ["deep", "mid", "sib", "sub"],
        "nothing stopped"
    );
    // Its subtree: a grandchild too.
    stop(member("mid"), "deep")
        .await
        .expect("deep is under mid");
    stop(operator(), "sib")
        .await
        .expect("the operator stops anyone");
    assert_eq!(member_names(&s.fleet.engine).await, ["mid", "sub"]);
}

#[tokio::test(start_paused = true)]
async fn a_delegating_member_reads_and_acknowledges_only_its_subtrees_inbox() {
    let s = tree().await;
    let sib_reply = reply_from(&s, "sib", "sib's secret plan").await;
    let sub_reply = reply_from(&s, "sub", "sub's report").await;
    let poll = |who: Caller, target: &str| {
        let fleet = s.fleet.clone();
        let args = json!({ "target": target });
        async move { call_as(&fleet, &who, "fleet_poll", args).await }
    };
    let ack = |who: Caller, target: &str, id: MsgId| {
        let fleet = s.fleet.clone();
        let args = json!({ "target": target, "msgId": id });
        async move { call_as(&fleet, &who, "fleet_ack", args).await }
    };
    refused(poll(member("mid"), "sib").await, "sib");
    refused(poll(member("mid"), "mid").await, "mid");
    refused(ack(member("mid"), "sib", sib_reply).await, "sib");
    let still = s.store.peek(&t("sib"), 10).await.expect("peek");
    assert_eq!(still.len(), 1, "sib's reply is still there");
    // Its own member's inbox: read and acknowledged.
    let page = poll(member("mid"), "sub").await.expect("sub is mid's");
    assert_eq!(page["replies"][0]["text"], "sub's report");
    let acked = ack(member("mid"), "sub", sub_reply)
        .await
        .expect("sub is mid's");
    assert_eq!(acked["acked"][0]["acked"], true);
    // A released member's mail is still its delegating lead's to read.
    let last = reply_from(&s, "deep", "deep's last words").await;
    call_as(
        &s.fleet,
        &operator(),
        "fleet_stop",
        json!({ "target": "deep" }),
    )
    .await
    .expect("stopped");
    let page = poll(member("mid"), "deep")
        .await
        .expect("deep's mail is mid's");
    assert!(
        page["replies"]
            .as_array()
            .is_some_and(|r| r.iter().any(|m| m["msgId"] == json!(last))),
        "{page}"
    );
    refused(poll(member("sib"), "deep").await, "deep");
    // The operator reads anyone's.
    let page = poll(operator(), "sib").await.expect("operator");
    assert_eq!(page["replies"][0]["text"], "sib's secret plan");
}

#[tokio::test(start_paused = true)]
async fn a_delegating_member_answers_only_its_subtrees_questions() {
    let s = tree().await;
    let ask = |who: &str, question: &str| {
        let fleet = s.fleet.clone();
        let args = json!({ "question": question, "waitSecs": 1 });
        let who = member(who);
        async move { call_as(&fleet, &who, "fleet_ask", args).await }
    };
    let sibs = ask("sib", "which branch?").await.expect("asked");
    let subs = ask("sub", "which test?").await.expect("asked");
    let answer = |who: Caller, question: &Value| {
        let fleet = s.fleet.clone();
        let args = json!({ "questionId": question["questionId"], "answer": "main" });
        async move { call_as(&fleet, &who, "fleet_answer", args).await }
    };
    refused(answer(member("mid"), &sibs).await, "sib");
    let open = s
        .fleet
        .engine
        .questions(Some(t("sib")))
        .await
        .expect("engine");
    assert_eq!(open.len(), 1, "sib's question is still open");
    let answered = answer(member("mid"), &subs).await.expect("sub is mid's");
    assert_eq!(answered["deliveredTo"], "task");
    answer(operator(), &sibs)
        .await
        .expect("the operator answers anyone");
    // An unknown question is still called unknown.
    let (code, _) = call_as(
        &s.fleet,
        &member("mid"),
        "fleet_answer",
        json!({ "questionId": "no-such", "answer": "x" }),
    )
    .await
    .expect_err("unknown");
    assert_eq!(code, "unknown_question");
}

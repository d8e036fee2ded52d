//! Tests of the CLI's daemon discovery and output.

use super::*;

fn rendered(f: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> String {
    let mut out = Vec::new();
    f(&mut out).expect("writes");
    String::from_utf8(out).expect("utf-8")
}

#[test]
fn status_is_an_aligned_table() {
    let body = json!({ "members": [
        { "target": "alice", "profile": "sim", "paneId": "lead:%3", "status": "idle",
          "inboxDepth": 2, "openTickets": [], "lead": null },
        { "target": "bo", "profile": "cheap-model", "paneId": "member:w1:p12", "status": "working",
          "inboxDepth": 0, "openTickets": ["t1"], "lead": "lead:w1:p1",
          "usage": { "totalTokens": 12345, "costUsd": 0.0412, "budget": "12,345 of 100,000 tokens" },
          "treeUsage": { "totalTokens": 40100, "costUsd": 0.12 } },
        { "target": "cy", "profile": "apart", "paneId": "member:w1:p13", "status": "idle",
          "inboxDepth": 0, "openTickets": [], "lead": "lead:w1:p1", "runAs": "fleet-agent" },
    ]});
    let text = rendered(|out| status::render(&body, out));
    assert_eq!(
        text,
        "TARGET  PROFILE                 PANE           STATUS   INBOX  OPEN  LEAD        MODEL\n\
         alice   sim                     lead:%3        idle     2      0     -           -\n\
         bo      cheap-model             member:w1:p12  working  0      1     lead:w1:p1  12.3k tok $0.04 (tree 40.1k tok $0.12) [12,345 of 100,000 tokens]\n\
         cy      apart (as fleet-agent)  member:w1:p13  idle     0      0     lead:w1:p1  -\n"
    );
}

#[test]
fn empty_answers_say_so() {
    let text = rendered(|out| status::render(&json!({ "members": [] }), out));
    assert!(text.starts_with("no members"), "{text}");
    let text = rendered(|out| render_inbox("alice", &json!({ "replies": [] }), out));
    assert_eq!(text, "alice: no replies waiting\n");
}

#[test]
fn an_inbox_page_with_more_says_how_to_read_the_next() {
    let id = "019b0000-0000-7000-8000-000000000001";
    let body = json!({ "more": true, "replies": [
        { "msgId": id, "kind": "reply", "ticket": null, "text": "done", "createdAt": "t" }
    ] });
    let text = rendered(|out| render_inbox("alice", &body, out));
    assert!(text.starts_with("alice: 1 reply on this page"), "{text}");
    assert!(
        text.ends_with(&format!("`fleetd inbox alice --after {id}`\n")),
        "{text}"
    );
    let (_, path, _, _) = route(&Request::Inbox {
        target: "alice".into(),
        after: Some(id.into()),
        limit: Some(5),
    })
    .expect("routed");
    assert_eq!(path, format!("/sessions/alice/replies?after={id}&limit=5"));
    let err = route(&Request::Inbox {
        target: "alice".into(),
        after: Some("nope".into()),
        limit: None,
    })
    .expect_err("refused");
    assert!(err.to_string().contains("--after"), "{err}");
}

#[test]
fn send_without_a_reply_only_succeeds_without_wait() {
    let send = |wait| Request::Send {
        target: "alice".into(),
        task: "x".into(),
        wait,
        timeout_secs: 1,
    };
    let queued = json!({ "ticket": "t", "status": "working" });
    assert!(settled_ok(&send(false), &queued));
    assert!(!settled_ok(&send(true), &queued));
    assert!(settled_ok(
        &send(true),
        &json!({ "ticket": "t", "status": "replied", "reply": "done" })
    ));
}

#[test]
fn bad_names_are_refused_before_any_request() {
    let err = route(&Request::Inbox {
        target: "../etc".into(),
        after: None,
        limit: None,
    })
    .expect_err("refused");
    assert!(matches!(err, ClientError::Argument(_)), "{err}");
    let err = route(&Request::Ack {
        target: "alice".into(),
        msg_id: "nope".into(),
    })
    .expect_err("refused");
    assert!(err.to_string().contains("nope"), "{err}");
}

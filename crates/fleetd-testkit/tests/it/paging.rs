//! End to end (issue 15): the built daemon pages through a deep inbox of the largest replies it
//! accepts — via `fleet_poll` over MCP, via `GET /sessions/{t}/replies`, and emptied by the drain
//! route — seeing every reply exactly once and in order, while its peak RSS (`VmHWM`) stays
//! bounded. The inbox is filled through the embedded store before the daemon starts (the daemon
//! reads the same file), so the test measures reading, not 1 GB of MCP uploads.
//!
//! CI runs 200 replies and one reader; `FLEETD_E2E_PAGING_REPLIES=1000` runs the full
//! thousand, and `FLEETD_E2E_PAGING_READERS=8` pages through `fleet_poll` with 8 readers at once
//! (the 8 parallel polls). Only a generous memory bound is asserted (unpaged, one answer
//! of 100 such replies was ~105 MB, and 8 at once took the daemon to 2.1 GiB); the measured peaks
//! are printed.

use fleetd::store::{self, StoreOptions, StoreSpec};
use fleetd_core::{Message, MessageKind, MessageLimits, MsgId, Target};
use fleetd_testkit::daemon::{Daemon, state_dir};
use fleetd_testkit::http::{self, Endpoint};
use serde_json::{Value, json};

/// Replies in CI's run; the acceptance is 1,000 (set the variable below).
const SHORT_REPLIES: usize = 200;
/// Sets how many replies the run queues.
const REPLIES_VAR: &str = "FLEETD_E2E_PAGING_REPLIES";
/// Sets how many readers page through `fleet_poll` at once (default 1).
const READERS_VAR: &str = "FLEETD_E2E_PAGING_READERS";
/// A paged daemon needs a few pages' worth on top of its ~20 MiB baseline; an unpaged one held
/// hundreds of MiB per answer. Far from both, so it cannot flake.
const RSS_BOUND_KIB: u64 = 512 * 1024;
/// Bytes of reply text in one answer (fleet_poll's budget).
const PAGE_BYTES: usize = 1024 * 1024;

/// A positive count from the environment variable `var`, else `default`.
fn count_from(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// A reply of exactly the largest accepted size whose first bytes say which one it is.
fn reply_text(n: usize) -> String {
    let mut text = format!("reply {n:06} ");
    text.push_str(&"x".repeat(MessageLimits::DEFAULT_MAX_MESSAGE_BYTES - text.len()));
    text
}

/// Queues `count` replies for `target` in the embedded inbox a daemon in `home` will open, one
/// publish after the other (so the store's order is the order of the returned ids).
#[expect(
    clippy::disallowed_methods,
    reason = "fresh, ordered msgIds for messages written before any daemon runs"
)]
fn queue_replies(home: &std::path::Path, target: &Target, count: usize) -> Vec<MsgId> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let spec = StoreSpec::Embedded {
            path: state_dir(home).join("inbox.db"),
        };
        let inbox = store::open(&spec, &StoreOptions::default())
            .await
            .expect("open the daemon's inbox");
        let mut ids = Vec::with_capacity(count);
        for n in 0..count {
            let message = Message {
                msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
                target: target.clone(),
                ticket: None,
                kind: MessageKind::Reply,
                text: reply_text(n),
                from: target.to_string(),
                created_at: jiff::Timestamp::from_second(1_700_000_000).expect("valid"),
            };
            ids.push(message.msg_id);
            inbox.publish(message).await.expect("publish");
        }
        inbox.close().await.expect("close");
        ids
    })
}

/// The daemon's peak resident set so far, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status")
}

/// An MCP tool call as the operator; its `structuredContent`.
fn tool(to: &Endpoint, name: &str, args: &Value) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": { "name": name, "arguments": args } });
    let response = http::request(to, "POST", "/mcp", Some(&body.to_string())).expect("answers");
    let value = response.json();
    assert_eq!(value["result"]["isError"], false, "{name} {args}: {value}");
    value["result"]["structuredContent"].clone()
}

/// One page's replies checked against what was queued (`expected[seen..]`): their ids, their
/// size, and the page's budget. Returns how many it held.
fn check_page(page: &Value, expected: &[MsgId], seen: usize, how: &str) -> usize {
    let replies = page["replies"].as_array().expect("replies");
    let mut bytes = 0;
    for (i, reply) in replies.iter().enumerate() {
        let n = seen + i;
        let text = reply["text"].as_str().expect("text");
        assert_eq!(
            reply["msgId"],
            json!(expected[n].to_string()),
            "{how}: reply {n} out of order or repeated"
        );
        assert!(
            text.starts_with(&format!("reply {n:06} ")),
            "{how}: reply {n}"
        );
        assert_eq!(text.len(), MessageLimits::DEFAULT_MAX_MESSAGE_BYTES);
        bytes += text.len();
    }
    assert!(
        bytes <= PAGE_BYTES || replies.len() == 1,
        "{how}: {bytes} bytes in {} replies",
        replies.len()
    );
    replies.len()
}

/// Pages through the whole inbox with `next(after)` and checks every reply is seen once, in
/// order; returns the number of pages.
fn page_through(
    expected: &[MsgId],
    how: &str,
    mut next: impl FnMut(Option<&str>) -> Value,
) -> usize {
    let mut seen = 0;
    let mut pages = 0;
    let mut after: Option<String> = None;
    loop {
        let page = next(after.as_deref());
        pages += 1;
        assert!(page.get("afterNotPending").is_none(), "{how}: cursor lost");
        seen += check_page(&page, expected, seen, how);
        after = page["replies"]
            .as_array()
            .and_then(|r| r.last())
            .map(|r| r["msgId"].as_str().expect("msgId").to_owned());
        if page["more"] == false {
            break;
        }
        assert!(after.is_some(), "{how}: more, but an empty page");
    }
    assert_eq!(seen, expected.len(), "{how}: every reply seen");
    pages
}

#[test]
fn e2e_paging_a_deep_inbox_of_1_mib_replies_keeps_the_daemon_small() {
    let count = count_from(REPLIES_VAR, SHORT_REPLIES);
    let readers = count_from(READERS_VAR, 1);
    let home = tempfile::tempdir().expect("tempdir");
    let bulk = Target::new("bulk").expect("target");
    let expected = queue_replies(home.path(), &bulk, count);
    let daemon = Daemon::start(home.path(), &[]);
    let pid = daemon.child.id();
    let operator = daemon.operator();
    let started = peak_rss_kib(pid);

    // The tool's schema offers the paging arguments.
    let listed = http::request(
        &operator,
        "POST",
        "/mcp",
        Some(&json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }).to_string()),
    )
    .expect("answers")
    .json();
    let poll = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "fleet_poll")
        .expect("fleet_poll listed")
        .clone();
    for arg in ["limit", "after"] {
        assert!(
            poll["inputSchema"]["properties"].get(arg).is_some(),
            "{poll}"
        );
    }

    // fleet_poll over MCP, the way a lead pages: after = the last msgId seen, nothing acked;
    // `readers` leads at once, each seeing everything.
    let pages = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..readers)
            .map(|_| {
                scope.spawn(|| {
                    page_through(&expected, "fleet_poll", |after| {
                        let mut args = json!({ "target": "bulk", "limit": 100 });
                        if let Some(after) = after {
                            args["after"] = json!(after);
                        }
                        tool(&operator, "fleet_poll", &args)
                    })
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().expect("a reader"))
            .max()
            .unwrap_or(0)
    });
    let after_mcp = peak_rss_kib(pid);

    // The REST route, same pages; a bad limit is refused naming it.
    let refused = http::get(&operator, "/sessions/bulk/replies?limit=0").expect("answers");
    assert_eq!(
        (refused.status, refused.error_code().as_str()),
        (400, "invalid_arguments")
    );
    assert!(refused.body.contains("`limit`"), "{}", refused.body);
    page_through(&expected, "GET /replies", |after| {
        let path = match after {
            Some(after) => format!("/sessions/bulk/replies?limit=100&after={after}"),
            None => "/sessions/bulk/replies?limit=100".to_owned(),
        };
        let response = http::get(&operator, &path).expect("answers");
        assert_eq!(response.status, 200, "{}", response.body);
        response.json()
    });
    let after_rest = peak_rss_kib(pid);

    // The drain route empties it a page at a time: each page is the oldest left, then acked.
    page_through(&expected, "drain", |_| {
        let response = http::request(
            &operator,
            "POST",
            "/sessions/bulk/replies/drain?limit=100",
            None,
        )
        .expect("answers");
        assert_eq!(response.status, 200, "{}", response.body);
        response.json()
    });
    let empty = tool(&operator, "fleet_poll", &json!({ "target": "bulk" }));
    assert_eq!(empty["replies"], json!([]), "{empty}");
    let peak = peak_rss_kib(pid);

    println!(
        "paging {count} replies of 1 MiB ({pages} pages each way): fleetd VmHWM {started} KiB at start, \
         {after_mcp} KiB after fleet_poll ({readers} at once), {after_rest} KiB after GET /replies, \
         {peak} KiB after drain"
    );
    assert!(
        peak < RSS_BOUND_KIB,
        "fleetd's peak RSS {peak} KiB is not bounded by a page ({RSS_BOUND_KIB} KiB allowed)"
    );
    drop(daemon);
}

//! End-to-end tests of the MCP bridge (issue 5): the built `fleetd`, real tmux, `sim-agent`
//! members spawned through `fleet_spawn`, and a lead pane calling tools over real HTTP.

use std::time::Duration;

use fleetd_testkit::rig::{Rig, error_code, sim_profile, structured_ok};
use fleetd_testkit::{Service, http, require_tmux, wait_until};
use serde_json::{Value, json};

fn rig(profiles: &[(&str, &[(&str, &str)])]) -> Option<Rig> {
    rig_with("", profiles)
}

fn rig_with(extra: &str, profiles: &[(&str, &[(&str, &str)])]) -> Option<Rig> {
    // The lead pane is a shell running mcp-call: it must never be nudged (typed-in text would
    // corrupt the next command), so the push budget is zero here; push tests use agent leads.
    let mut yaml = format!("primary:\n  tab: base:lead\n  pushReminders: 0\n{extra}profiles:\n");
    for (name, env) in profiles {
        yaml.push_str(&sim_profile(name, env));
    }
    Rig::start_if_tmux(&yaml)
}

/// A rig whose one profile is `profile`, a sim-agent with `env`, and a member `member` spawned
/// from it.
fn rig_with_member(member: &str, profile: &str, env: &[(&str, &str)]) -> Option<Rig> {
    let rig = rig(&[(profile, env)])?;
    rig.spawn(profile, member);
    Some(rig)
}

fn poll_until(rig: &Rig, args: &Value, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_until(what, Duration::from_secs(90), || {
        last = structured_ok(&rig.lead("fleet_poll", args));
        cond(&last)
    });
    last
}

#[test]
fn e2e_send_waits_for_the_reply() {
    let Some(rig) = rig(&[("sim", &[("SIM_AGENT_WORK_MS", "300")])]) else {
        return;
    };
    let spawned = rig.spawn("sim", "alice");
    assert_eq!(spawned["target"], "alice");
    assert!(
        spawned["paneId"]
            .as_str()
            .is_some_and(|p| p.starts_with("lead:%")),
        "{spawned}"
    );
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "alice", "task": "count the files" }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"], "sim-agent did: count the files");
    // The waiter acknowledged it: nothing left to read.
    let inbox = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "alice" })));
    assert_eq!(inbox["replies"], json!([]), "{inbox}");
    let alice = rig.member("alice");
    assert_eq!(alice["connected"], true, "{alice}");
}

#[test]
fn e2e_send_without_wait_then_poll_the_ticket() {
    let Some(rig) = rig_with_member("bob", "sim", &[]) else {
        return;
    };
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "bob", "task": "lint", "wait": false }),
    ));
    assert_eq!(sent["status"], "queued");
    let ticket = sent["ticket"].as_str().expect("ticket").to_owned();
    let polled = poll_until(&rig, &json!({ "ticket": ticket }), "ticket replied", |v| {
        v["state"] == "replied"
    });
    assert_eq!(polled["reply"]["text"], "sim-agent did: lint");
    let msg_id = polled["reply"]["msgId"].as_str().expect("msgId").to_owned();
    let acked = structured_ok(&rig.lead("fleet_ack", &json!({ "target": "bob", "msgId": msg_id })));
    assert_eq!(acked["acked"][0]["acked"], true);
    let again = structured_ok(&rig.lead("fleet_ack", &json!({ "target": "bob", "msgId": msg_id })));
    assert_eq!(
        again["acked"][0]["acked"], false,
        "acking twice is not an error"
    );
}

#[test]
fn e2e_busy_member_gets_queued_tasks_in_order() {
    let Some(rig) = rig_with_member("cy", "slow", &[("SIM_AGENT_WORK_MS", "1500")]) else {
        return;
    };
    let tickets: Vec<String> = ["one", "two", "three"]
        .iter()
        .map(|task| rig.send_task("cy", task))
        .collect();
    let inbox = poll_until(&rig, &json!({ "target": "cy" }), "three replies", |v| {
        v["replies"].as_array().is_some_and(|r| r.len() == 3)
    });
    // Field `name` of each reply, in the inbox's order.
    let of_each = |name: &str| -> Vec<String> {
        let replies = inbox["replies"].as_array().expect("replies");
        replies
            .iter()
            .map(|r| r[name].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(
        of_each("text"),
        [
            "sim-agent did: one",
            "sim-agent did: two",
            "sim-agent did: three"
        ]
    );
    assert_eq!(of_each("ticket"), tickets);
}

#[test]
fn e2e_silent_turn_ends_without_reply_with_the_pane_tail() {
    // The turn outlasts two of tmux's 400 ms status polls: the only sign of a silent turn is
    // the status, and a shorter one can fall between two polls and read as never started.
    let Some(rig) = rig_with_member(
        "dex",
        "mute",
        &[
            ("SIM_AGENT_SCRIPT", "silent"),
            ("SIM_AGENT_WORK_MS", "1200"),
        ],
    ) else {
        return;
    };
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "dex", "task": "think quietly" }),
    ));
    assert_eq!(sent["status"], "ended_without_reply", "{sent}");
    let tail = sent["reply"].as_str().expect("fallback text");
    assert!(tail.contains("ended without fleet_reply"), "{tail}");
    assert!(
        tail.contains("think quietly"),
        "the tail shows the pane: {tail}"
    );
}

#[test]
fn e2e_question_is_answered_by_the_lead() {
    let Some(rig) = rig_with_member(
        "eve",
        "curious",
        &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "200")],
    ) else {
        return;
    };
    let ticket = rig.send_task("eve", "deploy");
    let question = rig.question_from("eve");
    assert_eq!(question["question"], "sim-agent asks about: deploy");
    let answered = structured_ok(&rig.lead(
        "fleet_answer",
        &json!({ "questionId": question["questionId"], "answer": "use staging" }),
    ));
    assert_eq!(answered["deliveredTo"], "waiter");
    let reply = rig.reply_of(&ticket);
    assert!(
        reply.contains("use staging"),
        "the reply after the answer: {reply}"
    );
}

#[test]
fn e2e_reply_outlives_its_waiter_until_acked() {
    let Some(rig) = rig_with_member("fay", "slow", &[("SIM_AGENT_WORK_MS", "4000")]) else {
        return;
    };
    // The waiter gives up first: the reply must land in the inbox.
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "fay", "task": "a", "timeoutSecs": 1 }),
    ));
    assert!(
        matches!(
            sent["status"].as_str(),
            Some("working" | "delivered" | "queued")
        ),
        "{sent}"
    );
    // A second waiter's connection is dropped (its process killed) mid-wait.
    let out = rig.lead_async("fleet_send", &json!({ "target": "fay", "task": "b" }));
    wait_until(
        "the second task to be submitted",
        Duration::from_secs(60),
        || {
            http::get(rig.daemon.operator(), "/sessions/fay").is_ok_and(|r| {
                r.json()["openTickets"]
                    .as_array()
                    .is_some_and(|t| t.len() == 2)
            })
        },
    );
    rig.tmux
        .run(&["send-keys", "-t", fleetd_testkit::rig::LEAD, "C-c", ""])
        .expect("tmux");
    let inbox = poll_until(
        &rig,
        &json!({ "target": "fay" }),
        "both replies in the inbox",
        |v| v["replies"].as_array().is_some_and(|r| r.len() == 2),
    );
    assert!(!out.exists(), "the killed call wrote nothing");
    let ids: Vec<Value> = inbox["replies"]
        .as_array()
        .expect("replies")
        .iter()
        .map(|r| r["msgId"].clone())
        .collect();
    structured_ok(&rig.lead("fleet_ack", &json!({ "target": "fay", "msgIds": ids })));
    let after = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "fay" })));
    assert_eq!(after["replies"], json!([]));
}

#[test]
fn e2e_identity_is_decided_by_the_connection() {
    let Some(rig) = rig_with_member("gus", "sim", &[]) else {
        return;
    };
    // The test process is in no pane: read-only tools work, the rest are refused.
    let anon = mcp_http(
        rig.daemon.addr,
        "fleet_send",
        &json!({ "target": "gus", "task": "x" }),
    );
    assert_eq!(error_code(&anon), "anonymous_caller");
    let anon_list = mcp_http(rig.daemon.addr, "fleet_list", &json!({}));
    assert_eq!(anon_list["isError"], false);
    // A lead may not answer as a member, whatever it claims.
    let as_member = rig.lead(
        "fleet_reply",
        &json!({ "text": "I am gus", "target": "gus" }),
    );
    assert_eq!(error_code(&as_member), "not_a_member");
    let as_member = rig.lead("fleet_reply", &json!({ "text": "I am gus" }));
    assert_eq!(error_code(&as_member), "not_a_member");
    let inbox = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "gus" })));
    assert_eq!(
        inbox["replies"],
        json!([]),
        "nothing was stored in gus's name"
    );
}

#[test]
fn e2e_hostile_input_gets_clear_errors_and_nothing_raw_reaches_a_pane() {
    let Some(rig) = rig_with_member("hal", "sim", &[]) else {
        return;
    };
    let task = "title\u{1b}]0;pwned\u{7} and \u{1b}[31mred\u{1b}[0m\u{1b}[2J text";
    let sent = structured_ok(&rig.lead("fleet_send", &json!({ "target": "hal", "task": task })));
    assert_eq!(sent["reply"], "sim-agent did: title and red text", "{sent}");
    let huge = "x".repeat(10 * 1024 * 1024);
    let too_big = rig.lead("fleet_send", &json!({ "target": "hal", "task": huge }));
    assert_eq!(error_code(&too_big), "task_too_large");
    assert!(
        too_big["structuredContent"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("1048576"))
    );
    assert_eq!(
        error_code(&rig.lead("fleet_nope", &json!({}))),
        "unknown_tool"
    );
    assert_eq!(
        error_code(&rig.lead("fleet_send", &json!({ "target": 7, "task": [] }))),
        "invalid_arguments"
    );
    assert_eq!(
        error_code(&rig.lead("fleet_send", &json!({ "target": "Bad Name", "task": "x" }))),
        "invalid_target"
    );
    assert_eq!(
        error_code(&rig.lead("fleet_send", &json!({ "target": "nobody", "task": "x" }))),
        "unknown_target"
    );
    let garbage =
        http::request(rig.daemon.addr, "POST", "/mcp", Some("{not json")).expect("answers");
    assert!(
        (400..500).contains(&garbage.status) && garbage.body.contains("deserialize"),
        "{} {}",
        garbage.status,
        garbage.body
    );
    // The daemon is still fine.
    assert_eq!(
        mcp_http(rig.daemon.addr, "fleet_list", &json!({}))["isError"],
        false
    );
}

#[test]
fn e2e_rest_sessions_and_replies() {
    let Some(rig) = rig_with_member("ivy", "sim", &[]) else {
        return;
    };
    structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "ivy", "task": "r1", "timeoutSecs": 0 }),
    ));
    wait_until("a pending reply over REST", Duration::from_secs(60), || {
        http::get(rig.daemon.operator(), "/sessions/ivy/replies")
            .is_ok_and(|r| r.json()["replies"].as_array().is_some_and(|a| a.len() == 1))
    });
    let sessions = http::get(rig.daemon.operator(), "/sessions")
        .expect("sessions")
        .json();
    assert_eq!(sessions["members"][0]["target"], "ivy");
    assert_eq!(sessions["members"][0]["inboxDepth"], 1);
    let peek = http::get(rig.daemon.operator(), "/sessions/ivy/replies")
        .expect("peek")
        .json();
    let id = peek["replies"][0]["msgId"]
        .as_str()
        .expect("msgId")
        .to_owned();
    let again = http::get(rig.daemon.operator(), "/sessions/ivy/replies")
        .expect("peek")
        .json();
    assert_eq!(
        again["replies"].as_array().map(Vec::len),
        Some(1),
        "peek is non-destructive"
    );
    let acked = http::request(
        rig.daemon.operator(),
        "POST",
        &format!("/sessions/ivy/replies/{id}/ack"),
        None,
    )
    .expect("ack");
    assert_eq!(acked.json()["acked"], true);
    // A GET never removes anything; the drain is a POST.
    let refused =
        http::get(rig.daemon.operator(), "/sessions/ivy/replies?drain=true").expect("answers");
    assert_eq!(refused.status, 400);
    assert_eq!(refused.error_code(), "drain_is_post");
    structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "ivy", "task": "r2", "timeoutSecs": 0 }),
    ));
    wait_until("the second reply", Duration::from_secs(60), || {
        http::reply_texts(rig.daemon.operator(), "ivy").len() == 1
    });
    let drained = http::request(
        rig.daemon.operator(),
        "POST",
        "/sessions/ivy/replies/drain",
        None,
    )
    .expect("drain")
    .json();
    assert_eq!(drained["drained"], true);
    assert_eq!(drained["replies"].as_array().map(Vec::len), Some(1));
    assert!(http::reply_texts(rig.daemon.operator(), "ivy").is_empty());
    assert_eq!(
        http::get(rig.daemon.operator(), "/sessions/nobody")
            .expect("404")
            .status,
        404
    );
}

/// A tool call over HTTP from the test process itself (no pane: anonymous).
fn mcp_http(addr: std::net::SocketAddr, tool: &str, args: &Value) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": tool, "arguments": args } });
    let resp = http::request(addr, "POST", "/mcp", Some(&body.to_string())).expect("mcp answers");
    let v: Value =
        serde_json::from_str(&resp.body).unwrap_or_else(|e| panic!("{e}: {}", resp.body));
    v["result"].clone()
}

/// What fleetd answered a member that called `tool` with `args` (the member replies with it).
fn member_calls(rig: &Rig, member: &str, tool: &str, args: &Value) -> Value {
    let task = format!("{tool} {args}");
    let sent = structured_ok(&rig.lead("fleet_send", &json!({ "target": member, "task": task })));
    assert_eq!(sent["status"], "replied", "{sent}");
    serde_json::from_str(sent["reply"].as_str().expect("reply text")).expect("a tool result")
}

#[test]
fn e2e_a_member_can_act_neither_as_lead_nor_as_another_member() {
    let Some(rig) = rig(&[
        (
            "caller",
            &[("SIM_AGENT_SCRIPT", "call"), ("SIM_AGENT_WORK_MS", "100")],
        ),
        ("sim", &[]),
    ]) else {
        return;
    };
    rig.spawn("caller", "kit");
    rig.spawn("sim", "lux");
    // kit calls `tool` with `args`, and fleetd refuses it with `code`.
    let kit_refused = |tool: &str, args: Value, code: &str| {
        let answer = member_calls(&rig, "kit", tool, &args);
        assert_eq!(error_code(&answer), code, "kit's {tool} {args}");
    };
    // Lead tools are refused to a member whose profile does not allow delegation.
    kit_refused(
        "fleet_send",
        json!({ "target": "lux", "task": "x" }),
        "not_a_lead",
    );
    kit_refused("fleet_stop", json!({ "target": "lux" }), "not_a_lead");
    // Naming another member changes nothing: there is no such argument, and another member's
    // ticket is refused.
    let named = json!({ "text": "forged", "target": "lux" });
    kit_refused("fleet_reply", named, "invalid_arguments");
    let lux = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "lux", "task": "own work" }),
    ));
    let forged = json!({ "text": "forged", "ticket": lux["ticket"] });
    kit_refused("fleet_reply", forged, "not_your_ticket");
    let inbox = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "lux" })));
    assert_eq!(
        inbox["replies"],
        json!([]),
        "nothing landed in lux's inbox: {inbox}"
    );
    assert_eq!(rig.members().len(), 2, "lux was not stopped");
}

#[test]
fn e2e_stdio_shim_relays_to_the_daemon_with_connection_identity() {
    use std::io::{BufRead, BufReader, Write};
    let Some(rig) = rig(&[("sim", &[])]) else {
        return;
    };
    let mut shim = fleetd_testkit::daemon::command(rig.dir())
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("fleetd mcp starts");
    let mut stdin = shim.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(shim.stdout.take().expect("stdout"));
    let mut exchange = |request: Value| -> Value {
        writeln!(stdin, "{request}").expect("write");
        stdin.flush().expect("flush");
        if request.get("id").is_none() {
            return Value::Null;
        }
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let init = exchange(
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } } }),
    );
    assert_eq!(init["result"]["serverInfo"]["name"], "fleetd", "{init}");
    exchange(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }));
    let list = exchange(json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": { "name": "fleet_list", "arguments": {} } }));
    assert_eq!(list["result"]["isError"], false, "{list}");
    // This test process is in no pane: the daemon sees that through the socket, not a claim.
    let send = exchange(json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": { "name": "fleet_send", "arguments": { "target": "x", "task": "y" } } }));
    assert_eq!(error_code(&send["result"]), "anonymous_caller");
    drop(stdin);
    let status = shim.wait().expect("shim exits");
    assert!(
        status.success(),
        "the shim exits cleanly when its client closes stdin"
    );
}

#[test]
fn e2e_a_swallowed_submit_is_retried_once_with_enter() {
    // The member keeps its first submitted line as an unsent draft, as agent TUIs do when the
    // Enter glued to a paste is lost; only fleetd's one Enter retry gets the turn started.
    let Some(rig) = rig_with(
        "delivery:\n  verifyGraceMs: 1500\n",
        &[(
            "sticky",
            &[("SIM_AGENT_SWALLOW", "1"), ("SIM_AGENT_WORK_MS", "300")],
        )],
    ) else {
        return;
    };
    rig.spawn("sticky", "max");
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "max", "task": "stuck in the composer" }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    assert_eq!(sent["reply"], "sim-agent did: stuck in the composer");
}

#[test]
fn e2e_a_delegating_member_polls_the_tickets_it_sent_and_no_others() {
    if require_tmux() == Service::Skip {
        return;
    }
    // Review M14: a delegating member's `fleet_poll{ticket}` went down the own-task path and
    // answered `not_your_ticket` for the tickets it had sent itself.
    let delegator = format!(
        "{}    allowDelegation: true\n",
        sim_profile(
            "delegator",
            &[("SIM_AGENT_SCRIPT", "call"), ("SIM_AGENT_WORK_MS", "100")]
        )
    );
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{delegator}{}",
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")])
    ));
    rig.spawn("delegator", "dee");
    // dee's own member (a delegating member sends only within its subtree).
    structured_ok(&member_calls(
        &rig,
        "dee",
        "fleet_spawn",
        &json!({ "profile": "sim", "name": "lux" }),
    ));
    let sent = member_calls(
        &rig,
        "dee",
        "fleet_send",
        &json!({ "target": "lux", "task": "sub-task", "wait": false }),
    );
    let ticket = structured_ok(&sent)["ticket"]
        .as_str()
        .expect("a ticket")
        .to_owned();
    let polled = member_calls(&rig, "dee", "fleet_poll", &json!({ "ticket": ticket }));
    let polled = structured_ok(&polled);
    assert_eq!(polled["ticket"], ticket.as_str(), "{polled}");
    assert!(polled["state"].is_string(), "{polled}");
    // A ticket the lead sent is still not the member's to read.
    let lead_ticket = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "lux", "task": "lead's own", "wait": false }),
    ))["ticket"]
        .as_str()
        .expect("ticket")
        .to_owned();
    let refused = member_calls(&rig, "dee", "fleet_poll", &json!({ "ticket": lead_ticket }));
    assert_eq!(error_code(&refused), "not_your_ticket");
}

//! Delegation trees end to end (issue 19, SPEC §7) with the built daemon on real tmux and
//! sim-agents: lead → `mid` (a member whose profile allows delegation) → `sub`. `mid` hands its
//! task to `sub` without waiting and ends its turn; `sub`'s reply nudges `mid` (typed into
//! `mid`'s pane, never the primary's), `mid` reads it and answers the lead's ticket; a question
//! `sub` asks goes to `mid` the same way, and `mid`'s answer reaches it. The limits
//! (`maxDelegationDepth`, `maxMembersPerLead`) refuse clearly, a delegating member may not act
//! on a member outside its subtree, and a kill -9 of fleetd in the middle of the tree loses
//! nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{LEAD, Rig, error_code, sim_profile, structured_ok};
use fleetd_testkit::sim_agent::{log_events, log_turns};
use fleetd_testkit::wait_until;
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);

/// A rig whose profiles are `mid` (delegates to a `leaf` named `sub`, then collects),
/// `leaf` (replies `leaf did: ...` after `leaf_ms`), `caller` (calls the tool its task names
/// and replies with the result; may delegate), `asking-mid` (delegates to an `asker` named
/// `sub`, answers the question its nudge names, then collects) and `asker` (asks its lead
/// about its task, then replies with the answer). The primary (the rig's shell lead) is nudged
/// at most once per batch. `extra` is added at the top level.
fn rig(logs: &Path, leaf_ms: u64, extra: &str) -> Option<Rig> {
    let log = |name: &str| logs.join(format!("{name}.log")).display().to_string();
    let delegate = "    allowDelegation: true\n";
    Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 1\n  pushBackoffMs: 500\n{extra}profiles:\n{}{delegate}{}{}{delegate}{}{delegate}{}",
        sim_profile(
            "mid",
            &[
                ("SIM_AGENT_SCRIPT", "delegate,collect"),
                ("SIM_AGENT_DELEGATE_PROFILE", "leaf"),
                ("SIM_AGENT_DELEGATE_NAME", "sub"),
                ("SIM_AGENT_WORK_MS", "200"),
                ("SIM_AGENT_LOG", &log("mid")),
            ]
        ),
        sim_profile(
            "leaf",
            &[
                ("SIM_AGENT_REPLY", "leaf did: {prompt}"),
                ("SIM_AGENT_WORK_MS", &leaf_ms.to_string()),
                ("SIM_AGENT_LOG", &log("leaf")),
            ]
        ),
        sim_profile(
            "caller",
            &[("SIM_AGENT_SCRIPT", "call"), ("SIM_AGENT_WORK_MS", "100")]
        ),
        sim_profile(
            "asking-mid",
            &[
                ("SIM_AGENT_SCRIPT", "delegate,answer,collect"),
                ("SIM_AGENT_DELEGATE_PROFILE", "asker"),
                ("SIM_AGENT_DELEGATE_NAME", "sub"),
                ("SIM_AGENT_ANSWER", "the big ones"),
                ("SIM_AGENT_WORK_MS", "200"),
                ("SIM_AGENT_LOG", &log("mid")),
            ]
        ),
        sim_profile(
            "asker",
            &[
                ("SIM_AGENT_SCRIPT", "ask"),
                ("SIM_AGENT_QUESTION", "which stones? ({prompt})"),
                ("SIM_AGENT_WORK_MS", "200"),
                ("SIM_AGENT_LOG", &log("sub")),
            ]
        ),
    ))
}

fn members(rig: &Rig) -> Vec<Value> {
    structured_ok(&rig.lead("fleet_list", &json!({})))["members"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn member<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|m| m["target"] == name)
}

/// Polls the lead's ticket until it is replied; its reply text.
fn replied(rig: &Rig, ticket: &str) -> String {
    let mut last = Value::Null;
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("the lead's ticket to be replied", PATIENCE, || {
            last = structured_ok(&rig.lead("fleet_poll", &json!({ "ticket": ticket })));
            last["state"] == "replied"
        });
    }));
    if let Err(panic) = waited {
        eprintln!(
            "ticket: {last}\n---- members ----\n{}",
            rig.screen("fleet:")
        );
        std::panic::resume_unwind(panic);
    }
    last["reply"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn logs_dir() -> PathBuf {
    tempfile::tempdir().expect("tempdir").keep()
}

/// Has member `target` (a `caller`) call `tool` with `args` and reply with the result; that
/// result.
fn via(rig: &Rig, target: &str, tool: &str, args: &Value) -> Value {
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": target, "task": format!("{tool} {args}"), "timeoutSecs": 120 }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    serde_json::from_str(sent["reply"].as_str().expect("reply")).expect("the tool's result")
}

/// The first reply waiting in `target`'s inbox, read by the lead (who leads `target`'s lead).
fn first_reply(rig: &Rig, target: &str) -> Value {
    let mut reply = Value::Null;
    wait_until(&format!("{target}'s reply"), PATIENCE, || {
        let polled = structured_ok(&rig.lead("fleet_poll", &json!({ "target": target })));
        reply = polled["replies"][0].clone();
        !reply.is_null()
    });
    reply
}

/// The tool result `target` replied with to the first task it was handed (a `caller` member
/// calls the tool its task names and replies with the result).
fn first_task_result(rig: &Rig, target: &str) -> Value {
    let text = first_reply(rig, target)["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{target}'s tool result: {e}"))
}

/// Asserts that tool result `result` was refused with `code`, its message saying each of `says`.
fn assert_refused(result: &Value, code: &str, says: &[&str]) {
    assert_eq!(result["structuredContent"]["code"], code, "{result}");
    let message = result["structuredContent"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(says.iter().all(|s| message.contains(s)), "{result}");
}

/// Spawns a `profile` (a delegating member) as `mid`, hands it `task` and waits for the reply
/// the lead's ticket gets; its text.
fn mid_replies_to(rig: &Rig, profile: &str, task: &str) -> String {
    rig.spawn(profile, "mid");
    let ticket = rig.send_task("mid", task);
    replied(rig, &ticket)
}

/// The first call of `tool` that the sim-agent logging to `log` made (its arguments and result).
fn tool_call(log: &Path, tool: &str) -> Value {
    log_events(log)
        .into_iter()
        .find(|e| e["event"] == "tool" && e["name"] == tool)
        .unwrap_or_else(|| panic!("{} did not call {tool}", log.display()))
}

/// A member's traffic with its own members is nudged into its pane, never the primary's.
fn assert_primary_never_nudged_about_sub(rig: &Rig) {
    let primary = rig.history(LEAD);
    assert!(
        !primary.contains("from sub"),
        "the primary was nudged about sub:\n{primary}"
    );
}

/// The operator's socket, where the lead's inboxes can be read without being the lead.
fn operator(rig: &Rig) -> Endpoint {
    Endpoint::Unix(state_dir(rig.dir()).join("api.sock"))
}

#[test]
fn e2e_delegation_a_sub_members_reply_nudges_its_delegating_member_whose_reply_reaches_the_lead() {
    let logs = logs_dir();
    let Some(rig) = rig(&logs, 300, "") else {
        return;
    };
    let text = mid_replies_to(&rig, "mid", "count the stones");
    assert_eq!(
        text, "collected: leaf did: count the stones",
        "mid passed sub's reply on"
    );

    // The tree: sub reports to mid, one level down.
    let list = members(&rig);
    let sub = member(&list, "sub").expect("sub is listed");
    assert_eq!(sub["delegator"], "mid", "{sub}");
    assert_eq!(sub["depth"], 2);
    assert_eq!(member(&list, "mid").expect("mid")["depth"], 1);

    // sub's reply was nudged into mid's pane (its second turn's prompt) ...
    let mid_prompts = log_turns(&logs.join("mid.log"));
    assert_eq!(mid_prompts.len(), 2, "{mid_prompts:?}");
    assert!(
        mid_prompts[1].starts_with("[fleet] 1 message from sub waiting"),
        "{mid_prompts:?}"
    );
    // ... and never into the primary's; mid's own reply went to the lead (a waiter-less send:
    // the lead got it by polling its ticket), and no fallback was recorded for mid's first
    // turn, which ended waiting on sub.
    assert_primary_never_nudged_about_sub(&rig);
    let leaf_prompts = log_turns(&logs.join("leaf.log"));
    assert_eq!(leaf_prompts, ["count the stones"]);

    // mid polls the ticket it sent sub (a delegating member reads the tickets it delegated).
    let sub_ticket = tool_call(&logs.join("mid.log"), "fleet_send")["result"]["structuredContent"]
        ["ticket"]
        .clone();
    assert!(
        sub_ticket.is_string(),
        "mid's fleet_send answered with a ticket"
    );
    let by_lead = structured_ok(&rig.lead("fleet_poll", &json!({ "ticket": sub_ticket })));
    assert_eq!(by_lead["state"], "replied");

    // The CLI shows the tree: sub under mid.
    let out = fleetd_testkit::daemon::command(rig.dir())
        .arg("status")
        .output()
        .expect("fleetd status");
    let table = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert!(rows[0].starts_with("mid "), "{table}");
    assert!(rows[1].starts_with("└─sub "), "{table}");
    assert!(rows[1].contains("member mid"), "{table}");
}

#[test]
fn e2e_delegation_depth_and_width_limits_refuse_clearly() {
    let logs = logs_dir();
    let Some(rig) = rig(&logs, 300, "maxMembersPerLead: 2\n") else {
        return;
    };
    // Width: the lead's third member is refused, naming the key.
    rig.spawn("caller", "up");
    rig.spawn("leaf", "l2");
    let third = rig.lead("fleet_spawn", &json!({ "profile": "leaf", "name": "l3" }));
    assert_eq!(error_code(&third), "too_many_members");
    assert_refused(&third, "too_many_members", &["maxMembersPerLead = 2"]);
    assert!(member(&members(&rig), "l3").is_none(), "nothing half-made");

    // Depth: `up` (depth 1) spawns `deep` (depth 2, the default maxDelegationDepth) and hands
    // it a first task: to spawn a member of its own, which is refused. (`deep` answers `up`,
    // whose inbox the lead reads; a task the lead sent `deep` itself would make the lead its
    // lead, at depth 1.)
    let call = |target: &str, tool: &str, args: Value| via(&rig, target, tool, &args);
    let deeper = json!({ "profile": "leaf", "name": "deeper" });
    let spawned = call(
        "up",
        "fleet_spawn",
        json!({ "profile": "caller", "name": "deep", "task": format!("fleet_spawn {deeper}") }),
    );
    assert_eq!(spawned["isError"], false, "{spawned}");
    let list = members(&rig);
    assert_eq!(member(&list, "deep").expect("deep")["delegator"], "up");
    // `up` reads the ticket it delegated (the first task it gave `deep`).
    let delegated = spawned["structuredContent"]["ticket"].clone();
    let polled = call("up", "fleet_poll", json!({ "ticket": delegated }));
    assert_eq!(polled["isError"], false, "{polled}");
    assert_eq!(polled["structuredContent"]["ticket"], delegated, "{polled}");
    assert_refused(
        &first_task_result(&rig, "deep"),
        "delegation_too_deep",
        &["maxDelegationDepth is 2", "spawn members"],
    );
    // A send from depth 2 is refused the same way: `deep2`'s first task is to hand `l2` work.
    let send = json!({ "target": "l2", "task": "x", "wait": false });
    let spawned = call(
        "up",
        "fleet_spawn",
        json!({ "profile": "caller", "name": "deep2", "task": format!("fleet_send {send}") }),
    );
    assert_eq!(spawned["isError"], false, "{spawned}");
    assert_refused(
        &first_task_result(&rig, "deep2"),
        "delegation_too_deep",
        &["maxDelegationDepth is 2", "hand out tasks"],
    );
    let l2 = members(&rig);
    let l2 = member(&l2, "l2").expect("l2");
    assert!(l2["delegator"].is_null(), "l2 still the lead's: {l2}");
    assert_eq!(l2["openTickets"], json!([]), "{l2}");
    // Width for a delegating member: `up` has two members, the most one lead may have.
    let third = call(
        "up",
        "fleet_spawn",
        json!({ "profile": "leaf", "name": "l4" }),
    );
    assert_refused(
        &third,
        "too_many_members",
        &["member up has 2 members", "maxMembersPerLead = 2"],
    );
    assert!(member(&members(&rig), "l4").is_none(), "nothing half-made");
    // Nor may a member hand work up its own tree.
    let cycle = call(
        "up",
        "fleet_send",
        json!({ "target": "up", "task": "x", "wait": false }),
    );
    assert_refused(&cycle, "delegation_cycle", &[]);
    assert!(member(&members(&rig), "deeper").is_none());
}

#[test]
fn e2e_delegation_a_sub_members_question_goes_to_its_delegating_member_whose_answer_reaches_it() {
    let logs = logs_dir();
    let Some(rig) = rig(&logs, 300, "") else {
        return;
    };
    // sub asked, mid answered, sub replied with the answer, and mid passed that on.
    let text = mid_replies_to(&rig, "asking-mid", "count the stones");
    assert!(
        text.starts_with("collected: answer was: ") && text.contains("the big ones"),
        "{text}"
    );
    // The question was nudged into mid's pane (its second turn) ...
    let mid_prompts = log_turns(&logs.join("mid.log"));
    assert_eq!(mid_prompts.len(), 3, "{mid_prompts:?}");
    assert!(
        mid_prompts[1].starts_with("[fleet] question ") && mid_prompts[1].contains(" from sub "),
        "{mid_prompts:?}"
    );
    assert!(
        mid_prompts[2].starts_with("[fleet] 1 message from sub waiting"),
        "{mid_prompts:?}"
    );
    // ... never into the primary's.
    assert_primary_never_nudged_about_sub(&rig);
    // mid's fleet_answer reached sub while it still waited in fleet_ask.
    let answered = tool_call(&logs.join("mid.log"), "fleet_answer");
    assert_eq!(
        answered["result"]["structuredContent"]["deliveredTo"], "waiter",
        "{answered}"
    );
    let asked = tool_call(&logs.join("sub.log"), "fleet_ask");
    assert_eq!(
        asked["arguments"]["question"], "which stones? (count the stones)",
        "{asked}"
    );
    assert_eq!(
        asked["result"]["structuredContent"]["answer"], "the big ones",
        "{asked}"
    );
}

#[test]
fn e2e_delegation_a_delegating_member_may_not_stop_read_or_take_over_a_member_outside_its_subtree()
{
    let logs = logs_dir();
    let Some(rig) = rig(&logs, 300, "") else {
        return;
    };
    rig.spawn("caller", "up");
    rig.spawn("leaf", "sib");
    rig.send_task("sib", "tidy the shed");
    let reply = first_reply(&rig, "sib");
    assert_eq!(reply["text"], "leaf did: tidy the shed");
    let msg_id = reply["msgId"].clone();

    // `up` delegates too, but `sib` is the lead's, not up's.
    for (tool, args) in [
        ("fleet_stop", json!({ "target": "sib" })),
        ("fleet_poll", json!({ "target": "sib" })),
        ("fleet_ack", json!({ "target": "sib", "msgId": msg_id })),
        // Its tickets and questions are the lead's to read.
        ("fleet_status", json!({ "target": "sib" })),
        // Nor may up take sib over by handing it work (and with it sib's replies and stop).
        (
            "fleet_send",
            json!({ "target": "sib", "task": "forged", "wait": false }),
        ),
    ] {
        let refused = via(&rig, "up", tool, &args);
        assert_eq!(refused["isError"], true, "{tool}: {refused}");
        assert_refused(
            &refused,
            "not_your_member",
            &["sib is not in your delegation tree", "subtree"],
        );
        assert!(
            !refused.to_string().contains("tidy the shed"),
            "{tool} showed sib's reply: {refused}"
        );
    }
    // Nothing changed: sib still runs, and its reply still waits for the lead.
    let list = members(&rig);
    let sib = member(&list, "sib").expect("sib still runs");
    assert_ne!(sib["status"], "gone", "{sib}");
    assert_eq!(
        http::reply_texts(operator(&rig), "sib"),
        ["leaf did: tidy the shed"]
    );
    // Its own member it may stop.
    let spawned = via(
        &rig,
        "up",
        "fleet_spawn",
        &json!({ "profile": "leaf", "name": "own" }),
    );
    assert_eq!(spawned["isError"], false, "{spawned}");
    let stopped = via(&rig, "up", "fleet_stop", &json!({ "target": "own" }));
    assert_eq!(stopped["isError"], false, "{stopped}");
    assert!(member(&members(&rig), "own").is_none());
}

#[test]
fn e2e_delegation_releasing_a_delegating_member_hands_its_members_to_its_lead() {
    let logs = logs_dir();
    let Some(rig) = rig(&logs, 4000, "") else {
        return;
    };
    rig.spawn("mid", "mid");
    rig.send_task("mid", "weigh the sand");
    wait_until("sub to be working for mid", PATIENCE, || {
        member(&members(&rig), "sub")
            .is_some_and(|s| s["openTickets"].as_array().is_some_and(|t| !t.is_empty()))
    });
    structured_ok(&rig.lead("fleet_stop", &json!({ "target": "mid" })));
    // sub keeps working, now under the lead; its reply waits in its inbox for the lead. (Read
    // from the operator's socket.)
    let list = members(&rig);
    let sub = member(&list, "sub").expect("sub still runs");
    assert!(sub["delegator"].is_null(), "{sub}");
    assert_eq!(sub["depth"], 1);
    let operator = operator(&rig);
    wait_until("sub's reply in its inbox", PATIENCE, || {
        http::reply_texts(&operator, "sub")
            .iter()
            .any(|t| t == "leaf did: weigh the sand")
    });
    // The lead was told which members it took over (in mid's inbox), and nudged about sub.
    let notices = http::reply_texts(&operator, "mid");
    assert!(
        notices.iter().any(|t| t.contains("while it led sub")),
        "{notices:?}"
    );
    // (A shell lead reads as an agent only while a command runs in it: one call at a time.)
    wait_until("the lead to be nudged about sub", PATIENCE, || {
        rig.lead("fleet_list", &json!({}));
        rig.history(LEAD).contains("from sub")
    });
}

#[test]
fn e2e_delegation_a_kill_9_in_the_middle_of_the_tree_loses_nothing() {
    let logs = logs_dir();
    let Some(mut rig) = rig(&logs, 3000, "") else {
        return;
    };
    rig.spawn("mid", "mid");
    let ticket = rig.send_task("mid", "sort the shells");
    // sub is at work on mid's task when fleetd dies.
    wait_until("sub to start its turn", PATIENCE, || {
        log_turns(&logs.join("leaf.log"))
            .iter()
            .any(|p| p == "sort the shells")
    });
    rig.kill_daemon();
    rig.restart_daemon();
    let list = members(&rig);
    assert_eq!(
        member(&list, "sub").expect("sub kept")["delegator"],
        "mid",
        "the tree survives the restart"
    );
    let text = replied(&rig, &ticket);
    assert_eq!(text, "collected: leaf did: sort the shells");
    let tool_errors: Vec<Value> = log_events(&logs.join("leaf.log"))
        .into_iter()
        .filter(|e| e["event"] == "tool_error")
        .collect();
    assert!(
        tool_errors.is_empty(),
        "sub's reply failed: {tool_errors:?}"
    );
}

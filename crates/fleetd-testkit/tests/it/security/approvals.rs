//! Who may answer a member's dialog (issue 39, SPEC §20): with `approvals.by` at its default,
//! the operator alone. A member (from its shell, over MCP and REST), the lead (its tool),
//! a process in no pane, another uid and a web page all try to type a choice into `bea`'s
//! permission prompt and are refused, and `bea` still waits on the same dialog with nothing
//! typed; then the operator answers it and `bea` goes on.

use serde_json::{Value, json};

use super::{PATIENCE, as_nobody, code, fleet_state, mcp_call, mcp_tcp, rig_with_mail, run_in};
use fleetd_testkit::rig::{error_code, sim_profile};
use fleetd_testkit::{bin_path, http, wait_until};

/// What the operator's `GET /blocked` says of bea, once she waits on her prompt.
fn bea_blocked(rig: &fleetd_testkit::rig::Rig) -> Value {
    let mut bea = Value::Null;
    wait_until("bea's permission prompt", PATIENCE, || {
        let blocked = http::get(rig.daemon.operator(), "/blocked")
            .map(|r| r.json())
            .unwrap_or_default();
        bea = blocked["blocked"]
            .as_array()
            .and_then(|all| all.iter().find(|e| e["target"] == "bea").cloned())
            .unwrap_or(Value::Null);
        bea["choices"].as_array().is_some_and(|c| c.len() == 2)
    });
    bea
}

/// The operator types choice 1 into bea's dialog `dialog`; what fleetd answered.
fn operator_approves_bea(rig: &fleetd_testkit::rig::Rig, dialog: &Value) -> Value {
    let body = json!({ "choice": "1", "dialog": dialog }).to_string();
    let operator = rig.daemon.operator();
    let answered =
        http::request(operator, "POST", "/sessions/bea/approve", Some(&body)).expect("answer");
    assert_eq!(answered.status, 200, "{}", answered.body);
    answered.json()
}

#[test]
fn e2e_security_only_the_operator_answers_a_members_dialog() {
    let Some((rig, _)) = rig_with_mail(&sim_profile(
        "blocker",
        &[
            ("SIM_AGENT_SCRIPT", "permission"),
            ("SIM_AGENT_WORK_MS", "100"),
        ],
    )) else {
        return;
    };
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "deploy");
    let before = bea_blocked(&rig);
    let dialog = before["dialog"].as_str().expect("a fingerprint").to_owned();
    let state = fleet_state(&rig);
    let addr = rig.daemon.addr;
    let body = json!({ "choice": "1", "dialog": dialog }).to_string();
    let args = json!({ "target": "bea", "choice": "1", "dialog": dialog });

    // A process in no pane, over REST and MCP; and what it may not read either.
    let rest = http::request(addr, "POST", "/sessions/bea/approve", Some(&body)).expect("answer");
    rest.assert_refused(403, "anonymous_caller", "an approval from no pane");
    let listed = http::get(addr, "/blocked").expect("answer");
    assert_eq!(listed.error_code(), "anonymous_caller", "{}", listed.body);
    let mcp = mcp_tcp(addr, &[], "fleet_approve", &args);
    assert_eq!(error_code(&mcp.json()["result"]), "anonymous_caller");
    // A web page: refused at the door, whoever it would have been.
    let page = http::request_with(
        addr,
        "POST",
        "/sessions/bea/approve",
        &[("Origin", "https://evil.example")],
        Some(&body),
    )
    .expect("answer");
    assert_eq!(page.status, 403, "{}", page.body);
    // Nor may a page read who waits on what (it is in no pane: anonymous, whatever it sends).
    let page =
        http::get_with(addr, "/blocked", &[("Origin", "https://evil.example")]).expect("answer");
    page.assert_refused(403, "anonymous_caller", "a page reading /blocked");
    // A member, from its own shell: never, over MCP or REST; nor does it read the list.
    let listed = run_in(
        &rig,
        "mallory",
        &format!("{} --http GET /blocked", mcp_call()),
    );
    assert_eq!(listed[0]["status"], 403, "{listed:?}");
    let from_member = run_in(
        &rig,
        "mallory",
        &format!("{} --print fleet_approve '{args}'", mcp_call()),
    );
    // (Refused as any lead's tool is; a delegating member is refused by the tool itself:
    // `approvals_off`, members never answer.)
    assert_eq!(code(&from_member[0]), "not_a_lead", "{from_member:?}");
    let from_member = run_in(
        &rig,
        "mallory",
        &format!("{} --http POST /sessions/bea/approve '{body}'", mcp_call()),
    );
    assert_eq!(from_member[0]["status"], 403, "{from_member:?}");
    // The lead: not while approvals.by is operator.
    let lead = rig.lead("fleet_approve", &args);
    assert_eq!(error_code(&lead), "approvals_off", "{lead}");
    // Another uid.
    if let Some(out) = as_nobody(
        &bin_path("mcp-call").display().to_string(),
        &["--print", "fleet_approve", &args.to_string()],
        &[("FLEETD_URL", &format!("http://{addr}"))],
    ) {
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(code(&answer), "anonymous_caller", "{answer}");
        let out = as_nobody(
            &bin_path("mcp-call").display().to_string(),
            &["--http", "GET", "/blocked"],
            &[("FLEETD_URL", &format!("http://{addr}"))],
        )
        .expect("ran");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        assert_eq!(answer["status"], 403, "{answer}");
        assert_eq!(code(&answer), "anonymous_caller", "{answer}");
    }

    // Nothing changed: bea waits on the same dialog, nothing typed, no inbox touched.
    let after = bea_blocked(&rig);
    assert_eq!(after["dialog"], before["dialog"]);
    assert_eq!(after["since"], before["since"], "the same episode");
    assert_eq!(fleet_state(&rig), state);

    // The operator answers it, and bea goes on with her task.
    let answered = operator_approves_bea(&rig, &json!(dialog));
    assert_eq!(answered["outcome"], "answered", "{answered}");
    let reply = rig.reply_of(&ticket);
    assert!(
        reply.contains("sim-agent did: deploy"),
        "bea's reply: {reply}"
    );
}

#[test]
fn e2e_security_with_operator_and_lead_the_lead_answers_its_own_members_dialog() {
    let Some(rig) = fleetd_testkit::rig::Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\napprovals:\n  by: operator-and-lead\nprofiles:\n{}",
        sim_profile(
            "blocker",
            &[
                ("SIM_AGENT_SCRIPT", "permission"),
                ("SIM_AGENT_WORK_MS", "100")
            ]
        ),
    )) else {
        return;
    };
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "deploy");
    let dialog = bea_blocked(&rig)["dialog"]
        .as_str()
        .expect("fingerprint")
        .to_owned();
    let answered = rig.lead(
        "fleet_approve",
        &json!({ "target": "bea", "choice": "1", "dialog": dialog }),
    );
    assert_eq!(answered["isError"], false, "{answered}");
    assert_eq!(
        answered["structuredContent"]["outcome"], "answered",
        "{answered}"
    );
    rig.reply_of(&ticket);
    // bea waits on nothing any more.
    let events = http::get(rig.daemon.operator(), "/blocked").expect("answer");
    assert_eq!(events.json()["blocked"], json!([]));
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that nothing is typed means letting fleetd's waits run out"
)]
fn e2e_security_fleetd_never_answers_a_dialog_drawn_after_its_title_went_idle() {
    // bea's title reads idle 150 ms before her permission prompt shows, the task's text echoed
    // on her prompt line above her output. Neither is a turn over (a fallback would end her task
    // while she waits) nor a task unsent (an Enter would answer the dialog: consent given by
    // fleetd for the person). Seen in CI: fleetd pressed Enter and bea's prompt said yes.
    if fleetd_testkit::require_tmux() == fleetd_testkit::Service::Skip {
        return;
    }
    let files = tempfile::tempdir().expect("tempdir");
    let log = files.path().join("bea.log");
    let rig = fleetd_testkit::rig::Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile(
            "blocker",
            &[
                ("SIM_AGENT_SCRIPT", "permission"),
                ("SIM_AGENT_WORK_MS", "100"),
                ("SIM_AGENT_DIALOG_AFTER_MS", "150"),
                ("SIM_AGENT_LOG", &log.display().to_string()),
            ],
        )
    ));
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "deploy");
    let before = bea_blocked(&rig);
    // Past every wait fleetd has (the turn's settle, the delivery's grace): nothing typed.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let poll = || rig.lead("fleet_poll", &json!({ "ticket": ticket }))["structuredContent"].clone();
    assert_eq!(poll()["state"], "working", "{}", poll());
    assert_eq!(
        fleetd_testkit::sim_agent::logged(&log, "dialog_answered"),
        0,
        "fleetd answered bea's dialog"
    );
    let after = bea_blocked(&rig);
    assert_eq!(after["since"], before["since"], "the same episode");

    // The operator answers; her reply is the task's, and no fallback came before it.
    operator_approves_bea(&rig, &after["dialog"]);
    assert!(rig.reply_of(&ticket).contains("sim-agent did: deploy"));
}

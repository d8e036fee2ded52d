//! Attacks on MCP tasks (issue 33): a task id is its caller's alone. A member, another pane's
//! process, an anonymous process, another uid and a web page all get the same "not found" for
//! a lead's task (or are refused at the door), guessed ids too, and none of them can cancel it:
//! the lead's task still completes with its reply afterwards.

use serde_json::{Value, json};

use super::security::{as_nobody, mcp_call, rig_with_mail, run_in};
use fleetd_testkit::rig::LEAD;
use fleetd_testkit::{bin_path, wait_until};

/// The JSON-RPC error code in an `mcp-call --rpc` answer (0 when it succeeded).
fn rpc_code(answer: &Value) -> i64 {
    answer["error"]["code"].as_i64().unwrap_or(0)
}

#[test]
fn e2e_security_a_task_is_its_callers_alone() {
    let Some((rig, _)) = rig_with_mail("") else {
        return;
    };
    // The lead's client takes tasks: its waiting fleet_send answers with one.
    let created = rig.rpc_from(
        LEAD,
        "tools/call",
        &json!({ "name": "fleet_send", "arguments": { "target": "alice", "task": "the second report" } }),
    );
    assert_eq!(created["result"]["resultType"], "task", "{created}");
    let id = created["result"]["taskId"]
        .as_str()
        .expect("a task id")
        .to_owned();
    assert_eq!(id.len(), 32, "128 random bits, hex: {id}");
    let mut guess = id.clone();
    guess.replace_range(..1, if id.starts_with('0') { "1" } else { "0" });

    // A member (its agent's shell tool): not found, for the id and for a guess; cancel too.
    let m = mcp_call();
    let get = |task: &str| format!("{m} --rpc tasks/get '{{\"taskId\":\"{task}\"}}'");
    let cancel = |task: &str| format!("{m} --rpc tasks/cancel '{{\"taskId\":\"{task}\"}}'");
    let line = [get(&id), cancel(&id), get(&guess), cancel(&guess)].join(" ; ");
    let answers = run_in(&rig, "mallory", &line);
    let codes: Vec<i64> = answers.iter().take(4).map(rpc_code).collect();
    assert_eq!(codes, vec![-32602; 4], "{answers:#?}");
    assert!(
        answers
            .iter()
            .take(4)
            .all(|a| a["error"]["message"] == "Task not found"),
        "one answer for another's task and an unknown one alike: {answers:#?}"
    );

    // An anonymous process (this test, in no pane) and another uid: the same.
    let url = format!("http://{}", rig.daemon.addr);
    for method in ["tasks/get", "tasks/cancel"] {
        let params = json!({ "taskId": id }).to_string();
        let out = std::process::Command::new(bin_path("mcp-call"))
            .env("FLEETD_URL", &url)
            .args(["--rpc", method, &params])
            .output()
            .expect("mcp-call runs");
        let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(rpc_code(&answer), -32602, "anonymous {method}: {answer}");
        if let Some(out) = as_nobody(
            &bin_path("mcp-call").display().to_string(),
            &["--rpc", method, &params],
            &[("FLEETD_URL", &url)],
        ) {
            let answer: Value = serde_json::from_slice(&out.stdout).expect("JSON");
            assert_eq!(
                rpc_code(&answer),
                -32602,
                "another uid's {method}: {answer}"
            );
        }
    }

    // A web page: refused at the door, before any MCP.
    let body =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/cancel", "params": { "taskId": id } })
            .to_string();
    let page = fleetd_testkit::http::request_with(
        rig.daemon.addr,
        "POST",
        "/mcp",
        &[
            ("Origin", "https://evil.example"),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ],
        Some(&body),
    )
    .expect("an answer");
    assert_eq!(page.status, 403, "{}", page.body);

    // Nothing changed: the lead's task completes with alice's reply, not cancelled.
    let mut last = Value::Null;
    wait_until(
        "the lead's task to complete",
        std::time::Duration::from_secs(60),
        || {
            last = rig.rpc_from(LEAD, "tasks/get", &json!({ "taskId": id }));
            last["result"]["status"] != "working"
        },
    );
    assert_eq!(last["result"]["status"], "completed", "{last}");
    assert_eq!(
        last["result"]["result"]["structuredContent"]["status"], "replied",
        "{last}"
    );
}

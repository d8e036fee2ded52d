//! Answering a member's dialog on herdr (issue 39): herdr says the member is blocked (its own
//! detection, fake-herdr's copy of herdr 0.8.2's manifests), fleetd reads the dialog with
//! `pane.read`, and the operator's choice goes in with `pane.send_text` — raw bytes, no Enter
//! (herdr's PROTOCOL: `pane.send_text` writes exactly the text given) — and the member goes on.

use std::time::Duration;

use fleetd_testkit::rig_herdr::HerdrRig;
use fleetd_testkit::{http, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn e2e_herdr_a_blocked_members_dialog_is_read_and_answered() {
    let (rig, lead) = HerdrRig::with_member(
        &format!(
            "{}      SIM_AGENT_SCRIPT: permission\n",
            fleetd_testkit::rig_herdr::sim_profile("blocker", 200),
        ),
        ["blocker", "bea"],
    );
    rig.call_from(
        &lead,
        r#"fleet_send {"target":"bea","task":"deploy","wait":false}"#,
    );
    let mut bea = Value::Null;
    wait_until("bea's dialog", PATIENCE, || {
        let blocked = http::get(rig.daemon.operator(), "/blocked")
            .map(|r| r.json())
            .unwrap_or_default();
        bea = blocked["blocked"][0].clone();
        bea["target"] == "bea"
    });
    assert_eq!(bea["question"], "Do you want to proceed?", "{bea}");
    assert_eq!(
        bea["choices"][1],
        json!({ "key": "2", "label": "No" }),
        "{bea}"
    );
    let answered = http::request(
        rig.daemon.operator(),
        "POST",
        "/sessions/bea/approve",
        Some(&json!({ "choice": "2", "dialog": bea["dialog"] }).to_string()),
    )
    .expect("answer");
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(answered.json()["outcome"], "answered", "{}", answered.body);
    // It chose No: the member says so.
    wait_until("bea's reply", PATIENCE, || {
        http::reply_texts(rig.daemon.operator(), "bea")
            .first()
            .is_some_and(|t| t == "denied: deploy")
    });
}

//! End-to-end tests of the push loop (issue 6) with real tmux: the lead is a `sim-agent` (an
//! agent, so its status is real), members are `sim-agent`s spawned through `fleet_spawn`.

use std::time::Duration;

use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::{Service, bin_path, http, require_tmux, wait_until};

/// Starts a rig whose lead pane runs a `sim-agent` in `call` mode: each line typed into it is
/// `TOOL {json}`, which it calls over MCP (so fleetd sees a lead in that pane).
fn agent_lead_rig(work_ms: &str) -> Option<(Rig, String)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let yaml = format!(
        "primary:\n  tab: base:1\n  pushReminders: 3\n  pushBackoffMs: 1000\n  pushBackoffMaxMs: 2000\nprofiles:\n{}",
        sim_profile("slow", &[("SIM_AGENT_WORK_MS", work_ms)])
    );
    let rig = Rig::start(&yaml);
    let url = format!("FLEETD_URL=http://{}", rig.daemon.addr);
    let out = rig
        .tmux
        .run(&[
            "new-window",
            "-d",
            "-t",
            "base",
            "-n",
            "agentlead",
            "-e",
            &url,
            "-e",
            "SIM_AGENT_SCRIPT=call",
            "-e",
            "SIM_AGENT_WORK_MS=100",
            &bin_path("sim-agent").display().to_string(),
        ])
        .expect("tmux");
    assert!(out.status.success());
    Some((rig, "base:agentlead".to_owned()))
}

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "proving that no nudge comes means waiting out the backoff window"
)]
fn e2e_late_reply_nudges_the_idle_lead_until_read() {
    let Some((rig, lead)) = agent_lead_rig("2500") else {
        return;
    };
    rig.spawn("slow", "nia");
    // The agent lead delegates with a one-second window: the reply will come after it closes.
    rig.type_line(
        &lead,
        r#"fleet_send {"target":"nia","task":"long job","timeoutSecs":1}"#,
    );
    wait_until(
        "the nudge in the lead's pane",
        Duration::from_secs(60),
        || {
            rig.screen(&lead)
                .contains("[fleet] 1 message from nia waiting")
        },
    );
    let screen = rig.screen(&lead);
    assert!(
        !screen.contains("sim-agent did: long job"),
        "a nudge never carries the reply: {screen}"
    );
    // Reading and acknowledging the mail stops the reminders.
    let replies = http::get(rig.daemon.addr, "/sessions/nia/replies")
        .expect("peek")
        .json();
    let id = replies["replies"][0]["msgId"]
        .as_str()
        .expect("a pending reply")
        .to_owned();
    http::request(
        rig.daemon.addr,
        "POST",
        &format!("/sessions/nia/replies/{id}/ack"),
        None,
    )
    .expect("ack");
    let count = |s: &str| s.matches("[fleet] 1 message from nia").count();
    let after_ack = count(&rig.screen(&lead));
    // Three reminders would need 1 s + 2 s of backoff; wait past that and see none came.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        count(&rig.screen(&lead)),
        after_ack,
        "no nudge after the mail was read"
    );
}

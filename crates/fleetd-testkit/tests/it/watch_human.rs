//! `fleetd watch` and what waits on a person (issue 39): run in a real terminal (a tmux window),
//! it marks a member blocked on a dialog and a member's open question under the member table,
//! and answers both from what is typed into it — `approve NAME CHOICE`, `answer NAME TEXT` —
//! after which the members go on.

use std::time::Duration;

use fleetd_testkit::daemon::{fleetd_binary, state_dir};
use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::wait_until;

const PATIENCE: Duration = Duration::from_secs(60);
const WATCH: &str = "base:watch";

fn screen_shows(rig: &Rig, what: &str, text: &str) {
    let mut seen = String::new();
    let shown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(what, PATIENCE, || {
            seen = rig.screen(WATCH);
            seen.contains(text)
        });
    }));
    if let Err(panic) = shown {
        eprintln!("---- fleetd watch ----\n{seen}");
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn e2e_watch_marks_what_waits_on_a_person_and_answers_it() {
    let Some(rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}{}",
        sim_profile(
            "blocker",
            &[
                ("SIM_AGENT_SCRIPT", "permission"),
                ("SIM_AGENT_WORK_MS", "200")
            ]
        ),
        sim_profile(
            "curious",
            &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "200")]
        ),
    )) else {
        return;
    };
    let socket = format!("unix:{}", state_dir(rig.dir()).join("api.sock").display());
    rig.tmux.run_ok(&[
        "new-window",
        "-d",
        "-t",
        "base",
        "-n",
        "watch",
        &fleetd_binary().display().to_string(),
        "watch",
        "--daemon",
        &socket,
    ]);
    rig.spawn("blocker", "bea");
    let deploy = rig.send_task("bea", "deploy");
    rig.spawn("curious", "eve");
    let region = rig.send_task("eve", "which region");
    screen_shows(
        &rig,
        "bea marked blocked",
        "BLOCKED   bea: Do you want to proceed?",
    );
    screen_shows(&rig, "eve's question marked", "QUESTION  eve");

    rig.type_line(WATCH, "approve bea 1");
    screen_shows(
        &rig,
        "the approval's outcome",
        "typed 1 (Yes) into bea's dialog: it went",
    );
    assert!(rig.reply_of(&deploy).contains("sim-agent did: deploy"));
    rig.type_line(WATCH, "answer eve eu-west");
    screen_shows(&rig, "the answer's outcome", "answered eve's question");
    assert!(rig.reply_of(&region).contains("eu-west"));
}

//! Who is a lead (SPEC §2; docs/SECURITY.md, "Who is a lead"), attacked as review H1 found it:
//! a pane a member opens outside the members' workspace — a new tmux session, a new window in
//! the lead's session, a split of the lead's own pane — is a stray: nobody on every door, the
//! operator's socket included, and it cannot admit itself; nothing changes in any inbox. The
//! operator admits such a pane with `fleetd admit` (a member cannot), and from then on it is a
//! lead. The lead's pane, opened before any member ran, needed nothing. Real tmux, the built
//! binary, real HTTP.

use std::path::PathBuf;

use fleetd_testkit::bin_path;
use fleetd_testkit::rig::{Rig, structured_ok};
use serde_json::{Value, json};

use crate::security::{code, fleet_state, mcp_call, read_when_there, rig_with_mail, run_in};

/// A script for a pane a member opens: every lead call and the operator's CLI, answers to
/// `NAME.out` (JSON lines) and `NAME.cli`; then a shell stays in the pane.
fn attack(rig: &Rig, name: &str, msg_id: &str) -> (PathBuf, PathBuf, PathBuf) {
    let out = rig.dir().join(format!("{name}.out"));
    let cli = rig.dir().join(format!("{name}.cli"));
    let script = rig.dir().join(format!("{name}.sh"));
    let home = rig.dir().display().to_string();
    let m = mcp_call();
    let fleetd = bin_path("fleetd").display().to_string();
    std::fs::write(
        &script,
        format!(
            "export HOME={home} XDG_CONFIG_HOME={home}/config XDG_STATE_HOME={home}/state\n\
             {{ env -u FLEETD_URL {fleetd} inbox alice; env -u FLEETD_URL {fleetd} admit \"$TMUX_PANE\"; }} > {cli}.tmp 2>&1; mv {cli}.tmp {cli}\n\
             export FLEETD_URL=http://{addr}\n\
             {{ {m} --print fleet_list '{{}}'\n\
             {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
             {m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{msg_id}\"}}'\n\
             {m} --print fleet_send '{{\"target\":\"alice\",\"task\":\"forged\"}}'\n\
             {m} --print fleet_stop '{{\"target\":\"alice\"}}'\n\
             {m} --http POST /sessions/alice/replies/drain\n\
             {m} --http POST /dashboard/keys\n\
             }} > {out}.tmp; mv {out}.tmp {out}\n\
             exec bash --norc --noprofile\n",
            addr = rig.daemon.addr,
            cli = cli.display(),
            out = out.display(),
        ),
    )
    .expect("write script");
    (script, out, cli)
}

/// `fleetd admit PANE` as the operator (this test process: the daemon's user in no pane).
fn admit(rig: &Rig, pane: &str) -> std::process::Output {
    fleetd_testkit::daemon::command(rig.dir())
        .args(["admit", pane])
        .output()
        .expect("fleetd runs")
}

#[test]
fn e2e_security_panes_a_member_opens_outside_the_members_workspace_are_strays() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    let lead_pane = rig.pane_ids("base:lead");
    let variants = [
        ("session", "tmux new-session -d -s evil"),
        ("window", "tmux new-window -d -t base"),
        ("split", "tmux split-window -d -t base:lead"),
    ];
    let scripts: Vec<_> = variants
        .iter()
        .map(|(name, _)| attack(&rig, name, &id))
        .collect();
    let line = variants
        .iter()
        .zip(&scripts)
        .map(|((_, how), (script, _, _))| format!("{how} 'sh {}'", script.display()))
        .collect::<Vec<_>>()
        .join(" ; ");
    run_in(&rig, "mallory", &line);
    for ((name, how), (_, out, cli)) in variants.iter().zip(&scripts) {
        let text = read_when_there(out, name);
        let codes: Vec<String> = text
            .lines()
            .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
            .collect();
        assert_eq!(
            codes,
            [
                "stray_pane",
                "stray_pane",
                "stray_pane",
                "stray_pane",
                "stray_pane",
                "stray_pane",
                "not_the_operator"
            ],
            "{how}: {text}"
        );
        let cli = read_when_there(cli, name);
        assert!(
            cli.contains("stray_pane") && cli.contains("fleetd admit"),
            "{how}: the operator's CLI from the pane is refused and says how to admit it: {cli}"
        );
        assert!(
            cli.contains("not_the_operator") && cli.contains("you are nobody"),
            "{how}: the pane cannot admit itself: {cli}"
        );
    }
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");

    // The split of the lead's pane, admitted: a member cannot do it, the operator can.
    let split = rig
        .pane_ids("base:lead")
        .into_iter()
        .find(|p| !lead_pane.contains(p))
        .expect("the split pane");
    let fleetd = bin_path("fleetd").display().to_string();
    let home = rig.dir().display();
    let by_member = run_in(
        &rig,
        "mallory",
        &format!(
            "{fleetd} admit '{split}' 2>&1 ; env -u FLEETD_URL HOME={home} XDG_CONFIG_HOME={home}/config XDG_STATE_HOME={home}/state {fleetd} admit '{split}' 2>&1"
        ),
    );
    let by_member = format!("{by_member:?}");
    assert_eq!(
        by_member.matches("not_the_operator").count(),
        2,
        "a member cannot admit a pane, over TCP or the operator's socket: {by_member}"
    );
    let refused = structured_ok(&rig.lead("fleet_list", &json!({})));
    assert!(refused["members"].is_array(), "the lead still works");
    let out = admit(&rig, &split);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("is a lead now"),
        "the operator admits it: {} {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let polled = rig.call_from(
        &split,
        "fleet_poll",
        &json!({ "target": "alice" }),
        std::time::Duration::from_secs(60),
    );
    let polled: Value = structured_ok(&polled);
    assert_eq!(
        polled["replies"][0]["msgId"].as_str(),
        Some(id.as_str()),
        "the admitted pane reads as a lead: {polled}"
    );
    // A pane that does not exist, or a member's, is refused with what to do.
    let missing = admit(&rig, "%999");
    assert!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("no_such_pane"),
        "{missing:?}"
    );
}

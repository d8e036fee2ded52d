//! The real Claude Code and Codex CLIs as lead and members on herdr (`fake-herdr`: real PTYs,
//! herdr's socket API and its agent detection — which process is the agent, what its screen
//! says), set up as the README tells a user to: each lead started by hand in a herdr tab.

use std::time::Duration;

use fleetd_testkit::agents::claude::{self, Transport};
use fleetd_testkit::agents::panes::Mux;
use fleetd_testkit::agents::rig::AgentRig;
use fleetd_testkit::agents::turns::{offers, one_nudge, prompt};
use fleetd_testkit::agents::{Cli, codex, stories};
use serde_json::Value;

/// The agent herdr detects in `pane` of the rig's user, and its status.
fn detected(rig: &AgentRig, pane: &str) -> (Value, Value) {
    let fleetd_testkit::agents::panes::Panes::Herdr(herdr) = &rig.panes else {
        unreachable!("a herdr rig")
    };
    let info = herdr
        .call("pane.get", &serde_json::json!({ "pane_id": pane }))
        .expect("fake-herdr answers");
    let pane = &info["result"]["pane"];
    (pane["agent"].clone(), pane["agent_status"].clone())
}

/// The lead in `pane`, once herdr sees it at rest as `agent`, delegates `@reply forty-two` to a
/// member `alice` of profile `agent`; then [`delegated_and_stopped`].
fn delegates_once_seen_idle(rig: &mut AgentRig, lead: &str, agent: &str, reply_tool: &str) {
    rig.wait(
        "herdr to see the lead idle",
        Duration::from_secs(30),
        || {
            let (seen, status) = detected(rig, lead);
            seen == agent && (status == "idle" || status == "done")
        },
    );
    rig.say(lead, &format!("@spawn {agent} alice @reply forty-two"));
    delegated_and_stopped(rig, lead, reply_tool);
}

/// What a lead's delegation leaves behind, checked the same way for both agents: the lead read
/// the reply on its first nudge (one turn, one copy) and acknowledged it, the member's first
/// turn had fleetd's tools, the members' token stayed with the members' model and fleetd
/// counted what it served. Then the lead stops the member and its tab closes.
fn delegated_and_stopped(rig: &mut AgentRig, lead: &str, reply_tool: &str) {
    let lead_turns =
        stories::lead_reads_and_acks(rig, "alice", "forty-two", Duration::from_secs(120));
    rig.assert_task_typed_after_tools("alice");
    let member = rig.member_model.turns();
    let first = member
        .iter()
        .find(|r| prompt(r) == "@reply forty-two")
        .expect("the task reached the member's model");
    assert!(offers(first, reply_tool), "{first}");
    one_nudge(&lead_turns);
    stories::gateway_kept_its_books(rig, lead, "alice");
    stories::lead_stops(rig, lead, "alice");
}

#[test]
fn e2e_claude_on_herdr_lead_delegates_and_reads_the_reply_on_its_first_nudge() {
    let Some(cli) = Cli::newest("claude-code") else {
        return;
    };
    let mut rig = AgentRig::start_on(Mux::Herdr, &[&cli], &claude::profile("claude"), "");
    let lead = claude::start_lead(&mut rig, &cli, Transport::Http);
    // herdr names Claude Code's native binary (`claude.exe`) `claude`, and reads it at rest.
    delegates_once_seen_idle(&mut rig, &lead, "claude", "mcp__fleet__fleet_reply");
}

#[test]
fn e2e_codex_on_herdr_lead_over_the_stdio_shim_delegates_to_a_codex_member() {
    let Some(cli) = Cli::newest("codex") else {
        return;
    };
    let mut rig = AgentRig::start_on(Mux::Herdr, &[&cli], &codex::profile("codex"), "");
    let lead = codex::start_lead(&mut rig, true);
    // herdr looks through `node …/bin/codex` to Codex.
    delegates_once_seen_idle(&mut rig, &lead, "codex", "fleet_reply");
}

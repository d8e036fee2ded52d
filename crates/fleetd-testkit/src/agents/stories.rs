//! Stories the real-agent tests tell the same way whichever CLI plays the lead and the member:
//! each a script said into the lead's pane and the transcript the scripted models must log.

use std::time::Duration;

use super::rig::AgentRig;
use super::turns::{finished, nudges, prompt, read_on_nudge};

/// The lead in pane `lead` spawns `member` from profile `profile` with a model that replies
/// after 6 s, and meanwhile starts a 15 s turn of its own: the member's reply is stored while
/// the lead is busy, and the lead's one nudge (one `[fleet]` line) starts only after that turn
/// ended: a lead is never typed to mid-turn.
pub fn reply_waits_for_the_busy_lead(rig: &AgentRig, lead: &str, profile: &str, member: &str) {
    let spawn = format!("@spawn {profile} {member} @sleep 6 @reply late news");
    rig.say(lead, &spawn);
    rig.wait("the spawn turn to end", Duration::from_secs(90), || {
        finished(&rig.lead_model.turns(), |r| prompt(r) == spawn)
    });
    rig.say(lead, "@sleep 15 @text busy");
    rig.wait(
        &format!("the lead to read {member}'s reply"),
        Duration::from_secs(120),
        || read_on_nudge(&rig.lead_model.turns(), "late news"),
    );
    let turns = rig.lead_model.turns();
    let busy = turns
        .iter()
        .find(|r| prompt(r) == "@sleep 15 @text busy")
        .expect("the busy turn");
    let busy_end = busy["t"].as_u64().expect("t") + 15_000;
    let replied = rig
        .member_model
        .turns()
        .into_iter()
        .find(|r| r["steps"] == 1)
        .and_then(|r| r["t"].as_u64())
        .unwrap_or_else(|| panic!("{member}'s reply"));
    assert!(
        replied < busy_end,
        "{member} replied while the lead was busy ({replied} < {busy_end})"
    );
    let nudges = nudges(&turns);
    assert_eq!(nudges.len(), 1, "{nudges:#?}");
    let nudged = nudges[0]["t"].as_u64().expect("t");
    assert!(
        nudged >= busy_end,
        "the nudge started a turn {} ms before the busy turn ended",
        busy_end.saturating_sub(nudged)
    );
    assert_eq!(prompt(&nudges[0]).matches("[fleet]").count(), 1);
}

//! Stories the real-agent tests tell the same way whichever CLI plays the lead and the member:
//! each a script said into the lead's pane and the transcript the scripted models must log.

use std::time::Duration;

use super::rig::{ANSWER, AgentRig};
use super::turns::{answer, finished, one_nudge, prompt, read_on_nudge};
use crate::fake_model::Logged;

/// Says `line` into pane `pane` and waits up to `patience` for the turn it starts to end;
/// returns that turn's last request (the one the script answered `DONE`).
pub fn turn(rig: &AgentRig, pane: &str, line: &str, patience: Duration) -> Logged {
    rig.say(pane, line);
    rig.wait(&format!("the turn of {line:?} to end"), patience, || {
        finished(&rig.lead_model.turns(), |r| prompt(r) == line)
    });
    rig.lead_model
        .turns()
        .into_iter()
        .rev()
        .find(|r| prompt(r) == line)
        .expect("the turn")
}

/// Waits up to `patience` for the lead to poll and acknowledge `member`'s reply `text` in the
/// turn a `[fleet]` nudge started.
pub fn lead_reads(rig: &AgentRig, member: &str, text: &str, patience: Duration) {
    rig.wait(
        &format!("the lead to poll and ack {member}'s reply"),
        patience,
        || read_on_nudge(&rig.lead_model.turns(), text),
    );
}

/// The lead spawns `member` from `profile` with `@reply text` as its task and, within
/// `patience`, reads the reply on its nudge; the task was typed only once the member's agent had
/// fleetd's tools. The member's model's first turn, for the caller to check how it replied.
pub fn member_replies(
    rig: &mut AgentRig,
    lead: &str,
    [profile, member]: [&str; 2],
    text: &str,
    patience: Duration,
) -> Logged {
    rig.say(lead, &format!("@spawn {profile} {member} @reply {text}"));
    lead_reads(rig, member, text, patience);
    rig.assert_task_typed_after_tools(member);
    rig.member_model
        .turns()
        .into_iter()
        .next()
        .expect("a turn of the member's model")
}

/// [`lead_reads`], and the lead's last turn acknowledged what it read; the lead's turns.
pub fn lead_reads_and_acks(
    rig: &AgentRig,
    member: &str,
    text: &str,
    patience: Duration,
) -> Vec<Logged> {
    lead_reads(rig, member, text, patience);
    let turns = rig.lead_model.turns();
    let last = turns.last().expect("turns");
    assert!(
        answer(last).contains(r#"\"acked\":true"#),
        "the lead acknowledged what it read: {last}"
    );
    turns
}

/// The lead stops `member`: fleetd releases it and its window (tmux) or tab (herdr) closes.
pub fn lead_stops(rig: &AgentRig, lead: &str, member: &str) {
    rig.say(
        lead,
        &format!(r#"@call fleet_stop {{"target":"{member}"}}"#),
    );
    rig.wait(
        &format!("{member} to be released"),
        Duration::from_secs(60),
        || rig.member(member).is_none(),
    );
    rig.wait(
        &format!("{member}'s window to close"),
        Duration::from_secs(30),
        || !rig.windows().contains(&member.to_owned()),
    );
}

/// The lead spawns `member` from `profile` with a question for the lead as its task: the lead
/// answers it with `fleet_answer`, and the member replies with the answer.
pub fn member_question_is_answered(rig: &AgentRig, lead: &str, profile: &str, member: &str) {
    rig.say(
        lead,
        &format!("@spawn {profile} {member} @ask which branch should I use?"),
    );
    rig.wait(
        &format!("{member}'s answer-bearing reply to reach the lead"),
        Duration::from_secs(120),
        || {
            finished(&rig.lead_model.turns(), |r| {
                answer(r).contains("the lead answered")
            })
        },
    );
    let turns = rig.lead_model.turns();
    assert!(
        turns.iter().any(|r| answer(r).contains("fleet_answer")),
        "the lead answered with fleet_answer: {turns:#?}"
    );
    let replies = rig.member_model.turns();
    assert!(
        replies
            .iter()
            .any(|r| answer(r).contains("fleet_reply") && answer(r).contains(ANSWER)),
        "the member replied with the lead's answer: {replies:#?}"
    );
    gateway_kept_its_books(rig, lead, member);
}

/// The lead in pane `lead` spawns `member` from profile `profile` with a model that replies
/// after 6 s, and meanwhile starts a 15 s turn of its own: the member's reply is stored while
/// the lead is busy, and the lead's one nudge (one `[fleet]` line) starts only after that turn
/// ended: a lead is never typed to mid-turn.
pub fn reply_waits_for_the_busy_lead(rig: &AgentRig, lead: &str, profile: &str, member: &str) {
    let spawn = format!("@spawn {profile} {member} @sleep 6 @reply late news");
    turn(rig, lead, &spawn, Duration::from_secs(90));
    rig.say(lead, "@sleep 15 @text busy");
    lead_reads(rig, member, "late news", Duration::from_secs(120));
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
    let nudged = one_nudge(&turns)["t"].as_u64().expect("t");
    assert!(
        nudged >= busy_end,
        "the nudge started a turn {} ms before the busy turn ended",
        busy_end.saturating_sub(nudged)
    );
    gateway_kept_its_books(rig, lead, member);
}

/// What every story ends with while its one member, `member`, is still there: the members'
/// token went only to the members' model, each member and the lead in pane `lead` held what they
/// should ([`AgentRig::assert_member_token_only_with_members`]), and fleetd counted `member`
/// exactly what that model served it ([`AgentRig::assert_usage_is_what_was_served`]).
pub fn gateway_kept_its_books(rig: &AgentRig, lead: &str, member: &str) {
    rig.assert_member_token_only_with_members(lead);
    rig.assert_usage_is_what_was_served(member);
}

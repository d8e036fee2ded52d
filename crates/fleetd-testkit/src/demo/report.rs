//! The demo's report: the steps with their durations, and the reply tally that decides the
//! `N replies lost` line — computed from what the members' `sim-agent` logs say they sent and what
//! the lead's log and fleetd's inbox show became of it, never assumed. Pure: it reads events
//! and writes text, and runs nothing.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

/// One step the demo played.
#[derive(Debug, Clone)]
pub(crate) struct StepRecord {
    /// What the step does.
    pub(crate) title: String,
    /// How long it took.
    pub(crate) took: Duration,
    /// What happened (on success), or why it failed.
    pub(crate) outcome: Result<String, String>,
}

/// A reply a member sent and fleetd acknowledged (its `fleet_reply` returned a msgId).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentReply {
    /// The member.
    pub(crate) member: String,
    /// The id fleetd gave it.
    pub(crate) msg_id: String,
    /// Where fleetd said it went: `waiter` or `inbox`.
    pub(crate) delivered: String,
}

/// What members sent, from their logs: acknowledged replies, and the count of `fleet_reply`
/// calls that failed or were refused (a reply the member could not hand over).
pub(crate) fn sent_replies(member: &str, events: &[Value]) -> (Vec<SentReply>, usize) {
    let mut sent = Vec::new();
    let mut failed = 0;
    for event in events {
        if event["name"] != "fleet_reply" {
            continue;
        }
        let content = &event["result"]["structuredContent"];
        match (event["event"].as_str(), content["msgId"].as_str()) {
            (Some("tool"), Some(id)) if event["result"]["isError"] != true => {
                sent.push(SentReply {
                    member: member.to_owned(),
                    msg_id: id.to_owned(),
                    delivered: content["delivered"].as_str().unwrap_or("?").to_owned(),
                });
            }
            (Some("tool" | "tool_error"), _) => failed += 1,
            _ => {}
        }
    }
    (sent, failed)
}

/// Where replies were found: handed to a waiting `fleet_send`, acknowledged by the lead after it
/// read them (`fleet_ack` answered `acked: true`, so fleetd still had them), or still in an
/// inbox at the end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    /// msgIds a lead's `fleet_send` returned as its reply.
    pub(crate) to_waiter: BTreeSet<String>,
    /// msgIds the lead acknowledged.
    pub(crate) acked: BTreeSet<String>,
    /// msgIds in the members' inboxes at the end.
    pub(crate) in_inbox: BTreeSet<String>,
}

impl Found {
    /// Reads the lead's log: replies its `fleet_send` calls returned, ids its `fleet_ack` calls
    /// acknowledged.
    pub(crate) fn from_lead_log(events: &[Value]) -> Self {
        let mut found = Self::default();
        for event in events.iter().filter(|e| e["event"] == "tool") {
            let content = &event["result"]["structuredContent"];
            if event["result"]["isError"] == true {
                continue;
            }
            if event["name"] == "fleet_send"
                && content["status"] == "replied"
                && let Some(id) = content["msgId"].as_str()
            {
                found.to_waiter.insert(id.to_owned());
            }
            if event["name"] == "fleet_ack" {
                for acked in content["acked"].as_array().into_iter().flatten() {
                    if acked["acked"] == true
                        && let Some(id) = acked["msgId"].as_str()
                    {
                        found.acked.insert(id.to_owned());
                    }
                }
            }
        }
        found
    }

    fn contains(&self, id: &str) -> bool {
        self.to_waiter.contains(id) || self.acked.contains(id) || self.in_inbox.contains(id)
    }
}

/// The reply count the report ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Replies members sent (acknowledged by fleetd).
    pub(crate) sent: usize,
    /// Of those, handed to a waiting `fleet_send`.
    pub(crate) to_waiter: usize,
    /// Read and acknowledged by the lead.
    pub(crate) acked: usize,
    /// Still in an inbox at the end.
    pub(crate) in_inbox: usize,
    /// Sent but found nowhere.
    pub(crate) lost: Vec<SentReply>,
    /// `fleet_reply` calls that failed or were refused.
    pub(crate) failed: usize,
}

/// Counts every sent reply against where it was found.
pub(crate) fn tally(sent: &[SentReply], failed: usize, found: &Found) -> Tally {
    let count = |set: &BTreeSet<String>| sent.iter().filter(|r| set.contains(&r.msg_id)).count();
    Tally {
        sent: sent.len(),
        to_waiter: count(&found.to_waiter),
        acked: count(&found.acked),
        in_inbox: count(&found.in_inbox),
        lost: sent
            .iter()
            .filter(|r| !found.contains(&r.msg_id))
            .cloned()
            .collect(),
        failed,
    }
}

/// Seconds with two decimals, or milliseconds under one second.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// The report: every step with its duration and what happened, the tally, and the last line
/// `N replies lost` (or why nothing could be counted).
pub(crate) fn render(steps: &[StepRecord], notes: &[String], tally: Option<&Tally>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n== fleetd demo: report ==");
    for (i, step) in steps.iter().enumerate() {
        let mark = if step.outcome.is_ok() { "ok  " } else { "FAIL" };
        let _ = writeln!(
            out,
            "{mark} {:>2}. {:<68} {:>9}",
            i + 1,
            step.title,
            human(step.took)
        );
        let text = match &step.outcome {
            Ok(detail) => detail,
            Err(why) => why,
        };
        for line in text.lines() {
            let _ = writeln!(out, "          {line}");
        }
    }
    let total: Duration = steps.iter().map(|s| s.took).sum();
    let _ = writeln!(out, "     total {:>81}", human(total));
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    match tally {
        Some(t) => {
            let _ = writeln!(
                out,
                "replies: members sent {}; {} went straight to a waiting fleet_send, {} were read \
                 and acknowledged by the lead, {} are still in an inbox",
                t.sent, t.to_waiter, t.acked, t.in_inbox
            );
            if t.failed > 0 {
                let _ = writeln!(
                    out,
                    "{} fleet_reply call(s) failed or were refused",
                    t.failed
                );
            }
            for r in &t.lost {
                let _ = writeln!(
                    out,
                    "LOST: {}'s reply {} (delivered: {})",
                    r.member, r.msg_id, r.delivered
                );
            }
            let _ = writeln!(out, "{} replies lost", t.lost.len());
        }
        None => {
            let _ = writeln!(out, "replies were not counted: the demo did not finish");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reply(id: &str, delivered: &str) -> Value {
        json!({ "event": "tool", "name": "fleet_reply", "arguments": { "text": "t" },
                "result": { "isError": false, "structuredContent": { "msgId": id, "delivered": delivered } } })
    }

    #[test]
    fn every_sent_reply_is_found_or_counted_as_lost() {
        let member = vec![
            json!({ "event": "turn", "prompt": "x" }),
            reply("m1", "waiter"),
            reply("m2", "inbox"),
            reply("m3", "inbox"),
            reply("m4", "inbox"),
            json!({ "event": "tool_error", "name": "fleet_reply", "error": "connection refused" }),
            json!({ "event": "tool", "name": "fleet_reply", "result": { "isError": true, "structuredContent": { "code": "not_a_member" } } }),
        ];
        let (sent, failed) = sent_replies("bob", &member);
        assert_eq!(sent.len(), 4);
        assert_eq!(failed, 2);
        let lead = vec![
            json!({ "event": "tool", "name": "fleet_send", "result": { "isError": false, "structuredContent": { "status": "replied", "msgId": "m1" } } }),
            json!({ "event": "tool", "name": "fleet_ack", "result": { "isError": false, "structuredContent": { "acked": [ { "msgId": "m2", "acked": true }, { "msgId": "m4", "acked": false } ] } } }),
        ];
        let mut found = Found::from_lead_log(&lead);
        found.in_inbox.insert("m3".to_owned());
        let t = tally(&sent, failed, &found);
        assert_eq!((t.sent, t.to_waiter, t.acked, t.in_inbox), (4, 1, 1, 1));
        assert_eq!(
            t.lost.iter().map(|r| r.msg_id.as_str()).collect::<Vec<_>>(),
            ["m4"],
            "an ack answered acked:false proves nothing"
        );
        let text = render(&[], &[], Some(&t));
        assert!(text.ends_with("1 replies lost\n"), "{text}");
    }

    #[test]
    fn an_unfinished_demo_counts_nothing() {
        let step = StepRecord {
            title: "start".to_owned(),
            took: Duration::from_millis(1500),
            outcome: Err("tmux failed".to_owned()),
        };
        let text = render(&[step], &[], None);
        assert!(text.contains("FAIL  1. start"), "{text}");
        assert!(text.contains("1.50 s"), "{text}");
        assert!(!text.contains("replies lost"), "{text}");
    }
}

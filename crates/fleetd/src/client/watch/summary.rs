//! What `fleetd watch` prints of an event: the SSE block parsed, and one line for a person
//! (its time, kind and what it is about), with the helpers the table shares (ticket ages,
//! durations, status colours).

use std::time::Duration;

use serde_json::Value;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SseEvent {
    pub(super) kind: String,
    pub(super) id: Option<String>,
    pub(super) data: Value,
}

/// Parses one SSE block (`event:`, `id:`, `data:` lines); `None` for a comment.
pub(super) fn parse_block(block: &str) -> Option<SseEvent> {
    let (mut kind, mut id, mut data) = (String::new(), None, String::new());
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            kind = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("id:") {
            id = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    if kind.is_empty() && data.is_empty() {
        return None;
    }
    let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
    Some(SseEvent { kind, id, data })
}

/// An event as one line: its time, its kind and what it is about.
pub(super) fn summary(event: &SseEvent) -> String {
    let d = &event.data;
    let s = |key: &str| d[key].as_str().unwrap_or("-").to_owned();
    let time = d["at"]
        .as_str()
        .and_then(|at| at.get(11..19))
        .unwrap_or("--:--:--");
    let what = match event.kind.as_str() {
        "member.spawned" => format!("{} joined (profile {})", s("target"), s("profile")),
        "member.status" => format!("{} is {}", s("target"), s("status")),
        "member.released" => format!("{} released ({})", s("target"), s("cause")),
        "ticket.state" => format!(
            "{} ticket {} {}",
            s("target"),
            short(&s("ticket")),
            s("state")
        ),
        "reply.stored" => format!(
            "{} replied ({} bytes{})",
            s("target"),
            d["bytes"].as_u64().unwrap_or(0),
            d["ticket"]
                .as_str()
                .map(|t| format!(", ticket {}", short(t)))
                .unwrap_or_default()
        ),
        "ticket.wake" => format!(
            "{} ticket {}: wake {}",
            s("target"),
            short(&s("ticket")),
            match s("state").as_str() {
                "armed" => "armed (the lead's client polls for it; no nudge)",
                "read" => "read by the lead's client",
                "lapsed" => "not read in time; the nudge takes over",
                _ => "cancelled; the nudge takes over",
            }
        ),
        "inbox.depth" => format!(
            "{} has {} replies waiting",
            s("target"),
            d["depth"].as_u64().unwrap_or(0)
        ),
        "question.opened" => format!("{} asks (question {})", s("target"), s("question_id")),
        "question.closed" => format!(
            "{}'s question {} {}",
            s("target"),
            s("question_id"),
            s("how")
        ),
        "nudge" => match d["lead"].as_str() {
            Some(lead) => format!("nudge {} → {lead}", s("outcome")),
            None => format!("nudge {}", s("outcome")),
        },
        "incident" => format!("incident: {}", s("text")),
        "member.blocked" => {
            let choices = choices(&d["choices"]);
            if choices.is_empty() {
                format!("{} waits on a dialog: {}", s("target"), s("question"))
            } else {
                format!(
                    "{} waits on a dialog: {} ({}; approve {} N)",
                    s("target"),
                    s("question"),
                    choices.join(" · "),
                    s("target")
                )
            }
        }
        "member.unblocked" => format!(
            "{}'s dialog went after {}",
            s("target"),
            human(Duration::from_millis(d["waitedMs"].as_u64().unwrap_or(0)))
        ),
        "member.approved" => format!(
            "{} typed {} ({}) into {}'s dialog: {}",
            s("by"),
            s("choice"),
            s("label"),
            s("target"),
            s("outcome")
        ),
        "config.reloaded" => "configuration reloaded".to_owned(),
        "usage" => {
            let t = &d["tokens"];
            let n = |k: &str| t[k].as_u64().unwrap_or(0);
            let micros = |k: &str| d[k].as_u64().unwrap_or(0);
            format!(
                "{} used {} tokens (in {}, out {}, cache read {}, cache write {}) ${:.4}; {} tokens ${:.2} so far",
                s("target"),
                n("input") + n("output") + n("cacheRead") + n("cacheWrite"),
                n("input"),
                n("output"),
                n("cacheRead"),
                n("cacheWrite"),
                micros("costMicros") as f64 / 1e6,
                d["totalTokens"].as_u64().unwrap_or(0),
                micros("totalCostMicros") as f64 / 1e6,
            )
        }
        "stream.gap" | "stream.lagged" => s("message"),
        _ => d.to_string(),
    };
    format!("{time} {:<16} {what}", event.kind)
}

/// A dialog's choices (`[{key, label}]`) as `1 Yes`, `2 No`.
pub(super) fn choices(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{} {}",
                c["key"].as_str().unwrap_or("?"),
                c["label"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The first block of a ticket id (enough to tell tickets apart on a screen).
pub(super) fn short(ticket: &str) -> &str {
    ticket.get(..8).unwrap_or(ticket)
}

/// How long ago a UUIDv7 ticket was opened (its first 48 bits are its creation time in ms).
pub(super) fn ticket_age(ticket: &str, now_ms: i64) -> Option<Duration> {
    let hex: String = ticket.chars().filter(|c| *c != '-').take(12).collect();
    let opened = i64::from_str_radix(&hex, 16).ok()?;
    u64::try_from(now_ms - opened)
        .ok()
        .map(Duration::from_millis)
}

pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

pub(super) fn colour(status: &str) -> &'static str {
    match status {
        "working" => "\x1b[33m",
        "blocked" => "\x1b[31m",
        "idle" | "done" => "\x1b[32m",
        _ => "\x1b[2m",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_parse_and_comments_are_skipped() {
        let event = parse_block(
            "event: member.status\nid: 1a2-7\ndata: {\"type\":\"member.status\",\"target\":\"nia\",\"status\":\"working\",\"at\":\"2026-12-01T08:00:05.1Z\"}\n\n",
        )
        .expect("an event");
        assert_eq!(event.kind, "member.status");
        assert_eq!(event.id.as_deref(), Some("1a2-7"));
        assert_eq!(summary(&event), "08:00:05 member.status    nia is working");
        assert_eq!(parse_block(": keep-alive\n\n"), None);
    }

    #[test]
    fn ticket_ages_come_from_the_uuid_v7_time() {
        // 0x0191_0000_0000 ms after the epoch, then 90 s later.
        let opened = 0x0191_0000_0000_i64;
        let age = ticket_age("01910000-0000-7000-8000-000000000000", opened + 90_000);
        assert_eq!(age, Some(Duration::from_secs(90)));
        assert_eq!(human(Duration::from_secs(90)), "1m30s");
        assert_eq!(ticket_age("not-a-ticket", 0), None);
    }
}

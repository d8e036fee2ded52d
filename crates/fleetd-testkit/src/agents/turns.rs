//! Reading the scripted model's request log as a test transcript: which turn a prompt started,
//! what the model answered, which tools a turn offered.

use crate::fake_model::Logged;

/// The turn's prompt (empty for a request without one).
pub fn prompt(r: &Logged) -> &str {
    r["prompt"].as_str().unwrap_or_default()
}

/// What the model answered (the script's plan, as logged).
pub fn answer(r: &Logged) -> &str {
    r["answer"].as_str().unwrap_or_default()
}

/// Whether a turn matching `pred` ended: its last request was answered with the script's
/// closing `DONE` text, after its tool calls.
pub fn finished(model: &[Logged], pred: impl Fn(&Logged) -> bool) -> bool {
    model
        .iter()
        .any(|r| pred(r) && answer(r).starts_with("Text(\"DONE"))
}

/// Whether a `[fleet]` nudge's turn ended having read `text` (polled, then acknowledged).
pub fn read_on_nudge(model: &[Logged], text: &str) -> bool {
    finished(model, |r| {
        prompt(r).starts_with("[fleet]") && answer(r).contains(text)
    })
}

/// The turns a `[fleet]` nudge started (their first request, before any tool call).
pub fn nudges(model: &[Logged]) -> Vec<Logged> {
    model
        .iter()
        .filter(|r| prompt(r).starts_with("[fleet]") && r["steps"] == 0)
        .cloned()
        .collect()
}

/// The one turn a `[fleet]` nudge started, its prompt holding one `[fleet]` line (one nudge,
/// submitted by its first Enter: one turn, one copy of the text); panics otherwise.
pub fn one_nudge(model: &[Logged]) -> Logged {
    let nudges = nudges(model);
    assert_eq!(nudges.len(), 1, "nudge turns: {nudges:#?}");
    assert_eq!(
        prompt(&nudges[0]).matches("[fleet]").count(),
        1,
        "{}",
        nudges[0]
    );
    nudges[0].clone()
}

/// Whether the request offered a tool named `tool` (Claude Code's `mcp__fleet__fleet_reply`,
/// Codex's bare `fleet_reply` in its namespace).
pub fn offers(r: &Logged, tool: &str) -> bool {
    r["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|n| n.as_str() == Some(tool)))
}

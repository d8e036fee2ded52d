//! The Anthropic Messages API as Claude Code speaks it (`POST /v1/messages`): the request reduced
//! to a [`Conversation`], the [`Plan`] rendered as a streamed answer (server-sent events
//! `message_start`, `content_block_start`, `content_block_delta` with `text_delta` or
//! `input_json_delta`, `content_block_stop`, `message_delta` with the stop reason and usage,
//! `message_stop`) or, for `stream: false`, one JSON message. Shapes as the API reference gives
//! them (docs.anthropic.com/en/api/messages, /en/api/messages-streaming).

use serde_json::{Value, json};

use super::content_text;
use super::script::{Conversation, Plan, Reply, Step, ToolName};
use super::served::Usage;

/// Claude Code's own reminders, which share a user message with what was typed.
const REMINDER_OPEN: &str = "<system-reminder>";
const REMINDER_CLOSE: &str = "</system-reminder>";
/// What marks a Claude Code task notification (an MCP task completed), itself sent inside a
/// reminder: it is a prompt, the wake of an idle lead.
const TASK_NOTIFICATION: &str = "<task-notification>";

/// The conversation of a Messages request.
pub fn conversation(body: &Value) -> Conversation {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let tools = body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str())
                .map(|name| ToolName {
                    namespace: None,
                    name: name.to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    // The prompt: the last user message with text of its own, or a task notification.
    let mut prompt_at = None;
    let mut prompt = String::new();
    for (i, m) in messages.iter().enumerate() {
        if m["role"] != "user" {
            continue;
        }
        let text = typed_text(&m["content"]);
        if !text.trim().is_empty() {
            prompt_at = Some(i);
            prompt = text;
        }
    }
    let mut steps: Vec<Step> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for m in messages.iter().skip(prompt_at.map_or(0, |i| i + 1)) {
        for block in blocks(&m["content"]) {
            match block["type"].as_str() {
                Some("tool_use") => {
                    ids.push(block["id"].as_str().unwrap_or_default().to_owned());
                    steps.push(Step {
                        tool: bare(block["name"].as_str().unwrap_or_default()),
                        input: block["input"].clone(),
                        result: String::new(),
                    });
                }
                Some("tool_result") => {
                    let id = block["tool_use_id"].as_str().unwrap_or_default();
                    if let Some(at) = ids.iter().position(|i| i == id) {
                        steps[at].result = content_text(&block["content"]);
                    }
                }
                _ => {}
            }
        }
    }
    let side = tools_empty(body) && !prompt.contains(TASK_NOTIFICATION) && prompt_at.is_some();
    Conversation {
        prompt,
        steps,
        tools,
        side,
    }
}

/// A request with no tools is one of Claude Code's side requests (a title, a topic): the agent's
/// turns always offer tools.
fn tools_empty(body: &Value) -> bool {
    body["tools"].as_array().is_none_or(Vec::is_empty)
}

/// fleetd's bare tool name from Claude Code's `mcp__<server>__<tool>`.
fn bare(name: &str) -> String {
    match name.rfind("__") {
        Some(i) if name.starts_with("mcp__") => name[i + 2..].to_owned(),
        _ => name.to_owned(),
    }
}

fn blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

/// The text a person (or fleetd, or a task notification) wrote in a user message: its text
/// blocks with Claude Code's reminders taken out, except a reminder carrying a task notification.
fn typed_text(content: &Value) -> String {
    let mut out = String::new();
    for block in blocks(content) {
        if block["type"] != "text" {
            continue;
        }
        let text = block["text"].as_str().unwrap_or_default();
        out.push_str(&strip_reminders(text));
        out.push('\n');
    }
    out.trim().to_owned()
}

fn strip_reminders(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find(REMINDER_OPEN) {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let end = after
            .find(REMINDER_CLOSE)
            .map_or(after.len(), |e| e + REMINDER_CLOSE.len());
        if after[..end].contains(TASK_NOTIFICATION) {
            out.push_str(&after[..end]);
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The usage object of a message (the numbers are made up, see [`Usage::planned`]; the shape is
/// the API's).
fn usage_of(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input,
        "output_tokens": usage.output,
        "cache_creation_input_tokens": usage.cache_write,
        "cache_read_input_tokens": usage.cache_read,
    })
}

/// The content block and stop reason a plan becomes.
fn block_of(plan: &Plan, n: u64) -> (Value, &'static str) {
    match &plan.reply {
        Reply::Text(text) => (json!({"type": "text", "text": text}), "end_turn"),
        Reply::Call { tool, input } => (
            json!({
                "type": "tool_use",
                "id": format!("toolu_fake{n:08}"),
                "name": tool.name,
                "input": input,
            }),
            "tool_use",
        ),
    }
}

/// The whole answer as one JSON message (`stream: false`).
pub fn message(plan: &Plan, model: &str, n: u64, usage: Usage) -> Value {
    let (block, stop) = block_of(plan, n);
    json!({
        "id": format!("msg_fake{n:08}"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage_of(usage),
    })
}

/// The answer as server-sent events, in order: each `(event name, data)`. As the API does,
/// `message_start` counts the input and the first output token, `message_delta` the whole
/// output (its counts are cumulative).
pub fn events(plan: &Plan, model: &str, n: u64, usage: Usage) -> Vec<(String, Value)> {
    let (block, stop) = block_of(plan, n);
    let mut start = message(plan, model, n, usage);
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    start["usage"]["output_tokens"] = json!(1);
    let mut out = vec![(
        "message_start".to_owned(),
        json!({"type": "message_start", "message": start}),
    )];
    let (empty, delta) = match &plan.reply {
        Reply::Text(text) => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
        ),
        Reply::Call { input, .. } => {
            let mut empty = block;
            empty["input"] = json!({});
            (
                empty,
                json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            )
        }
    };
    out.push((
        "content_block_start".to_owned(),
        json!({"type": "content_block_start", "index": 0, "content_block": empty}),
    ));
    out.push((
        "content_block_delta".to_owned(),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    ));
    out.push((
        "content_block_stop".to_owned(),
        json!({"type": "content_block_stop", "index": 0}),
    ));
    out.push((
        "message_delta".to_owned(),
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null},
            "usage": {"output_tokens": usage.output},
        }),
    ));
    out.push(("message_stop".to_owned(), json!({"type": "message_stop"})));
    out
}

/// A keep-alive while the model "thinks" (a long turn): the API's own `ping` event.
pub fn ping() -> (String, Value) {
    ("ping".to_owned(), json!({"type": "ping"}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_is_the_last_typed_text_and_steps_follow_it() {
        let body = json!({
            "tools": [{"name": "mcp__fleet__fleet_poll"}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>CLAUDE.md says fleet_poll(target=\"x\")</system-reminder>"},
                    {"type": "text", "text": "@reply hi"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "mcp__fleet__fleet_reply", "input": {"text": "hi"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "stored"}]},
                    {"type": "text", "text": "<system-reminder>todo list is empty</system-reminder>"}]},
            ]
        });
        let c = conversation(&body);
        assert_eq!(c.prompt, "@reply hi");
        assert_eq!(c.steps.len(), 1);
        assert_eq!(c.steps[0].tool, "fleet_reply");
        assert_eq!(c.steps[0].result, "stored");
        assert!(!c.side);
    }

    #[test]
    fn a_task_notification_is_a_prompt() {
        let body = json!({
            "tools": [{"name": "mcp__fleet__fleet_poll"}],
            "messages": [
                {"role": "user", "content": "@send alice x"},
                {"role": "assistant", "content": [{"type": "text", "text": "WAITING"}]},
                {"role": "user", "content": [{"type": "text", "text":
                    "<system-reminder>[SYSTEM NOTIFICATION] <task-notification><result>alice replied</result></task-notification></system-reminder>"}]},
            ]
        });
        assert!(conversation(&body).prompt.contains("alice replied"));
    }
}

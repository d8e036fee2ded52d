//! The OpenAI Responses API as Codex speaks it (`POST /v1/responses`, always streamed): the
//! request reduced to a [`Conversation`], the [`Plan`] rendered as the server-sent events Codex
//! reads (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.output_text.delta`/`.done` or `response.function_call_arguments.delta`/`.done`,
//! `response.output_item.done`, `response.completed` with `usage`). Shapes as the API reference
//! gives them (platform.openai.com/docs/api-reference/responses-streaming) and as Codex 0.171
//! was seen to send and read them (the research note `codex-cli.md`): MCP tools arrive as one
//! `namespace` per server, and a call names both the namespace and the tool.

use serde_json::{Value, json};

use super::content_text;
use super::script::{Conversation, Plan, Reply, Step, ToolName};
use super::served::Usage;

/// Codex's own context messages, sent as user messages before what was typed.
const CONTEXT_TAGS: &[&str] = &[
    "<environment_context>",
    "<user_instructions>",
    "<permissions instructions>",
    "# AGENTS.md instructions",
    "<INSTRUCTIONS>",
    "<user_shell_command>",
    "<turn_aborted>",
];

/// The conversation of a Responses request.
pub fn conversation(body: &Value) -> Conversation {
    let input = body["input"].as_array().cloned().unwrap_or_default();
    let mut tools = Vec::new();
    for tool in body["tools"].as_array().into_iter().flatten() {
        match tool["type"].as_str() {
            Some("namespace") => {
                let namespace = tool["name"].as_str().map(str::to_owned);
                for inner in tool["tools"].as_array().into_iter().flatten() {
                    if let Some(name) = inner["name"].as_str() {
                        tools.push(ToolName {
                            namespace: namespace.clone(),
                            name: name.to_owned(),
                        });
                    }
                }
            }
            _ => {
                if let Some(name) = tool["name"].as_str() {
                    tools.push(ToolName {
                        namespace: None,
                        name: name.to_owned(),
                    });
                }
            }
        }
    }
    let mut prompt_at = None;
    let mut prompt = String::new();
    for (i, item) in input.iter().enumerate() {
        if item["type"] != "message" || item["role"] != "user" {
            continue;
        }
        let text = content_text(&item["content"]);
        let trimmed = text.trim_start();
        if trimmed.is_empty() || CONTEXT_TAGS.iter().any(|t| trimmed.starts_with(t)) {
            continue;
        }
        prompt_at = Some(i);
        prompt = text.trim().to_owned();
    }
    let mut steps: Vec<Step> = Vec::new();
    let mut ids: Vec<String> = Vec::new();
    for item in input.iter().skip(prompt_at.map_or(0, |i| i + 1)) {
        match item["type"].as_str() {
            Some("function_call") => {
                ids.push(item["call_id"].as_str().unwrap_or_default().to_owned());
                let args = item["arguments"].as_str().unwrap_or("{}");
                steps.push(Step {
                    tool: item["name"].as_str().unwrap_or_default().to_owned(),
                    input: serde_json::from_str(args).unwrap_or(Value::Null),
                    result: String::new(),
                });
            }
            Some("function_call_output") => {
                let id = item["call_id"].as_str().unwrap_or_default();
                if let Some(at) = ids.iter().position(|i| i == id) {
                    steps[at].result = match &item["output"] {
                        Value::String(s) => s.clone(),
                        other => content_text(other),
                    };
                }
            }
            _ => {}
        }
    }
    // Codex's title request: no tools, a JSON schema for the answer.
    let side = tools.is_empty() && body["text"]["format"]["type"] == "json_schema";
    Conversation {
        prompt,
        steps,
        tools,
        side,
    }
}

/// The output item a plan becomes, complete.
fn item_of(plan: &Plan, n: u64) -> Value {
    match &plan.reply {
        Reply::Text(text) => json!({
            "id": format!("msg_fake{n:08}"),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }),
        Reply::Call { tool, input } => {
            let mut item = json!({
                "id": format!("fc_fake{n:08}"),
                "type": "function_call",
                "status": "completed",
                "call_id": format!("call_fake{n:08}"),
                "name": tool.name,
                "arguments": input.to_string(),
            });
            if let Some(ns) = &tool.namespace {
                item["namespace"] = json!(ns);
            }
            item
        }
    }
}

/// The usage object of a response: the input counts the cached tokens too (the numbers are made
/// up, see [`Usage::planned`]; the shape is the API's).
fn usage_of(usage: Usage) -> Value {
    let input = usage.input + usage.cache_read;
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + usage.output,
    })
}

fn response(model: &str, n: u64, status: &str, output: &[Value], usage: Usage) -> Value {
    let mut r = json!({
        "id": format!("resp_fake{n:08}"),
        "object": "response",
        "created_at": 0,
        "status": status,
        "model": model,
        "output": output,
    });
    if status == "completed" {
        r["usage"] = usage_of(usage);
    }
    r
}

/// The answer as server-sent events, in order: each `(event name, data)`.
pub fn events(plan: &Plan, model: &str, n: u64, usage: Usage) -> Vec<(String, Value)> {
    let item = item_of(plan, n);
    let item_id = item["id"].clone();
    let mut seq = 0_u64;
    let mut out = Vec::new();
    let mut push = |name: &str, mut data: Value| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(seq);
        seq += 1;
        out.push((name.to_owned(), data));
    };
    push(
        "response.created",
        json!({"response": response(model, n, "in_progress", &[], usage)}),
    );
    push(
        "response.in_progress",
        json!({"response": response(model, n, "in_progress", &[], usage)}),
    );
    let mut added = item.clone();
    added["status"] = json!("in_progress");
    match &plan.reply {
        Reply::Text(text) => {
            added["content"] = json!([]);
            push(
                "response.output_item.added",
                json!({"output_index": 0, "item": added}),
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            push(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            );
            push(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": text}),
            );
            push(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "text": text}),
            );
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            push(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            );
        }
        Reply::Call { input, .. } => {
            added["arguments"] = json!("");
            push(
                "response.output_item.added",
                json!({"output_index": 0, "item": added}),
            );
            let args = input.to_string();
            push(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": 0, "delta": args}),
            );
            push(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": 0, "arguments": args}),
            );
        }
    }
    push(
        "response.output_item.done",
        json!({"output_index": 0, "item": item}),
    );
    push(
        "response.completed",
        json!({"response": response(model, n, "completed", &[item_of(plan, n)], usage)}),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_tools_and_calls_are_read() {
        let body = json!({
            "tools": [{"type": "namespace", "name": "mcp__fleet", "tools": [
                {"type": "function", "name": "fleet_reply"}]}],
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "@reply hi"}]},
                {"type": "function_call", "namespace": "mcp__fleet", "name": "fleet_reply", "arguments": "{\"text\":\"hi\"}", "call_id": "c1"},
                {"type": "function_call_output", "call_id": "c1", "output": "Wall time: 0.01 seconds\nOutput:\nstored"},
            ]
        });
        let c = conversation(&body);
        assert_eq!(c.prompt, "@reply hi");
        assert_eq!(
            c.tools,
            vec![ToolName {
                namespace: Some("mcp__fleet".into()),
                name: "fleet_reply".into()
            }]
        );
        assert_eq!(c.steps[0].input, json!({"text": "hi"}));
        assert!(c.steps[0].result.ends_with("stored"));
    }
}

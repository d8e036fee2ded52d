//! The OpenAI Chat Completions API (`POST /v1/chat/completions`): the request reduced to a
//! [`Conversation`] (its last user message is the prompt; tools are not read, so the script
//! answers in text only and a directive that needs a tool ends with `NO TOOL <name>`), the
//! [`Plan`] rendered as one `chat.completion` object or, for `stream: true`, as
//! `chat.completion.chunk`s: the role, the text in pieces, the finish, then — when
//! `stream_options.include_usage` is set — a chunk with no choices and the usage, and `[DONE]`.
//! Shapes as the API reference gives them (platform.openai.com/docs/api-reference/chat,
//! /chat-streaming).

use serde_json::{Value, json};

use super::content_text;
use super::script::{Conversation, Plan, Reply};
use super::served::Usage;

/// The conversation of a Chat Completions request.
pub fn conversation(body: &Value) -> Conversation {
    let prompt = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| content_text(&m["content"]))
        .rfind(|t| !t.trim().is_empty())
        .unwrap_or_default();
    Conversation {
        prompt: prompt.trim().to_owned(),
        steps: Vec::new(),
        tools: Vec::new(),
        side: false,
    }
}

/// The text a plan becomes (a call, which the script never plans without tools, as prose).
fn text(plan: &Plan) -> String {
    match &plan.reply {
        Reply::Text(text) => text.clone(),
        Reply::Call { tool, input } => format!("CALL {} {input}", tool.name),
    }
}

/// The usage object (the numbers are made up, see [`Usage::planned`]; the prompt tokens count
/// the cached ones too; the shape is the API's).
fn usage_of(usage: Usage) -> Value {
    let prompt = usage.input + usage.cache_read;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output,
        "total_tokens": prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    })
}

/// The whole answer as one `chat.completion` (`stream` false or absent).
pub fn completion(plan: &Plan, model: &str, n: u64, usage: Usage) -> Value {
    json!({
        "id": format!("chatcmpl-fake{n:08}"),
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text(plan), "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }],
        "usage": usage_of(usage),
    })
}

/// The answer as server-sent events, in order: each `("", data)` (the stream names no events),
/// the last `("", "[DONE]")`. With `include_usage`, every chunk carries `"usage": null` but the
/// last before `[DONE]`, which has no choices and the usage.
pub fn chunks(
    plan: &Plan,
    model: &str,
    n: u64,
    usage: Usage,
    include_usage: bool,
) -> Vec<(String, Value)> {
    let chunk = |choices: Value| {
        let mut c = json!({
            "id": format!("chatcmpl-fake{n:08}"),
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": choices,
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let choice = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    let mut out = vec![chunk(choice(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    ))];
    for piece in pieces(&text(plan)) {
        out.push(chunk(choice(json!({"content": piece}), Value::Null)));
    }
    out.push(chunk(choice(json!({}), json!("stop"))));
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage_of(usage);
        out.push(last);
    }
    out.push(json!("[DONE]"));
    out.into_iter().map(|c| (String::new(), c)).collect()
}

/// `text` in pieces of a word each (its whitespace kept), as a model streams tokens.
fn pieces(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_whitespace() && !word.trim().is_empty() {
            out.push(std::mem::take(&mut word));
        }
        word.push(c);
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_user_message_is_the_prompt() {
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "OK"},
            {"role": "user", "content": [{"type": "text", "text": "@text hi"}]},
        ]});
        assert_eq!(conversation(&body).prompt, "@text hi");
    }

    #[test]
    fn pieces_join_to_the_text() {
        let text = "one two  three";
        assert_eq!(pieces(text).concat(), text);
        assert_eq!(pieces(text).len(), 3);
    }
}

//! The fake model's script: what a model would do next, decided from the conversation alone
//! (stateless, so a restarted agent or a resumed session gets the same answer). Pure: no wire
//! format, no I/O. Both APIs (`anthropic`, `openai`) reduce a request to a [`Conversation`] and
//! render the [`Plan`] this module returns.
//!
//! What the model does with the last prompt:
//! - **directives** a test writes into a lead's prompt or a member's task, in order:
//!   - `@reply TEXT` calls `fleet_reply{text}`;
//!   - `@ask QUESTION` calls `fleet_ask{question}`, then `fleet_reply` with the answer it got;
//!   - `@send TARGET TASK…` calls `fleet_send{target, task}` (the rest of the prompt is the task,
//!     so a member's directives ride inside it); `@send-nowait` the same with `wait: false`;
//!   - `@spawn PROFILE NAME [TASK…]` calls `fleet_spawn`;
//!   - `@call TOOL {json}` calls any tool with those arguments (the rest of the prompt);
//!   - `@bash COMMAND` calls the client's shell tool (Claude Code's `Bash`) with that command;
//!   - `@exec COMMAND` calls Codex's `exec_command` asking to run it outside Codex's sandbox;
//!   - `@sleep SECS` makes this turn's next answer take that long (a long turn, streamed);
//!   - `@text TEXT` ends the turn with that text;
//! - **a text of fleetd's** (a `[fleet]` nudge, or a task's result in a Claude Code task
//!   notification) is followed as a model would: every call it names (`fleet_poll(target="alice")`,
//!   `fleet_answer(questionId="…", answer=...)`, `fleet_poll(ticket="…", wait=true)`) is made, in
//!   order, and every message a `fleet_poll{target}` returned is acknowledged with `fleet_ack`;
//! - anything else ends the turn with `OK`.
//!
//! A tool the request does not offer is never called: the turn ends with the text
//! `NO TOOL <name>` instead, which is what a real model does without the tool (the symptom of a
//! member typed to before its agent listed fleetd's tools).

use std::time::Duration;

use serde_json::{Value, json};

/// A tool as the client offers it: Claude Code names MCP tools `mcp__<server>__<tool>`, Codex
/// groups them in a namespace (`mcp__fleet`) holding the bare name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolName {
    /// Codex's namespace, when the tool sits in one.
    pub namespace: Option<String>,
    /// The name the client knows it by.
    pub name: String,
}

impl ToolName {
    /// Whether this is fleetd's tool `bare` (`fleet_reply`), whatever the client calls it.
    fn is(&self, bare: &str) -> bool {
        self.name == bare || self.name.ends_with(&format!("__{bare}"))
    }
}

/// One tool call the model made after the prompt, and what came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// fleetd's name of the tool called (`fleet_poll`), or the client's name for any other tool.
    pub tool: String,
    /// The arguments it was called with.
    pub input: Value,
    /// The result's text as the client handed it to the model (empty until it arrives).
    pub result: String,
}

/// A request reduced to what the script needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    /// The text of the turn's prompt: the last user message a person, fleetd or the client's
    /// task notification wrote (the client's own reminders taken out).
    pub prompt: String,
    /// The tool calls made since the prompt, in order.
    pub steps: Vec<Step>,
    /// The tools the request offers.
    pub tools: Vec<ToolName>,
    /// A side request of the client's (a title, a summary): answered with a short text, never
    /// a tool call.
    pub side: bool,
}

/// What the model answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// End the turn with this text.
    Text(String),
    /// Call this tool.
    Call {
        /// The tool as the client knows it.
        tool: ToolName,
        /// Its arguments.
        input: Value,
    },
}

/// The answer and how long it takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// How long the model "thinks" before the answer completes (streamed meanwhile).
    pub delay: Duration,
    /// The answer.
    pub reply: Reply,
}

/// Knobs of the script.
#[derive(Debug, Clone)]
pub struct Options {
    /// What the model answers a member's question with.
    pub answer: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            answer: "yes".to_owned(),
        }
    }
}

/// One thing the script wants done.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    /// Call fleetd's tool (bare name) with these arguments.
    Call(&'static str, Value),
    /// Call `fleet_reply` with the answer the last `fleet_ask` got.
    ReplyWithAnswer,
    /// Acknowledge what the last `fleet_poll{target}` returned.
    AckPolled,
    /// Wait this long before the next answer.
    Sleep(Duration),
    /// End the turn with this text.
    Text(String),
}

/// The model's next answer for `conv`.
pub fn next(conv: &Conversation, opts: &Options) -> Plan {
    if conv.side {
        // Both clients ask for a JSON title (a json_schema output format) and ignore prose.
        return plan(
            Duration::ZERO,
            Reply::Text(json!({ "title": "Fleet task" }).to_string()),
        );
    }
    let wants = wants(&conv.prompt, opts);
    let mut delay = Duration::ZERO;
    let mut done = conv.steps.iter();
    for want in wants {
        let call = match want {
            Want::Sleep(d) => {
                // A sleep before a step already made was slept already.
                if done.len() == 0 {
                    delay += d;
                }
                continue;
            }
            Want::Text(text) => return plan(delay, Reply::Text(text)),
            Want::Call(tool, input) => (tool, input),
            Want::ReplyWithAnswer => {
                let answer = conv
                    .steps
                    .iter()
                    .rev()
                    .find(|s| s.tool == "fleet_ask")
                    .map(|s| s.result.clone())
                    .unwrap_or_default();
                (
                    "fleet_reply",
                    json!({ "text": format!("the lead answered: {answer}") }),
                )
            }
            Want::AckPolled => {
                let polled = conv.steps.iter().rev().find(|s| s.tool == "fleet_poll");
                let Some(polled) = polled else { continue };
                let ids = msg_ids(&polled.result);
                let Some(target) = polled.input.get("target").cloned() else {
                    continue;
                };
                if ids.is_empty() {
                    continue;
                }
                ("fleet_ack", json!({ "target": target, "msgIds": ids }))
            }
        };
        if done.next().is_some() {
            continue;
        }
        let (bare, input) = call;
        return match conv.tools.iter().find(|t| t.is(bare)) {
            Some(tool) => plan(
                delay,
                Reply::Call {
                    tool: tool.clone(),
                    input,
                },
            ),
            None => plan(delay, Reply::Text(format!("NO TOOL {bare}"))),
        };
    }
    let text = if conv.steps.is_empty() {
        "OK".to_owned()
    } else {
        // What the model read, so a test (and the bench) can see the reply reached it.
        let read: Vec<&str> = conv.steps.iter().map(|s| s.result.as_str()).collect();
        format!("DONE {}", read.join(" | "))
    };
    plan(delay, Reply::Text(text))
}

fn plan(delay: Duration, reply: Reply) -> Plan {
    Plan { delay, reply }
}

/// The steps a prompt asks for: its directives, else the calls a text of fleetd's names.
fn wants(prompt: &str, opts: &Options) -> Vec<Want> {
    let directives = directives(prompt);
    if !directives.is_empty() {
        return directives;
    }
    let mut out = Vec::new();
    for (tool, args) in named_calls(prompt) {
        let polls_target = tool == "fleet_poll" && args.get("target").is_some();
        let args = fill(args, opts);
        out.push(Want::Call(tool, args));
        if polls_target {
            out.push(Want::AckPolled);
        }
    }
    out
}

/// `@word` directives, left to right. `@send`, `@spawn` and `@call` take the rest of the
/// prompt, so a task's own directives travel inside it.
fn directives(prompt: &str) -> Vec<Want> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(at) = find_directive(rest) {
        let after = &rest[at + 1..];
        let word_end = after
            .find(|c: char| c.is_whitespace())
            .unwrap_or(after.len());
        let word = &after[..word_end];
        let body_all = after[word_end..].trim_start();
        let (body, next) = match find_directive(body_all) {
            Some(n) if !matches!(word, "send" | "send-nowait" | "spawn" | "call") => {
                (body_all[..n].trim(), &body_all[n..])
            }
            _ => (body_all.trim(), ""),
        };
        match word {
            "reply" => out.push(Want::Call("fleet_reply", json!({ "text": body }))),
            "ask" => {
                out.push(Want::Call("fleet_ask", json!({ "question": body })));
                out.push(Want::ReplyWithAnswer);
            }
            "send" | "send-nowait" => {
                let (target, task) = split_word(body);
                let mut args = json!({ "target": target, "task": task });
                if word == "send-nowait" {
                    args["wait"] = json!(false);
                }
                out.push(Want::Call("fleet_send", args));
            }
            "spawn" => {
                let (profile, rest) = split_word(body);
                let (name, task) = split_word(rest);
                let mut args = json!({ "profile": profile, "name": name });
                if !task.is_empty() {
                    args["task"] = json!(task);
                }
                out.push(Want::Call("fleet_spawn", args));
            }
            "call" => {
                let (tool, args) = split_word(body);
                let args = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
                if let Some(bare) = FLEET_TOOLS.iter().find(|t| **t == tool) {
                    out.push(Want::Call(bare, args));
                }
            }
            // Claude Code's own shell tool: what a member asks its user to allow.
            "bash" => out.push(Want::Call(
                "Bash",
                json!({ "command": body, "description": "Run what the task asks" }),
            )),
            // Codex's shell tool, asking to run outside its sandbox: what Codex asks its user
            // to approve under its default `approval_policy = "on-request"`.
            "exec" => out.push(Want::Call(
                "exec_command",
                json!({
                    "cmd": body,
                    "sandbox_permissions": "require_escalated",
                    "justification": "the task asks for it",
                }),
            )),
            "sleep" => {
                let secs: f64 = body.parse().unwrap_or(1.0);
                out.push(Want::Sleep(Duration::from_secs_f64(secs.max(0.0))));
            }
            "text" => out.push(Want::Text(body.to_owned())),
            _ => {}
        }
        rest = next;
    }
    out
}

/// fleetd's tools, the names `@call` and fleetd's texts may use.
const FLEET_TOOLS: &[&str] = &[
    "fleet_profiles",
    "fleet_spawn",
    "fleet_list",
    "fleet_status",
    "fleet_send",
    "fleet_poll",
    "fleet_ack",
    "fleet_answer",
    "fleet_stop",
    "fleet_reply",
    "fleet_ask",
];

/// Where the next `@word` directive starts (an `@` at the start or after whitespace, followed by
/// a known word).
fn find_directive(text: &str) -> Option<usize> {
    const WORDS: &[&str] = &[
        "reply",
        "ask",
        "send",
        "send-nowait",
        "spawn",
        "call",
        "bash",
        "exec",
        "sleep",
        "text",
    ];
    text.match_indices('@').map(|(i, _)| i).find(|&i| {
        let before_ok = i == 0 || text[..i].ends_with(char::is_whitespace);
        let word: String = text[i + 1..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        before_ok && WORDS.contains(&word.as_str())
    })
}

fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], text[i..].trim_start()),
        None => (text, ""),
    }
}

/// Every `fleet_xxx(key="value", key=true, key=...)` call form in `text`, in order.
fn named_calls(text: &str) -> Vec<(&'static str, serde_json::Map<String, Value>)> {
    // A text of fleetd's may arrive inside JSON (a task's structured result): its quotes escaped.
    let text = &text.replace("\\\"", "\"");
    let mut out = Vec::new();
    for (i, _) in text.match_indices("fleet_") {
        let rest = &text[i..];
        let Some(open) = rest.find('(') else { continue };
        let name = &rest[..open];
        let Some(bare) = FLEET_TOOLS.iter().find(|t| **t == name) else {
            continue;
        };
        let Some(close) = rest[open..].find(')') else {
            continue;
        };
        let inner = &rest[open + 1..open + close];
        let mut args = serde_json::Map::new();
        for pair in inner.split(',') {
            let Some((key, value)) = pair.split_once('=') else {
                continue;
            };
            let value = value.trim();
            let value = if let Some(s) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                json!(s)
            } else if value == "..." {
                Value::Null
            } else {
                serde_json::from_str(value).unwrap_or_else(|_| json!(value))
            };
            args.insert(key.trim().to_owned(), value);
        }
        out.push((*bare, args));
    }
    out
}

/// Fills a named call's placeholders (`answer=...`).
fn fill(mut args: serde_json::Map<String, Value>, opts: &Options) -> Value {
    if args.get("answer").is_some_and(Value::is_null) {
        args.insert("answer".to_owned(), json!(opts.answer));
    }
    Value::Object(args)
}

/// The message ids in a `fleet_poll` result as the client handed it over (JSON, JSON inside a
/// string, or prose): every UUID that follows a `msgId` key.
pub fn msg_ids(result: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for (i, _) in result.match_indices("msgId") {
        let after = &result[i + "msgId".len()..];
        let start = after.find(|c: char| c.is_ascii_hexdigit());
        let Some(start) = start.filter(|s| *s < 8) else {
            continue;
        };
        let id: String = after[start..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '-')
            .collect();
        if id.len() == 36 && !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet_tools(prefix: &str) -> Vec<ToolName> {
        FLEET_TOOLS
            .iter()
            .map(|t| ToolName {
                namespace: None,
                name: format!("{prefix}{t}"),
            })
            .collect()
    }

    fn conv(prompt: &str, steps: &[(&str, Value, &str)]) -> Conversation {
        Conversation {
            prompt: prompt.to_owned(),
            steps: steps
                .iter()
                .map(|(tool, input, result)| Step {
                    tool: (*tool).to_owned(),
                    input: input.clone(),
                    result: (*result).to_owned(),
                })
                .collect(),
            tools: fleet_tools("mcp__fleet__"),
            side: false,
        }
    }

    fn call_of(plan: &Plan) -> (String, Value) {
        match &plan.reply {
            Reply::Call { tool, input } => (tool.name.clone(), input.clone()),
            other => panic!("expected a call, got {other:?}"),
        }
    }

    #[test]
    fn a_task_with_a_reply_directive_is_answered_with_fleet_reply_then_ends() {
        let c = conv("please @reply forty-two", &[]);
        assert_eq!(
            call_of(&next(&c, &Options::default())),
            (
                "mcp__fleet__fleet_reply".into(),
                json!({"text": "forty-two"})
            )
        );
        let c = conv(
            "please @reply forty-two",
            &[("fleet_reply", json!({}), "{\"msgId\":\"x\"}")],
        );
        assert!(
            matches!(next(&c, &Options::default()).reply, Reply::Text(t) if t.starts_with("DONE"))
        );
    }

    #[test]
    fn send_takes_the_rest_of_the_prompt_as_the_task() {
        let c = conv("@send alice @reply 42 @text no", &[]);
        assert_eq!(
            call_of(&next(&c, &Options::default())).1,
            json!({"target": "alice", "task": "@reply 42 @text no"})
        );
    }

    #[test]
    fn a_nudge_is_followed_by_poll_then_ack_of_what_it_returned() {
        let nudge = "[fleet] 1 message from alice waiting — call fleet_poll(target=\"alice\") (then fleet_ack the messages you have read)";
        let c = conv(nudge, &[]);
        assert_eq!(
            call_of(&next(&c, &Options::default())),
            ("mcp__fleet__fleet_poll".into(), json!({"target": "alice"}))
        );
        let id = "0193d1a2-0000-7000-8000-000000000001";
        let polled = format!("{{\"replies\":[{{\"msgId\":\"{id}\",\"text\":\"hi\"}}]}}");
        let c = conv(
            nudge,
            &[("fleet_poll", json!({"target": "alice"}), &polled)],
        );
        assert_eq!(
            call_of(&next(&c, &Options::default())).1,
            json!({"target": "alice", "msgIds": [id]})
        );
    }

    #[test]
    fn a_call_named_inside_a_tasks_json_result_is_made() {
        let wake = r#"<task-notification><result>{"next":"once read, fleet_ack(target=\"alice\", msgId=\"m-1\")","reply":"42"}</result></task-notification>"#;
        let c = conv(wake, &[]);
        assert_eq!(
            call_of(&next(&c, &Options::default())),
            (
                "mcp__fleet__fleet_ack".into(),
                json!({"target": "alice", "msgId": "m-1"})
            )
        );
    }

    #[test]
    fn a_question_in_a_nudge_is_answered_with_the_configured_answer() {
        let nudge = "[fleet] question q-1 from bob waiting — call fleet_answer(questionId=\"q-1\", answer=...)";
        let opts = Options {
            answer: "use main".into(),
        };
        assert_eq!(
            call_of(&next(&conv(nudge, &[]), &opts)).1,
            json!({"questionId": "q-1", "answer": "use main"})
        );
    }

    #[test]
    fn a_missing_tool_is_never_called() {
        let mut c = conv("@reply 42", &[]);
        c.tools.clear();
        assert_eq!(
            next(&c, &Options::default()).reply,
            Reply::Text("NO TOOL fleet_reply".into())
        );
    }

    #[test]
    fn sleep_delays_only_the_step_after_it() {
        let c = conv("@sleep 2 @reply done", &[]);
        assert_eq!(next(&c, &Options::default()).delay, Duration::from_secs(2));
        let c = conv("@sleep 2 @reply done", &[("fleet_reply", json!({}), "ok")]);
        assert_eq!(next(&c, &Options::default()).delay, Duration::ZERO);
    }

    #[test]
    fn ids_are_found_in_json_escaped_inside_a_string() {
        let id = "0193d1a2-0000-7000-8000-0000000000ab";
        let text = format!("Output:\n{{\\\"msgId\\\": \\\"{id}\\\"}}");
        assert_eq!(msg_ids(&text), vec![id.to_owned()]);
    }
}

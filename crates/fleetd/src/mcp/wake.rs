//! The keystroke-free wake: MCP tasks (extension `io.modelcontextprotocol/tasks`, SEP-2663).
//!
//! To a client whose request declares the extension (Claude Code ≥ 2.1.3xx), a waiting
//! `fleet_send` — or `fleet_poll{ticket, wait: true}` on a ticket it holds — answers at once
//! with a task once the ticket and its wake are durable. The client polls `tasks/get`; when the
//! ticket has news the caller must act on (a reply, a question from its member, a turn ended
//! without reply, stalled, failed) the task completes with the same result a waiting
//! `fleet_send` returns, and the client starts a turn with it by itself. Nothing is typed into
//! its pane, and that news is not nudged about while the wake is live (see `engine::state::wakes`).
//!
//! A task id is a random 128-bit capability bound to the caller's identity (its pane, not its
//! connection: a reconnect or `claude --resume` polls from new ones); another caller's id and an
//! unknown one get the same "not found". `tasks/cancel` only stops the wake: the reply still
//! lands in the inbox and the nudge takes over.

use std::time::Duration;

use rmcp::ErrorData;
use rmcp::model::{
    CallToolResult, ContentBlock, CreateTaskResult, DetailedTask, JsonObject, Task, TaskPayload,
    TaskStatus,
};
use serde_json::{Value, json};

use super::{Caller, Fleet, ToolOutput, tools};
use crate::engine::WakeView;
use fleetd_core::{MessageKind, Ticket, TicketState};

/// How often a client polls a task (`pollIntervalMs`). Claude Code wakes within this of the
/// news (plus ~0.2 s), and stops re-dialling an HTTP server after five failed polls in a row
/// (`../shared/research/mcp-tasks-claude-code.md`), so five of these must outlast a restart of
/// the daemon. Measured: kill -9 → answering again takes ~20 ms; the service unit waits 2 s
/// (`RestartSec=2s`), so 2 s polls (≈10 s of outage survived) keep a crash's wake with room to
/// spare. The wake itself does not wait for a poll: a working task's poll is held
/// ([`TASK_HOLD`]) and answered on the news (p50 100 ms, docs/BENCHMARKS.md). The stdio shim
/// holds its session across a restart itself (`shim_relay`).
pub const TASK_POLL: Duration = Duration::from_millis(2000);

/// How long a `tasks/get` of a working task is held for news before it answers `working`:
/// well under the 60 s after which Claude Code drops a silent answer.
pub const TASK_HOLD: Duration = Duration::from_secs(20);

/// The events after which a held `tasks/get` looks at its ticket again.
const NEWS: &[&str] = &[
    "ticket.state",
    "reply.stored",
    "question.opened",
    "ticket.wake",
];

/// How long a task is kept (`ttlMs`): as long as its ticket at least, most of a working day.
pub const TASK_TTL: Duration = Duration::from_secs(24 * 3600);

/// Whether this call, by a client that takes tasks, is answered with one: a waiting
/// `fleet_send`, or `fleet_poll` with a ticket and `wait: true`.
pub(super) fn takes_task(name: &str, args: &serde_json::Map<String, Value>) -> bool {
    match name {
        "fleet_send" => args.get("wait") != Some(&Value::Bool(false)),
        "fleet_poll" => {
            args.get("wait") == Some(&Value::Bool(true))
                && args.get("ticket").is_some_and(Value::is_string)
        }
        _ => false,
    }
}

/// Runs `name` without its wait, then arms a wake on its ticket for `caller`: the task, or the
/// tool's own answer when it refused (or the caller can own no task).
pub(super) async fn call_as_task(
    fleet: &Fleet,
    caller: &Caller,
    name: &str,
    mut args: serde_json::Map<String, Value>,
) -> Result<CreateTaskResult, Result<ToolOutput, super::ToolError>> {
    args.insert("wait".to_owned(), Value::Bool(false));
    args.remove("timeoutSecs");
    let out = tools::call(fleet, caller, name, Value::Object(args)).await;
    let Ok(output) = &out else {
        return Err(out);
    };
    let (Some(owner), Some(ticket)) = (
        caller.holder(),
        output.value["ticket"]
            .as_str()
            .and_then(|t| Ticket::parse(t).ok()),
    ) else {
        return Err(out);
    };
    let armed = match fleet.engine.arm_wake(ticket, owner).await {
        Ok(armed) => armed,
        Err(e) => return Err(Err(tools::gone(e))),
    };
    let id = match armed {
        Ok(id) => id,
        Err(refusal) => return Err(Err(refusal)),
    };
    tracing::debug!(%ticket, caller = %caller, "ticket answered with a task");
    metrics::counter!("fleetd_tasks_total", "outcome" => "armed").increment(1);
    let now = fleet.clock.now().to_string();
    let task = Task::new(id, TaskStatus::Working, now.clone(), now)
        .with_ttl_ms(millis(TASK_TTL))
        .with_poll_interval_ms(millis(TASK_POLL))
        .with_status_message(format!("waiting on ticket {ticket}"));
    Ok(CreateTaskResult::new(task))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// "Not found", the same for another caller's task and an unknown one.
fn not_found() -> ErrorData {
    ErrorData::invalid_params("Task not found", None)
}

/// `tasks/get`: the task as its ticket makes it now.
///
/// A task still working is answered after up to [`TASK_HOLD`], or the moment its ticket has
/// news: a long poll, so the client hears of a reply at once rather than at its next poll.
/// `gone` fires when the client stops waiting.
pub(super) async fn get(
    fleet: &Fleet,
    caller: &Caller,
    id: &str,
    gone: &tokio_util::sync::CancellationToken,
) -> Result<DetailedTask, ErrorData> {
    let owner = caller.holder().ok_or_else(not_found)?;
    // Subscribed before the first look, so news between the look and the wait is not missed.
    let mut news = fleet.engine.events().subscribe(None).live;
    let deadline = tokio::time::Instant::now() + TASK_HOLD;
    let (view, payload) = loop {
        let view = fleet
            .engine
            .wake(id.to_owned(), owner.clone())
            .await
            .map_err(|_| ErrorData::internal_error("fleetd is shutting down", None))?
            .ok_or_else(not_found)?;
        let payload = outcome(fleet, &view).await;
        if !matches!(payload, TaskPayload::Working) {
            break (view, payload);
        }
        let changed = loop {
            tokio::select! {
                event = news.recv() => match event {
                    Ok(event) if NEWS.contains(&event.kind) => break true,
                    Ok(_) => {}
                    // Missed some: look again. Closed: the daemon is stopping.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break false,
                },
                () = tokio::time::sleep_until(deadline) => break false,
                () = gone.cancelled() => break false,
            }
        };
        if !changed {
            break (view, payload);
        }
    };
    let created = view.created_at.to_string();
    let updated = if matches!(payload, TaskPayload::Working) {
        created.clone()
    } else {
        fleet.clock.now().to_string()
    };
    if let TaskPayload::Completed { result } = &payload {
        let error = result.get("isError") == Some(&Value::Bool(true));
        metrics::counter!("fleetd_tasks_total", "outcome" => if error { "failed" } else { "completed" })
            .increment(1);
        let _ = fleet.engine.wake_read(id.to_owned(), owner).await;
    }
    let task = Task::new(id, TaskStatus::Working, created, updated)
        .with_ttl_ms(millis(TASK_TTL))
        .with_poll_interval_ms(millis(TASK_POLL));
    Ok(DetailedTask::new(task, payload))
}

/// `tasks/cancel`: stops the wake (the nudge takes over); the member's work goes on.
pub(super) async fn cancel(fleet: &Fleet, caller: &Caller, id: &str) -> Result<(), ErrorData> {
    let owner = caller.holder().ok_or_else(not_found)?;
    let cancelled = fleet
        .engine
        .cancel_wake(id.to_owned(), owner)
        .await
        .map_err(|_| ErrorData::internal_error("fleetd is shutting down", None))?;
    if !cancelled {
        return Err(not_found());
    }
    metrics::counter!("fleetd_tasks_total", "outcome" => "cancelled").increment(1);
    Ok(())
}

/// What the wake's ticket says now. Claude Code hands the model the structured result when there
/// is one (measured with 2.1.332), else the text: both say what happened and, in `next`, the
/// call to make.
async fn outcome(fleet: &Fleet, view: &WakeView) -> TaskPayload {
    if view.cancelled {
        return TaskPayload::Cancelled;
    }
    let ticket = view.ticket;
    let (Some(target), Some(state)) = (&view.target, view.state) else {
        return completed(
            json!({ "ticket": ticket, "status": "expired" }),
            format!("fleet: ticket {ticket} has expired"),
            "its reply, if any, is in the member's inbox: fleet_poll(target=...) reads it"
                .to_owned(),
            true,
        );
    };
    if state.is_terminal() {
        let reply = match &view.reply {
            Some(reply) => Some(reply.clone()),
            None => tools::poll::find_reply(&*fleet.store, target, ticket)
                .await
                .ok()
                .flatten(),
        };
        let failed = matches!(state, TicketState::Failed | TicketState::Stalled);
        let mut value = json!({ "ticket": ticket, "target": target, "status": state });
        let Some(reply) = reply else {
            return completed(
                value,
                format!("fleet: ticket {ticket}: {target} {}", state.as_str()),
                format!("fleet_poll(target=\"{target}\") shows its notices"),
                failed,
            );
        };
        value["reply"] = json!(reply.text);
        value["msgId"] = json!(reply.msg_id);
        let what = if reply.kind == MessageKind::Fallback {
            "ended its turn without fleet_reply; the end of its screen"
        } else {
            "replied"
        };
        return completed(
            value,
            format!("fleet: ticket {ticket}: {target} {what}:\n{}", reply.text),
            format!(
                "once read, fleet_ack(target=\"{target}\", msgId=\"{}\") (your next fleet call acknowledges it too)",
                reply.msg_id
            ),
            failed,
        );
    }
    if let Some(question) = &view.question {
        let id = &question.question_id;
        return completed(
            json!({ "ticket": ticket, "target": target, "status": "question",
                    "questionId": id, "question": question.question }),
            format!(
                "fleet: ticket {ticket}: {target} asks (question {id}): {}",
                question.question
            ),
            format!(
                "fleet_answer(questionId=\"{id}\", answer=...), then fleet_poll(ticket=\"{ticket}\", wait=true) to wait for the reply"
            ),
            false,
        );
    }
    TaskPayload::Working
}

/// A completed task's result: `value` with `next` in it, and the text `what` then `next`.
fn completed(mut value: Value, what: String, next: String, is_error: bool) -> TaskPayload {
    let mut text = what;
    text.push_str("\nNext: ");
    text.push_str(&next);
    value["next"] = Value::String(next);
    let mut result = if is_error {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    result.content = vec![ContentBlock::text(text)];
    let result: JsonObject = match serde_json::to_value(&result) {
        Ok(Value::Object(map)) => map,
        _ => JsonObject::new(),
    };
    TaskPayload::Completed { result }
}

//! The REST routes of the fleet (`/sessions...`, `/questions...`, `/tickets`): each one MCP tool
//! call (`mcp::tools::call`) for the caller the connection resolves to, or one engine read
//! behind the same `authorize` as the tool of its class, so no route grants what a tool refuses.

use axum::Json;
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use fleetd_core::access::ToolClass;
use serde::Deserialize;
use serde_json::{Value, json};

use super::ApiError;
use super::requester::Requester;

pub(super) type ApiResult = Result<Json<Value>, ApiError>;

/// `GET /sessions` = `fleet_list`.
pub(super) async fn sessions(requester: Requester) -> ApiResult {
    requester.tool("fleet_list", json!({})).await.map(Json)
}

/// `GET /sessions/{target}` = `fleet_status`.
pub(super) async fn session(requester: Requester, Path(name): Path<String>) -> ApiResult {
    requester
        .tool("fleet_status", json!({ "target": name }))
        .await
        .map(Json)
}

/// The query of `GET /sessions/{target}/replies`: `fleet_poll`'s paging arguments. `drain` is
/// only here to say where it went.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RepliesQuery {
    limit: Option<String>,
    after: Option<String>,
    drain: Option<String>,
}

/// `fleet_poll{target}`'s arguments from a query: `limit` goes as a number when it is one (else
/// as given, for the tool to refuse naming it).
fn poll_args(name: &str, limit: Option<String>, after: Option<String>) -> Value {
    let mut args = json!({ "target": name });
    if let Some(limit) = limit {
        args["limit"] = limit
            .parse::<u64>()
            .map_or(Value::String(limit), Value::from);
    }
    if let Some(after) = after {
        args["after"] = Value::String(after);
    }
    args
}

fn bad_query(e: &axum::extract::rejection::QueryRejection, route: &str, takes: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_query",
        format!("{e}: {route} takes {takes}"),
    )
}

/// A body the route cannot read: 400 `invalid_body`, with what to `send` instead.
pub(super) fn bad_body(e: &impl std::fmt::Display, send: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_body",
        format!("{e}: send {send}"),
    )
}

/// `GET /sessions/{target}/replies?limit=&after=` = `fleet_poll{target}`: a page of pending
/// replies and the open questions, non-destructive.
pub(super) async fn replies(
    requester: Requester,
    Path(name): Path<String>,
    query: Result<Query<RepliesQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| {
        bad_query(
            &e,
            "GET /sessions/{target}/replies",
            "only `limit` and `after`",
        )
    })?;
    if query.drain.is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "drain_is_post",
            "a GET never removes anything: drain with POST /sessions/{target}/replies/drain",
        ));
    }
    requester
        .tool("fleet_poll", poll_args(&name, query.limit, query.after))
        .await
        .map(Json)
}

/// The query of `POST /sessions/{target}/replies/drain`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DrainQuery {
    limit: Option<String>,
}

/// `POST /sessions/{target}/replies/drain?limit=` = `fleet_poll{target}` then `fleet_ack` of
/// every reply it returned: the destructive read, one page (the first: at most `limit` replies
/// and ~1 MiB of text). Repeat while `more` is true; memory stays one page whatever the depth.
pub(super) async fn drain(
    requester: Requester,
    Path(name): Path<String>,
    query: Result<Query<DrainQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    // The ack's class first, so a caller who may read but not remove learns nothing.
    let caller = requester
        .authorized(ToolClass::Orchestration, "drain")
        .await?;
    let Query(query) = query
        .map_err(|e| bad_query(&e, "POST /sessions/{target}/replies/drain", "only `limit`"))?;
    let mut polled = crate::mcp::tools::call(
        &requester.app.fleet,
        &caller,
        "fleet_poll",
        poll_args(&name, query.limit, None),
    )
    .await
    .map_err(ApiError::tool)?
    .value;
    let ids: Vec<Value> = polled["replies"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["msgId"].clone())
        .collect();
    if !ids.is_empty() {
        crate::mcp::tools::call(
            &requester.app.fleet,
            &caller,
            "fleet_ack",
            json!({ "target": name, "msgIds": ids }),
        )
        .await
        .map_err(ApiError::tool)?;
    }
    polled["drained"] = json!(true);
    Ok(Json(polled))
}

/// `POST /sessions/{target}/replies/{msgId}/ack` = `fleet_ack`.
pub(super) async fn ack(
    requester: Requester,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult {
    let out = requester
        .tool("fleet_ack", json!({ "target": name, "msgId": id }))
        .await?;
    let acked = out["acked"]
        .as_array()
        .and_then(|a| a.first())
        .cloned()
        .unwrap_or_default();
    Ok(Json(json!({
        "target": out["target"],
        "msgId": acked["msgId"],
        "acked": acked["acked"],
    })))
}

/// The body of `POST /sessions/{target}/tasks`: `fleet_send`'s arguments without the target.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TaskBody {
    task: String,
    /// Wait for the reply (default true, as `fleet_send`).
    wait: Option<bool>,
    /// How long to wait, in seconds (default 120).
    timeout_secs: Option<u64>,
}

/// `POST /sessions/{target}/tasks` = `fleet_send`. A lead calling from its pane is bound as the
/// member's delegating lead, as over MCP; the operator has no pane, so nudges for the reply go
/// to the primary lead.
pub(super) async fn task(
    requester: Requester,
    Path(name): Path<String>,
    body: Result<Json<TaskBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult {
    let Json(body) = body.map_err(|e| {
        bad_body(
            &e,
            r#"JSON {"task": "...", "wait": bool, "timeoutSecs": n}"#,
        )
    })?;
    let args = json!({
        "target": name,
        "task": body.task,
        "wait": body.wait,
        "timeoutSecs": body.timeout_secs,
    });
    requester.tool("fleet_send", args).await.map(Json)
}

/// The body of `POST /sessions/{target}/stop`: optional, `fleet_stop`'s `cause`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StopBody {
    cause: Option<String>,
}

/// `POST /sessions/{target}/stop` = `fleet_stop{target}`. The body may be empty.
pub(super) async fn stop(
    requester: Requester,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult {
    let body: StopBody = if body.iter().all(u8::is_ascii_whitespace) {
        StopBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| bad_body(&e, r#"nothing, or JSON {"cause": "..."}"#))?
    };
    let mut args = json!({ "target": name });
    if let Some(cause) = body.cause {
        args["cause"] = Value::String(cause);
    }
    requester.tool("fleet_stop", args).await.map(Json)
}

/// `GET /questions`: every open question (`fleet_ask`) with the asking member. Every member's
/// question texts: leads and the operator only (the observe class, like `/events`); a
/// delegating member reads its own members' with `fleet_status`.
pub(super) async fn questions(requester: Requester) -> ApiResult {
    requester
        .authorized(ToolClass::Observe, "GET /questions")
        .await?;
    let open = requester
        .app
        .fleet
        .engine
        .questions(None)
        .await
        .map_err(|e| ApiError::tool(crate::mcp::tools::gone(e)))?;
    let questions: Vec<Value> = open
        .into_iter()
        .map(|q| {
            json!({
                "questionId": q.question_id,
                "target": q.target.as_ref().map(ToString::to_string),
                "question": q.question,
            })
        })
        .collect();
    Ok(Json(json!({ "questions": questions })))
}

/// The body of `POST /questions/{id}/answer`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AnswerBody {
    answer: String,
}

/// `POST /questions/{questionId}/answer` = `fleet_answer`.
pub(super) async fn answer(
    requester: Requester,
    Path(question_id): Path<String>,
    body: Result<Json<AnswerBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult {
    let Json(body) = body.map_err(|e| bad_body(&e, r#"JSON {"answer": "..."}"#))?;
    let args = json!({ "questionId": question_id, "answer": body.answer });
    requester.tool("fleet_answer", args).await.map(Json)
}

/// The query of `GET /tickets`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TicketsQuery {
    target: Option<String>,
}

/// `GET /tickets[?target=]`: the recent tickets (the last ten each) of one member or of every
/// member, newest first. Ticket states are details: the class of `fleet_status`.
pub(super) async fn tickets(
    requester: Requester,
    query: Result<Query<TicketsQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    let Query(query) = query.map_err(|e| bad_query(&e, "GET /tickets", "only `target`"))?;
    // Every member's tickets: leads and the operator (a delegating member polls its own).
    requester
        .authorized(ToolClass::Observe, "GET /tickets")
        .await?;
    let gone = |e| ApiError::tool(crate::mcp::tools::gone(e));
    let targets = match query.target {
        Some(name) => {
            let target = fleetd_core::Target::new(&name).map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_target",
                    format!("{name:?}: {e}"),
                )
            })?;
            if !requester
                .app
                .fleet
                .engine
                .list()
                .await
                .map_err(gone)?
                .iter()
                .any(|m| m.target == target)
            {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_target",
                    format!("no member is named {name:?}: `fleetd status` lists them"),
                ));
            }
            vec![target]
        }
        None => requester
            .app
            .fleet
            .engine
            .list()
            .await
            .map_err(gone)?
            .into_iter()
            .map(|m| m.target)
            .collect(),
    };
    let mut all = Vec::new();
    for target in targets {
        all.extend(
            requester
                .app
                .fleet
                .engine
                .recent(target)
                .await
                .map_err(gone)?,
        );
    }
    all.sort_by_key(|t| std::cmp::Reverse(t.created_at));
    Ok(Json(json!({ "tickets": all })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_limit_goes_to_the_tool_as_a_number_when_it_is_one() {
        assert_eq!(
            poll_args("ann", Some("7".into()), Some("m".into())),
            json!({ "target": "ann", "limit": 7, "after": "m" })
        );
        assert_eq!(
            poll_args("ann", Some("-1".into()), None),
            json!({ "target": "ann", "limit": "-1" }),
            "left for the tool to refuse, naming `limit`"
        );
        assert_eq!(poll_args("ann", None, None), json!({ "target": "ann" }));
    }
}

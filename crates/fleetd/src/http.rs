//! The HTTP surface on the daemon's one listener (SPEC §9): `/healthz`, `/mcp` (MCP streamable
//! HTTP), and the REST API for sessions, replies and tasks. Owns routes, status codes and the
//! REST API's token rule; the only module that serves HTTP. Handlers ask the daemon, the engine
//! or the store for answers and hold no domain state themselves.
//!
//! The token rule: a request to `/sessions...` from a non-loopback peer must present the
//! configured API token as `Authorization: Bearer ...`; a presented token that is wrong is
//! refused from any peer. Loopback callers without a token are the operator on this machine
//! (the `fleetd` CLI), except that a member's pane may not hand out tasks.

use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleetd_core::access::Role;
use fleetd_core::{MsgId, Target};
use serde::Deserialize;
use serde_json::json;

use crate::health::HealthStatus;
use crate::mcp::{ConnInfo, Fleet};
use crate::serve::Daemon;

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
struct App {
    daemon: Daemon,
    fleet: Arc<Fleet>,
}

/// The router for every endpoint; `mcp` is the MCP service mounted at `/mcp`.
pub fn router(daemon: Daemon, fleet: Arc<Fleet>, mcp: crate::mcp::HttpService) -> Router {
    let app = App { daemon, fleet };
    Router::new()
        .route("/healthz", get(healthz))
        .merge(sessions_routes(app.clone()))
        .nest_service("/mcp", mcp)
        .fallback(not_found)
        .with_state(app)
}

/// `GET /metrics`: every fleetd metric in Prometheus text (see `telemetry`).
async fn metrics() -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::render(),
    )
}

/// The REST API under `/sessions` (and `/metrics`, which names members), behind the token rule.
fn sessions_routes(app: App) -> Router<App> {
    Router::new()
        .route("/sessions", get(sessions))
        .route("/sessions/{target}", get(session))
        .route("/sessions/{target}/replies", get(replies))
        .route("/sessions/{target}/replies/{msg_id}/ack", post(ack))
        .route("/sessions/{target}/tasks", post(task))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(app, authenticate))
}

/// The bearer token of a request, if it presents one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether `peer` is this machine (an IPv4-mapped IPv6 loopback counts).
fn is_loopback(peer: std::net::SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// The token rule (see the module header).
async fn authenticate(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    request: Request,
    next: Next,
) -> Response {
    match bearer(request.headers()) {
        Some(given) if !app.fleet.token_matches(given) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "bad_token",
            "the bearer token is not fleetd's API token: use the value of the secret named by `apiToken` (FLEETD_TOKEN for the fleetd CLI)",
        )
        .into_response(),
        None if !is_loopback(conn.peer) => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "token_required",
            format!(
                "this request comes from {}, not from this machine: present the API token as `Authorization: Bearer ...` (FLEETD_TOKEN for the fleetd CLI)",
                conn.peer.ip()
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

async fn healthz(State(app): State<App>) -> impl IntoResponse {
    let report = app.daemon.health().await;
    let code = match report.status {
        HealthStatus::Ok => StatusCode::OK,
        HealthStatus::Degraded => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, Json(report))
}

/// An API error: a status, a stable code and a sentence saying what to do.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("failed to {e}"),
        )
    }

    /// A tool's refusal, with the status its code calls for. The one mapping from tool error
    /// codes to HTTP statuses.
    fn tool(e: crate::mcp::ToolError) -> Self {
        let status = match e.code {
            "unknown_target" => StatusCode::NOT_FOUND,
            "invalid_target" | "empty_task" | "invalid_arguments" => StatusCode::BAD_REQUEST,
            "task_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "not_a_lead" => StatusCode::FORBIDDEN,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, e.code, e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": self.code, "message": self.message })),
        )
            .into_response()
    }
}

type ApiResult = Result<Json<serde_json::Value>, ApiError>;

fn parse_target(name: &str) -> Result<Target, ApiError> {
    Target::new(name)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_target", e.to_string()))
}

async fn sessions(State(app): State<App>) -> ApiResult {
    let members = crate::mcp::tools::members(&app.fleet)
        .await
        .map_err(ApiError::tool)?;
    Ok(Json(json!({ "members": members })))
}

async fn session(State(app): State<App>, Path(name): Path<String>) -> ApiResult {
    let target = parse_target(&name)?;
    crate::mcp::tools::status::detail(&app.fleet, &target)
        .await
        .map(Json)
        .map_err(ApiError::tool)
}

/// `?drain=true` asks for the destructive read.
#[derive(Debug, Deserialize)]
struct RepliesQuery {
    drain: Option<bool>,
}

async fn replies(
    State(app): State<App>,
    Path(name): Path<String>,
    Query(query): Query<RepliesQuery>,
) -> ApiResult {
    let target = parse_target(&name)?;
    let store = &app.fleet.store;
    let drain = query.drain.unwrap_or(false);
    let messages = if drain {
        store.drain(&target).await
    } else {
        store.peek(&target, 1000).await
    }
    .map_err(ApiError::unavailable)?;
    if drain {
        let _ = app.fleet.engine.inbox_changed(target.clone()).await;
    }
    Ok(Json(
        json!({ "target": target, "drained": drain, "replies": messages }),
    ))
}

async fn ack(State(app): State<App>, Path((name, id)): Path<(String, String)>) -> ApiResult {
    let target = parse_target(&name)?;
    let msg_id = MsgId::parse(&id)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_msg_id", e.to_string()))?;
    let acked = app
        .fleet
        .store
        .ack(&target, msg_id)
        .await
        .map_err(ApiError::unavailable)?;
    let _ = app.fleet.engine.inbox_changed(target.clone()).await;
    Ok(Json(
        json!({ "target": target, "msgId": msg_id, "acked": acked }),
    ))
}

/// The body of `POST /sessions/{target}/tasks`: `fleet_send`'s arguments without the target.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TaskBody {
    task: String,
    /// Wait for the reply (default true, as `fleet_send`).
    wait: Option<bool>,
    /// How long to wait, in seconds (default 120).
    timeout_secs: Option<u64>,
}

/// Hands a task to a member through `fleet_send`'s own path. The caller has no pane of its own
/// that fleetd should bind or nudge (it is a person at a shell, or a script), so no delegation
/// binding is made and nudges for the reply go to the primary lead. A caller found in a member's
/// pane is refused unless its profile allows delegation, exactly as over MCP.
async fn task(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Json<TaskBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult {
    let Json(body) = body.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("{e}: send JSON {{\"task\": \"...\", \"wait\": bool, \"timeoutSecs\": n}}"),
        )
    })?;
    let caller =
        crate::mcp::http_caller(&app.fleet, conn, bearer(&headers).map(str::to_owned)).await;
    if let Role::Member {
        target,
        allow_delegation: false,
    } = &caller.role
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_a_lead",
            format!(
                "this request comes from member {target}'s pane, and its profile does not allow delegation: answer your task with fleet_reply instead"
            ),
        ));
    }
    let args = crate::mcp::tools::send::Args {
        target: name,
        task: body.task,
        wait: body.wait,
        timeout_secs: body.timeout_secs,
    };
    let out = crate::mcp::tools::send::delegate(&app.fleet, None, &caller.cancel, args)
        .await
        .map_err(ApiError::tool)?;
    Ok(Json(out.value))
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: fleetd serves /healthz, /mcp and /sessions",
    )
}

//! The HTTP surface on the daemon's one listener (SPEC §9): `/healthz`, `/mcp` (MCP streamable
//! HTTP), and the REST API for sessions and replies. Owns routes and status codes; the only
//! module that knows HTTP. Handlers ask the daemon, the engine or the store for answers and hold
//! no domain state themselves.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleetd_core::{MsgId, Target};
use serde::Deserialize;
use serde_json::json;

use crate::health::HealthStatus;
use crate::mcp::Fleet;
use crate::serve::Daemon;

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
struct App {
    daemon: Daemon,
    fleet: Arc<Fleet>,
}

/// The router for every endpoint; `mcp` is the MCP service mounted at `/mcp`.
pub fn router(daemon: Daemon, fleet: Arc<Fleet>, mcp: crate::mcp::HttpService) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/sessions", get(sessions))
        .route("/sessions/{target}", get(session))
        .route("/sessions/{target}/replies", get(replies))
        .route("/sessions/{target}/replies/{msg_id}/ack", post(ack))
        .nest_service("/mcp", mcp)
        .fallback(not_found)
        .with_state(App { daemon, fleet })
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

    fn tool(e: crate::mcp::ToolError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, e.code, e.message)
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
    match crate::mcp::tools::status::detail(&app.fleet, &target).await {
        Ok(member) => Ok(Json(member)),
        Err(e) if e.code == "unknown_target" => {
            Err(ApiError::new(StatusCode::NOT_FOUND, e.code, e.message))
        }
        Err(e) => Err(ApiError::tool(e)),
    }
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

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: fleetd serves /healthz, /mcp and /sessions",
    )
}

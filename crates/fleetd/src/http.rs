//! The HTTP surface on the daemon's one listener: `/healthz` now, `/mcp`, `/metrics` and the REST
//! API as they arrive. Owns routes and status codes; the only module that knows HTTP. Handlers
//! ask the daemon for answers and never hold domain state themselves.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::health::HealthStatus;
use crate::serve::Daemon;

/// The router for every endpoint.
pub fn router(daemon: Daemon) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .fallback(not_found)
        .with_state(daemon)
}

async fn healthz(State(daemon): State<Daemon>) -> impl IntoResponse {
    let report = daemon.health().await;
    let code = match report.status {
        HealthStatus::Ok => StatusCode::OK,
        HealthStatus::Degraded => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, Json(report))
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "not_found",
            "message": "no such endpoint: fleetd serves /healthz and /mcp",
        })),
    )
}

//! The human in the loop's routes (SPEC §20): `GET /blocked`, the members waiting on a dialog
//! now with the dialog as shown and its choices (the class of `/events`: leads and the
//! operator), and `POST /sessions/{target}/approve` (`fleetd approve`, the dashboard), which is
//! the tool `fleet_approve` for the connection's caller, so no door grants what the tool refuses.

use axum::Json;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::HeaderMap;
use fleetd_core::access::ToolClass;
use serde::Deserialize;
use serde_json::json;

use super::rest::{ApiResult, bad_body, tool};
use super::{App, authorized};
use crate::identity::ConnInfo;

/// `GET /blocked`: every member waiting on a dialog, longest waiting first.
pub(super) async fn blocked(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
) -> ApiResult {
    authorized(&app, &conn, &headers, ToolClass::Observe, "GET /blocked").await?;
    Ok(Json(json!({ "blocked": app.fleet.human.blocked() })))
}

/// The body of `POST /sessions/{target}/approve`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApproveBody {
    choice: String,
    dialog: Option<String>,
}

/// `POST /sessions/{target}/approve` = `fleet_approve`.
pub(super) async fn approve(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
    Path(target): Path<String>,
    body: Result<Json<ApproveBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult {
    let Json(body) = body.map_err(|e| {
        bad_body(
            &e,
            r#"JSON {"choice": "1", "dialog": "<from member.blocked>"}"#,
        )
    })?;
    let args = json!({ "target": target, "choice": body.choice, "dialog": body.dialog });
    tool(&app, &conn, &headers, "fleet_approve", args)
        .await
        .map(Json)
}

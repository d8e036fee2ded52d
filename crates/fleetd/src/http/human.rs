//! The human in the loop's routes (SPEC §20): `GET /blocked`, the members waiting on a dialog
//! now with the dialog as shown and its choices (the class of `/events`: leads and the
//! operator), and `POST /sessions/{target}/approve` (`fleetd approve`, the dashboard), which is
//! the tool `fleet_approve` for the connection's caller, so no door grants what the tool refuses.

use axum::Json;
use axum::extract::Path;
use fleetd_core::access::ToolClass;
use serde::Deserialize;
use serde_json::json;

use super::requester::Requester;
use super::rest::{ApiResult, bad_body};

/// `GET /blocked`: every member waiting on a dialog, longest waiting first.
pub(super) async fn blocked(requester: Requester) -> ApiResult {
    requester
        .authorized(ToolClass::Observe, "GET /blocked")
        .await?;
    Ok(Json(
        json!({ "blocked": requester.app.fleet.human.blocked() }),
    ))
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
    requester: Requester,
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
    requester.tool("fleet_approve", args).await.map(Json)
}

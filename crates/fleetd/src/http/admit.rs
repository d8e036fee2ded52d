//! `POST /leads/admit` (`fleetd admit PANE`): the operator vouches for a pane as a lead. By the
//! lead rule (`engine::state::standing`, docs/SECURITY.md "Who is a lead") a pane outside the
//! members' workspace that was opened while members ran is nobody, since a member may have
//! opened it; only the operator can say it is the user's. The admitted pane is a registered
//! lead from then on, until its incarnation ends.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleetd_core::{MuxDaemon, PaneRef, QualifiedPaneId};
use serde::Deserialize;
use serde_json::json;

use super::requester::Requester;
use super::{ApiError, App};
use crate::engine::{LeadRef, Standing};
use crate::identity::in_members_space;

/// The body: the pane, bare (`%7`, `w1:p3`: on the user's multiplexer) or daemon-qualified.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Admit {
    pane: String,
}

/// `POST /leads/admit`: the operator's only.
pub(super) async fn admit(requester: Requester, Json(body): Json<Admit>) -> Response {
    if let Err(refused) = requester.operator_only("admitting a pane as a lead is",
        "run `fleetd admit PANE` as fleetd's user from a lead's pane or a shell outside the multiplexer",
    )
    .await
    {
        return refused;
    }
    match admit_pane(&requester.app, &body.pane).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn admit_pane(app: &App, named: &str) -> Result<serde_json::Value, ApiError> {
    let pane = match PaneRef::parse(named) {
        Ok(PaneRef::Qualified(q)) => q,
        Ok(PaneRef::Bare(p)) => QualifiedPaneId::new(MuxDaemon::Lead, p),
        Err(e) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_pane",
                format!(
                    "{named:?} is not a pane id ({e}): give what `echo $TMUX_PANE` (tmux, e.g. %7) or `echo $HERDR_PANE_ID` (herdr, e.g. w1:p3) prints in that pane"
                ),
            ));
        }
    };
    let fleet = &app.fleet;
    let found = fleet.locator.pane(&pane).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "mux_unavailable",
            format!("cannot list the panes to find {pane}: {e}; try again"),
        )
    })?;
    let Some(found) = found else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_pane",
            format!(
                "no pane {pane} is open: give what `echo $TMUX_PANE` (tmux) or `echo $HERDR_PANE_ID` (herdr) prints in the pane to admit"
            ),
        ));
    };
    if in_members_space(&fleet.config.current(), &found) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "members_space",
            format!(
                "pane {pane} is in the members' workspace, where a pane is a member or nobody, never a lead: run the lead in a pane of your own"
            ),
        ));
    }
    let standing = fleet
        .engine
        .standing(pane.clone(), found.terminal.clone(), found.age())
        .await
        .map_err(|_| ApiError::engine_gone())?;
    if let Standing::Member(target, _) = standing {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "a_member",
            format!("pane {pane} holds member {target}, which is never a lead"),
        ));
    }
    fleet
        .engine
        .lead_seen(LeadRef {
            pane: pane.clone(),
            terminal: found.terminal,
        })
        .await
        .map_err(|_| ApiError::engine_gone())?;
    tracing::info!(%pane, "the operator admitted a pane as a lead");
    Ok(json!({ "pane": pane.to_string(), "lead": true, "already": standing == Standing::Lead }))
}

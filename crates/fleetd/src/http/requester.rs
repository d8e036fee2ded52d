//! Who asks a REST route (`Requester`): the handlers' shared state, the connection and the
//! request's headers, taken by one extractor. Every route resolves its caller from these three
//! (exactly as `/mcp` does, see `identity`) and then asks one question of it — may it make a
//! call of this class, is it the operator, or run this tool for it — so the three travel
//! together here rather than as three arguments each handler takes and threads on.

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use fleetd_core::access::{Role, ToolClass};
use serde_json::Value;

use super::{ApiError, App, bearer};
use crate::identity::{Caller, ConnInfo};

/// The party to one request: what resolves its caller, with the handlers' state.
pub(super) struct Requester {
    /// The handlers' shared state.
    pub(super) app: App,
    /// The connection the request came on (its peer decides who calls).
    conn: ConnInfo,
    /// The request's headers (its token or dashboard cookie, `Last-Event-ID`).
    pub(super) headers: HeaderMap,
}

impl FromRequestParts<App> for Requester {
    /// Only a request served without its connection's info is refused (a wiring error: both
    /// listeners insert it), with axum's own answer for a missing extension.
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, Response> {
        let ConnectInfo(conn) = ConnectInfo::<ConnInfo>::from_request_parts(parts, app)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Self {
            app: app.clone(),
            conn,
            headers: parts.headers.clone(),
        })
    }
}

impl Requester {
    /// The caller, resolved exactly as for an MCP call on the same connection; a signed-in
    /// dashboard's session counts as presenting the token.
    pub(super) async fn caller(&self) -> Caller {
        let token = bearer(&self.headers).is_some_and(|given| self.app.fleet.token_matches(given))
            || self.app.sessions.signed_in(&self.headers);
        crate::identity::resolve_with(
            &self.app.fleet,
            Some(&self.conn),
            token,
            tokio_util::sync::CancellationToken::new(),
        )
        .await
    }

    /// The caller, when it may make a call of `class` (`what`, for the refusal); else its
    /// refusal.
    pub(super) async fn authorized(
        &self,
        class: ToolClass,
        what: &str,
    ) -> Result<Caller, ApiError> {
        let caller = self.caller().await;
        caller.authorize(class, what).map_err(ApiError::tool)?;
        Ok(caller)
    }

    /// A call that is the operator's only: `Err` (403 `not_the_operator`) for anyone else,
    /// saying that `what` is for the operator only, who the caller is, and `how` to call as the
    /// operator.
    pub(super) async fn operator_only(&self, what: &str, how: &str) -> Result<(), Response> {
        let caller = self.caller().await;
        if caller.role == Role::Operator {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "not_the_operator",
            format!(
                "{what} for the operator only (you are {}): {how}",
                caller.role.as_str()
            ),
        )
        .into_response())
    }

    /// Runs MCP tool `tool` with `args` for the caller: a REST route's whole work.
    pub(super) async fn tool(&self, tool: &str, args: Value) -> Result<Value, ApiError> {
        let caller = self.caller().await;
        crate::mcp::tools::call(&self.app.fleet, &caller, tool, args)
            .await
            .map(|out| out.value)
            .map_err(ApiError::tool)
    }
}

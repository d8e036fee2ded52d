//! The HTTP surface (SPEC §9), served on the daemon's TCP listener and on the operator's unix
//! socket: `/healthz`, `/metrics`, `/mcp` (MCP streamable HTTP) and the REST API for sessions,
//! replies and tasks. Owns routes, status codes and the request guard; the only module that
//! serves HTTP. Handlers hold no domain state and no policy of their own: every REST route is an
//! MCP tool call (`mcp::tools::call`), made for the caller `identity` resolves from the
//! connection exactly as for `/mcp`, so a route never grants what the tool would refuse.
//!
//! The guard, before any route:
//! - `Host` must be this daemon's listen address, a loopback address, `localhost` or a name in
//!   `allowedHosts`: a page that reaches fleetd through DNS rebinding names its own host and is
//!   refused (unix-socket requests carry no meaningful `Host`; no browser can send them).
//! - A state-changing request (anything but GET/HEAD/OPTIONS), or a read of the event stream
//!   (`/events`), whose `Origin` is not this very `Host` is refused: a cross-site form, `fetch`
//!   or `EventSource` from any web page.
//! - A presented bearer token that is wrong is refused from anywhere; a peer that is not on
//!   this machine must present the right one (everything but `/healthz`).

mod events;
pub mod serve;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleetd_core::access::{ToolClass, authorize};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::health::{HealthStatus, Probe};
use crate::identity::{Caller, ConnInfo, Endpoint};
use crate::mcp::Fleet;

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
struct App {
    health: Probe,
    fleet: Arc<Fleet>,
    /// Cancelled when the daemon stops serving: ends the streams that would otherwise hold
    /// the shutdown (`/events`).
    stopping: tokio_util::sync::CancellationToken,
}

/// The router for every endpoint; `mcp` is the MCP service mounted at `/mcp`, `health` what
/// `/healthz` asks, `stopping` cancelled when the daemon stops serving.
pub fn router(
    health: Probe,
    fleet: Arc<Fleet>,
    mcp: crate::mcp::HttpService,
    stopping: tokio_util::sync::CancellationToken,
) -> Router {
    let app = App {
        health,
        fleet,
        stopping,
    };
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/events", get(events::stream))
        .route("/sessions", get(sessions))
        .route("/sessions/{target}", get(session))
        .route("/sessions/{target}/replies", get(replies))
        .route("/sessions/{target}/replies/drain", post(drain))
        .route("/sessions/{target}/replies/{msg_id}/ack", post(ack))
        .route("/sessions/{target}/tasks", post(task))
        .nest_service("/mcp", mcp)
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// The bearer token of a request, if it presents one.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// The request guard (see the module header).
async fn guard(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    request: Request,
    next: Next,
) -> Response {
    if let Endpoint::Tcp { peer, local } = conn.endpoint {
        let config = app.fleet.config.current();
        let host = request
            .headers()
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok());
        if let Err(e) = check_host(host, local, &config.allowed_hosts) {
            return e.into_response();
        }
        if let Err(e) = check_origin(
            request.method(),
            request.uri().path(),
            request.headers(),
            host,
        ) {
            return e.into_response();
        }
        let exempt = request.uri().path() == "/healthz";
        match bearer(request.headers()) {
            Some(given) if !app.fleet.token_matches(given) => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "bad_token",
                    "the bearer token is not fleetd's API token: use the value of the secret named by `apiToken` (FLEETD_TOKEN for the fleetd CLI)",
                )
                .into_response();
            }
            None if !exempt && !peer.ip().to_canonical().is_loopback() => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "token_required",
                    format!(
                        "this request comes from {}, not from this machine: present the API token as `Authorization: Bearer ...` (FLEETD_TOKEN for the fleetd CLI)",
                        peer.ip()
                    ),
                )
                .into_response();
            }
            _ => {}
        }
    }
    next.run(request).await
}

/// The host part of a `Host` header value (`name`, `1.2.3.4`, `[::1]`, each with an optional
/// port), without the port and brackets.
fn host_name(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match value.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => value,
    }
}

/// Whether `Host: value` names this daemon (listening on `local`): a loopback address, the
/// listen address itself (any address when listening on all of them), `localhost`, or a name
/// the configuration allows. A DNS name that is none of these is what a rebinding page sends.
fn check_host(value: Option<&str>, local: SocketAddr, allowed: &[String]) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "missing_host",
            "the request has no Host header: send the address you connected to (HTTP/1.1 requires it)",
        ));
    };
    let name = host_name(value).trim_end_matches('.');
    let ok = match name.parse::<IpAddr>() {
        Ok(ip) => {
            let ip = ip.to_canonical();
            ip.is_loopback() || ip == local.ip().to_canonical() || local.ip().is_unspecified()
        }
        Err(_) => {
            name.eq_ignore_ascii_case("localhost")
                || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
        }
    };
    if ok {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "foreign_host",
        format!(
            "this request is addressed to {name:?}, which is not this daemon ({local}, localhost or a name in `allowedHosts`); a web page reaching fleetd through DNS rebinding is refused this way. If {name:?} is this machine, add it to `allowedHosts`"
        ),
    ))
}

/// Refuses a state-changing request whose `Origin` is another site than `Host`.
fn check_origin(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    host: Option<&str>,
) -> Result<(), ApiError> {
    // The event stream is read by fleetd's own page only: another site's `EventSource` is
    // refused before the stream opens, not merely hidden from it by the browser's CORS rules.
    let reads_the_fleet = path == "/events";
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) && !reads_the_fleet {
        return Ok(());
    }
    let Some(origin) = headers.get(axum::http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    let same = host.is_some_and(|host| {
        ["http://", "https://"].iter().any(|scheme| {
            origin
                .strip_prefix(scheme)
                .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
        })
    });
    if same {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "foreign_origin",
        format!(
            "a {method} from the web page at {origin:?} is refused: fleetd changes nothing for another site (cross-site request). Use the fleetd CLI, an agent's MCP tools, or fleetd's own pages"
        ),
    ))
}

async fn healthz(State(app): State<App>) -> impl IntoResponse {
    let report = app.health.report().await;
    let code = match report.status {
        HealthStatus::Ok => StatusCode::OK,
        HealthStatus::Degraded => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, Json(report))
}

/// The caller of a REST request, resolved exactly as for an MCP call on the same connection.
async fn caller(app: &App, conn: &ConnInfo, headers: &HeaderMap) -> Caller {
    crate::identity::resolve(
        &app.fleet,
        Some(conn),
        bearer(headers),
        tokio_util::sync::CancellationToken::new(),
    )
    .await
}

/// `GET /metrics`: every fleetd metric in Prometheus text (see `telemetry`). Names members, no
/// bodies: the class of `fleet_list`.
async fn metrics(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
) -> Response {
    let caller = caller(&app, &conn, &headers).await;
    if let Err(e) = authorize(&caller.role, ToolClass::Public, "GET /metrics") {
        return ApiError::tool(e).into_response();
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::render(),
    )
        .into_response()
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

    /// A tool's refusal, with the status its code calls for. The one mapping from tool error
    /// codes to HTTP statuses.
    fn tool(e: crate::mcp::ToolError) -> Self {
        let status = match e.code {
            "unknown_target" | "unknown_ticket" => StatusCode::NOT_FOUND,
            "invalid_target" | "empty_task" | "invalid_arguments" | "invalid_msg_id"
            | "invalid_ticket" => StatusCode::BAD_REQUEST,
            "task_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            // A per-member cap (`limits:`): the same request succeeds once the member catches up.
            "queue_full" | "too_many_questions" => StatusCode::TOO_MANY_REQUESTS,
            "not_a_lead" | "not_a_member" | "anonymous_caller" | "unregistered_pane"
            | "not_your_ticket" => StatusCode::FORBIDDEN,
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

type ApiResult = Result<Json<Value>, ApiError>;

/// Runs MCP tool `tool` with `args` for the connection's caller: the REST route's whole work.
async fn tool(
    app: &App,
    conn: &ConnInfo,
    headers: &HeaderMap,
    tool: &str,
    args: Value,
) -> Result<Value, ApiError> {
    let caller = caller(app, conn, headers).await;
    crate::mcp::tools::call(&app.fleet, &caller, tool, args)
        .await
        .map(|out| out.value)
        .map_err(ApiError::tool)
}

/// `GET /sessions` = `fleet_list`.
async fn sessions(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
) -> ApiResult {
    tool(&app, &conn, &headers, "fleet_list", json!({}))
        .await
        .map(Json)
}

/// `GET /sessions/{target}` = `fleet_status`.
async fn session(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> ApiResult {
    tool(
        &app,
        &conn,
        &headers,
        "fleet_status",
        json!({ "target": name }),
    )
    .await
    .map(Json)
}

/// The query of `GET /sessions/{target}/replies`: `fleet_poll`'s paging arguments. `drain` is
/// only here to say where it went.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RepliesQuery {
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

/// `GET /sessions/{target}/replies?limit=&after=` = `fleet_poll{target}`: a page of pending
/// replies and the open questions, non-destructive.
async fn replies(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
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
    tool(
        &app,
        &conn,
        &headers,
        "fleet_poll",
        poll_args(&name, query.limit, query.after),
    )
    .await
    .map(Json)
}

/// The query of `POST /sessions/{target}/replies/drain`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainQuery {
    limit: Option<String>,
}

/// `POST /sessions/{target}/replies/drain?limit=` = `fleet_poll{target}` then `fleet_ack` of
/// every reply it returned: the destructive read, one page (the first: at most `limit` replies
/// and ~1 MiB of text). Repeat while `more` is true; memory stays one page whatever the depth.
async fn drain(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<DrainQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult {
    // The ack's class first, so a caller who may read but not remove learns nothing.
    let caller = caller(&app, &conn, &headers).await;
    authorize(&caller.role, ToolClass::Orchestration, "drain").map_err(ApiError::tool)?;
    let Query(query) = query
        .map_err(|e| bad_query(&e, "POST /sessions/{target}/replies/drain", "only `limit`"))?;
    let mut polled = crate::mcp::tools::call(
        &app.fleet,
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
            &app.fleet,
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
async fn ack(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult {
    let out = tool(
        &app,
        &conn,
        &headers,
        "fleet_ack",
        json!({ "target": name, "msgId": id }),
    )
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
struct TaskBody {
    task: String,
    /// Wait for the reply (default true, as `fleet_send`).
    wait: Option<bool>,
    /// How long to wait, in seconds (default 120).
    timeout_secs: Option<u64>,
}

/// `POST /sessions/{target}/tasks` = `fleet_send`. A lead calling from its pane is bound as the
/// member's delegating lead, as over MCP; the operator has no pane, so nudges for the reply go
/// to the primary lead.
async fn task(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Result<Json<TaskBody>, axum::extract::rejection::JsonRejection>,
) -> ApiResult {
    let Json(body) = body.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("{e}: send JSON {{\"task\": \"...\", \"wait\": bool, \"timeoutSecs\": n}}"),
        )
    })?;
    let args = json!({
        "target": name,
        "task": body.task,
        "wait": body.wait,
        "timeoutSecs": body.timeout_secs,
    });
    tool(&app, &conn, &headers, "fleet_send", args)
        .await
        .map(Json)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: fleetd serves /healthz, /metrics, /mcp and /sessions",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_per_member_cap_is_429_and_a_bad_paging_argument_400() {
        let status = |code| ApiError::tool(crate::mcp::ToolError::new(code, "x")).status;
        assert_eq!(status("queue_full"), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status("too_many_questions"), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status("invalid_arguments"), StatusCode::BAD_REQUEST);
    }

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

    fn host(value: Option<&str>, local: &str, allowed: &[&str]) -> Result<(), &'static str> {
        let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
        check_host(value, local.parse().expect("addr"), &allowed).map_err(|e| e.code)
    }

    #[test]
    fn hosts_this_daemon_answers_to() {
        let local = "127.0.0.1:7797";
        for ok in [
            "127.0.0.1:7797",
            "127.0.0.1",
            "localhost:7797",
            "LOCALHOST",
            "localhost.:7797",
            "[::1]:7797",
            "127.0.0.2:7797",
        ] {
            assert_eq!(host(Some(ok), local, &[]), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example:7797",
            "localhost.evil.example",
            "10.0.0.5:7797",
            "fleet.lan",
        ] {
            assert_eq!(host(Some(bad), local, &[]), Err("foreign_host"), "{bad}");
        }
        assert_eq!(host(None, local, &[]), Err("missing_host"));
        assert_eq!(host(Some("Fleet.LAN:7797"), local, &["fleet.lan"]), Ok(()));
        // Listening on every address: any address literal is this daemon, names still not.
        assert_eq!(host(Some("10.0.0.5:7797"), "0.0.0.0:7797", &[]), Ok(()));
        assert_eq!(
            host(Some("build-2:7797"), "0.0.0.0:7797", &[]),
            Err("foreign_host")
        );
        assert_eq!(
            host(Some("build-2:7797"), "0.0.0.0:7797", &["build-2"]),
            Ok(())
        );
    }

    fn origin(method: &Method, origin: Option<&str>, host: &str) -> Result<(), &'static str> {
        origin_at(method, "/sessions", origin, host)
    }

    fn origin_at(
        method: &Method,
        path: &str,
        origin: Option<&str>,
        host: &str,
    ) -> Result<(), &'static str> {
        let mut headers = HeaderMap::new();
        if let Some(o) = origin {
            headers.insert(axum::http::header::ORIGIN, o.parse().expect("header"));
        }
        check_origin(method, path, &headers, Some(host)).map_err(|e| e.code)
    }

    #[test]
    fn state_changes_from_another_site_are_refused() {
        let h = "127.0.0.1:7797";
        assert_eq!(
            origin(&Method::POST, None, h),
            Ok(()),
            "no Origin: not a browser"
        );
        assert_eq!(
            origin(&Method::POST, Some("http://127.0.0.1:7797"), h),
            Ok(())
        );
        assert_eq!(
            origin(&Method::POST, Some("http://evil.example"), h),
            Err("foreign_origin")
        );
        assert_eq!(
            origin(&Method::POST, Some("http://127.0.0.1:3000"), h),
            Err("foreign_origin"),
            "another port on this machine is another site"
        );
        assert_eq!(
            origin(&Method::POST, Some("null"), h),
            Err("foreign_origin")
        );
        assert_eq!(
            origin(&Method::DELETE, Some("https://evil.example"), h),
            Err("foreign_origin")
        );
        assert_eq!(
            origin(&Method::GET, Some("http://evil.example"), h),
            Ok(()),
            "a read changes nothing, and the browser keeps the answer from the page"
        );
        assert_eq!(
            origin_at(&Method::GET, "/events", Some("http://evil.example"), h),
            Err("foreign_origin"),
            "the event stream is refused to another site outright"
        );
        assert_eq!(
            origin_at(&Method::GET, "/events", Some("http://127.0.0.1:7797"), h),
            Ok(())
        );
        assert_eq!(origin_at(&Method::GET, "/events", None, h), Ok(()));
    }
}

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
//!   or `EventSource` from any web page. A request without `Origin` goes on: current browsers
//!   send it on every cross-site state change, and the dashboard's cookie is `SameSite=Strict`
//!   and checked against `Sec-Fetch-Site`; a browser old enough to send neither is not
//!   defended against here.
//! - A presented bearer token that is wrong is refused from anywhere; a peer that is not on
//!   this machine must present the right one, or the session cookie of a signed-in dashboard
//!   (everything but `/healthz` and the dashboard's page and sign-in, see `dashboard`).

mod admit;
mod budget;
mod dashboard;
mod event_stream;
mod human;
pub mod listen;
mod requester;
mod rest;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fleetd_core::access::ToolClass;
use serde_json::json;

use crate::health::{HealthStatus, Probe};
use crate::identity::{ConnInfo, Endpoint};
use crate::mcp::Fleet;
use requester::Requester;

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
struct App {
    health: Probe,
    fleet: Arc<Fleet>,
    /// Cancelled when the daemon stops serving: ends the streams that would otherwise hold
    /// the shutdown (`/events`).
    stopping: tokio_util::sync::CancellationToken,
    /// Signed-in dashboard browsers.
    sessions: Arc<dashboard::Sessions>,
}

/// The router for every endpoint; `mcp` is the MCP service mounted at `/mcp`, `health` what
/// `/healthz` asks, `stopping` cancelled when the daemon stops serving, `local` the TCP
/// listener's address (for the dashboard links `fleetd dashboard` prints).
pub fn router(
    health: Probe,
    fleet: Arc<Fleet>,
    mcp: crate::mcp::HttpService,
    stopping: tokio_util::sync::CancellationToken,
    local: SocketAddr,
) -> Router {
    let app = App {
        health,
        fleet,
        stopping,
        sessions: Arc::new(dashboard::Sessions::new(local)),
    };
    Router::new()
        .route("/", get(dashboard::index))
        .route("/dashboard/app.js", get(dashboard::script))
        .route("/dashboard/app.css", get(dashboard::style))
        .route("/dashboard/keys", post(dashboard::keys))
        .route("/dashboard/login", post(dashboard::login))
        .route("/dashboard/session", get(dashboard::session))
        .route("/dashboard/logout", post(dashboard::logout))
        .route("/leads/admit", post(admit::admit))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/events", get(event_stream::stream))
        .route("/events/latency", get(event_stream::latency))
        .route("/sessions", get(rest::sessions))
        .route("/sessions/{target}", get(rest::session))
        .route("/sessions/{target}/replies", get(rest::replies))
        .route("/sessions/{target}/replies/drain", post(rest::drain))
        .route("/sessions/{target}/replies/{msg_id}/ack", post(rest::ack))
        .route("/sessions/{target}/tasks", post(rest::task))
        .route("/sessions/{target}/stop", post(rest::stop))
        .route("/sessions/{target}/budget", post(budget::set))
        .route("/sessions/{target}/approve", post(human::approve))
        .route("/blocked", get(human::blocked))
        .route("/questions", get(rest::questions))
        .route("/questions/{question_id}/answer", post(rest::answer))
        .route("/tickets", get(rest::tickets))
        .route("/model/{*rest}", axum::routing::any(model))
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
            tracing::info!(
                method = %request.method(),
                path = request.uri().path(),
                origin = ?request.headers().get(axum::http::header::ORIGIN),
                "a request from another site was refused"
            );
            return e.into_response();
        }
        let path = request.uri().path();
        // The model gateway checks a member's model key and connection itself: a bearer token
        // there is that key, never fleetd's API token.
        if path.starts_with("/model/") {
            return next.run(request).await;
        }
        let exempt = path == "/healthz"
            || dashboard::open_to_remote(path)
            || app.sessions.signed_in(request.headers());
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
    // The event stream (and its latency record) is read by fleetd's own page only: another
    // site's `EventSource` is refused before the stream opens, not merely hidden from it by the
    // browser's CORS rules.
    let reads_the_fleet = path == "/events" || path.starts_with("/events/");
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

/// `/model/<backend>/...`: a member's model traffic (`model_gateway`).
async fn model(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    request: Request,
) -> Response {
    crate::model_gateway::forward(app.fleet.clone(), conn, request).await
}

async fn healthz(State(app): State<App>) -> impl IntoResponse {
    let report = app.health.report().await;
    let code = match report.status {
        HealthStatus::Ok => StatusCode::OK,
        HealthStatus::Degraded => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, Json(report))
}

/// `GET /metrics`: every fleetd metric in Prometheus text (see `telemetry`). Names members, no
/// bodies: the class of `fleet_list`.
async fn metrics(requester: Requester) -> Response {
    if let Err(e) = requester
        .authorized(ToolClass::Public, "GET /metrics")
        .await
    {
        return e.into_response();
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::ops::telemetry::render(),
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

    /// The engine stopped (the daemon is going down): retry against the next one.
    fn engine_gone() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_gone",
            "fleetd is stopping; try again once it is back",
        )
    }

    /// A tool's refusal, with the status its kind calls for: the one mapping from refusals to
    /// HTTP statuses, checked whole by the compiler.
    fn tool(e: crate::mcp::ToolError) -> Self {
        use fleetd_core::refusal::Kind;
        let status = match e.code.kind() {
            Kind::NotFound => StatusCode::NOT_FOUND,
            Kind::Invalid => StatusCode::BAD_REQUEST,
            Kind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Kind::Cap => StatusCode::TOO_MANY_REQUESTS,
            Kind::Conflict => StatusCode::CONFLICT,
            // Asking again changes nothing, so never a 503 (which tells a client to retry).
            Kind::Forbidden => StatusCode::FORBIDDEN,
            Kind::Trouble => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, e.code.as_str(), e.message)
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

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint: fleetd serves / (the dashboard), /healthz, /metrics, /events, /mcp, /sessions, /questions, /blocked and /tickets",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status a refusal with code `text` is answered with.
    fn status(text: &str) -> StatusCode {
        let code = fleetd_core::refusal::Code::ALL
            .iter()
            .find(|c| c.as_str() == text)
            .unwrap_or_else(|| panic!("no code {text}"));
        ApiError::tool(crate::mcp::ToolError::new(*code, "x")).status
    }

    #[test]
    fn a_per_member_cap_is_429_and_a_bad_paging_argument_400() {
        assert_eq!(status("queue_full"), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status("too_many_questions"), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(status("invalid_arguments"), StatusCode::BAD_REQUEST);
        assert_eq!(status("unknown_question"), StatusCode::NOT_FOUND);
        assert_eq!(status("answer_too_large"), StatusCode::PAYLOAD_TOO_LARGE);
    }

    /// Attack T2b: `not_your_member` and the other delegation refusals were answered 503, which
    /// tells a client to retry what will never be allowed. Only fleetd's own trouble is a 503.
    #[test]
    fn only_fleetds_own_trouble_is_a_503() {
        let expected: &[(StatusCode, &[&str])] = &[
            (
                StatusCode::FORBIDDEN,
                &[
                    "not_your_member",
                    "delegation_cycle",
                    "delegation_too_deep",
                    "no_gateway",
                ],
            ),
            (StatusCode::TOO_MANY_REQUESTS, &["too_many_members"]),
            (StatusCode::CONFLICT, &["name_taken"]),
            (StatusCode::PAYLOAD_TOO_LARGE, &["question_too_large"]),
            (
                StatusCode::NOT_FOUND,
                &[
                    "unknown_profile",
                    "unknown_backend",
                    "unknown_gateway",
                    "unknown_tool",
                ],
            ),
            (
                StatusCode::BAD_REQUEST,
                &[
                    "invalid_name",
                    "no_name",
                    "invalid_gateway",
                    "empty_question",
                ],
            ),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                &[
                    "store_unavailable",
                    "store_failed",
                    "shutting_down",
                    "spawn_failed",
                    "agent_not_ready",
                    "worktree_failed",
                ],
            ),
        ];
        for (answer, codes) in expected {
            for code in *codes {
                assert_eq!(status(code), *answer, "{code}");
            }
        }
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
        assert_eq!(
            origin_at(
                &Method::GET,
                "/events/latency",
                Some("http://evil.example"),
                h
            ),
            Err("foreign_origin")
        );
    }
}

//! The model gateway (SPEC §18): a member whose backend is served through fleetd
//! (`backends.<name>.throughFleetd`, the default) gets `<fleetd>/model/<name>` as its backend's
//! URL and a model key of its own ([`key`]) instead of the backend's credential. Each request
//! is admitted only when the connection it came on is that member's (the same locator as every
//! door: another member's key, a lead, a process in no pane, another user or a web page are
//! refused), and only while the member's budgets allow; then it goes to the backend with the
//! real credential in the header the member used, and the answer streams back as it arrives,
//! frame by frame ([`relay`]), while its usage is read off it and counted on the member's
//! account once the backend reports the answer complete — before its last frame reaches the
//! member, so an answer the member got whole is never left uncounted. An answer cut off (the
//! member went away, fleetd stopped) counts nothing; dropping it closes the backend connection,
//! which tells the backend to stop.
//!
//! Never logged, at any level: a request's or answer's body, a model key, the real credential.
//! Errors are in the shape of the API the request spoke (Anthropic's or OpenAI's), so the agent
//! shows the member's user fleetd's words.
//!
//! This is the one place besides `client::wire` that makes HTTP requests (to backends), and
//! besides `http` that answers them (it is mounted by `http` at `/model/`).

mod credential;
pub(crate) mod key;
mod relay;
pub(crate) mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleetd_core::access::{Refusal, Role};
use fleetd_core::refusal::Code;
use fleetd_core::usage::{Api, api_of};
use serde_json::json;

use crate::identity::{Caller, ConnInfo};
use crate::mcp::Fleet;

/// How long a request from a pane whose member is still being registered waits for it: an
/// agent may send its first model request as soon as it starts.
const REGISTRATION_WAIT: Duration = Duration::from_secs(5);

/// Headers that belong to one hop, and the credentials and encodings fleetd sets itself.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "x-api-key",
    "accept-encoding",
];

/// The URL a member of `backend` is given: fleetd's own, when the backend is served through
/// it; else the backend's.
pub(crate) fn member_url(
    config: &crate::config::Config,
    backend: &str,
    fleet_url: &str,
) -> Option<String> {
    let b = config.backends.get(backend)?;
    Some(if b.through_fleetd {
        format!("{}/model/{backend}", fleet_url.trim_end_matches('/'))
    } else {
        b.base_url.clone()
    })
}

/// Serves one request to `/model/<backend>/<path>` from `conn`.
pub(crate) async fn forward(fleet: Arc<Fleet>, conn: ConnInfo, request: Request<Body>) -> Response {
    let path = request.uri().path().to_owned();
    let api = api_of(request.method() == http::Method::POST, &path);
    match admit_and_send(&fleet, &conn, request).await {
        Ok(response) => response,
        Err((status, refusal)) => error(api, status, &refusal),
    }
}

type Refused = (StatusCode, Refusal);

async fn admit_and_send(
    fleet: &Arc<Fleet>,
    conn: &ConnInfo,
    request: Request<Body>,
) -> Result<Response, Refused> {
    let config = fleet.config.current();
    let (parts, body) = request.into_parts();
    let rest = parts.uri.path().strip_prefix("/model/").unwrap_or_default();
    let (name, path) = rest.split_once('/').map_or((rest, ""), |(n, p)| (n, p));
    let backend = config
        .backends
        .get(name)
        .filter(|b| b.through_fleetd)
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                Refusal::new(
                    Code::UnknownBackend,
                    format!("fleetd serves no backend {name:?} through its model gateway: a member is given its backend's URL at spawn"),
                ),
            )
        })?;
    let Some(key) = presented_key(&parts.headers) else {
        return Err((
            StatusCode::UNAUTHORIZED,
            Refusal::new(
                Code::ModelKeyRefused,
                "fleetd's model gateway needs the member's model key (its backend token variable, as fleetd set it at spawn)",
            ),
        ));
    };
    let refused = |r: Refusal| {
        let status = if r.code == Code::BudgetReached {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::UNAUTHORIZED
        };
        (status, r)
    };
    // A member's own pane, the usual case, is admitted by the pass the engine published for
    // it, else in one turn of the engine (a refusal, in words); anyone else is found out the
    // long way, for the refusal's words (or a member by its user, `runAs`).
    let key_hash = key::hash(key);
    let fast = match crate::identity::own_users_pane(fleet, conn).await {
        Some(p) => match (fleet.engine.model_passes())
            .and_then(|passes| passes.admits(&p.pane, &p.terminal, &key_hash, name))
        {
            Some(pass) => Some(Ok(pass)),
            None => (fleet.engine)
                .model_admit_at(p.pane, p.terminal, key_hash.clone(), name.to_owned())
                .await
                .map_err(|_| gone())?,
        },
        None => None,
    };
    let (target, account) = match fast {
        Some(admitted) => admitted.map_err(refused)?,
        None => {
            let target = member_of(fleet, conn).await?;
            let account = (fleet.engine)
                .model_admit(target.clone(), key_hash, name.to_owned())
                .await
                .map_err(|_| gone())?
                .map_err(refused)?;
            (target, account)
        }
    };
    let Some((origin, prefix)) = upstream::Origin::parse(&backend.base_url) else {
        return Err(trouble(format!(
            "backend {name}'s baseUrl is not an http(s) URL"
        )));
    };
    let mut uri = format!("{prefix}/{path}");
    if let Some(q) = parts.uri.query() {
        uri.push('?');
        uri.push_str(q);
    }
    let mut out = Request::builder().method(parts.method.clone()).uri(&uri);
    let headers = out
        .headers_mut()
        .ok_or_else(|| trouble("a request could not be built".to_owned()))?;
    for (k, v) in &parts.headers {
        if !NOT_FORWARDED.contains(&k.as_str()) {
            headers.append(k.clone(), v.clone());
        }
    }
    let host = HeaderValue::from_str(&origin.authority()).map_err(|e| trouble(e.to_string()))?;
    headers.insert(header::HOST, host);
    // The usage is read off the answer as it passes: it must come uncompressed.
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    if let Some(secret) = &backend.auth_token_secret {
        let value = credential::current(&config, secret)
            .map_err(|e| trouble(format!("backend {name}'s credential does not resolve: {e}")))?;
        let in_x_api_key = parts.headers.contains_key("x-api-key");
        let header_value = if in_x_api_key {
            HeaderValue::from_str(value.expose())
        } else {
            HeaderValue::from_str(&format!("Bearer {}", value.expose()))
        };
        let mut header_value = header_value.map_err(|_| {
            trouble(format!(
                "backend {name}'s credential is not a valid header value"
            ))
        })?;
        header_value.set_sensitive(true);
        headers.insert(
            if in_x_api_key {
                "x-api-key"
            } else {
                "authorization"
            },
            header_value,
        );
    }
    let request = out.body(body).map_err(|e| trouble(e.to_string()))?;
    let mut lent = upstream::lend(&origin)
        .await
        .map_err(|e| bad_gateway(name, &e))?;
    let response = lent
        .send(request)
        .await
        .map_err(|e| bad_gateway(name, &e))?;
    tracing::debug!(member = %target, backend = name, status = response.status().as_u16(), "a model request was forwarded");
    let api = api_of(parts.method == http::Method::POST, parts.uri.path());
    Ok(relay::answer(
        response,
        lent,
        relay::Counting {
            engine: fleet.engine.clone(),
            account,
            api,
            prices: backend.prices,
        },
    ))
}

/// The model key a request presents: `x-api-key` (Anthropic), else a bearer token.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| crate::http::bearer(headers))
        .filter(|k| !k.is_empty())
}

/// The member `conn` belongs to, waiting a little for a pane whose member is being registered.
async fn member_of(fleet: &Fleet, conn: &ConnInfo) -> Result<fleetd_core::Target, Refused> {
    let until = tokio::time::Instant::now() + REGISTRATION_WAIT;
    loop {
        let caller: Caller = crate::identity::resolve_with(
            fleet,
            Some(conn),
            false,
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
        if let Role::Member { target, .. } = &caller.role {
            return Ok(target.clone());
        }
        if caller.unregistered.is_none() || tokio::time::Instant::now() >= until {
            let refusal = caller.explain(Refusal::new(
                Code::NotAMember,
                format!(
                    "fleetd's model gateway serves members only, from their own panes, and this request comes from {}: a model key works only in the pane of the member it was made for",
                    caller.role.as_str()
                ),
            ));
            return Err((StatusCode::FORBIDDEN, refusal));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn gone() -> Refused {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Refusal::new(
            Code::ShuttingDown,
            "fleetd is shutting down: try again once it is back",
        ),
    )
}

fn trouble(message: impl std::fmt::Display) -> Refused {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Refusal::new(
            Code::ProfileNotReady,
            format!("fleetd's model gateway: {message}"),
        ),
    )
}

fn bad_gateway(name: &str, e: &upstream::UpstreamError) -> Refused {
    tracing::warn!(backend = name, error = %e, "a model backend could not be reached");
    (
        StatusCode::BAD_GATEWAY,
        Refusal::new(
            Code::BackendUnreachable,
            format!("fleetd could not reach backend {name}: {e}"),
        ),
    )
}

/// A refusal in the error shape of the API the request spoke.
fn error(api: Api, status: StatusCode, refusal: &Refusal) -> Response {
    let body = match api {
        Api::OpenAiResponses | Api::OpenAiChat => {
            json!({"error": {"message": refusal.message, "type": refusal.code.as_str(), "code": refusal.code.as_str()}})
        }
        // Anthropic's shape, with the code beside: what Claude Code shows, readable by others.
        _ => {
            let kind = match status {
                StatusCode::UNAUTHORIZED => "authentication_error",
                StatusCode::FORBIDDEN => "permission_error",
                StatusCode::NOT_FOUND => "not_found_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": refusal.message, "code": refusal.code.as_str()}})
        }
    };
    (status, axum::Json(body)).into_response()
}

//! The dashboard (SPEC §14): the page at `/`, its script and style (embedded in the binary: no
//! separate server, no build step), and how a browser signs in.
//!
//! A browser is a process in no pane, so on its own it is anonymous and sees what anonymous
//! callers see. It becomes the operator by signing in, one of two ways:
//! - `fleetd dashboard` (the operator's CLI) asks `POST /dashboard/keys` for a one-time key and
//!   prints fleetd's address with the key in the fragment (`/#key=...`, never sent in a request
//!   line or logged); the page trades it at `POST /dashboard/login` within [`KEY_TTL`].
//! - The page's form sends the API token to `POST /dashboard/login` (for a daemon reached from
//!   another host, where the token is needed anyway).
//!
//! Either way the answer sets a session cookie (`HttpOnly`, `SameSite=Strict`, `Path=/`), held
//! in memory for [`SESSION_TTL`] (a restart signs every browser out). A request with a live
//! session counts as presenting the API token, so the role is decided exactly as for the token
//! (a pane still decides first). The cookie counts only when the browser says the request comes
//! from fleetd's own page (`Sec-Fetch-Site` absent, `same-origin` or `none`): another site on
//! the same host (same-site for cookies) gets nothing from it, on top of the `Origin` check the
//! request guard makes of every change and of `/events`.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use axum::Json;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use fleetd_core::access::Role;
use serde::Deserialize;
use serde_json::json;

use super::requester::Requester;
use super::{ApiError, App};
use crate::identity::{ConnInfo, constant_time_eq};

/// How long a key from `fleetd dashboard` can be traded for a session.
pub(super) const KEY_TTL: Duration = Duration::from_secs(120);
/// How long a session lasts from sign-in.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Keys waiting to be traded; the oldest is dropped past this.
const MAX_KEYS: usize = 16;
/// Sessions held; the oldest is signed out past this.
const MAX_SESSIONS: usize = 64;
/// The session cookie's name.
pub(super) const COOKIE: &str = "fleetd_session";
/// Wrong sign-ins a peer address may make before it must wait: enough for typos.
const FREE_FAILURES: u32 = 5;
/// The wait after the first wrong sign-in past [`FREE_FAILURES`]; it doubles with each further
/// one, up to [`MOST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest a peer waits between two sign-in attempts.
const MOST_WAIT: Duration = Duration::from_secs(60);
/// Peer addresses whose wrong sign-ins are remembered; the stalest is forgotten past this.
const MAX_PEERS: usize = 256;

const INDEX: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/app.js");
const STYLE: &str = include_str!("dashboard/app.css");

/// What the page may load and where it may connect: only fleetd itself; no inline script or
/// style, no framing (an answer box in another site's frame would be clickjacking).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The keys and sessions of signed-in browsers.
#[derive(Debug)]
pub(super) struct Sessions {
    /// fleetd's TCP address, for the links `fleetd dashboard` prints.
    local: SocketAddr,
    inner: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    keys: Vec<(String, Instant)>,
    sessions: Vec<(String, Instant)>,
    /// Per peer address (`None`: the unix socket): wrong sign-ins in a row, and until when the
    /// next attempt is refused unheard.
    failures: std::collections::HashMap<Option<std::net::IpAddr>, (u32, Instant)>,
}

/// Holds `id` in `held` for `ttl` from now, once the expired entries are dropped and, when
/// `max` are still held, the oldest.
fn remember(held: &mut Vec<(String, Instant)>, id: String, max: usize, ttl: Duration) {
    let now = Instant::now();
    held.retain(|(_, until)| *until > now);
    if held.len() >= max {
        held.remove(0);
    }
    held.push((id, now + ttl));
}

impl Sessions {
    /// Sessions for the daemon listening on `local`.
    pub(super) fn new(local: SocketAddr) -> Self {
        Self {
            local,
            inner: Mutex::new(Held::default()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        crate::sync::lock(&self.inner)
    }

    fn mint_key(&self) -> String {
        let key = secret();
        remember(&mut self.held().keys, key.clone(), MAX_KEYS, KEY_TTL);
        key
    }

    /// Spends `key` if it is held and fresh.
    fn spend_key(&self, given: &str) -> bool {
        let mut held = self.held();
        let now = Instant::now();
        held.keys.retain(|(_, until)| *until > now);
        let found = held
            .keys
            .iter()
            .position(|(key, _)| constant_time_eq(key.as_bytes(), given.as_bytes()));
        found.map(|i| held.keys.remove(i)).is_some()
    }

    fn open_session(&self) -> String {
        let id = secret();
        remember(
            &mut self.held().sessions,
            id.clone(),
            MAX_SESSIONS,
            SESSION_TTL,
        );
        id
    }

    fn close_session(&self, given: &str) {
        self.held()
            .sessions
            .retain(|(id, _)| !constant_time_eq(id.as_bytes(), given.as_bytes()));
    }

    /// How long `peer` must still wait before its next sign-in attempt is heard.
    fn must_wait(&self, peer: Option<std::net::IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        self.held()
            .failures
            .get(&peer)
            .map(|(_, until)| until.saturating_duration_since(now))
            .filter(|wait| !wait.is_zero())
    }

    /// Counts a sign-in by `peer`: a success forgets its failures; a failure past
    /// [`FREE_FAILURES`] makes it wait, twice as long each time.
    fn attempted(&self, peer: Option<std::net::IpAddr>, ok: bool) {
        let mut held = self.held();
        if ok {
            held.failures.remove(&peer);
            return;
        }
        let now = Instant::now();
        if !held.failures.contains_key(&peer) && held.failures.len() >= MAX_PEERS {
            let stalest = held
                .failures
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(peer, _)| *peer);
            if let Some(stalest) = stalest {
                held.failures.remove(&stalest);
            }
        }
        let entry = held.failures.entry(peer).or_insert((0, now));
        entry.0 = entry.0.saturating_add(1);
        if let Some(over) = entry.0.checked_sub(FREE_FAILURES + 1) {
            let wait = FIRST_WAIT
                .saturating_mul(1u32.checked_shl(over.min(16)).unwrap_or(u32::MAX))
                .min(MOST_WAIT);
            entry.1 = now + wait;
        }
    }

    /// Whether `given` is a live session.
    fn live(&self, given: &str) -> bool {
        let now = Instant::now();
        self.held()
            .sessions
            .iter()
            .any(|(id, until)| *until > now && constant_time_eq(id.as_bytes(), given.as_bytes()))
    }

    /// Whether the request carries a live session from fleetd's own page (see the module
    /// header): it then counts as presenting the API token.
    pub(super) fn signed_in(&self, headers: &HeaderMap) -> bool {
        let own_page = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_none_or(|site| matches!(site, "same-origin" | "none"));
        own_page && cookie(headers).is_some_and(|id| self.live(id))
    }
}

/// 256 random bits from the kernel, as 64 hex digits.
fn secret() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    // Reading /dev/urandom cannot fail on a running Linux system short of fd exhaustion; a key
    // made of zeros would be guessable, so there is no fallback.
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom for a dashboard secret");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session cookie's value, when the request has one.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CSP),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the page. It holds no fleet data: everything comes from the API once signed in.
pub(super) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

/// `GET /dashboard/app.js`.
pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `GET /dashboard/app.css`.
pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

/// `POST /dashboard/keys`: a one-time sign-in key, for the operator only (`fleetd dashboard` on
/// the operator's socket, or a client with the API token).
pub(super) async fn keys(requester: Requester) -> Response {
    if let Err(refused) = requester
        .operator_only(
            "dashboard sign-in keys are",
            "run `fleetd dashboard` as fleetd's user on its machine",
        )
        .await
    {
        return refused;
    }
    let sessions = &requester.app.sessions;
    let key = sessions.mint_key();
    let host = match sessions.local {
        addr if addr.ip().is_unspecified() => SocketAddr::new([127, 0, 0, 1].into(), addr.port()),
        addr => addr,
    };
    tracing::info!("a dashboard sign-in key was issued");
    Json(json!({
        "url": format!("http://{host}/#key={key}"),
        "key": key,
        "expiresInSeconds": KEY_TTL.as_secs(),
    }))
    .into_response()
}

/// The body of `POST /dashboard/login`: a key from `fleetd dashboard`, or the API token.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Login {
    key: Option<String>,
    token: Option<String>,
}

/// `POST /dashboard/login`: trades a key or the token for a session cookie.
pub(super) async fn login(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    body: Result<Json<Login>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let peer = match conn.endpoint {
        crate::identity::Endpoint::Tcp { peer, .. } => Some(peer.ip()),
        crate::identity::Endpoint::Unix { .. } => None,
    };
    if let Some(wait) = app.sessions.must_wait(peer) {
        // Not even checked: a guesser learns nothing until the wait is over.
        let secs = wait.as_secs().max(1);
        let mut refused = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_sign_ins",
            format!("too many wrong sign-ins from this address: try again in {secs} s"),
        )
        .into_response();
        refused
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        return refused;
    }
    let Ok(Json(login)) = body else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_login",
            "send a JSON object with `key` (from `fleetd dashboard`) or `token` (fleetd's API token)",
        )
        .into_response();
    };
    let ok = match (&login.key, &login.token) {
        (Some(key), None) => app.sessions.spend_key(key),
        (None, Some(token)) => app.fleet.token_matches(token),
        _ => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_login",
                "send exactly one of `key` (from `fleetd dashboard`) and `token` (fleetd's API token)",
            )
            .into_response();
        }
    };
    app.sessions.attempted(peer, ok);
    if !ok {
        tracing::info!("a dashboard sign-in was refused");
        let message = if login.key.is_some() {
            "this sign-in link was used already, or is more than two minutes old, or is from another run of fleetd: run `fleetd dashboard` again and open the new link"
        } else {
            "that is not fleetd's API token (the value of the secret named by `apiToken`)"
        };
        return ApiError::new(StatusCode::UNAUTHORIZED, "bad_credential", message).into_response();
    }
    let session = app.sessions.open_session();
    tracing::info!("a browser signed in to the dashboard");
    let cookie = format!(
        "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    );
    (
        [(header::SET_COOKIE, cookie)],
        Json(json!({ "signedIn": true })),
    )
        .into_response()
}

/// `GET /dashboard/session`: whether this browser is signed in (as whom).
pub(super) async fn session(requester: Requester) -> Response {
    let caller = requester.caller().await;
    if matches!(caller.role, Role::Operator | Role::Lead) {
        return Json(json!({ "role": caller.role.as_str() })).into_response();
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "signed_out",
        "this browser is not signed in: run `fleetd dashboard` and open the link it prints",
    )
    .into_response()
}

/// `POST /dashboard/logout`: ends this browser's session.
pub(super) async fn logout(State(app): State<App>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers) {
        app.sessions.close_session(id);
    }
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
        )],
        Json(json!({ "signedIn": false })),
    )
        .into_response()
}

/// Requests a peer on another host may make without the token: the page and signing in.
pub(super) fn open_to_remote(path: &str) -> bool {
    matches!(
        path,
        "/" | "/dashboard/app.js"
            | "/dashboard/app.css"
            | "/dashboard/login"
            | "/dashboard/session"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn a_key_is_spent_once() {
        let s = Sessions::new("127.0.0.1:1".parse().expect("addr"));
        let key = s.mint_key();
        assert_eq!(key.len(), 64);
        assert!(!s.spend_key("0000"), "an unknown key");
        assert!(s.spend_key(&key));
        assert!(!s.spend_key(&key), "a key works once");
    }

    #[test]
    fn only_a_live_session_from_the_own_page_counts() {
        let s = Sessions::new("127.0.0.1:1".parse().expect("addr"));
        let id = s.open_session();
        let cookie = format!("other=1; {COOKIE}={id}");
        assert!(s.signed_in(&headers(&[("cookie", &cookie)])));
        assert!(s.signed_in(&headers(&[
            ("cookie", &cookie),
            ("sec-fetch-site", "same-origin")
        ])));
        for site in ["same-site", "cross-site"] {
            assert!(
                !s.signed_in(&headers(&[("cookie", &cookie), ("sec-fetch-site", site)])),
                "{site}"
            );
        }
        assert!(!s.signed_in(&headers(&[("cookie", &format!("{COOKIE}=forged"))])));
        s.close_session(&id);
        assert!(!s.signed_in(&headers(&[("cookie", &cookie)])), "signed out");
    }

    #[test]
    fn the_oldest_session_goes_past_the_bound() {
        let s = Sessions::new("127.0.0.1:1".parse().expect("addr"));
        let first = s.open_session();
        for _ in 0..MAX_SESSIONS {
            s.open_session();
        }
        assert!(!s.live(&first));
        assert_eq!(s.held().sessions.len(), MAX_SESSIONS);
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for asset in [INDEX, SCRIPT] {
            assert!(!asset.contains("http://") || asset.contains("http://www.w3.org/2000/svg"));
            assert!(!asset.contains("https://"), "no CDN");
        }
        assert!(!SCRIPT.contains("innerHTML"), "daemon text goes in as text");
        assert!(
            !INDEX.contains("<script>"),
            "no inline script (the CSP forbids it)"
        );
    }
}

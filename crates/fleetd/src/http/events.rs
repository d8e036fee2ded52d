//! `GET /events`: the fleet's event stream as server-sent events (SPEC §14), for leads and the
//! operator (`ToolClass::Observe`). Each event is `event: <type>`, `id: <id>` and one `data:`
//! line holding the event's JSON. A client that reconnects with `Last-Event-ID` first gets what
//! it missed from the ring; when some of it is no longer held, a `stream.gap` event (no id, so
//! the client's last id stands) says so before the rest. A client that falls too far behind gets
//! `stream.lagged` and the stream ends: it reconnects and resumes from the ring. A comment every
//! [`KEEP_ALIVE`] keeps proxies and the connection's idle timer from closing a quiet stream;
//! the stream ends when the daemon stops serving.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fleetd_core::access::{ToolClass, authorize};
use tokio::sync::broadcast::error::RecvError;

use super::{ApiError, App, caller};
use crate::events::Published;
use crate::identity::ConnInfo;

/// How often a quiet stream sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What the stream sends next.
struct Cursor {
    prelude: VecDeque<Event>,
    live: tokio::sync::broadcast::Receiver<Arc<Published>>,
    stopping: tokio_util::sync::CancellationToken,
    ended: bool,
}

fn event(published: &Published) -> Event {
    Event::default()
        .event(published.kind)
        .id(published.id.clone())
        .data(published.json.clone())
}

fn notice(kind: &str, message: &str) -> Event {
    Event::default()
        .event(kind)
        .data(serde_json::json!({ "type": kind, "message": message }).to_string())
}

/// `GET /events`.
pub(super) async fn stream(
    State(app): State<App>,
    ConnectInfo(conn): ConnectInfo<ConnInfo>,
    headers: HeaderMap,
) -> Response {
    let caller = caller(&app, &conn, &headers).await;
    if let Err(e) = authorize(&caller.role, ToolClass::Observe, "GET /events") {
        return ApiError::tool(e).into_response();
    }
    let last = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let sub = app.fleet.engine.events().subscribe(last);
    let mut prelude = VecDeque::with_capacity(sub.missed.len() + 1);
    if let Some(gap) = &sub.gap {
        prelude.push_back(notice("stream.gap", gap));
    }
    prelude.extend(sub.missed.iter().map(|p| event(p)));
    let cursor = Cursor {
        prelude,
        live: sub.live,
        stopping: app.stopping.clone(),
        ended: false,
    };
    let events = futures_util::stream::unfold(cursor, |mut cursor| async move {
        if cursor.ended {
            return None;
        }
        if let Some(next) = cursor.prelude.pop_front() {
            return Some((Ok::<_, Infallible>(next), cursor));
        }
        let received = tokio::select! {
            received = cursor.live.recv() => received,
            () = cursor.stopping.cancelled() => return None,
        };
        match received {
            Ok(published) => Some((Ok(event(&published)), cursor)),
            Err(RecvError::Lagged(missed)) => {
                cursor.ended = true;
                let message = format!(
                    "this client fell {missed} events behind: reconnect with Last-Event-ID to resume from fleetd's ring"
                );
                Some((Ok(notice("stream.lagged", &message)), cursor))
            }
            Err(RecvError::Closed) => None,
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

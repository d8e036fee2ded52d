//! `GET /events`: the fleet's event stream as server-sent events (SPEC §14), for leads and the
//! operator (`ToolClass::Observe`). Each event is `event: <type>`, `id: <id>` and one `data:`
//! line holding the event's JSON. A client that reconnects with `Last-Event-ID` first gets what
//! it missed from the ring; when some of it is no longer held, a `stream.gap` event (no id, so
//! the client's last id stands) says so before the rest. A client that falls too far behind gets
//! `stream.lagged` and the stream ends: it reconnects and resumes from the ring. A comment every
//! [`KEEP_ALIVE`] keeps proxies and the connection's idle timer from closing a quiet stream;
//! the stream ends when the daemon stops serving.
//!
//! `?replay=ring` (the dashboard) asks, when there is no `Last-Event-ID`, for every event the
//! ring still holds instead of only what comes next; with it, once the backlog is sent, a
//! `stream.replayed` event (no id) marks where the live stream begins, so a client knows when
//! to read the fleet's state and apply events on top of it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Query;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fleetd_core::access::ToolClass;
use tokio::sync::broadcast::error::RecvError;

use super::ApiError;
use super::requester::Requester;
use crate::events::Published;

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

/// `GET /events/latency`: the last hour's latencies the events carried (a task's wait until it
/// was typed, mail → its lead's first nudge), for a dashboard that opens now; the same readers
/// as the stream.
pub(super) async fn latency(requester: Requester) -> Response {
    if let Err(e) = requester
        .authorized(ToolClass::Observe, "GET /events/latency")
        .await
    {
        return e.into_response();
    }
    axum::Json(requester.app.fleet.engine.latency()).into_response()
}

/// The query of `GET /events`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    replay: Option<String>,
}

/// `GET /events[?replay=ring]`.
pub(super) async fn stream(
    requester: Requester,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let replay = match query {
        Ok(Query(EventsQuery { replay: None })) => false,
        Ok(Query(EventsQuery { replay: Some(r) })) if r == "ring" => true,
        _ => {
            return ApiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                "invalid_query",
                "GET /events takes only `replay=ring` (every event the ring holds, then `stream.replayed`)",
            )
            .into_response();
        }
    };
    if let Err(e) = requester
        .authorized(ToolClass::Observe, "GET /events")
        .await
    {
        return e.into_response();
    }
    let last = requester
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.trim().is_empty());
    let hub = requester.app.fleet.engine.events();
    let sub = match last {
        None if replay => hub.subscribe_all(),
        last => hub.subscribe(last),
    };
    let mut prelude = VecDeque::with_capacity(sub.missed.len() + 2);
    if let Some(gap) = &sub.gap {
        prelude.push_back(notice("stream.gap", gap));
    }
    prelude.extend(sub.missed.iter().map(|p| event(p)));
    if replay {
        prelude.push_back(notice(
            "stream.replayed",
            &format!("{} earlier events sent; live from here", sub.missed.len()),
        ));
    }
    let cursor = Cursor {
        prelude,
        live: sub.live,
        stopping: requester.app.stopping.clone(),
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

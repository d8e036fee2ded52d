//! A backend's answer on its way to the member: each frame is passed on as it arrives (no
//! buffering), and read for its usage on the way. When the answer reports itself complete (a
//! stream's last event), its usage is committed to the member's account before that frame is
//! passed on; a one-document answer is counted at its end. The backend connection goes back to
//! the pool only after a clean end; dropping the answer (the member went away) closes it.

use axum::body::{Body, Bytes};
use axum::response::Response;
use fleetd_core::usage::{Api, Tokens, UsageReader};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::upstream::Lent;
use crate::config::Prices;
use crate::engine::EngineHandle;

/// Headers of the answer that belong to the backend's hop only.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Where an answer's usage is counted.
pub(super) struct Counting {
    pub(super) engine: EngineHandle,
    pub(super) account: u64,
    pub(super) api: Api,
    pub(super) prices: Prices,
}

struct Relay {
    body: Incoming,
    lent: Option<Lent>,
    reader: Option<UsageReader>,
    counting: Counting,
}

/// The member's answer: the backend's status and headers, its body relayed.
pub(super) fn answer(
    response: http::Response<Incoming>,
    lent: Lent,
    counting: Counting,
) -> Response {
    let (parts, body) = response.into_parts();
    let event_stream = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    // Only a successful answer reports usage (an error's body is the backend's words).
    let reader = (parts.status.is_success() && counting.api != Api::Other)
        .then(|| UsageReader::new(counting.api, event_stream));
    let relay = Relay {
        body,
        lent: Some(lent),
        reader,
        counting,
    };
    let stream = futures_util::stream::unfold(Some(relay), |relay| async move {
        let mut relay = relay?;
        loop {
            match relay.body.frame().await {
                None => {
                    relay.end().await;
                    return None;
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "a backend's answer broke off");
                    return Some((Err(std::io::Error::other(e)), None));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers: HTTP/1 answers to agents carry none worth passing.
                        continue;
                    };
                    relay.read(&data).await;
                    return Some((Ok::<Bytes, std::io::Error>(data), Some(relay)));
                }
            }
        }
    });
    let mut out = Response::builder().status(parts.status);
    if let Some(headers) = out.headers_mut() {
        for (k, v) in &parts.headers {
            if !HOP.contains(&k.as_str()) {
                headers.append(k.clone(), v.clone());
            }
        }
    }
    out.body(Body::from_stream(stream)).unwrap_or_default()
}

impl Relay {
    /// Reads `data` for usage; when it completes the answer, counts it (durably) first.
    async fn read(&mut self, data: &[u8]) {
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        reader.feed(data);
        if reader.complete() {
            let tokens = self.reader.take().and_then(UsageReader::finish);
            self.count(tokens).await;
        }
    }

    /// The answer ended cleanly: a one-document answer is counted now, and the connection
    /// serves the next request.
    async fn end(&mut self) {
        if let Some(reader) = self.reader.take() {
            let tokens = reader.finish();
            self.count(tokens).await;
        }
        if let Some(lent) = self.lent.take() {
            lent.give_back();
        }
    }

    async fn count(&self, tokens: Option<Tokens>) {
        let Some(tokens) = tokens else {
            return;
        };
        let cost = self.counting.prices.cost_micros(&tokens);
        match self
            .counting
            .engine
            .model_usage(self.counting.account, tokens, cost)
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(account = self.counting.account, reason = %e.message, "a model answer's usage could not be kept");
            }
            Err(_) => tracing::warn!("the engine is gone: a model answer's usage was not counted"),
        }
    }
}

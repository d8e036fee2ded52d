//! fake-herdr's `events.subscribe`: lifecycle subscriptions that replay the event ring from
//! sequence 0 (0.8) or start at the live edge (0.9), per-pane `pane.agent_status_changed` (with
//! herdr's initial event when a status filter already matches), herdr's rule that any inbound
//! byte or EOF ends the stream, and 0.9's `events_lost` end of a stream (see `version`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::api::{Request, error, find_pane, success};
use super::{Server, lock};

/// How often subscriptions look for new events: herdr 0.8.2 polls each subscription
/// connection every `CONNECTION_POLL_INTERVAL`, 100 ms (src/api/server.rs:28, the loop at
/// :724-741), so an event reaches a subscriber up to 100 ms after herdr detected it.
const SUBSCRIPTION_POLL: Duration = Duration::from_millis(100);

/// One active subscription.
enum Sub {
    /// A lifecycle kind: replays the ring from sequence 0.
    Lifecycle { kind: String, last: u64 },
    /// `pane.agent_status_changed` for one pane.
    Status {
        pane_id: String,
        filter: Option<String>,
        last: u64,
        initial: Option<Value>,
    },
}

fn status_event(data: &Value) -> Value {
    let mut data = data.clone();
    if let Value::Object(map) = &mut data {
        map.remove("type");
    }
    json!({ "event": "pane.agent_status_changed", "data": data })
}

/// Answers a subscription request with herdr's error `code` and `message` (the stream ends
/// there); a client already gone hears nothing.
async fn refuse(stream: &mut UnixStream, id: &str, code: &str, message: &str) {
    let line = error(id, code, message);
    let _ = stream.write_all(format!("{line}\n").as_bytes()).await;
}

/// `events.subscribe`: validates every subscription, acks, then streams until the client goes
/// away (any inbound byte or EOF, as herdr) or the server restarts.
pub(super) async fn subscribe(server: &Arc<Server>, req: Request, mut stream: UnixStream) {
    let generation = server.generation.load(std::sync::atomic::Ordering::SeqCst);
    let mut subs = Vec::new();
    let list = req
        .params
        .get("subscriptions")
        .and_then(Value::as_array)
        .cloned();
    let Some(list) = list else {
        refuse(
            &mut stream,
            &req.id,
            "invalid_request",
            "invalid request: missing field `subscriptions`",
        )
        .await;
        return;
    };
    for sub in list {
        let kind = sub
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        if kind == "pane.agent_status_changed" {
            let pane_id = sub
                .get("pane_id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let Some(pane) = find_pane(server, &pane_id) else {
                let why = format!("pane {pane_id} not found");
                refuse(&mut stream, &req.id, "pane_not_found", &why).await;
                return;
            };
            let filter = sub
                .get("agent_status")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let current = pane.detected();
            let initial = (filter.as_deref() == Some(current.status)).then(|| {
                json!({ "event": "pane.agent_status_changed", "data": {
                    "pane_id": pane_id, "workspace_id": pane.identity.workspace_id,
                    "agent_status": current.status, "agent": current.agent, "title": null }})
            });
            subs.push(Sub::Status {
                pane_id,
                filter,
                last: lock(&server.hub).current(),
                initial,
            });
        } else if let Some(lifecycle) = lifecycle_kind(&kind) {
            let last = if server.opts.herdr.lifecycle_from_live_edge() {
                lock(&server.hub).current()
            } else {
                0
            };
            subs.push(Sub::Lifecycle {
                kind: lifecycle,
                last,
            });
        } else {
            let why = format!("invalid request: unknown subscription type `{kind}`");
            refuse(&mut stream, &req.id, "invalid_request", &why).await;
            return;
        }
    }
    let ack = success(&req.id, &json!({ "type": "subscription_started" }));
    if stream
        .write_all(format!("{ack}\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let (mut read, mut write) = stream.into_split();
    let mut probe = [0u8; 1];
    // An `events_lost` fault after this point ends this subscription.
    let loss_epoch = lock(&server.loss).epoch;
    let mut dropped = 0usize;
    loop {
        if server.generation.load(std::sync::atomic::Ordering::SeqCst) != generation {
            return;
        }
        let mut out = String::new();
        // Status reports pushed in this round, for the `--status-log`: written once they are
        // on the socket, the moment a subscriber can know.
        let mut reported = Vec::new();
        let oldest = subs
            .iter()
            .map(|s| match s {
                Sub::Lifecycle { last, .. } | Sub::Status { last, .. } => *last,
            })
            .min()
            .unwrap_or(0);
        let events = lock(&server.hub).after(oldest);
        for sub in &mut subs {
            match sub {
                Sub::Lifecycle { kind, last } => {
                    let from = *last;
                    for (seq, event) in events.iter().filter(|(s, _)| *s > from) {
                        *last = *seq;
                        if event["event"] == kind.as_str() {
                            out.push_str(&format!("{event}\n"));
                        }
                    }
                }
                Sub::Status {
                    pane_id,
                    filter,
                    last,
                    initial,
                } => {
                    if let Some(first) = initial.take() {
                        out.push_str(&format!("{first}\n"));
                    }
                    let from = *last;
                    for (seq, event) in events.iter().filter(|(s, _)| *s > from) {
                        *last = *seq;
                        let data = &event["data"];
                        if event["event"] == "pane_agent_status_changed"
                            && data["pane_id"] == pane_id.as_str()
                            && filter.as_deref().is_none_or(|f| data["agent_status"] == f)
                        {
                            out.push_str(&format!("{}\n", status_event(data)));
                            reported.push((pane_id.clone(), data["agent_status"].clone()));
                        }
                    }
                }
            }
        }
        let (epoch, until, linger_ms) = {
            let loss = lock(&server.loss);
            (loss.epoch, loss.until, loss.linger_ms)
        };
        if epoch > loss_epoch {
            dropped += out.lines().count();
            out.clear();
            reported.clear();
            if until.is_none_or(|u| tokio::time::Instant::now() >= u) {
                let lost = json!({ "event": "events_lost",
                    "data": { "type": "events_lost", "dropped": dropped } });
                if write
                    .write_all(format!("{lost}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
                // The subscription is over: closed once the linger is up, or the client goes.
                tokio::select! {
                    _ = read.read(&mut probe) => {}
                    () = tokio::time::sleep(Duration::from_millis(linger_ms)) => {}
                }
                return;
            }
        }
        if !out.is_empty() && write.write_all(out.as_bytes()).await.is_err() {
            return;
        }
        if let Some(path) = &server.opts.status_log {
            for (pane_id, status) in reported {
                super::log_status(path, &pane_id, status);
            }
        }
        tokio::select! {
            // Any inbound byte or EOF means the client is gone.
            _ = read.read(&mut probe) => return,
            () = tokio::time::sleep(SUBSCRIPTION_POLL) => {}
        }
    }
}

/// `pane.closed` → `pane_closed`, for the lifecycle kinds herdr streams.
fn lifecycle_kind(kind: &str) -> Option<String> {
    const KINDS: &[&str] = &[
        "workspace.created",
        "workspace.updated",
        "workspace.closed",
        "workspace.renamed",
        "workspace.focused",
        "tab.created",
        "tab.closed",
        "tab.focused",
        "tab.renamed",
        "pane.created",
        "pane.closed",
        "pane.updated",
        "pane.focused",
        "pane.exited",
        "pane.agent_detected",
        "layout.updated",
    ];
    KINDS.contains(&kind).then(|| kind.replace('.', "_"))
}

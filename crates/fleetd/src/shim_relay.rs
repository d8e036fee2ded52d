//! `fleetd mcp`'s relay: the client's stdin to the daemon's shim socket, line by line (MCP over
//! stdio is one JSON-RPC message per line), and the daemon's answers to stdout. The relay
//! outlives the daemon: when the socket closes while the client is still there (a restart, a
//! kill -9 and a service manager's start), it dials again for up to [`RECONNECT_FOR`] and
//! carries on, so a client polling an MCP task (`tasks/get`) never sees its server go — Claude
//! Code does not restart a stdio server that went away.
//!
//! What it keeps to do that: the client's `initialize` and `notifications/initialized`
//! (2025-11-25 sessions), replayed to the new daemon with the second answer swallowed; and the
//! requests not yet answered. Those that change nothing (`tasks/get`, `tools/list`, …) are sent
//! again; a `tools/call` is not (it may have run: sent twice, a `fleet_send` would delegate
//! twice), it is answered with an error saying its outcome is unknown and how to find it.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// How long the relay dials a daemon that went away before it gives up: a restart takes a
/// second or two, and a client waits about 30 s for an answer.
pub const RECONNECT_FOR: Duration = Duration::from_secs(25);
const RECONNECT_EVERY: Duration = Duration::from_millis(200);

/// Methods whose request is safe to send again after a restart: they change nothing.
const REPEATABLE: &[&str] = &[
    "initialize",
    "server/discover",
    "ping",
    "tools/list",
    "tasks/get",
    "tasks/cancel",
];

/// Relays until the client closes stdin (then drains the daemon's last answers).
pub async fn run(path: &Path) -> anyhow::Result<()> {
    let mut stream = UnixStream::connect(path).await.map_err(|e| {
        anyhow::anyhow!(
            "failed to reach fleetd at {}: {e}; start it with `fleetd serve` (same config and state directory)",
            path.display()
        )
    })?;
    let (lines_tx, mut lines_rx) = tokio::sync::mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if lines_tx.send(line).await.is_err() {
                break;
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut held = Held::default();
    let mut replay: Vec<String> = Vec::new();
    loop {
        let (read, mut write) = stream.into_split();
        let mut from_daemon = BufReader::new(read).lines();
        let mut gone = false;
        for line in replay.drain(..) {
            gone |= send(&mut write, &line).await.is_err();
        }
        while !gone {
            tokio::select! {
                line = lines_rx.recv() => {
                    let Some(line) = line else {
                        // The client is done: no more requests; its answers still come down.
                        let _ = write.shutdown().await;
                        while let Ok(Some(line)) = from_daemon.next_line().await {
                            if held.received(&line) {
                                emit(&mut stdout, &line).await?;
                            }
                        }
                        return Ok(());
                    };
                    held.sent(&line);
                    gone = send(&mut write, &line).await.is_err();
                }
                line = from_daemon.next_line() => match line {
                    Ok(Some(line)) => {
                        if held.received(&line) {
                            emit(&mut stdout, &line).await?;
                        }
                    }
                    _ => gone = true,
                },
            }
        }
        match redial(path).await {
            Some(again) => {
                stream = again;
                let (lines, unknown) = held.after_restart();
                for line in unknown {
                    emit(&mut stdout, &line).await?;
                }
                replay = lines;
            }
            None => {
                for line in held.give_up() {
                    emit(&mut stdout, &line).await?;
                }
                anyhow::bail!(
                    "fleetd at {} went away and did not come back within {} s",
                    path.display(),
                    RECONNECT_FOR.as_secs()
                );
            }
        }
    }
}

async fn send(write: &mut tokio::net::unix::OwnedWriteHalf, line: &str) -> std::io::Result<()> {
    write.write_all(line.as_bytes()).await?;
    write.write_all(b"\n").await
}

async fn emit(stdout: &mut tokio::io::Stdout, line: &str) -> std::io::Result<()> {
    stdout.write_all(line.as_bytes()).await?;
    stdout.write_all(b"\n").await?;
    stdout.flush().await
}

async fn redial(path: &Path) -> Option<UnixStream> {
    let deadline = tokio::time::Instant::now() + RECONNECT_FOR;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(RECONNECT_EVERY).await;
        if let Ok(stream) = UnixStream::connect(path).await {
            return Some(stream);
        }
    }
    None
}

/// What the relay keeps of the session to carry it across a restart.
#[derive(Debug, Default)]
struct Held {
    /// The client's `initialize`, then its `notifications/initialized`.
    handshake: Vec<String>,
    /// Requests sent and not answered yet, in order: (id as JSON text, method, line).
    pending: Vec<(String, String, String)>,
    /// Ids of replayed `initialize` requests, whose answers the client must not see.
    swallow: HashSet<String>,
    replays: u64,
}

impl Held {
    /// The client sent `line`.
    fn sent(&mut self, line: &str) {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            return;
        };
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return;
        };
        match message.get("id") {
            Some(id) => {
                if method == "initialize" {
                    self.handshake = vec![line.to_owned()];
                }
                self.pending
                    .push((id.to_string(), method.to_owned(), line.to_owned()));
            }
            None if method == "notifications/initialized" => {
                self.handshake.push(line.to_owned());
            }
            None => {}
        }
    }

    /// The daemon sent `line`; false when the client must not see it.
    fn received(&mut self, line: &str) -> bool {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            return true;
        };
        if message.get("method").is_some() {
            return true;
        }
        let Some(id) = message.get("id").map(Value::to_string) else {
            return true;
        };
        if self.swallow.remove(&id) {
            return false;
        }
        self.pending.retain(|(p, _, _)| *p != id);
        true
    }

    /// After a reconnect: the lines to send the new daemon (the handshake again, then the
    /// pending requests that change nothing) and the answers to give the client for the
    /// others (their outcome is unknown).
    fn after_restart(&mut self) -> (Vec<String>, Vec<String>) {
        let mut send = Vec::new();
        let init_pending = self.pending.iter().any(|(_, m, _)| m == "initialize");
        if let Some(init) = self.handshake.first()
            && !init_pending
            && let Ok(mut message) = serde_json::from_str::<Value>(init)
        {
            self.replays += 1;
            let id = json!(format!("fleetd-mcp-replay-{}", self.replays));
            self.swallow.insert(id.to_string());
            message["id"] = id;
            send.push(message.to_string());
            send.extend(self.handshake[1..].iter().cloned());
        }
        let mut unknown = Vec::new();
        let mut kept = Vec::new();
        for (id, method, line) in std::mem::take(&mut self.pending) {
            if REPEATABLE.contains(&method.as_str()) {
                send.push(line.clone());
                kept.push((id, method, line));
            } else {
                unknown.push(error_line(
                    &id,
                    &format!(
                        "fleetd restarted while this {method} ran, so its outcome is unknown: check with fleet_list or fleet_poll before calling it again"
                    ),
                ));
            }
        }
        self.pending = kept;
        (send, unknown)
    }

    /// The daemon did not come back: an error for every request still waiting.
    fn give_up(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .map(|(id, _, _)| {
                error_line(
                    &id,
                    "fleetd went away and did not come back; start it with `fleetd serve`",
                )
            })
            .collect()
    }
}

/// A JSON-RPC error answering request `id` (its JSON text).
fn error_line(id: &str, message: &str) -> String {
    let id: Value = serde_json::from_str(id).unwrap_or(Value::Null);
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": -32000, "message": message } })
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::Held;

    #[test]
    fn a_restart_replays_the_handshake_and_what_changes_nothing() {
        let mut held = Held::default();
        held.sent(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#);
        assert!(held.received(r#"{"jsonrpc":"2.0","id":0,"result":{}}"#));
        held.sent(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        held.sent(r#"{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"taskId":"t"}}"#);
        held.sent(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_send"}}"#,
        );
        let (send, unknown) = held.after_restart();
        assert_eq!(send.len(), 3, "{send:#?}");
        assert!(send[0].contains("fleetd-mcp-replay-1") && send[0].contains("initialize"));
        assert!(send[1].contains("notifications/initialized"));
        assert!(send[2].contains("tasks/get"));
        assert_eq!(unknown.len(), 1);
        assert!(unknown[0].contains(r#""id":2"#) && unknown[0].contains("outcome is unknown"));
        assert!(
            !held.received(r#"{"jsonrpc":"2.0","id":"fleetd-mcp-replay-1","result":{}}"#),
            "the replayed handshake's answer is the relay's"
        );
        assert!(held.received(r#"{"jsonrpc":"2.0","id":1,"result":{"status":"working"}}"#));
        assert!(held.give_up().is_empty(), "everything was answered");
    }

    #[test]
    fn a_discover_session_has_no_handshake_to_replay() {
        let mut held = Held::default();
        held.sent(r#"{"jsonrpc":"2.0","id":"server-discover-probe-1","method":"server/discover"}"#);
        assert!(held.received(r#"{"jsonrpc":"2.0","id":"server-discover-probe-1","result":{}}"#));
        held.sent(r#"{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"t"}}"#);
        let (send, unknown) = held.after_restart();
        assert_eq!(send.len(), 1);
        assert!(unknown.is_empty());
        let errors = held.give_up();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains(r#""id":7"#));
    }
}

//! Notices to where people are (SPEC §20): each configured sink (`notify.sinks`) that wants a
//! notice's kind gets it — a webhook (a JSON POST, signed with HMAC-SHA256 when the sink names a
//! secret, tried three times), an ntfy topic (a POST with a title and a click link), the desktop
//! (`notify-send`). A notice says who and what in fleetd's own words, with a link to the
//! dashboard at that member; never a reply's or task's body, never a credential.
//!
//! Nothing here holds anything else up: each notice is sent on a task of its own, at most
//! [`IN_FLIGHT`] at once (beyond that a notice is dropped with a warning), and each attempt has
//! a deadline. One notice per member, kind and episode: the same key within [`DEBOUNCE`] is
//! not sent again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;

use crate::config::{Config, NoticeKind, SinkKind};

/// Notices being sent at once, over every sink.
const IN_FLIGHT: usize = 32;
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Waits before the second and third attempts of a webhook.
const BACKOFF: [Duration; 2] = [Duration::from_secs(1), Duration::from_secs(4)];
/// The same notice (member, kind, key) is not sent again within this.
const DEBOUNCE: Duration = Duration::from_secs(600);

/// One notice.
#[derive(Debug, Clone)]
pub struct Notice {
    /// What it is about.
    pub kind: NoticeKind,
    /// The event it comes from (`member.blocked`, `question.opened`, ...).
    pub event: &'static str,
    /// The member it concerns, when one.
    pub target: Option<String>,
    /// What makes it this episode's (a dialog's fingerprint, a question's id, a ticket).
    pub key: String,
    /// fleetd's sentence.
    pub text: String,
    /// More fields for the webhook's body (a dialog's question and choices).
    pub extra: serde_json::Value,
    /// When it happened.
    pub at: jiff::Timestamp,
}

/// What makes a notice one episode's: its member, kind and key.
type Episode = (Option<String>, NoticeKind, String);

/// The sinks' sender. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    slots: Arc<Semaphore>,
    sent: Arc<Mutex<HashMap<Episode, tokio::time::Instant>>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

impl Default for Notifier {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            sent: Arc::default(),
        }
    }
}

impl Notifier {
    /// Sends `notice` to every sink of `config` that wants its kind, on tasks of their own;
    /// returns at once.
    pub fn send(&self, config: &Config, link: &str, notice: &Notice) {
        let sinks: Vec<SinkKind> = config
            .notify
            .sinks
            .iter()
            .filter(|s| s.events.contains(&notice.kind))
            .map(|s| s.kind.clone())
            .collect();
        if sinks.is_empty() || !self.first_of_episode(notice) {
            return;
        }
        let secrets = crate::secrets::Secrets::new(&config.secrets, &crate::secrets::process_env);
        for sink in sinks {
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                tracing::warn!(
                    kind = notice.kind.name(),
                    "too many notices being sent: one dropped"
                );
                continue;
            };
            let secret = match &sink {
                SinkKind::Webhook {
                    secret: Some(name), ..
                } => match secrets.resolve(name) {
                    Ok(value) => Some(value.expose().to_owned()),
                    Err(e) => {
                        tracing::warn!(secret = %name, reason = %e, "a webhook's signing secret does not resolve: the notice is not sent");
                        continue;
                    }
                },
                _ => None,
            };
            let (notice, link) = (notice.clone(), link.to_owned());
            tokio::spawn(async move {
                deliver(&sink, secret.as_deref(), &notice, &link).await;
                drop(slot);
            });
        }
    }

    /// Whether `notice` opens an episode (not sent within [`DEBOUNCE`] under the same key).
    fn first_of_episode(&self, notice: &Notice) -> bool {
        let now = tokio::time::Instant::now();
        let mut sent = crate::sync::lock(&self.sent);
        sent.retain(|_, at| now.duration_since(*at) < DEBOUNCE);
        let key = (notice.target.clone(), notice.kind, notice.key.clone());
        if sent.contains_key(&key) {
            return false;
        }
        sent.insert(key, now);
        true
    }
}

/// The webhook's body: the notice in JSON.
fn body(notice: &Notice, link: &str) -> Vec<u8> {
    let mut body = json!({
        "type": notice.event,
        "kind": notice.kind.name(),
        "target": notice.target,
        "text": notice.text,
        "link": link,
        "at": notice.at.to_string(),
    });
    if let (Some(map), Some(extra)) = (body.as_object_mut(), notice.extra.as_object()) {
        for (k, v) in extra {
            map.insert(k.clone(), v.clone());
        }
    }
    body.to_string().into_bytes()
}

async fn deliver(sink: &SinkKind, secret: Option<&str>, notice: &Notice, link: &str) {
    let outcome = match sink {
        SinkKind::Webhook { url, .. } => webhook(url, secret, notice, link).await,
        SinkKind::Ntfy { url } => ntfy(url, notice, link).await,
        SinkKind::Desktop => desktop(notice, link).await,
    };
    match outcome {
        Ok(()) => tracing::debug!(kind = notice.kind.name(), "notice sent"),
        Err(e) => {
            tracing::warn!(kind = notice.kind.name(), error = %e, "a notice could not be sent")
        }
    }
}

async fn webhook(
    url: &str,
    secret: Option<&str>,
    notice: &Notice,
    link: &str,
) -> Result<(), String> {
    let body = body(notice, link);
    let mut headers = vec![
        ("content-type", "application/json".to_owned()),
        (
            "user-agent",
            format!("fleetd/{}", env!("CARGO_PKG_VERSION")),
        ),
        ("x-fleetd-event", notice.event.to_owned()),
    ];
    if let Some(secret) = secret {
        let mac = hmac_sha256(secret.as_bytes(), &body);
        headers.push(("x-fleetd-signature", format!("sha256={}", hex(&mac))));
    }
    let mut last = String::new();
    for attempt in 0..=BACKOFF.len() {
        if attempt > 0 {
            tokio::time::sleep(BACKOFF[attempt - 1]).await;
        }
        let sent = tokio::time::timeout(
            ATTEMPT_TIMEOUT,
            crate::model_gateway::upstream::post(url, &headers, body.clone()),
        )
        .await;
        match sent {
            Ok(Ok(status)) if (200..300).contains(&status) => return Ok(()),
            // A refusal that asking again will not change.
            Ok(Ok(status)) if (400..500).contains(&status) && status != 429 => {
                return Err(format!("the webhook answered {status}"));
            }
            Ok(Ok(status)) => last = format!("the webhook answered {status}"),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("no answer in {} s", ATTEMPT_TIMEOUT.as_secs()),
        }
    }
    Err(format!("{last}, {} attempts", BACKOFF.len() + 1))
}

async fn ntfy(url: &str, notice: &Notice, link: &str) -> Result<(), String> {
    let title = match &notice.target {
        Some(t) => format!("fleetd: {t}"),
        None => "fleetd".to_owned(),
    };
    let headers = [
        ("title", title),
        ("click", link.to_owned()),
        ("tags", notice.kind.name().to_owned()),
    ];
    let post =
        crate::model_gateway::upstream::post(url, &headers, notice.text.clone().into_bytes());
    match tokio::time::timeout(ATTEMPT_TIMEOUT, post).await {
        Ok(Ok(status)) if (200..300).contains(&status) => Ok(()),
        Ok(Ok(status)) => Err(format!("ntfy answered {status}")),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!(
            "ntfy gave no answer in {} s",
            ATTEMPT_TIMEOUT.as_secs()
        )),
    }
}

async fn desktop(notice: &Notice, link: &str) -> Result<(), String> {
    let title = match &notice.target {
        Some(t) => format!("fleetd: {t}"),
        None => "fleetd".to_owned(),
    };
    let run = tokio::process::Command::new("notify-send")
        .args([
            "--app-name=fleetd",
            &title,
            &format!("{}\n{link}", notice.text),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(ATTEMPT_TIMEOUT, run).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("notify-send ended {status}")),
        Ok(Err(e)) => Err(format!(
            "notify-send: {e} (is it installed? Debian: libnotify-bin)"
        )),
        Err(_) => Err("notify-send did not end".to_owned()),
    }
}

/// HMAC-SHA256 (RFC 2104) of `message` under `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex(&mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex(&mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[tokio::test]
    async fn one_notice_per_member_kind_and_episode() {
        let notifier = Notifier::default();
        let notice = |target: &str, key: &str| Notice {
            kind: NoticeKind::Blocked,
            event: "member.blocked",
            target: Some(target.to_owned()),
            key: key.to_owned(),
            text: String::new(),
            extra: json!({}),
            at: jiff::Timestamp::UNIX_EPOCH,
        };
        assert!(notifier.first_of_episode(&notice("ann", "d1")));
        assert!(
            !notifier.first_of_episode(&notice("ann", "d1")),
            "the same dialog again"
        );
        assert!(
            notifier.first_of_episode(&notice("ann", "d2")),
            "another dialog"
        );
        assert!(
            notifier.first_of_episode(&notice("bob", "d1")),
            "another member"
        );
    }
}

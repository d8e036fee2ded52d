//! The human in the loop (SPEC §20): a member waiting on a dialog, and the people who can
//! answer it. A daemon-wide task follows the fleet's events: when a member's status turns
//! `blocked` it reads the member's screen, recognises the dialog (`fleetd_core::dialog`), and
//! publishes `member.blocked` with the dialog as shown (cleaned, secrets redacted as for any
//! text to a lead), when it began and the choices fleetd can type; when the member moves on,
//! `member.unblocked` with how long it waited. Those, a member's question, a failed or stalled
//! ticket, a budget reached and another host's trouble become notices (`notify`). An approval
//! (`approve`) types exactly one recognised choice into the member's pane, and only while the
//! same dialog is still on its screen.
//!
//! It holds no fleet state of its own beyond the open episodes (the engine owns members and
//! their status), and it never blocks the engine: it reads events from the hub and the screen
//! from the multiplexer.

mod approve;
pub mod notify;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use fleetd_core::{AgentStatus, Target};
use serde::Serialize;
use serde_json::{Value, json};

use crate::config::{Live, NoticeKind};
use crate::engine::EngineHandle;
use crate::events::FleetEvent;
use crate::mux::MuxRouter;

pub use approve::Approved;

/// How many lines of a member's screen are read for its dialog.
const SCREEN_LINES: u32 = 60;
/// How long a blocked member's screen is read for a dialog with choices it does not show yet,
/// and how often. Claude Code says "Waiting for permission…" (blocked, to the screen reading)
/// a moment before it draws its prompt: under load that moment passed 400 ms in CI.
const DIALOG_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const DIALOG_READ_GAP: std::time::Duration = std::time::Duration::from_millis(100);

/// A choice, as events and the dashboard show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChoiceView {
    /// Its number, what an approval names.
    pub key: String,
    /// Its words.
    pub label: String,
}

/// A member waiting on a dialog, now.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Episode {
    /// The member.
    pub target: String,
    /// The dialog's question (the screen's last line when fleetd recognises no dialog).
    pub question: String,
    /// The dialog as the member's screen shows it.
    pub lines: Vec<String>,
    /// The choices fleetd can type (empty: it recognises none).
    pub choices: Vec<ChoiceView>,
    /// The dialog's fingerprint: an approval that names it is typed only into this dialog.
    pub dialog: String,
    /// When the member began waiting.
    pub since: jiff::Timestamp,
    #[serde(skip)]
    started: tokio::time::Instant,
    /// Whether `member.blocked` was published (its dialog read).
    #[serde(skip)]
    told: bool,
}

/// The human-in-the-loop service. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Human {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    engine: EngineHandle,
    mux: MuxRouter,
    config: Live,
    redactor: crate::secrets::Redactor,
    clock: crate::clock::SharedClock,
    notifier: notify::Notifier,
    /// fleetd's URL as people reach it, for the links (unless `notify.dashboardUrl`).
    url: String,
    blocked: Mutex<BTreeMap<String, Episode>>,
}

impl Human {
    /// The service, not yet following events (see [`Human::start`]).
    pub fn new(
        engine: EngineHandle,
        mux: MuxRouter,
        config: Live,
        redactor: crate::secrets::Redactor,
        clock: crate::clock::SharedClock,
        url: String,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                engine,
                mux,
                config,
                redactor,
                clock,
                notifier: notify::Notifier::default(),
                url,
                blocked: Mutex::default(),
            }),
        }
    }

    /// Follows the fleet's events for the daemon's life.
    pub fn start(&self) {
        let me = self.clone();
        tokio::spawn(async move { me.run().await });
    }

    /// The members waiting on a dialog now, longest waiting first.
    pub fn blocked(&self) -> Vec<Episode> {
        let mut all: Vec<Episode> = crate::sync::lock(&self.inner.blocked)
            .values()
            .filter(|e| e.told)
            .cloned()
            .collect();
        all.sort_by_key(|e| e.since);
        all
    }

    /// Member `target`'s open episode, if it waits on a dialog.
    pub fn episode(&self, target: &str) -> Option<Episode> {
        crate::sync::lock(&self.inner.blocked).get(target).cloned()
    }

    /// The dashboard's address at member `target`, for a notice's link.
    fn link(&self, target: Option<&str>) -> String {
        let config = self.inner.config.current();
        let base = config
            .notify
            .dashboard_url
            .clone()
            .unwrap_or_else(|| self.inner.url.trim_end_matches('/').to_owned());
        match target {
            Some(t) => format!("{base}/#member={t}"),
            None => format!("{base}/"),
        }
    }

    async fn run(self) {
        let mut events = self.inner.engine.events().subscribe(None).live;
        self.resync().await;
        loop {
            match events.recv().await {
                Ok(event) => {
                    let Ok(value) = serde_json::from_str::<Value>(&event.json) else {
                        continue;
                    };
                    self.on_event(event.kind, &value).await;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => self.resync().await,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn on_event(&self, kind: &str, event: &Value) {
        let text = |k: &str| event[k].as_str().unwrap_or_default().to_owned();
        let target = text("target");
        match kind {
            "member.status" if event["status"] == "blocked" => self.blocked_now(&target).await,
            // Another host's member no longer heard from: its gateway is, as far as this host
            // can tell, unreachable (one notice per gateway per episode).
            "member.status" if event["status"] == "unreachable" => {
                let gateway = target.rsplit_once('@').map_or("?", |(_, gw)| gw).to_owned();
                self.notice(&notify::Notice {
                    kind: NoticeKind::Gateway,
                    event: "member.status",
                    key: gateway.clone(),
                    text: format!("gateway {gateway} is not heard from: its members ({target}, …) are unreachable"),
                    extra: json!({ "gateway": gateway }),
                    target: None,
                    at: self.inner.clock.now(),
                });
            }
            "member.status" => self.unblocked(&target),
            "member.released" => {
                crate::sync::lock(&self.inner.blocked).remove(&target);
            }
            "question.opened" => self.notice(&notify::Notice {
                kind: NoticeKind::Question,
                event: "question.opened",
                key: text("question_id"),
                text: format!("{target} asked its lead a question; answer it with fleet_answer, the dashboard or `fleetd answer`"),
                extra: json!({ "questionId": text("question_id") }),
                target: Some(target),
                at: self.inner.clock.now(),
            }),
            "ticket.state" if matches!(event["state"].as_str(), Some("failed" | "stalled")) => {
                let state = text("state");
                self.notice(&notify::Notice {
                    kind: NoticeKind::TicketFailed,
                    event: "ticket.state",
                    key: text("ticket"),
                    text: format!("ticket {} to {target} {state}", text("ticket")),
                    extra: json!({ "ticket": text("ticket"), "state": state }),
                    target: Some(target),
                    at: self.inner.clock.now(),
                });
            }
            "incident" => {
                let kind = match event["kind"].as_str() {
                    Some("budget") => NoticeKind::Budget,
                    Some("gateway") => NoticeKind::Gateway,
                    _ => return,
                };
                let targets = event["targets"].as_array().cloned().unwrap_or_default();
                let first = targets.first().and_then(Value::as_str).map(str::to_owned);
                self.notice(&notify::Notice {
                    kind,
                    event: "incident",
                    key: text("text"),
                    text: text("text"),
                    extra: json!({ "targets": targets }),
                    target: first,
                    at: self.inner.clock.now(),
                });
            }
            _ => {}
        }
    }

    fn notice(&self, notice: &notify::Notice) {
        let config = self.inner.config.current();
        let link = self.link(notice.target.as_deref());
        self.inner.notifier.send(&config, &link, notice);
    }

    /// Sets the open episodes right from the engine's members (at start, and when the event
    /// stream outran this task).
    async fn resync(&self) {
        let Ok(members) = self.inner.engine.list().await else {
            return;
        };
        for m in &members {
            let open = crate::sync::lock(&self.inner.blocked).contains_key(m.target.as_str());
            match (m.status == AgentStatus::Blocked, open) {
                (true, false) => self.blocked_now(m.target.as_str()).await,
                (false, true) => self.unblocked(m.target.as_str()),
                _ => {}
            }
        }
        let here: Vec<String> = members.iter().map(|m| m.target.to_string()).collect();
        crate::sync::lock(&self.inner.blocked).retain(|t, _| here.contains(t));
    }

    /// Member `target` turned `blocked`: opens its episode at once (pending: not told yet), and
    /// reads its dialog on a task of its own, so other members' events are not held up. A
    /// member of another host (not in this engine) is its own host's business.
    async fn blocked_now(&self, target: &str) {
        if crate::sync::lock(&self.inner.blocked).contains_key(target) {
            return;
        }
        let Some(pane) = self.pane_of(target).await else {
            return;
        };
        let episode = Episode {
            target: target.to_owned(),
            question: String::new(),
            lines: Vec::new(),
            choices: Vec::new(),
            dialog: String::new(),
            since: self.inner.clock.now(),
            started: tokio::time::Instant::now(),
            told: false,
        };
        crate::sync::lock(&self.inner.blocked).insert(target.to_owned(), episode.clone());
        let me = self.clone();
        tokio::spawn(async move { me.read_dialog(episode, pane).await });
    }

    /// Reads the dialog of `episode`'s member until one with choices shows (or [`DIALOG_WAIT`]
    /// passes: then what the screen shows), then tells `/events` and the sinks — unless the
    /// member moved on meanwhile.
    async fn read_dialog(&self, mut episode: Episode, pane: fleetd_core::QualifiedPaneId) {
        let target = episode.target.clone();
        let mut dialog = None;
        let screen = loop {
            let screen = self
                .inner
                .mux
                .read_tail(&pane, SCREEN_LINES)
                .await
                .unwrap_or_default();
            dialog = fleetd_core::dialog::recognise(&screen).or(dialog);
            let has_choices = dialog.as_ref().is_some_and(|d| !d.choices.is_empty());
            if has_choices || episode.started.elapsed() >= DIALOG_WAIT {
                break screen;
            }
            tokio::time::sleep(DIALOG_READ_GAP).await;
        };
        let redact = |l: &str| self.inner.redactor.redact(l).into_owned();
        let (question, lines, choices, fingerprint) = match &dialog {
            Some(d) => (
                redact(&d.question),
                d.lines.iter().map(|l| redact(l)).collect(),
                d.choices
                    .iter()
                    .map(|c| ChoiceView {
                        key: c.key.clone(),
                        label: redact(&c.label),
                    })
                    .collect(),
                d.fingerprint(),
            ),
            None => {
                let lines: Vec<String> = screen
                    .lines()
                    .map(fleetd_core::sanitize::clean_line)
                    .filter(|l| !l.is_empty())
                    .map(|l| redact(&l))
                    .collect();
                let lines = lines[lines.len().saturating_sub(12)..].to_vec();
                let question = lines.last().cloned().unwrap_or_default();
                (question, lines, Vec::new(), String::new())
            }
        };
        episode.question = question;
        episode.lines = lines;
        episode.choices = choices;
        episode.dialog = fingerprint;
        episode.told = true;
        {
            let mut open = crate::sync::lock(&self.inner.blocked);
            // Moved on (or blocked anew) while its screen was read: nothing to tell.
            match open.get(&target) {
                Some(e) if e.started == episode.started => {}
                _ => return,
            }
            open.insert(target.clone(), episode.clone());
        }
        self.inner.engine.publish_event(&FleetEvent::MemberBlocked {
            target: target.clone(),
            question: episode.question.clone(),
            lines: episode.lines.clone(),
            choices: episode
                .choices
                .iter()
                .map(|c| json!({ "key": c.key, "label": c.label }))
                .collect(),
            dialog: episode.dialog.clone(),
            since: episode.since.to_string(),
        });
        tracing::info!(%target, choices = episode.choices.len(), "a member waits on a dialog");
        let words: Vec<String> = episode
            .choices
            .iter()
            .map(|c| format!("{} {}", c.key, c.label))
            .collect();
        self.notice(&notify::Notice {
            kind: NoticeKind::Blocked,
            event: "member.blocked",
            target: Some(target.clone()),
            key: if episode.dialog.is_empty() {
                episode.since.to_string()
            } else {
                episode.dialog.clone()
            },
            text: format!("{target} waits on a dialog: {}", episode.question),
            extra: json!({ "question": episode.question, "choices": words, "dialog": episode.dialog }),
            at: episode.since,
        });
    }

    /// Member `target` is no longer blocked: closes its episode.
    fn unblocked(&self, target: &str) {
        let Some(episode) = crate::sync::lock(&self.inner.blocked).remove(target) else {
            return;
        };
        if !episode.told {
            return;
        }
        let waited = episode.started.elapsed();
        self.inner
            .engine
            .publish_event(&FleetEvent::MemberUnblocked {
                target: target.to_owned(),
                waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            });
        tracing::info!(%target, waited_ms = waited.as_millis(), "a member's dialog was answered");
    }

    /// The pane of this engine's member `target`.
    async fn pane_of(&self, target: &str) -> Option<fleetd_core::QualifiedPaneId> {
        let target = Target::new(target).ok()?;
        let members = self.inner.engine.list().await.ok()?;
        members
            .into_iter()
            .find(|m| m.target == target)
            .map(|m| m.pane_id)
    }
}

//! Answering a member's dialog (SPEC §20): the member must be `blocked`, its screen is read
//! again, the dialog recognised on it must offer the choice asked for — and, when the approval
//! names the dialog it answers, be that same dialog — and only then are the choice's keys typed,
//! with no Enter. Then the screen is watched for a moment to say whether the dialog went. Every
//! approval, typed or refused, is a log line; every typed one is an event.

use fleetd_core::access::Refusal;
use fleetd_core::refusal::Code;
use fleetd_core::{AgentStatus, Target};
use serde::Serialize;

use super::{Human, SCREEN_LINES};
use crate::events::FleetEvent;

/// How long a dialog must have been on screen before a choice is typed into it. Claude Code
/// 2.1.332 ignores keys for a moment after its permission prompt appears (measured on the real
/// CLI: a `1` typed 100 ms after the prompt showed was dropped, one typed 400 ms after was taken),
/// so an answer that comes sooner waits; a person also sees the dialog at least this long.
const DIALOG_MIN_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long after typing the screen is watched for the dialog to go.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);
const SETTLE_STEP: std::time::Duration = std::time::Duration::from_millis(100);

/// What an approval did.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Approved {
    /// The member.
    pub target: String,
    /// The choice typed (its number).
    pub choice: String,
    /// Its words.
    pub label: String,
    /// What was typed.
    pub keys: String,
    /// `answered`: the dialog left the screen; `typed`: the keys went in and the dialog was
    /// still there after a moment.
    pub outcome: &'static str,
}

impl Human {
    /// Types choice `choice` (its number or its words) into member `target`'s dialog for `by`
    /// (`operator`, `lead:<pane>`): only while the member is blocked on a dialog fleetd
    /// recognises that offers it, and, when `dialog` names a fingerprint, only into that dialog.
    pub async fn approve(
        &self,
        target: &Target,
        choice: &str,
        dialog: Option<&str>,
        by: &str,
    ) -> Result<Approved, Refusal> {
        let outcome = self.try_approve(target, choice, dialog, by).await;
        match &outcome {
            Ok(done) => {
                tracing::info!(%target, %by, choice = %done.choice, outcome = done.outcome, "typed a choice into a member's dialog")
            }
            Err(refusal) => {
                tracing::info!(%target, %by, code = refusal.code.as_str(), "an approval typed nothing")
            }
        }
        outcome
    }

    async fn try_approve(
        &self,
        target: &Target,
        choice: &str,
        dialog: Option<&str>,
        by: &str,
    ) -> Result<Approved, Refusal> {
        let members = self.inner.engine.list().await?;
        let member = members
            .iter()
            .find(|m| m.target == *target)
            .ok_or_else(|| {
                Refusal::new(
                    Code::UnknownTarget,
                    format!("no member {target} here: fleetd status lists them"),
                )
            })?;
        if member.status != AgentStatus::Blocked {
            return Err(Refusal::new(
                Code::NotBlocked,
                format!(
                    "{target} is {}, not waiting on a dialog: nothing typed (an answer is only ever typed into a dialog on screen)",
                    member.status.as_str()
                ),
            ));
        }
        // A dialog that has only just appeared takes no keys yet: wait until it has been up a
        // moment, then read it (again).
        let age = self
            .episode(target.as_str())
            .map_or(std::time::Duration::ZERO, |e| e.started.elapsed());
        if age < DIALOG_MIN_AGE {
            tokio::time::sleep(DIALOG_MIN_AGE - age).await;
        }
        let screen = self
            .inner
            .mux
            .read_tail(&member.pane_id, SCREEN_LINES)
            .await
            .map_err(|e| {
                Refusal::new(
                    Code::SpawnFailed,
                    format!("cannot read {target}'s screen ({e}): nothing typed"),
                )
            })?;
        let on_screen = fleetd_core::dialog::recognise(&screen).ok_or_else(|| {
            Refusal::new(
                Code::NoDialog,
                format!(
                    "{target} shows no dialog fleetd recognises: nothing typed; look at its pane"
                ),
            )
        })?;
        if let Some(asked) = dialog
            && asked != on_screen.fingerprint()
        {
            return Err(Refusal::new(
                Code::DialogChanged,
                format!(
                    "the dialog on {target}'s screen is not the one answered (it changed, or was answered): nothing typed; read it again"
                ),
            ));
        }
        let picked = on_screen.choice(choice).ok_or_else(|| {
            let offered: Vec<String> = on_screen
                .choices
                .iter()
                .map(|c| format!("{} ({})", c.key, c.label))
                .collect();
            Refusal::new(
                Code::UnknownChoice,
                if offered.is_empty() {
                    format!("{target}'s dialog offers no choice fleetd can type: nothing typed; answer it in its pane")
                } else {
                    format!(
                        "{choice:?} is not a choice of {target}'s dialog, which offers {}: nothing typed",
                        offered.join(", ")
                    )
                },
            )
        })?;
        // A choice's keys are a digit or a letter the dialog showed; anything else is never typed.
        if picked.keys.is_empty() || !picked.keys.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(Refusal::new(
                Code::UnknownChoice,
                format!(
                    "{target}'s choice {} has no key fleetd can type: nothing typed",
                    picked.key
                ),
            ));
        }
        self.inner
            .mux
            .type_keys(&member.pane_id, &picked.keys)
            .await
            .map_err(|e| {
                Refusal::new(
                    Code::SpawnFailed,
                    format!("typing into {target}'s pane failed ({e}); look at its pane before trying again"),
                )
            })?;
        let fingerprint = on_screen.fingerprint();
        let outcome = if self.dialog_leaves(&member.pane_id, &fingerprint).await {
            "answered"
        } else {
            "typed"
        };
        let label = self.inner.redactor.redact(&picked.label).into_owned();
        self.inner
            .engine
            .publish_event(&FleetEvent::MemberApproved {
                target: target.to_string(),
                choice: picked.key.clone(),
                label: label.clone(),
                by: by.to_owned(),
                outcome: outcome.to_owned(),
            });
        Ok(Approved {
            target: target.to_string(),
            choice: picked.key.clone(),
            label,
            keys: picked.keys.clone(),
            outcome,
        })
    }

    /// Whether the dialog `fingerprint` leaves `pane`'s screen within [`SETTLE`].
    async fn dialog_leaves(&self, pane: &fleetd_core::QualifiedPaneId, fingerprint: &str) -> bool {
        let deadline = tokio::time::Instant::now() + SETTLE;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(SETTLE_STEP).await;
            let Ok(screen) = self.inner.mux.read_tail(pane, SCREEN_LINES).await else {
                continue;
            };
            if fleetd_core::dialog::recognise(&screen)
                .is_none_or(|d| d.fingerprint() != fingerprint)
            {
                return true;
            }
        }
        false
    }
}

//! `approvals:` and `notify:` (SPEC §20): who may type a choice into a member's dialog, and where
//! fleetd tells people that a member waits on them. Both are read as each event or approval
//! comes, so a reload applies to the next.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::raw::At;
use super::validate::{Judge, is_http_url, require_secret};

/// `approvals:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawApprovals {
    pub(crate) by: Option<At<String>>,
}

/// `notify:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawNotify {
    pub(crate) dashboard_url: Option<At<String>>,
    pub(crate) sinks: Option<Vec<At<RawSink>>>,
}

/// One entry of `notify.sinks`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSink {
    pub(crate) kind: Option<String>,
    pub(crate) url: Option<String>,
    pub(crate) secret: Option<String>,
    pub(crate) events: Option<Vec<String>>,
}

/// Who may answer a member's dialog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalsBy {
    /// The operator only (`fleetd approve`, the dashboard signed in).
    #[default]
    Operator,
    /// The operator, and the member's own lead through `fleet_approve`.
    OperatorAndLead,
}

/// `approvals:`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Approvals {
    /// Who may answer.
    pub by: ApprovalsBy,
}

/// What a notice is about; a sink's `events` filter names these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum NoticeKind {
    /// A member waits on a dialog (`member.blocked`).
    Blocked,
    /// A member asked its lead a question (`question.opened`).
    Question,
    /// A ticket failed or stalled.
    TicketFailed,
    /// A member's or tree's model budget was reached.
    Budget,
    /// Another host's gateway could not be reached or refused.
    Gateway,
}

impl NoticeKind {
    /// Every kind, as `events` names them.
    pub const ALL: [NoticeKind; 5] = [
        Self::Blocked,
        Self::Question,
        Self::TicketFailed,
        Self::Budget,
        Self::Gateway,
    ];

    /// The name `events` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Blocked => "blocked",
            Self::Question => "question",
            Self::TicketFailed => "ticketFailed",
            Self::Budget => "budget",
            Self::Gateway => "gateway",
        }
    }
}

/// Where a sink sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum SinkKind {
    /// A JSON POST to `url`, signed with the secret when one is named.
    Webhook {
        /// Where.
        url: String,
        /// The secret (a name under `secrets:`) whose value signs each body.
        secret: Option<String>,
    },
    /// A POST to an ntfy topic URL.
    Ntfy {
        /// The topic's URL.
        url: String,
    },
    /// `notify-send` on this machine's desktop.
    Desktop,
}

/// One notification sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sink {
    /// Where it sends.
    #[serde(flatten)]
    pub kind: SinkKind,
    /// What it is told of.
    pub events: Vec<NoticeKind>,
}

/// `notify:`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Notify {
    /// The dashboard's address in the links notices carry; `None`: fleetd's own listen address.
    pub dashboard_url: Option<String>,
    /// The sinks.
    pub sinks: Vec<Sink>,
}

pub(super) fn approvals(
    judge: &Judge<'_>,
    raw: Option<At<RawApprovals>>,
) -> Result<Approvals, ConfigError> {
    let Some(by) = raw.and_then(|r| r.value.by) else {
        return Ok(Approvals::default());
    };
    let by_value = match by.value.as_str() {
        "operator" => ApprovalsBy::Operator,
        "operator-and-lead" => ApprovalsBy::OperatorAndLead,
        other => {
            return Err(judge.at(
                "approvals.by",
                &by,
                format!("{other:?} is not who may approve: use operator, or operator-and-lead"),
            ));
        }
    };
    Ok(Approvals { by: by_value })
}

pub(super) fn notify(
    judge: &Judge<'_>,
    raw: Option<At<RawNotify>>,
    secrets: &std::collections::BTreeMap<String, super::SecretSource>,
) -> Result<Notify, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Notify::default());
    };
    let dashboard_url = match raw.value.dashboard_url {
        Some(u) if is_http_url(&u.value) => Some(u.value.trim_end_matches('/').to_owned()),
        Some(u) => {
            return Err(judge.at(
                "notify.dashboardUrl",
                &u,
                "needs an http:// or https:// URL (the dashboard's address as people open it)",
            ));
        }
        None => None,
    };
    let mut sinks = Vec::new();
    for (i, sink) in raw.value.sinks.unwrap_or_default().into_iter().enumerate() {
        let key = format!("notify.sinks[{i}]");
        let url = |what: &str| match &sink.value.url {
            Some(u) if is_http_url(u) => Ok(u.clone()),
            _ => Err(judge.at(
                &format!("{key}.url"),
                &sink,
                format!("a {what} sink needs `url:`, an http:// or https:// URL"),
            )),
        };
        let kind = match sink.value.kind.as_deref() {
            Some("webhook") => {
                if let Some(secret) = &sink.value.secret {
                    require_secret(judge, &format!("{key}.secret"), &sink, secret, secrets)?;
                }
                SinkKind::Webhook {
                    url: url("webhook")?,
                    secret: sink.value.secret.clone(),
                }
            }
            Some("ntfy") => SinkKind::Ntfy { url: url("ntfy")? },
            Some("desktop") => SinkKind::Desktop,
            other => {
                return Err(judge.at(
                    &format!("{key}.kind"),
                    &sink,
                    format!("{other:?} is not a sink: use webhook, ntfy or desktop"),
                ));
            }
        };
        let events = match &sink.value.events {
            None => NoticeKind::ALL.to_vec(),
            Some(names) => {
                let mut kinds = Vec::new();
                for name in names {
                    let kind = NoticeKind::ALL.into_iter().find(|k| k.name() == name);
                    let Some(kind) = kind else {
                        let all: Vec<&str> = NoticeKind::ALL.iter().map(|k| k.name()).collect();
                        return Err(judge.at(
                            &format!("{key}.events"),
                            &sink,
                            format!("{name:?} is not a notice: use {}", all.join(", ")),
                        ));
                    };
                    kinds.push(kind);
                }
                kinds
            }
        };
        sinks.push(Sink { kind, events });
    }
    Ok(Notify {
        dashboard_url,
        sinks,
    })
}

//! Stage two of configuration: judge the raw file and apply defaults, producing `Config`. Every
//! refusal names the key, its position when known, and what to write instead. Pure: reads no
//! files and no environment (the `Environment` snapshot is passed in).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use serde_saphyr::Spanned;

use super::profiles::{backends, profiles};
use super::raw::{At, RawConfig, RawSecret, StoreKind};
use super::{
    AmqpUrl, Config, ConfigError, DEFAULT_LISTEN, Delivery, Environment, Inbox, Lead, Limits, Log,
    Position, Primary, SecretSource, Store, Tickets,
};

const DEFAULT_PUSH_REMINDERS: u32 = 5;
const DEFAULT_PUSH_BACKOFF_MS: u64 = 30_000;
const DEFAULT_PUSH_BACKOFF_MAX_MS: u64 = 600_000;
const DEFAULT_MAX_MESSAGE_BYTES: u64 = 1_048_576;
/// Above this a single message would make every peek and nudge path slow; 64 MiB is generous.
const MAX_MAX_MESSAGE_BYTES: u64 = 64 * 1_048_576;
const DEFAULT_TTL_AFTER_FINISH_SECS: u64 = 600;
const DEFAULT_VERIFY_GRACE_MS: u64 = 5_000;
const DEFAULT_MAX_INJECT_BYTES: u64 = 4_096;
/// A pane line buffer copes with a few tens of KiB; beyond that injection itself misbehaves.
const MAX_MAX_INJECT_BYTES: u64 = 65_536;
/// A member works through its queue one task at a time; 64 waiting tasks is far more than a lead
/// hands out on purpose, and few enough that a runaway loop is stopped early.
const DEFAULT_MAX_QUEUED_TASKS: u64 = 64;
/// Each queued task is held in memory and in the state file (up to `inbox.maxMessageBytes`).
const MAX_MAX_QUEUED_TASKS: u64 = 10_000;
/// A member asks one question at a time and waits; 16 open ones means its lead is not answering.
const DEFAULT_MAX_OPEN_QUESTIONS: u64 = 16;
/// Each open question is listed on every `fleet_poll` page of its member.
const MAX_MAX_OPEN_QUESTIONS: u64 = 1_000;
const DEFAULT_MEMBERS_WORKSPACE: &str = "fleet";

/// Collects refusals; the first one is reported (one clear message beats a wall of them).
pub(super) struct Judge<'a> {
    origin: &'a str,
}

impl Judge<'_> {
    pub(super) fn at<T>(
        &self,
        key: &str,
        spanned: &Spanned<T>,
        message: impl Into<String>,
    ) -> ConfigError {
        let loc = spanned.referenced;
        let at = (loc.line() > 0).then(|| Position {
            line: loc.line(),
            column: loc.column(),
        });
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            key: key.to_owned(),
            at,
            message: message.into(),
        }
    }

    fn nowhere(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            key: key.to_owned(),
            at: None,
            message: message.into(),
        }
    }
}

pub(super) fn validate(
    raw: RawConfig,
    origin: &str,
    env: &Environment,
) -> Result<Config, ConfigError> {
    let judge = Judge { origin };
    let secrets = secrets(&judge, raw.secrets.unwrap_or_default())?;
    let listen = listen(&judge, raw.listen.as_ref())?;
    let api_token = match raw.api_token {
        Some(token) => {
            require_secret(&judge, "apiToken", &token, &token.value, &secrets)?;
            Some(token.value)
        }
        None if !listen.ip().is_loopback() => {
            let key = "apiToken";
            let message = format!(
                "listening on non-loopback {listen} requires an API token: set `apiToken: <secret name>` and define that secret under `secrets:`"
            );
            return Err(match &raw.listen {
                Some(l) => judge.at(key, l, message),
                None => judge.nowhere(key, message),
            });
        }
        None => None,
    };
    let state_dir = env.default_state_dir();
    let backends = backends(&judge, raw.backends.unwrap_or_default(), &secrets)?;
    let profiles = profiles(&judge, raw.profiles.unwrap_or_default(), &backends)?;
    let gateway = super::gateway::gateway(&judge, raw.gateway, env, &secrets)?;
    let approvals = super::human::approvals(&judge, raw.approvals)?;
    let notify = super::human::notify(&judge, raw.notify, &secrets)?;
    Ok(Config {
        listen,
        api_token,
        allowed_hosts: allowed_hosts(&judge, raw.allowed_hosts.unwrap_or_default())?,
        multiplexer: raw.multiplexer.unwrap_or_default(),
        herdr_socket_explicit: raw.herdr_socket.is_some(),
        herdr_socket: raw
            .herdr_socket
            .unwrap_or_else(|| env.default_herdr_socket()),
        member_herdr_socket: raw.member_herdr_socket,
        codex_home: env.codex_home(),
        tmux_socket: raw.tmux_socket,
        members_workspace: members_workspace(&judge, raw.members_workspace)?,
        primary: raw
            .primary
            .as_ref()
            .map(|p| primary(&judge, p))
            .transpose()?,
        leads: leads(&judge, raw.leads.unwrap_or_default())?,
        store: store(&judge, raw.store, &state_dir, &secrets)?,
        state_dir,
        inbox: Inbox {
            max_message_bytes: bounded(
                &judge,
                "inbox.maxMessageBytes",
                raw.inbox.and_then(|i| i.max_message_bytes),
                DEFAULT_MAX_MESSAGE_BYTES,
                MAX_MAX_MESSAGE_BYTES,
            )?,
        },
        tickets: Tickets {
            ttl_after_finish_secs: raw
                .tickets
                .and_then(|t| t.ttl_after_finish_secs)
                .unwrap_or(DEFAULT_TTL_AFTER_FINISH_SECS),
        },
        delivery: Delivery {
            verify_grace_ms: raw
                .delivery
                .as_ref()
                .and_then(|d| d.verify_grace_ms)
                .unwrap_or(DEFAULT_VERIFY_GRACE_MS),
            max_inject_bytes: bounded(
                &judge,
                "delivery.maxInjectBytes",
                raw.delivery.and_then(|d| d.max_inject_bytes),
                DEFAULT_MAX_INJECT_BYTES,
                MAX_MAX_INJECT_BYTES,
            )?,
        },
        limits: limits(&judge, raw.limits)?,
        max_delegation_depth: super::delegation::max_depth(&judge, raw.max_delegation_depth)?,
        max_members_per_lead: super::delegation::max_members(&judge, raw.max_members_per_lead)?,
        connections: super::connections::connections(&judge, raw.connections)?,
        profiles,
        backends,
        secrets,
        config_reload: raw.config_reload.unwrap_or(false),
        log: log(&judge, raw.log)?,
        gateway,
        approvals,
        notify,
    })
}

/// `allowedHosts`: host names (no scheme, port or path) this daemon answers to besides its
/// listen address and `localhost`.
fn allowed_hosts(judge: &Judge<'_>, raw: Vec<At<String>>) -> Result<Vec<String>, ConfigError> {
    raw.into_iter()
        .map(|name| {
            let text = name.value.trim().to_ascii_lowercase();
            let valid = !text.is_empty()
                && text
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if valid {
                Ok(text)
            } else {
                Err(judge.at(
                    "allowedHosts",
                    &name,
                    format!(
                        "{:?} is not a host name: write the bare name clients use to reach this daemon (e.g. `build-2.lan`), without scheme, port or path",
                        name.value
                    ),
                ))
            }
        })
        .collect()
}

fn listen(judge: &Judge<'_>, raw: Option<&At<String>>) -> Result<SocketAddr, ConfigError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_LISTEN
            .parse()
            .expect("the default listen address parses"));
    };
    raw.value.parse().map_err(|_| {
        judge.at(
            "listen",
            raw,
            format!(
                "{:?} is not an address: write host:port with an IP, e.g. 127.0.0.1:7797",
                raw.value
            ),
        )
    })
}

pub(super) fn bounded(
    judge: &Judge<'_>,
    key: &str,
    raw: Option<At<u64>>,
    default: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    match raw {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v.value) => Ok(v.value),
        Some(v) => Err(judge.at(
            key,
            &v,
            format!(
                "{} is out of range: use 1 to {max} (default {default})",
                v.value
            ),
        )),
    }
}

fn limits(judge: &Judge<'_>, raw: Option<super::raw::RawLimits>) -> Result<Limits, ConfigError> {
    let (queued, questions) =
        raw.map_or((None, None), |l| (l.max_queued_tasks, l.max_open_questions));
    Ok(Limits {
        max_queued_tasks: bounded(
            judge,
            "limits.maxQueuedTasks",
            queued,
            DEFAULT_MAX_QUEUED_TASKS,
            MAX_MAX_QUEUED_TASKS,
        )?,
        max_open_questions: bounded(
            judge,
            "limits.maxOpenQuestions",
            questions,
            DEFAULT_MAX_OPEN_QUESTIONS,
            MAX_MAX_OPEN_QUESTIONS,
        )?,
    })
}

fn members_workspace(judge: &Judge<'_>, raw: Option<At<String>>) -> Result<String, ConfigError> {
    match raw {
        None => Ok(DEFAULT_MEMBERS_WORKSPACE.to_owned()),
        Some(w) if !w.value.trim().is_empty() => Ok(w.value),
        Some(w) => Err(judge.at(
            "membersWorkspace",
            &w,
            "must not be empty: name the herdr workspace or tmux session for member panes",
        )),
    }
}

fn primary(judge: &Judge<'_>, raw: &At<super::raw::RawPrimary>) -> Result<Primary, ConfigError> {
    if raw.value.terminal.is_some() {
        return Err(judge.at(
            "primary.terminal",
            raw,
            "this key was retired: name the lead's tab instead with `tab: w1:t1` (a herdr tab id, or a tmux session:window); fleetd finds the live terminal in that tab itself",
        ));
    }
    let Some(tab) = raw.value.tab.clone() else {
        return Err(judge.at(
            "primary.tab",
            raw,
            "a `primary:` block needs `tab:` — the herdr tab (e.g. w1:t1) or tmux session:window where the primary lead runs; or remove the block",
        ));
    };
    check_tab(judge, "primary.tab", raw, &tab)?;
    let p = &raw.value;
    let push_backoff_ms = p.push_backoff_ms.unwrap_or(DEFAULT_PUSH_BACKOFF_MS);
    let push_backoff_max_ms = p
        .push_backoff_max_ms
        .unwrap_or(DEFAULT_PUSH_BACKOFF_MAX_MS.max(push_backoff_ms));
    if push_backoff_ms == 0 {
        return Err(judge.at(
            "primary.pushBackoffMs",
            raw,
            "must be at least 1 millisecond",
        ));
    }
    if push_backoff_max_ms < push_backoff_ms {
        return Err(judge.at(
            "primary.pushBackoffMaxMs",
            raw,
            format!("{push_backoff_max_ms} is below pushBackoffMs ({push_backoff_ms}): the cap must be at least the first backoff"),
        ));
    }
    Ok(Primary {
        tab,
        push_reminders: p.push_reminders.unwrap_or(DEFAULT_PUSH_REMINDERS),
        push_backoff_ms,
        push_backoff_max_ms,
    })
}

/// A tab is `w1:t1` (herdr) or `session:window` (tmux): two non-empty parts around one colon.
fn check_tab<T>(
    judge: &Judge<'_>,
    key: &str,
    at: &Spanned<T>,
    tab: &str,
) -> Result<(), ConfigError> {
    let ok = tab.split_once(':').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && !tab.chars().any(char::is_whitespace)
    });
    if ok {
        Ok(())
    } else {
        Err(judge.at(
            key,
            at,
            format!("{tab:?} is not a tab: write a herdr tab id such as w1:t1, or a tmux session:window such as main:0"),
        ))
    }
}

fn leads(judge: &Judge<'_>, raw: Vec<At<super::raw::RawLead>>) -> Result<Vec<Lead>, ConfigError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, lead) in raw.into_iter().enumerate() {
        let key = format!("leads[{i}]");
        check_tab(judge, &format!("{key}.tab"), &lead, &lead.value.tab)?;
        if lead.value.name.trim().is_empty() {
            return Err(judge.at(&format!("{key}.name"), &lead, "must not be empty"));
        }
        if !seen.insert(lead.value.tab.clone()) {
            return Err(judge.at(
                &format!("{key}.tab"),
                &lead,
                format!("tab {} is listed twice", lead.value.tab),
            ));
        }
        out.push(Lead {
            tab: lead.value.tab,
            name: lead.value.name,
        });
    }
    Ok(out)
}

fn store(
    judge: &Judge<'_>,
    raw: Option<At<super::raw::RawStore>>,
    state_dir: &std::path::Path,
    secrets: &BTreeMap<String, SecretSource>,
) -> Result<Store, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Store::Embedded {
            path: state_dir.join("inbox.db"),
        });
    };
    match raw.value.kind.unwrap_or_default() {
        StoreKind::Embedded => {
            if raw.value.url.is_some() {
                return Err(judge.at(
                    "store.url",
                    &raw,
                    "only `kind: amqp` takes a url; remove it or set `kind: amqp`",
                ));
            }
            Ok(Store::Embedded {
                path: raw.value.path.unwrap_or_else(|| state_dir.join("inbox.db")),
            })
        }
        StoreKind::Amqp => {
            if raw.value.path.is_some() {
                return Err(judge.at(
                    "store.path",
                    &raw,
                    "`kind: amqp` keeps the inbox on the broker; remove `path`",
                ));
            }
            let Some(url) = raw.value.url.clone() else {
                return Err(judge.at(
                    "store.url",
                    &raw,
                    "`kind: amqp` needs `url: amqp://user:pass@host:5672/vhost` (or the name of a secret holding it)",
                ));
            };
            if url.starts_with("amqp://") || url.starts_with("amqps://") {
                Ok(Store::Amqp {
                    url: AmqpUrl::Literal(url),
                })
            } else {
                require_secret(judge, "store.url", &raw, &url, secrets)?;
                Ok(Store::Amqp {
                    url: AmqpUrl::Secret(url),
                })
            }
        }
    }
}

fn secrets(
    judge: &Judge<'_>,
    raw: BTreeMap<String, At<RawSecret>>,
) -> Result<BTreeMap<String, SecretSource>, ConfigError> {
    raw.into_iter()
        .map(|(name, s)| {
            let key = format!("secrets.{name}");
            let source = match (&s.value.env, &s.value.file) {
                (Some(var), None) if !var.is_empty() => SecretSource::Env(var.clone()),
                (None, Some(path)) if path.is_absolute() => SecretSource::File(path.clone()),
                (None, Some(_)) => {
                    return Err(judge.at(&key, &s, "`file:` must be an absolute path"));
                }
                _ => {
                    return Err(judge.at(
                        &key,
                        &s,
                        "a secret has exactly one source: `{env: VARIABLE}` or `{file: /absolute/path}`",
                    ));
                }
            };
            Ok((name, source))
        })
        .collect()
}

/// Whether `url` is an `http://` or `https://` URL with something after the scheme: what a
/// backend's `baseUrl`, a webhook sink and the dashboard's public URL must be.
pub(super) fn is_http_url(url: &str) -> bool {
    url.strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .is_some_and(|rest| !rest.is_empty())
}

pub(super) fn require_secret<T>(
    judge: &Judge<'_>,
    key: &str,
    at: &Spanned<T>,
    name: &str,
    secrets: &BTreeMap<String, SecretSource>,
) -> Result<(), ConfigError> {
    if secrets.contains_key(name) {
        Ok(())
    } else {
        Err(judge.at(
            key,
            at,
            format!("names secret {name:?}, which is not defined: add it under `secrets:` as `{name}: {{env: VARIABLE}}` or `{{file: /path}}`"),
        ))
    }
}

fn log(judge: &Judge<'_>, raw: Option<super::raw::RawLog>) -> Result<Log, ConfigError> {
    let format = raw.as_ref().and_then(|l| l.format).unwrap_or_default();
    let level = match raw.and_then(|l| l.level) {
        None => "info".to_owned(),
        Some(level) => {
            if tracing_subscriber::EnvFilter::try_new(&level.value).is_err() {
                return Err(judge.at(
                    "log.level",
                    &level,
                    format!("{:?} is not a log filter: use error, warn, info, debug, trace, or directives like `fleetd=debug,info`", level.value),
                ));
            }
            level.value
        }
    };
    Ok(Log { format, level })
}

//! Stage two for `backends:` and `profiles:`: each backend's URL and the secrets it names, each
//! profile's agent, command, environment and backend, judged with the rest of the file by
//! `validate`.

use std::collections::BTreeMap;

use super::raw::{At, RawBackend, RawProfile};
use super::validate::{Judge, is_http_url, require_secret};
use super::{Backend, ConfigError, Profile, SecretSource};

const DEFAULT_HEALTH_INTERVAL_SECS: u64 = 30;

/// Whether `agent` is a kind a profile may name: one herdr knows, or `custom` for anything else.
pub fn is_known_agent(agent: &str) -> bool {
    agent == "custom" || crate::mux::herdr::KNOWN_AGENT_KINDS.contains(&agent)
}

fn agent_kinds() -> String {
    let mut kinds = crate::mux::herdr::KNOWN_AGENT_KINDS.to_vec();
    kinds.push("custom");
    kinds.join(", ")
}

pub(super) fn backends(
    judge: &Judge<'_>,
    raw: BTreeMap<String, At<RawBackend>>,
    secrets: &BTreeMap<String, SecretSource>,
) -> Result<BTreeMap<String, Backend>, ConfigError> {
    raw.into_iter()
        .map(|(name, b)| {
            let key = format!("backends.{name}");
            let Some(base_url) = b.value.base_url.clone().filter(|u| is_http_url(u)) else {
                return Err(judge.at(
                    &format!("{key}.baseUrl"),
                    &b,
                    "needs an http:// or https:// URL",
                ));
            };
            if let Some(secret) = &b.value.auth_token_secret {
                require_secret(
                    judge,
                    &format!("{key}.authTokenSecret"),
                    &b,
                    secret,
                    secrets,
                )?;
            }
            if let Some(health) = &b.value.health_url {
                let plain = health
                    .strip_prefix("http://")
                    .is_some_and(|rest| !rest.is_empty());
                if !plain {
                    let why = if health.starts_with("https://") {
                        "needs a plain http:// URL: fleetd's health prober has no TLS client. Point it at a plain-http health port (or a local proxy), or leave healthUrl out (no incidents for this backend)"
                    } else {
                        "needs an http:// URL"
                    };
                    return Err(judge.at(&format!("{key}.healthUrl"), &b, why));
                }
            }
            let interval = b
                .value
                .health_interval_secs
                .unwrap_or(DEFAULT_HEALTH_INTERVAL_SECS);
            if interval == 0 {
                return Err(judge.at(
                    &format!("{key}.healthIntervalSecs"),
                    &b,
                    "must be at least 1",
                ));
            }
            Ok((
                name,
                Backend {
                    base_url,
                    auth_token_secret: b.value.auth_token_secret.clone(),
                    health_url: b.value.health_url,
                    health_interval_secs: interval,
                    through_fleetd: b.value.through_fleetd.unwrap_or(true),
                    prices: super::models::prices(judge, &key, b.value.prices.as_ref())?,
                },
            ))
        })
        .collect()
}

pub(super) fn profiles(
    judge: &Judge<'_>,
    raw: BTreeMap<String, At<RawProfile>>,
    backends: &BTreeMap<String, Backend>,
) -> Result<BTreeMap<String, Profile>, ConfigError> {
    raw.into_iter()
        .map(|(name, p)| {
            let key = format!("profiles.{name}");
            if fleetd_core::Target::new(name.as_str()).is_err() {
                return Err(judge.at(&key, &p, "a profile name is lowercase letters, digits, '_' or '-', starting with a letter"));
            }
            let Some(agent) = p.value.agent.clone() else {
                return Err(judge.at(&format!("{key}.agent"), &p, format!("is required: one of {}", agent_kinds())));
            };
            if !is_known_agent(&agent) {
                return Err(judge.at(
                    &format!("{key}.agent"),
                    &p,
                    format!("{agent:?} is not a known agent kind: use one of {} (custom needs `command:`)", agent_kinds()),
                ));
            }
            if agent == "custom" && p.value.command.is_none() {
                return Err(judge.at(&format!("{key}.command"), &p, "`agent: custom` needs `command:` — the program to start in the member's pane"));
            }
            if let Some(backend) = &p.value.backend
                && !backends.contains_key(backend)
            {
                return Err(judge.at(
                    &format!("{key}.backend"),
                    &p,
                    format!("names backend {backend:?}, which is not defined under `backends:`"),
                ));
            }
            if p.value.idle_timeout_secs == Some(0) {
                return Err(judge.at(&format!("{key}.idleTimeoutSecs"), &p, "must be at least 1 (omit it to never reap)"));
            }
            if let Some(bad) = p.value.env.iter().flatten().map(|(k, _)| k).find(|k| !is_env_name(k)) {
                return Err(judge.at(
                    &format!("{key}.env"),
                    &p,
                    format!("{bad:?} is not an environment variable name: use letters, digits and '_', not starting with a digit"),
                ));
            }
            let budget = super::models::budget(judge, &format!("{key}.budget"), p.value.budget.as_ref())?;
            let tree_budget = super::models::budget(judge, &format!("{key}.treeBudget"), p.value.tree_budget.as_ref())?;
            let run_as = super::sandbox::run_as(judge, &key, &p)?;
            let raw = p.value;
            Ok((
                name,
                Profile {
                    agent,
                    command: raw.command,
                    args: raw.args.unwrap_or_default(),
                    model: raw.model,
                    backend: raw.backend,
                    cwd: raw.cwd,
                    idle_timeout_secs: raw.idle_timeout_secs,
                    allow_delegation: raw.allow_delegation.unwrap_or(false),
                    env: raw.env.unwrap_or_default(),
                    worktree: super::delegation::worktree(judge, &key, raw.worktree)?,
                    budget,
                    tree_budget,
                    sandbox: super::sandbox::sandbox(judge, &key, raw.sandbox)?,
                    run_as,
                },
            ))
        })
        .collect()
}

/// Whether `name` can be an environment variable a shell can set (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

//! `profiles.<name>.sandbox`: the box a member of the profile runs in (SPEC §19): extra paths
//! it may read or write, whether it has a network beyond fleetd, and the template of its home.
//! Paths are absolute; what they may not expose is judged at spawn, where the state directory
//! and the member's worktree are known (`crate::sandbox`). And `profiles.<name>.runAs`, the
//! other way to keep a member apart: a second user it runs as (`crate::sandbox::user`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::raw::{At, RawProfile};
use super::validate::Judge;

/// `sandbox:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSandbox {
    pub(crate) read_only: Option<Vec<At<PathBuf>>>,
    pub(crate) writable: Option<Vec<At<PathBuf>>>,
    pub(crate) network: Option<bool>,
    pub(crate) home_from: Option<At<PathBuf>>,
}

/// A profile's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Paths the member may read (beyond the system's directories, its worktree and its home).
    pub read_only: Vec<PathBuf>,
    /// Paths the member may read and write.
    pub writable: Vec<PathBuf>,
    /// Whether the member has the host's network. `false`: a network of its own, with only
    /// fleetd in it (its MCP endpoint and model gateway, at the address it is given).
    pub network: bool,
    /// A directory copied into each member's private home when it is made (its agent's
    /// settings, say); `None`: the home starts empty.
    pub home_from: Option<PathBuf>,
}

/// Stage two of `<profile>.sandbox`.
pub(super) fn sandbox(
    judge: &Judge<'_>,
    profile: &str,
    raw: Option<At<RawSandbox>>,
) -> Result<Option<Sandbox>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let key = format!("{profile}.sandbox");
    let absolute = |field: &str, paths: Option<Vec<At<PathBuf>>>| {
        paths
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                if p.value.is_absolute() {
                    Ok(p.value)
                } else {
                    Err(judge.at(
                        &format!("{key}.{field}"),
                        &p,
                        format!(
                            "{} is not an absolute path: a sandbox binds paths as they are named, so write it from /",
                            p.value.display()
                        ),
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let read_only = absolute("readOnly", raw.value.read_only)?;
    let writable = absolute("writable", raw.value.writable)?;
    let home_from = absolute("homeFrom", raw.value.home_from.map(|p| vec![p]))?
        .into_iter()
        .next();
    Ok(Some(Sandbox {
        read_only,
        writable,
        network: raw.value.network.unwrap_or(true),
        home_from,
    }))
}

/// Stage two of `<profile>.runAs`: a user name, on a profile that neither boxes its members
/// nor gives them worktrees (whether the user exists, and fleetd may become it, is found at
/// spawn: a reload must not fail because a user is not there yet).
pub(super) fn run_as(
    judge: &Judge<'_>,
    profile: &str,
    raw: &At<RawProfile>,
) -> Result<Option<String>, ConfigError> {
    let Some(user) = raw.value.run_as.clone() else {
        return Ok(None);
    };
    let key = format!("{profile}.runAs");
    let named = user
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && user
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && user.len() <= 32;
    if !named {
        return Err(judge.at(
            &key,
            raw,
            format!("{user:?} is not a user name: name the user its members run as (lowercase letters, digits, '_' or '-', as useradd makes them)"),
        ));
    }
    if raw.value.sandbox.is_some() {
        return Err(judge.at(
            &key,
            raw,
            "cannot be combined with `sandbox:` yet: choose one (docs/SECURITY.md says which keeps a member from what)",
        ));
    }
    if raw.value.worktree.is_some() {
        return Err(judge.at(
            &key,
            raw,
            "cannot be combined with `worktree:`: a member running as another user cannot commit into your repository (its .git is yours, and git refuses a repository another user owns); give it a `cwd` that user owns, such as its own clone",
        ));
    }
    Ok(Some(user))
}

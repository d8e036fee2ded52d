//! The delegation keys judged (stage two of configuration): how deep and wide delegation trees
//! may grow, and a profile's `worktree:`. Pure; every refusal names its key.

use super::raw::{At, RawWorktree};
use super::validate::{Judge, bounded};
use super::{ConfigError, Worktree};

/// SPEC §7: a lead, its members, and theirs.
const DEFAULT_MAX_DEPTH: u64 = 2;
const MAX_MAX_DEPTH: u64 = 8;
const DEFAULT_MAX_MEMBERS: u64 = 16;
const MAX_MAX_MEMBERS: u64 = 1_024;
const DEFAULT_BRANCH_PREFIX: &str = "fleet/";

pub(super) fn max_depth(judge: &Judge<'_>, raw: Option<At<u64>>) -> Result<u64, ConfigError> {
    bounded(
        judge,
        "maxDelegationDepth",
        raw,
        DEFAULT_MAX_DEPTH,
        MAX_MAX_DEPTH,
    )
}

pub(super) fn max_members(judge: &Judge<'_>, raw: Option<At<u64>>) -> Result<u64, ConfigError> {
    bounded(
        judge,
        "maxMembersPerLead",
        raw,
        DEFAULT_MAX_MEMBERS,
        MAX_MAX_MEMBERS,
    )
}

/// `profiles.<name>.worktree`: a branch prefix git takes as the start of a branch name, and a
/// base that cannot be read as an option.
pub(super) fn worktree(
    judge: &Judge<'_>,
    profile: &str,
    raw: Option<At<RawWorktree>>,
) -> Result<Option<Worktree>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let key = format!("{profile}.worktree");
    let branch_prefix = match &raw.value.branch_prefix {
        None => DEFAULT_BRANCH_PREFIX.to_owned(),
        Some(p) if is_branch_prefix(&p.value) => p.value.clone(),
        Some(p) => {
            return Err(judge.at(
                &format!("{key}.branchPrefix"),
                p,
                format!(
                    "{:?} cannot start a git branch name: use letters, digits, '.', '_', '-' and '/' (not first, no '..', no '//'), e.g. \"fleet/\"",
                    p.value
                ),
            ));
        }
    };
    let base = match &raw.value.base {
        None => None,
        Some(b) if is_revision(&b.value) => Some(b.value.clone()),
        Some(b) => {
            return Err(judge.at(
                &format!("{key}.base"),
                b,
                format!(
                    "{:?} is not a branch, tag or commit: no spaces or control characters, not starting with '-' (omit it for the repository's HEAD)",
                    b.value
                ),
            ));
        }
    };
    if raw.value.repo.as_ref().is_some_and(|r| !r.is_absolute()) {
        return Err(judge.at(
            &format!("{key}.repo"),
            &raw,
            "must be an absolute path to a git repository (omit it to branch from the lead pane's repository)",
        ));
    }
    Ok(Some(Worktree {
        repo: raw.value.repo,
        branch_prefix,
        base,
    }))
}

/// What git accepts at the start of a branch name (`git check-ref-format`, kept simple).
fn is_branch_prefix(p: &str) -> bool {
    !p.starts_with(['/', '-', '.'])
        && !p.contains("..")
        && !p.contains("//")
        && !p.contains("/.")
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
}

fn is_revision(r: &str) -> bool {
    !r.is_empty() && !r.starts_with('-') && !r.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_prefixes_and_bases_git_would_take() {
        for ok in ["fleet/", "agents/", "x-", "team.a/"] {
            assert!(is_branch_prefix(ok), "{ok}");
        }
        for bad in ["/x", "-x", "a..b", "a//b", "a/.b", "sp ace", "a~b", "a:b"] {
            assert!(!is_branch_prefix(bad), "{bad}");
        }
        assert!(is_revision("main") && is_revision("v1.2") && is_revision("abc123"));
        assert!(!is_revision("") && !is_revision("--all") && !is_revision("a b"));
    }
}

//! Git worktrees for members (SPEC §7): a member whose profile has `worktree:` starts in a
//! worktree of its own, on a new branch, so parallel members never edit one checkout. This is
//! the one module that runs `git`, and it runs the user's own `git` as a process (their hooks,
//! config and credentials), never a reimplementation. Every call is bounded in time; a failure
//! comes back as a sentence saying what git refused and what to do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Longest a git command may take (a `post-checkout` hook on a large tree included).
const GIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How many `-2`, `-3`, ... suffixes are tried for a branch or path that is taken.
const MAX_SUFFIX: u32 = 100;

/// A member's worktree, as it was made (kept with the member, so a restart still knows it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeInfo {
    /// The repository's top-level directory (the main checkout the worktree belongs to).
    pub repo: PathBuf,
    /// The worktree's directory: where the member works.
    pub path: PathBuf,
    /// The member's branch.
    pub branch: String,
    /// The commit the branch started from.
    pub base: String,
    /// What that commit was named when the branch was made (`main`, a tag, or the commit).
    pub base_name: String,
}

/// What a worktree holds compared with where it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeState {
    /// Paths with uncommitted changes, untracked files included (`git status --porcelain`).
    pub uncommitted: u64,
    /// Commits on the branch that are not on its base.
    pub ahead: u64,
}

impl WorktreeState {
    /// Nothing uncommitted and nothing new: removing it loses nothing.
    pub fn is_clean(&self) -> bool {
        self.uncommitted == 0 && self.ahead == 0
    }

    /// "2 uncommitted changes and 3 commits ahead of main", for notices.
    pub fn describe(&self, base_name: &str) -> String {
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        match (self.uncommitted, self.ahead) {
            (0, 0) => format!("nothing new since {base_name}"),
            (u, 0) => plural(u, "uncommitted change", "uncommitted changes"),
            (0, a) => format!("{} ahead of {base_name}", plural(a, "commit", "commits")),
            (u, a) => format!(
                "{} and {} ahead of {base_name}",
                plural(u, "uncommitted change", "uncommitted changes"),
                plural(a, "commit", "commits")
            ),
        }
    }
}

/// What a spawn asks for.
#[derive(Debug, Clone)]
pub struct WorktreeRequest<'a> {
    /// A directory inside the repository to branch from.
    pub from: &'a Path,
    /// The branch name is this followed by the member's name.
    pub branch_prefix: &'a str,
    /// The member's name.
    pub name: &'a str,
    /// What to start from (`None`: the repository's `HEAD`).
    pub base: Option<&'a str>,
    /// Where worktrees go: `<root>/<repository>-<hash>/<name>`.
    pub root: &'a Path,
}

/// Makes the member's worktree: [`plan`], then [`make`]. On failure nothing is left behind.
pub async fn create(request: &WorktreeRequest<'_>) -> Result<WorktreeInfo, String> {
    let info = plan(request).await?;
    make(&info).await?;
    Ok(info)
}

/// Decides the member's worktree without making anything: the repository, the commit to start
/// from, a free branch `<branchPrefix><name>` and a free directory (a name already taken gets a
/// `-2`, `-3`, ... suffix). The spawn records the plan durably before [`make`] runs it, so a
/// kill in between leaves a record the next start settles.
pub async fn plan(request: &WorktreeRequest<'_>) -> Result<WorktreeInfo, String> {
    let from = request.from;
    let repo = main_checkout(from).await.map_err(|e| {
        format!(
            "{} is not in a git repository ({e}): give the profile's worktree.repo, or spawn from a lead whose pane is in one",
            from.display()
        )
    })?;
    let wanted = request.base.unwrap_or("HEAD");
    // `HEAD` is `from`'s: in a delegating member's worktree, where that member has got to.
    let base = git(
        from,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{wanted}^{{commit}}"),
        ],
    )
    .await
    .map_err(|_| match request.base {
        Some(b) => format!(
            "the worktree base {b:?} is no branch, tag or commit of {} (profiles.*.worktree.base)",
            repo.display()
        ),
        None => format!(
            "{} has no commit yet to branch from: commit something first",
            repo.display()
        ),
    })?;
    let base_name = match request.base {
        Some(b) => b.to_owned(),
        None => match git(from, &["symbolic-ref", "--quiet", "--short", "HEAD"]).await {
            Ok(branch) => branch,
            Err(_) => base.chars().take(12).collect(),
        },
    };
    let branch = free_branch(&repo, &format!("{}{}", request.branch_prefix, request.name)).await?;
    let path = free_dir(&request.root.join(repo_dir_name(&repo)), request.name)?;
    Ok(WorktreeInfo {
        repo,
        path,
        branch,
        base,
        base_name,
    })
}

/// Runs a [`plan`]: `git worktree add` of a new branch at the planned directory. When git fails
/// it can leave part of its work behind — the `-b` branch is made before the checkout and not
/// deleted when the checkout fails, and a failing `post-checkout` hook leaves worktree and
/// branch both — so a failure takes back the worktree git registered at that directory on that
/// branch and the branch (both free just before), and nothing that was there already.
pub async fn make(info: &WorktreeInfo) -> Result<(), String> {
    let (repo, branch) = (&info.repo, info.branch.as_str());
    // Taken since the plan (by a concurrent spawn, or by hand): refused before git makes
    // anything, so whatever holds the name is never taken back as ours below.
    if exists(&info.path).await {
        return Err(format!(
            "{} appeared since the spawn chose it: retry the spawn",
            info.path.display()
        ));
    }
    if branch_exists(repo, branch).await {
        return Err(format!(
            "branch {branch} appeared since the spawn chose it: retry the spawn"
        ));
    }
    if let Some(parent) = info.path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    let path_arg = info.path.to_string_lossy().into_owned();
    let Err(e) = git(
        repo,
        &[
            "worktree", "add", "--quiet", "-b", branch, &path_arg, &info.base,
        ],
    )
    .await
    else {
        return Ok(());
    };
    abandon(info).await;
    Err(format!("git worktree add failed: {e}"))
}

/// What a failed (or abandoned: its spawn cancelled while it ran) `git worktree add` of `info`
/// left: its worktree (only one git registered at that directory on that branch), then its
/// branch, then an empty parent directory of ours.
pub async fn abandon(info: &WorktreeInfo) {
    let (repo, branch) = (&info.repo, info.branch.as_str());
    let path_arg = info.path.to_string_lossy().into_owned();
    if exists(&info.path).await
        && registered_on(repo, &info.path, branch).await
        && let Err(e) = git(repo, &["worktree", "remove", "--force", &path_arg]).await
    {
        tracing::warn!(path = %info.path.display(), error = %e, "cannot remove what a failed git worktree add left");
    }
    let _ = git(repo, &["worktree", "prune"]).await;
    if branch_exists(repo, branch).await
        && let Err(e) = git(repo, &["branch", "-D", branch]).await
    {
        tracing::warn!(%branch, error = %e, "cannot delete the branch a failed git worktree add left");
    }
    // Only an empty directory of ours goes (`remove_dir` leaves anything else).
    if let Some(parent) = info.path.parent() {
        let _ = tokio::fs::remove_dir(parent).await;
    }
}

/// Whether `path` exists, asked off the runtime's threads.
async fn exists(path: &Path) -> bool {
    tokio::fs::try_exists(path).await.unwrap_or(false)
}

/// The repository `dir` is in, as its main checkout: the directory holding the common git
/// directory (`git rev-parse --git-common-dir`), or that directory itself for a bare
/// repository. Not `--show-toplevel`: inside a linked worktree (a delegating member's) that
/// names the linked worktree, which may be removed long before the worktrees made from it.
async fn main_checkout(dir: &Path) -> Result<PathBuf, String> {
    let common = PathBuf::from(
        git(
            dir,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .await?,
    );
    Ok(match common.parent() {
        Some(parent) if common.file_name().is_some_and(|n| n == ".git") => parent.to_path_buf(),
        _ => common,
    })
}

/// Where to run git for `info`'s repository: its `repo`, or — when that is gone (a record made
/// before the main checkout was resolved, which named a delegating member's removed worktree)
/// — the main checkout its own directory belongs to.
async fn admin_dir(info: &WorktreeInfo) -> PathBuf {
    if exists(&info.repo).await {
        return info.repo.clone();
    }
    match main_checkout(&info.path).await {
        Ok(repo) => repo,
        Err(_) => info.repo.clone(),
    }
}

/// Whether `repo` has a worktree at `path` with `branch` checked out.
async fn registered_on(repo: &Path, path: &Path, branch: &str) -> bool {
    let Ok(list) = git(repo, &["worktree", "list", "--porcelain"]).await else {
        return false;
    };
    // Compared as real paths: git may list the directory through another spelling of it
    // (resolved off the runtime's threads).
    let path = path.to_path_buf();
    let want_branch = format!("branch refs/heads/{branch}");
    tokio::task::spawn_blocking(move || {
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let want_path = real(&path);
        list.split("\n\n").any(|entry| {
            let mut lines = entry.lines();
            lines
                .next()
                .and_then(|l| l.strip_prefix("worktree "))
                .is_some_and(|p| real(Path::new(p)) == want_path)
                && lines.any(|l| l == want_branch)
        })
    })
    .await
    .unwrap_or(false)
}

/// Whether `repo` has a branch `name`.
async fn branch_exists(repo: &Path, name: &str) -> bool {
    git(
        repo,
        &[
            "show-ref",
            "--verify",
            "--quiet",
            &format!("refs/heads/{name}"),
        ],
    )
    .await
    .is_ok()
}

/// Reads what the worktree holds: uncommitted paths and commits past its base, on its HEAD or
/// on the member's branch (a member that committed on its branch and then checked out its base
/// still holds those commits).
pub async fn inspect(info: &WorktreeInfo) -> Result<WorktreeState, String> {
    let branch = branch_tip(&info.path, &info.branch).await;
    inspect_at(info, branch.as_deref()).await
}

/// [`inspect`], with the branch's commit as read beforehand (`None`: it has no branch).
async fn inspect_at(info: &WorktreeInfo, branch: Option<&str>) -> Result<WorktreeState, String> {
    let status = git(
        &info.path,
        &["status", "--porcelain=v1", "--untracked-files=normal"],
    )
    .await?;
    let mut range = vec!["rev-list", "--count", "HEAD"];
    range.extend(branch);
    range.extend(["--not", info.base.as_str()]);
    let ahead = git(&info.path, &range).await?;
    Ok(WorktreeState {
        uncommitted: u64::try_from(status.lines().filter(|l| !l.trim().is_empty()).count())
            .unwrap_or(u64::MAX),
        ahead: ahead.trim().parse().unwrap_or(0),
    })
}

/// What became of a released member's worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Clean with nothing new: removed with its branch.
    Removed,
    /// It holds work: kept, as it is.
    Kept(WorktreeState),
    /// Its directory is gone already (removed by hand): its branch is left as it is.
    Missing,
    /// Clean with nothing new when read, so its directory was removed; but its branch moved
    /// before it could be deleted (a commit landed meanwhile): the branch is kept.
    BranchMoved,
}

/// A released member's worktree: removed with its branch when it holds nothing new, else kept.
/// Never removes uncommitted work (`git worktree remove` without `--force` refuses it too).
pub async fn settle(info: &WorktreeInfo) -> Result<Settled, String> {
    let repo = admin_dir(info).await;
    if !exists(&info.path).await {
        let _ = git(&repo, &["worktree", "prune"]).await;
        return Ok(Settled::Missing);
    }
    // The branch's commit first, then what the tree holds against it: whatever lands on the
    // branch after this reading makes the delete below refuse.
    let tip = branch_tip(&repo, &info.branch).await;
    let state = inspect_at(info, tip.as_deref()).await?;
    if !state.is_clean() {
        return Ok(Settled::Kept(state));
    }
    let path = info.path.to_string_lossy().into_owned();
    git(&repo, &["worktree", "remove", &path])
        .await
        .map_err(|e| format!("git worktree remove failed: {e}"))?;
    match tip {
        Some(tip) => delete_branch(&repo, &info.branch, &tip).await,
        None => Ok(Settled::Removed),
    }
}

/// The commit branch `name` points at, if it exists.
async fn branch_tip(repo: &Path, name: &str) -> Option<String> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{name}^{{commit}}"),
        ],
    )
    .await
    .ok()
    .map(|out| out.trim().to_owned())
}

/// Deletes branch `name` only if it still points at `tip`, the commit read when it was judged
/// to hold nothing new (`git update-ref -d` compares and deletes in one step).
async fn delete_branch(repo: &Path, name: &str, tip: &str) -> Result<Settled, String> {
    let reference = format!("refs/heads/{name}");
    match git(repo, &["update-ref", "-d", &reference, tip]).await {
        Ok(_) => Ok(Settled::Removed),
        Err(e) if branch_tip(repo, name).await.is_some_and(|now| now != tip) => {
            tracing::warn!(branch = name, error = %e, "a branch moved while its worktree was settled; kept");
            Ok(Settled::BranchMoved)
        }
        Err(e) => Err(format!("git update-ref -d failed: {e}")),
    }
}

/// A worktree a spawn cut short by a restart planned and no member claims: settled as a
/// released member's, except that when its directory never came to be, a branch git made for
/// it that holds nothing past its base goes too (git makes the `-b` branch first).
pub async fn reclaim(info: &WorktreeInfo) -> Result<Settled, String> {
    let settled = settle(info).await?;
    if settled != Settled::Missing {
        return Ok(settled);
    }
    let repo = admin_dir(info).await;
    let Some(tip) = branch_tip(&repo, &info.branch).await else {
        return Ok(Settled::Removed);
    };
    let range = format!("{}..{tip}", info.base);
    let ahead = git(&repo, &["rev-list", "--count", &range]).await?;
    if ahead.trim() != "0" {
        return Ok(Settled::Missing);
    }
    delete_branch(&repo, &info.branch, &tip).await
}

/// Takes back a worktree a failed spawn made: directory and branch, whatever they hold (nothing
/// but the checkout: the member never ran in it).
pub async fn discard(info: &WorktreeInfo) {
    let repo = admin_dir(info).await;
    let path = info.path.to_string_lossy().into_owned();
    if let Err(e) = git(&repo, &["worktree", "remove", "--force", &path]).await {
        tracing::warn!(path = %info.path.display(), error = %e, "cannot remove a failed spawn's worktree");
    }
    if let Err(e) = git(&repo, &["branch", "-D", &info.branch]).await {
        tracing::warn!(branch = %info.branch, error = %e, "cannot delete a failed spawn's branch");
    }
}

/// `base`, or `base-2`, `base-3`, ...: the first name no branch of `repo` has.
async fn free_branch(repo: &Path, base: &str) -> Result<String, String> {
    git(repo, &["check-ref-format", "--branch", base])
        .await
        .map_err(|_| {
            format!(
                "{base:?} is not a valid branch name: change the profile's worktree.branchPrefix"
            )
        })?;
    for n in 1..=MAX_SUFFIX {
        let name = if n == 1 {
            base.to_owned()
        } else {
            format!("{base}-{n}")
        };
        if !branch_exists(repo, &name).await {
            return Ok(name);
        }
    }
    Err(format!(
        "branches {base} to {base}-{MAX_SUFFIX} all exist: delete the old ones (git branch -D)"
    ))
}

/// `dir/name`, or `dir/name-2`, ...: the first that does not exist.
fn free_dir(dir: &Path, name: &str) -> Result<PathBuf, String> {
    (1..=MAX_SUFFIX)
        .map(|n| {
            if n == 1 {
                dir.join(name)
            } else {
                dir.join(format!("{name}-{n}"))
            }
        })
        .find(|p| !p.exists())
        .ok_or_else(|| {
            format!(
                "{} holds {name} to {name}-{MAX_SUFFIX} already",
                dir.display()
            )
        })
}

/// `<repository's directory name>-<8 hex digits of its path>`: two repositories with one name
/// keep their worktrees apart.
fn repo_dir_name(repo: &Path) -> String {
    let name = repo
        .file_name()
        .map_or_else(|| "repo".to_owned(), |n| n.to_string_lossy().into_owned());
    // FNV-1a: stable across runs and builds (std's hasher is not).
    let hash = repo
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{name}-{:08x}", hash & 0xffff_ffff)
}

/// Runs `git -C dir args...`; its trimmed stdout, or what it said on stderr.
async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut command = tokio::process::Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(GIT_TIMEOUT, command.output())
        .await
        .map_err(|_| {
            format!(
                "git {} took longer than {}s",
                args.join(" "),
                GIT_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("cannot run git: {e} (is git installed and on PATH?)"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        let said = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        Err(if said.is_empty() {
            format!(
                "git {} exited with {}",
                args.first().unwrap_or(&""),
                output.status
            )
        } else {
            said
        })
    }
}

/// Test repositories for other modules' tests (this module is the one that runs git).
#[cfg(test)]
pub(crate) use tests::{
    branches_and_worktrees as test_branches, repo as test_repo, request as test_request,
    run as test_git,
};

#[cfg(test)]
mod tests;

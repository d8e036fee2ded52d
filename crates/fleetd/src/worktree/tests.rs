//! Tests of worktree planning, inspection and settling against real git repositories, and the
//! test repositories other modules' tests borrow.

use super::*;

pub(crate) fn run(dir: &Path, args: &[&str]) {
    let status = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .expect("git");
    assert!(
        status.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A repository on `main` with one commit.
pub(crate) fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tmp");
    run(dir.path(), &["init", "--quiet", "-b", "main"]);
    std::fs::write(dir.path().join("README"), "hello\n").expect("write");
    run(dir.path(), &["add", "README"]);
    run(dir.path(), &["commit", "--quiet", "-m", "first"]);
    dir
}

/// A request for member `name`'s worktree of the repository `from` is in, under `root`, on a
/// `fleet/` branch from the repository's `HEAD`.
pub(crate) fn request<'a>(from: &'a Path, name: &'a str, root: &'a Path) -> WorktreeRequest<'a> {
    WorktreeRequest {
        from,
        branch_prefix: "fleet/",
        name,
        base: None,
        root,
    }
}

#[tokio::test]
async fn a_worktree_is_made_read_and_removed_only_when_it_holds_nothing() {
    let repo = repo();
    let root = tempfile::tempdir().expect("tmp");
    let request = request(repo.path(), "ann", root.path());
    let first = create(&request).await.expect("worktree");
    assert_eq!(first.branch, "fleet/ann");
    assert_eq!(first.base_name, "main");
    assert!(first.path.join("README").exists());
    // The same name again: a free branch and directory.
    let second = create(&request).await.expect("second worktree");
    assert_eq!(second.branch, "fleet/ann-2");
    assert_ne!(first.path, second.path);

    // One commit on the first: kept; the second untouched: removed with its branch.
    std::fs::write(first.path.join("README"), "changed\n").expect("write");
    run(&first.path, &["commit", "--quiet", "-am", "work"]);
    std::fs::write(first.path.join("new.txt"), "x").expect("write");
    let state = inspect(&first).await.expect("inspect");
    assert_eq!(
        state,
        WorktreeState {
            uncommitted: 1,
            ahead: 1
        }
    );
    assert_eq!(
        state.describe("main"),
        "1 uncommitted change and 1 commit ahead of main"
    );
    assert_eq!(settle(&first).await.expect("settle"), Settled::Kept(state));
    assert!(first.path.exists());
    assert_eq!(settle(&second).await.expect("settle"), Settled::Removed);
    assert!(!second.path.exists());
    assert!(!branch_exists(repo.path(), "fleet/ann-2").await);
    assert!(branch_exists(repo.path(), "fleet/ann").await);
}

#[tokio::test]
async fn commits_on_the_branch_are_kept_when_head_moved_back_and_a_moved_branch_is_never_deleted() {
    let repo = repo();
    let root = tempfile::tempdir().expect("tmp");
    let request = request(repo.path(), "ann", root.path());
    // Attack W5: a commit on fleet/ann, then the base checked out detached — HEAD holds
    // nothing new, the branch does.
    let info = create(&request).await.expect("worktree");
    std::fs::write(
        info.path.join("README"),
        "work
",
    )
    .expect("write");
    run(&info.path, &["commit", "--quiet", "-am", "work"]);
    run(&info.path, &["checkout", "--quiet", "--detach", "main"]);
    let kept = WorktreeState {
        uncommitted: 0,
        ahead: 1,
    };
    assert_eq!(inspect(&info).await.expect("inspect"), kept);
    assert_eq!(settle(&info).await.expect("settle"), Settled::Kept(kept));
    assert!(info.path.exists());
    assert!(
        branch_exists(repo.path(), "fleet/ann").await,
        "the commit is kept"
    );

    // Review M3: the branch moves after it was judged (its tip read): the delete refuses.
    let other = create(&WorktreeRequest {
        name: "bo",
        ..request
    })
    .await
    .expect("worktree");
    let judged = branch_tip(repo.path(), &other.branch).await.expect("tip");
    std::fs::write(other.path.join("late.txt"), "late\n").expect("write");
    run(&other.path, &["add", "late.txt"]);
    run(&other.path, &["commit", "--quiet", "-m", "late"]);
    assert_eq!(
        delete_branch(repo.path(), &other.branch, &judged)
            .await
            .expect("compare"),
        Settled::BranchMoved
    );
    assert!(
        branch_exists(repo.path(), "fleet/bo").await,
        "the late commit is kept"
    );
    let now = branch_tip(repo.path(), &other.branch).await.expect("tip");
    assert_eq!(
        delete_branch(repo.path(), &other.branch, &now)
            .await
            .expect("delete"),
        Settled::Removed
    );
    assert!(!branch_exists(repo.path(), "fleet/bo").await);
}

#[tokio::test]
async fn outside_a_repository_or_from_a_missing_base_it_says_so_and_leaves_nothing() {
    let plain = tempfile::tempdir().expect("tmp");
    let root = tempfile::tempdir().expect("tmp");
    let mut request = request(plain.path(), "bo", root.path());
    let e = create(&request).await.expect_err("no repository");
    assert!(e.contains("is not in a git repository"), "{e}");
    let repo = repo();
    request.from = repo.path();
    request.base = Some("no-such-branch");
    let e = create(&request).await.expect_err("no base");
    assert!(e.contains("\"no-such-branch\" is no branch"), "{e}");
    assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0);
}

/// The branches of `repo` (one a line), and how many worktrees it has.
pub(crate) fn branches_and_worktrees(repo: &Path) -> (String, usize) {
    let out = |args: &[&str]| {
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(args)
            .output()
            .expect("git");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let worktrees = out(&["worktree", "list", "--porcelain"])
        .lines()
        .filter(|l| l.starts_with("worktree "))
        .count();
    (out(&["branch", "--format=%(refname:short)"]), worktrees)
}

#[tokio::test]
async fn a_checkout_that_fails_takes_back_the_worktree_and_the_branch_git_left() {
    let repo = repo();
    // git makes the branch and the worktree, then runs the hook, and keeps both when it
    // fails.
    let hook = repo.path().join(".git/hooks/post-checkout");
    std::fs::write(&hook, "#!/bin/sh\necho refused by the hook >&2\nexit 1\n").expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let root = tempfile::tempdir().expect("tmp");
    let request = request(repo.path(), "hook", root.path());
    let e = create(&request).await.expect_err("the hook fails");
    assert!(e.contains("git worktree add failed"), "{e}");
    assert!(e.contains("refused by the hook"), "git's own words: {e}");
    assert_eq!(
        branches_and_worktrees(repo.path()),
        ("main\n".to_owned(), 1),
        "no branch and no worktree left"
    );
    assert_eq!(std::fs::read_dir(root.path()).expect("root").count(), 0);

    // A directory that appeared under the planned name is refused, and left alone.
    std::fs::remove_file(&hook).expect("unhook");
    let planned = plan(&request).await.expect("plan");
    std::fs::create_dir_all(&planned.path).expect("mkdir");
    std::fs::write(planned.path.join("theirs"), "x").expect("write");
    let e = make(&planned).await.expect_err("taken");
    assert!(e.contains("appeared since the spawn chose it"), "{e}");
    assert!(planned.path.join("theirs").exists());
    assert_eq!(branches_and_worktrees(repo.path()).0, "main\n");
}

#[tokio::test]
async fn a_worktree_made_from_inside_another_belongs_to_the_main_checkout() {
    let repo = repo();
    let root = tempfile::tempdir().expect("tmp");
    let create_in = async |from: &Path, name: &str| create(&request(from, name, root.path())).await;
    let mid = create_in(repo.path(), "mid").await.expect("mid's worktree");
    // A delegating member working in its worktree spawns a worktree member of its own.
    let in_mid = mid.path.join("src");
    std::fs::create_dir_all(&in_mid).expect("mkdir");
    let sub = create_in(&in_mid, "sub").await.expect("sub's worktree");
    let real = |p: &Path| std::fs::canonicalize(p).expect("canonical");
    assert_eq!(real(&sub.repo), real(repo.path()), "{sub:?}");
    assert_eq!(
        sub.base_name, "fleet/mid",
        "branched from where mid had got to"
    );

    // mid's clean worktree goes first; sub's is still removed with its branch after it.
    std::fs::remove_dir(&in_mid).expect("rmdir");
    assert_eq!(settle(&mid).await.expect("settle mid"), Settled::Removed);
    assert_eq!(settle(&sub).await.expect("settle sub"), Settled::Removed);
    assert!(!sub.path.exists());
    assert!(!branch_exists(repo.path(), "fleet/sub").await);

    // A record from before this fix names mid's removed worktree as its repository: its
    // own directory still leads to the main checkout.
    let mut old = create_in(repo.path(), "old").await.expect("old's worktree");
    old.repo.clone_from(&mid.path);
    assert_eq!(settle(&old).await.expect("settle old"), Settled::Removed);
    assert!(!old.path.exists());
    assert!(!branch_exists(repo.path(), "fleet/old").await);
}

//! A git worktree per member (issue 19, SPEC §7), end to end with the built daemon on real tmux
//! and the real git: two members edit the same file at once, each on its own branch, and the
//! lead's checkout is untouched; `fleet_list` shows what each worktree holds; release removes a
//! clean worktree with its branch and keeps one with work in it, telling the lead where it is
//! and what it holds; a spawn whose worktree cannot be made fails clearly and leaves nothing.

use std::path::PathBuf;
use std::time::Duration;

use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{LEAD, Rig, error_code, sim_profile, structured_ok};
use fleetd_testkit::wait_until;
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);
const GIT_ID: &str = "-c user.name=fleet-test -c user.email=fleet-test@example.com";

/// A rig whose profile `wt` gives each member a worktree (its agent runs its task as a shell
/// command and replies with the output); `extra` is more of that profile's keys.
fn rig(worktree: &str) -> Option<Rig> {
    Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}    worktree: {worktree}\n",
        sim_profile(
            "wt",
            &[("SIM_AGENT_SCRIPT", "shell"), ("SIM_AGENT_WORK_MS", "100")]
        ),
    ))
}

fn member(rig: &Rig, name: &str) -> Value {
    structured_ok(&rig.lead("fleet_list", &json!({})))["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["target"] == name).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn e2e_worktrees_parallel_members_work_on_their_own_branches_and_release_keeps_only_work() {
    let repo = fleetd_testkit::git_repository();
    let Some(rig) = rig("{}") else {
        return;
    };
    // The lead works in the repository: members branch from there.
    rig.type_line(LEAD, &format!("cd {}", repo.display()));
    let mut events =
        fleetd_testkit::http::events::SseReader::unix(&state_dir(rig.dir()).join("api.sock"), None)
            .expect("the event stream");
    for name in ["ann", "bob", "cy"] {
        rig.spawn("wt", name);
    }
    let ann = member(&rig, "ann");
    assert_eq!(ann["branch"], "fleet/ann", "{ann}");
    // The dashboard learns the branch from the spawn's event, not only from a first listing.
    let joined = events.until("ann's member.spawned", |e| {
        e.event == "member.spawned" && e.data["target"] == "ann"
    });
    let joined = &joined.last().expect("until returns the match").data;
    assert_eq!(joined["branch"], "fleet/ann", "{joined}");
    let ann_dir = PathBuf::from(ann["worktree"]["path"].as_str().expect("path"));
    let bob_dir = PathBuf::from(
        member(&rig, "bob")["worktree"]["path"]
            .as_str()
            .expect("path"),
    );
    let cy_dir = PathBuf::from(
        member(&rig, "cy")["worktree"]["path"]
            .as_str()
            .expect("path"),
    );
    assert!(
        ann_dir.starts_with(state_dir(rig.dir()).join("worktrees")),
        "{ann_dir:?}"
    );
    assert_eq!(ann["worktree"]["base"], "main");

    // Both edit README at once: ann commits, bob leaves it uncommitted.
    let a = rig.send_task(
        "ann",
        &format!(
            "pwd && echo ann > README && git {GIT_ID} commit -qam 'ann edits' && git rev-parse --abbrev-ref HEAD"
        ),
    );
    let b = rig.send_task("bob", "pwd && echo bob > README && git status --porcelain");
    let a = rig.reply_of(&a);
    let b = rig.reply_of(&b);
    assert!(a.starts_with("exit 0"), "{a}");
    assert!(
        a.contains(&ann_dir.display().to_string()),
        "ann worked in her worktree: {a}"
    );
    assert!(a.trim_end().ends_with("fleet/ann"), "{a}");
    assert!(b.starts_with("exit 0") && b.contains(" M README"), "{b}");
    assert_eq!(
        std::fs::read_to_string(ann_dir.join("README")).expect("read"),
        "ann\n"
    );
    assert_eq!(
        std::fs::read_to_string(bob_dir.join("README")).expect("read"),
        "bob\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("README")).expect("read"),
        "hello\n",
        "the lead's checkout is untouched"
    );
    assert_eq!(
        fleetd_testkit::git(&repo, &["rev-list", "--count", "main..fleet/ann"]),
        "1"
    );

    // fleet_list shows what each holds (read at the turn's end).
    wait_until("the worktrees read after the turns", PATIENCE, || {
        let (ann, bob) = (member(&rig, "ann"), member(&rig, "bob"));
        ann["worktree"]["ahead"] == 1
            && ann["worktree"]["uncommitted"] == 0
            && bob["worktree"]["uncommitted"] == 1
            && bob["worktree"]["ahead"] == 0
    });
    assert_eq!(member(&rig, "cy")["worktree"]["uncommitted"], 0);
    // fleet_status shows the same for one member.
    let status = structured_ok(&rig.lead("fleet_status", &json!({ "target": "ann" })));
    assert_eq!(status["worktree"]["branch"], "fleet/ann", "{status}");
    assert_eq!(status["worktree"]["ahead"], 1, "{status}");
    assert_eq!(status["worktree"]["uncommitted"], 0, "{status}");

    // Release: the clean one goes with its branch; the others stay, and the lead is told.
    let operator = Endpoint::Unix(state_dir(rig.dir()).join("api.sock"));
    for name in ["cy", "bob", "ann"] {
        structured_ok(&rig.lead("fleet_stop", &json!({ "target": name })));
    }
    wait_until("cy's worktree and branch removed", PATIENCE, || {
        !cy_dir.exists() && fleetd_testkit::git(&repo, &["branch", "--list", "fleet/cy"]).is_empty()
    });
    let notice = |name: &str| {
        let mut found = String::new();
        wait_until(&format!("{name}'s worktree notice"), PATIENCE, || {
            found = http::reply_texts(&operator, name)
                .into_iter()
                .find(|t| t.contains("worktree is kept"))
                .unwrap_or_default();
            !found.is_empty()
        });
        found
    };
    let bob_notice = notice("bob");
    assert!(
        bob_notice.contains(&bob_dir.display().to_string()),
        "{bob_notice}"
    );
    assert!(
        bob_notice.contains("branch fleet/bob holds 1 uncommitted change"),
        "{bob_notice}"
    );
    let ann_notice = notice("ann");
    assert!(
        ann_notice.contains("branch fleet/ann holds 1 commit ahead of main"),
        "{ann_notice}"
    );
    assert!(bob_dir.join("README").exists() && ann_dir.join("README").exists());
    assert!(
        http::reply_texts(&operator, "cy")
            .iter()
            .all(|t| !t.contains("worktree"))
    );
    // (`+`: checked out in another worktree.)
    assert_eq!(
        fleetd_testkit::git(&repo, &["branch", "--list", "fleet/ann"]),
        "+ fleet/ann"
    );
}

/// Asserts that spawning `name` from `wt` fails with `worktree_failed`, its message saying
/// `says`, and that no member is left.
fn spawn_refused(rig: &Rig, name: &str, says: &str) {
    let refused = rig.lead("fleet_spawn", &json!({ "profile": "wt", "name": name }));
    assert_eq!(error_code(&refused), "worktree_failed", "{refused}");
    let message = refused["structuredContent"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(message.contains(says), "{message}");
    assert!(member(rig, name).is_null(), "no member");
}

#[test]
fn e2e_worktrees_a_spawn_whose_worktree_cannot_be_made_fails_clearly_and_leaves_nothing() {
    let plain = tempfile::tempdir().expect("tempdir").keep();
    let Some(rig) = rig(&format!("{{repo: {}}}", plain.display())) else {
        return;
    };
    let windows = |rig: &Rig| {
        let out = rig.tmux.run(&["list-windows", "-a"]).expect("tmux");
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let before = windows(&rig);
    spawn_refused(&rig, "dee", "is not in a git repository");
    assert_eq!(windows(&rig), before, "no pane left");
    // The name is free again, and nothing was written under the worktrees directory.
    let worktrees = state_dir(rig.dir()).join("worktrees");
    assert!(
        !worktrees.exists() || std::fs::read_dir(&worktrees).expect("dir").next().is_none(),
        "nothing under {worktrees:?}"
    );
}

#[test]
fn e2e_worktrees_a_failing_post_checkout_hook_fails_the_spawn_and_leaves_no_branch_or_directory() {
    // git makes the branch and the worktree before its hook runs, and keeps both when the hook
    // fails: fleetd takes them back.
    let repo = fleetd_testkit::git_repository();
    let hook = repo.join(".git/hooks/post-checkout");
    std::fs::write(&hook, "#!/bin/sh\necho no checkouts today >&2\nexit 1\n").expect("hook");
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let Some(rig) = rig(&format!("{{repo: {}}}", repo.display())) else {
        return;
    };
    spawn_refused(&rig, "eli", "no checkouts today");
    assert_eq!(
        fleetd_testkit::git(&repo, &["branch", "--format=%(refname:short)"]),
        "main",
        "no branch left"
    );
    assert_eq!(
        fleetd_testkit::git(&repo, &["worktree", "list", "--porcelain"])
            .lines()
            .filter(|l| l.starts_with("worktree "))
            .count(),
        1,
        "no worktree registered"
    );
    let worktrees = state_dir(rig.dir()).join("worktrees");
    assert!(
        !worktrees.exists() || std::fs::read_dir(&worktrees).expect("dir").next().is_none(),
        "nothing under {worktrees:?}"
    );
}

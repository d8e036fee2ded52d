//! Members in a sandbox (issue 38, SPEC §19), end to end with the built daemon, real tmux, real
//! git and the real bubblewrap: from inside a sandboxed member, as a shell its agent could run,
//! the state directory, the user's home, the lead's checkout, another member's worktree, other
//! processes and the user's tmux server are out of reach, while its task, `fleet_reply`,
//! `fleet_ask`, its model calls through fleetd, the stdio shim and git on its own branch work.
//! A profile asking for a sandbox the machine cannot give fails the spawn and says why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::fake_model::FakeModel;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{LEAD, Rig, error_code, sim_profile, structured_ok};
use fleetd_testkit::{bin_path, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);

/// The machine has bubblewrap: CI installs it; elsewhere a missing one skips, loudly.
fn require_bwrap() -> bool {
    let found = Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "the sandbox tests need bubblewrap: install it (apt-get install bubblewrap); .ci/run does"
        );
        eprintln!("skipping: no bubblewrap (apt-get install bubblewrap)");
    }
    found
}

/// The lead's repository: `main` with one commit, and an uncommitted file of the lead's.
fn repository() -> PathBuf {
    let dir = fleetd_testkit::git_repository();
    std::fs::write(dir.join("lead-notes.txt"), "the lead's own draft\n").expect("write");
    dir
}

/// A boxed fleet: profile `boxed` (a worktree each, runs its task as a shell command and
/// replies with the output, model backend `lab` through fleetd), `asker` (boxed in a
/// directory of its own, asks its lead before replying) and `offline` (as `boxed` in that
/// directory, with no network but fleetd).
struct Boxed {
    rig: Rig,
    repo: PathBuf,
    model: FakeModel,
    _files: tempfile::TempDir,
}

fn start() -> Option<Boxed> {
    if !require_bwrap() {
        return None;
    }
    let files = tempfile::tempdir().expect("tempdir");
    let (model, backend) = FakeModel::start_lab(files.path(), "boxed answer");
    let asker_dir = files.path().join("asker");
    std::fs::create_dir(&asker_dir).expect("mkdir");
    let rig = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n{backend}\
         profiles:\n{boxed}    backend: lab\n    worktree: {{}}\n    sandbox: {{}}\n\
         {asker}    cwd: {asker_dir}\n    sandbox: {{}}\n\
         {offline}    backend: lab\n    cwd: {asker_dir}\n    sandbox:\n      network: false\n",
        boxed = sim_profile(
            "boxed",
            &[("SIM_AGENT_SCRIPT", "shell"), ("SIM_AGENT_WORK_MS", "100")]
        ),
        asker = sim_profile(
            "asker",
            &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "100")]
        ),
        offline = sim_profile(
            "offline",
            &[("SIM_AGENT_SCRIPT", "shell"), ("SIM_AGENT_WORK_MS", "100")]
        ),
        asker_dir = asker_dir.display(),
    ))?;
    let repo = repository();
    // The lead works in the repository: members branch from there.
    rig.type_line(LEAD, &format!("cd {}", repo.display()));
    Some(Boxed {
        rig,
        repo,
        model,
        _files: files,
    })
}

impl Boxed {
    /// Member `name`'s worktree, as `fleet_list` shows it.
    fn worktree(&self, name: &str) -> PathBuf {
        let member = self.rig.member(name);
        PathBuf::from(
            member["worktree"]["path"]
                .as_str()
                .expect("a worktree path"),
        )
    }
}

/// Member `name` calls its model through fleetd (`model-call`, from its shell) and is
/// answered.
fn calls_its_model(rig: &Rig, name: &str) {
    let call = rig.run_task(
        name,
        &format!(
            "{} --prompt hello --out answer.json && cat answer.json",
            bin_path("model-call").display()
        ),
    );
    assert!(
        call.starts_with("exit 0") && call.contains("\"status\":200"),
        "{name}'s model call: {call}"
    );
}

#[test]
fn e2e_sandbox_a_member_reaches_only_its_worktree_and_fleetd() {
    let Some(fleet) = start() else {
        return;
    };
    let rig = &fleet.rig;
    rig.spawn("boxed", "ann");
    rig.spawn("boxed", "bob");
    let ann = fleet.worktree("ann");
    let bob = fleet.worktree("bob");
    let state = state_dir(rig.dir());
    let home = rig.dir();
    std::fs::write(home.join("user-secret.txt"), "the user's own\n").expect("write");
    let no_such = "No such file or directory";

    // Refused or impossible: fleetd's state, the user's home, the lead's checkout, another
    // member's worktree, writing outside its own, other processes, the user's tmux server.
    // Of the state directory, only the paths down to its door and to ann's own worktree exist.
    let listing = rig.run_task("ann", &format!("ls -A {0} {0}/worktrees", state.display()));
    let names: Vec<&str> = listing
        .lines()
        .filter(|l| !l.is_empty() && !l.ends_with(':'))
        .collect();
    let ann_root = ann
        .strip_prefix(state.join("worktrees"))
        .ok()
        .and_then(|p| p.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .expect("ann's worktree is under the state directory");
    assert_eq!(
        names,
        ["exit 0", "door", "worktrees", &ann_root],
        "{listing}"
    );
    rig.refused_in(
        "ann",
        &format!("cat {}", state.join("inbox.db").display()),
        no_such,
    );
    rig.refused_in(
        "ann",
        &format!("cat {}", home.join("user-secret.txt").display()),
        no_such,
    );
    rig.refused_in(
        "ann",
        &format!("cat {}", fleet.repo.join("lead-notes.txt").display()),
        no_such,
    );
    rig.refused_in("ann", &format!("ls {}", bob.display()), no_such);
    rig.refused_in("ann", "touch /usr/ann-was-here", "Read-only file system");
    // (The lead's checkout is no more than the path to its git directory: a file made there
    // lands in the box's own /tmp, never in the checkout.)
    rig.run_task(
        "ann",
        &format!("touch {}", fleet.repo.join("ann-was-here").display()),
    );
    assert!(!fleet.repo.join("ann-was-here").exists());
    rig.refused_in(
        "ann",
        &format!("touch {}", fleet.repo.join(".git/ann-was-here").display()),
        "Read-only file system",
    );
    // Nor can it point git at a configuration of its own, for fleetd's and the lead's git
    // run outside the box on its worktree (core.fsmonitor and the like would run there).
    rig.refused_in(
        "ann",
        "echo 'gitdir: /tmp/evil' > .git",
        "Read-only file system",
    );
    let admin = fleet.repo.join(".git/worktrees/ann");
    for file in ["commondir", "gitdir", "config.worktree"] {
        let path = admin.join(file);
        rig.refused_in(
            "ann",
            &format!("echo /tmp/evil > {}", path.display()),
            "Read-only file system",
        );
    }
    rig.refused_in(
        "ann",
        &format!("echo x >> {}", fleet.repo.join(".git/config").display()),
        "Read-only file system",
    );
    let daemon = rig.daemon.pid();
    rig.refused_in("ann", &format!("kill -0 {daemon}"), "");
    rig.refused_in("ann", &format!("cat /proc/{daemon}/environ"), no_such);
    let processes = rig.run_task("ann", "ls /proc | grep -c '^[0-9]'");
    let count: usize = processes
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(99);
    assert!(
        count <= 6,
        "ann sees only her own box's processes: {processes}"
    );
    // No tmux server of the user's, so no send-keys into the lead and no pane of its own
    // outside the members' workspace (the review's identity hole cannot open here).
    rig.refused_the_tmux_server("ann");
    rig.refused_in("ann", "tmux new-window", "");
    rig.refused_in("ann", "env | grep -E '^(TMUX|HERDR_SOCKET_PATH)='", "");

    // Working: its own home and /tmp, git on its branch (which the lead then sees), its model.
    let own = rig.run_task(
        "ann",
        "echo mine > $HOME/note && cat $HOME/note && echo t > /tmp/t && pwd",
    );
    assert!(own.starts_with("exit 0") && own.contains("mine"), "{own}");
    assert!(
        own.contains(&ann.display().to_string()),
        "ann starts in her worktree: {own}"
    );
    let commit = rig.run_task(
        "ann",
        "echo ann > README && git -c user.name=ann -c user.email=ann@example.com commit -qam 'ann edits' && git rev-parse --abbrev-ref HEAD",
    );
    assert!(
        commit.starts_with("exit 0") && commit.lines().any(|l| l == "fleet/ann"),
        "{commit}"
    );
    assert_eq!(
        fleetd_testkit::git(&fleet.repo, &["log", "-1", "--format=%s", "fleet/ann"]),
        "ann edits"
    );
    assert_eq!(
        std::fs::read_to_string(fleet.repo.join("README")).expect("read"),
        "hello\n"
    );
    calls_its_model(rig, "ann");

    // Released, a member's private home goes with it.
    let homes = state.join("sandboxes");
    assert!(
        homes.join("ann/home/note").exists(),
        "ann's home is on the host"
    );
    structured_ok(&rig.lead("fleet_stop", &json!({ "target": "ann" })));
    wait_until("ann's home to be taken away", PATIENCE, || {
        !homes.join("ann").exists()
    });
    assert!(
        homes.join("bob").exists(),
        "bob's home stays while he is here"
    );
}

#[test]
fn e2e_sandbox_a_member_asks_and_replies_and_uses_the_stdio_shim() {
    let Some(fleet) = start() else {
        return;
    };
    let rig = &fleet.rig;
    rig.spawn("asker", "cy");
    let ticket = rig.send_task("cy", "which branch?");
    let question = rig.question_from("cy");
    assert_eq!(question["question"], "sim-agent asks about: which branch?");
    structured_ok(&rig.lead(
        "fleet_answer",
        &json!({ "questionId": question["questionId"], "answer": "use main" }),
    ));
    let reply = rig.reply_of(&ticket);
    assert!(reply.contains("use main"), "cy's reply: {reply}");

    // The stdio relay inside a box finds fleetd through the door, and fleetd knows the caller
    // by its pane as over HTTP: the reply it sends is dee's reply to dee's task.
    rig.spawn("boxed", "dee");
    let lines = session(&json!({ "text": "replied over the stdio shim" }));
    let out = rig.run_task(
        "dee",
        &format!(
            "printf '%s\\n' {} > in.jsonl && (cat in.jsonl; sleep 3) | {} mcp",
            lines
                .iter()
                .map(|l| format!("'{l}'"))
                .collect::<Vec<_>>()
                .join(" "),
            fleetd_testkit::daemon::fleetd_binary().display()
        ),
    );
    assert_eq!(
        out, "replied over the stdio shim",
        "dee's reply came over the shim"
    );

    // The door is the shim's socket under another name, behind the same policy: a process in
    // no pane is no one there, and nothing reaches anyone's inbox.
    let door = state_dir(rig.dir()).join("door/fleetd.sock");
    let answer = shim_exchange(&door, &session(&json!({ "text": "from nowhere" })));
    assert!(answer.contains("anonymous_caller"), "{answer}");
    let dee = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "dee" })));
    assert!(!dee.to_string().contains("from nowhere"), "{dee}");

    // The boxes' HTTP door places callers as TCP does: what the operator's socket grants the
    // same process (dee's replies) is refused there, and a web page's Origin is refused too.
    let boxed = Endpoint::Unix(state_dir(rig.dir()).join("door/http.sock"));
    let path = "/sessions/dee/replies";
    assert_eq!(
        http::get(rig.daemon.operator(), path)
            .expect("answer")
            .status,
        200
    );
    let refused = http::get(boxed.clone(), path).expect("an answer");
    assert_eq!(refused.error_code(), "anonymous_caller", "{refused:?}");
    let page =
        http::get_with(boxed, path, &[("Origin", "https://evil.example")]).expect("an answer");
    assert_eq!(page.status, 403, "{page:?}");
}

/// An MCP session over the stdio shim that calls `fleet_reply` with `args`, one JSON-RPC
/// message a line.
fn session(args: &Value) -> Vec<String> {
    [
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"box","version":"1"}}}),
        json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
        json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"fleet_reply","arguments":args}}),
    ]
    .iter()
    .map(Value::to_string)
    .collect()
}

/// Sends `lines` to the shim's socket at `path` and returns the answer to request 2.
fn shim_exchange(path: &Path, lines: &[String]) -> String {
    use std::io::{BufRead as _, Write as _};
    let mut stream = std::os::unix::net::UnixStream::connect(path).expect("the door");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    for line in lines {
        writeln!(stream, "{line}").expect("write");
    }
    std::io::BufReader::new(stream)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("\"id\":2"))
        .expect("an answer to the call")
}

#[test]
fn e2e_sandbox_a_spawn_the_machine_cannot_box_fails_and_says_why() {
    if !require_bwrap() {
        return;
    }
    let empty = tempfile::tempdir().expect("tempdir");
    let Some(rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}    cwd: /tmp\n    sandbox: {{}}\n",
        sim_profile("nobox", &[("PATH", &empty.path().display().to_string())]),
    )) else {
        return;
    };
    let refused = rig.lead("fleet_spawn", &json!({ "profile": "nobox", "name": "eve" }));
    assert_eq!(error_code(&refused), "sandbox_unavailable", "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("bubblewrap is not installed")
            && message.contains("apt-get install bubblewrap"),
        "{message}"
    );
    let members = rig.members();
    assert!(members.is_empty(), "no member was left: {members:?}");
    let windows = fleetd_testkit::run_ok(
        rig.tmux.command().args(["list-windows", "-a", "-F", "#W"]),
        "tmux list-windows",
    );
    let windows = String::from_utf8_lossy(&windows.stdout).to_string();
    assert!(!windows.contains("eve"), "no pane was left: {windows}");
}

#[test]
fn e2e_sandbox_without_a_network_a_member_reaches_fleetd_and_its_model_only() {
    let Some(fleet) = start() else {
        return;
    };
    let rig = &fleet.rig;
    let offline = rig.profile("offline");
    assert_eq!(offline["sandbox"], json!({ "network": false }), "{offline}");
    let boxed = rig.profile("boxed");
    assert_eq!(boxed["sandbox"], json!({ "network": true }), "{boxed}");
    rig.spawn("offline", "fay");
    // Its replies reach fleetd (this very reply came through the box's relay), and so does its
    // model call through the gateway at the URL it was given.
    calls_its_model(rig, "fay");
    // Nothing else: not the model backend itself, not the broker, not the outside world.
    let backend = fleet.model.url();
    let port = backend.rsplit(':').next().expect("a port");
    for (what, host, port) in [
        ("the backend, directly", "127.0.0.1", port),
        ("the broker", "127.0.0.1", "5672"),
        ("the outside", "1.1.1.1", "443"),
    ] {
        let out = rig.run_task(
            "fay",
            &format!("timeout 5 bash -c 'echo > /dev/tcp/{host}/{port}' && echo reached"),
        );
        assert!(!out.contains("reached"), "{what}: {out}");
    }
}

#[test]
fn e2e_sandbox_on_herdr_a_member_cannot_reach_herdr() {
    if !require_bwrap() {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let (rig, lead) = fleetd_testkit::rig_herdr::HerdrRig::with_member(
        &format!(
            "{}      SIM_AGENT_SCRIPT: shell\n    cwd: {}\n    sandbox: {{}}\n",
            fleetd_testkit::rig_herdr::sim_profile("boxed", 100),
            work.path().display()
        ),
        ["boxed", "ann"],
    );
    // herdr's socket is not in the box, nor named in its environment: no pane.create, no
    // pane.send_text into the lead, from inside.
    let socket = rig.herdr.socket().display().to_string();
    let reply = rig.run_task(
        &lead,
        "ann",
        &format!("ls {socket}; env | grep -c HERDR_SOCKET_PATH"),
    );
    assert!(
        reply.contains("No such file or directory") && reply.lines().any(|l| l == "0"),
        "from inside ann's box: {reply}"
    );
}

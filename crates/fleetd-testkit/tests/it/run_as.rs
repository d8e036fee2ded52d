//! Members that run as a second user (`runAs`, issue 38, SPEC §19), end to end with the built
//! daemon, real tmux and the machine's own user `fleetd-agent` (`.ci/run` makes it): as a shell
//! its agent could run, the member is that user, and the kernel keeps it from fleetd's state
//! directory, the user's files and checkout, fleetd's process and the user's tmux server, while
//! its task, `fleet_reply` and its model calls through fleetd work — fleetd knows it by its
//! user. One member per user at a time; a released member's processes are ended, and its user
//! is nobody to fleetd until it is given to the next.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetd::sandbox::user::{self, User};
use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::fake_model::FakeModel;
use fleetd_testkit::rig::{Rig, error_code, structured_ok};
use fleetd_testkit::{Service, bin_path, require, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);

/// The user members run as here.
const AGENT_USER: &str = "fleetd-agent";

/// The user `fleetd-agent`, when this machine has it and this process may become it (root):
/// CI does; elsewhere the test skips, saying why.
pub(crate) fn agent_user() -> Option<User> {
    let found = Command::new("getent")
        .args(["passwd", AGENT_USER])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| user::parse_passwd(&String::from_utf8_lossy(&o.stdout)));
    let root = rustix::process::geteuid().is_root();
    let usable = found.is_some() && root;
    (require(
        "the user fleetd-agent, and root to become it",
        usable,
        "Run the suite as root, as CI does, after `useradd --system --create-home --shell /bin/sh fleetd-agent` (.ci/run makes it).",
    ) == Service::Present)
        .then_some(found)
        .flatten()
}

/// A fleet whose profile `apart` runs its members as `fleetd-agent` (sim-agent running its task
/// as a shell command and replying with the output, model backend `lab` through fleetd).
struct Apart {
    rig: Rig,
    /// Copies of the test kit's programs, and the member's directory, where the agent user can
    /// reach them (the checkout may be in a home it cannot enter).
    reachable: PathBuf,
    model: FakeModel,
    uid: u32,
    gid: u32,
    files: tempfile::TempDir,
}

fn start() -> Option<Apart> {
    let User { uid, gid, .. } = agent_user()?;
    let files = tempfile::tempdir().expect("tempdir");
    let (model, backend) = FakeModel::start_lab(files.path(), "apart answer");
    let reachable = files.path().join("reachable");
    std::fs::create_dir(&reachable).expect("mkdir");
    std::fs::set_permissions(files.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(&reachable, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for name in ["sim-agent", "model-call", "mcp-call"] {
        std::fs::copy(bin_path(name), reachable.join(name)).expect("copy");
    }
    let work = reachable.join("work");
    std::fs::create_dir(&work).expect("mkdir");
    std::os::unix::fs::chown(&work, Some(uid), None).expect("chown the member's directory");
    let rig = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n{backend}\
         profiles:\n  apart:\n    agent: custom\n    command: {sim}\n    runAs: {AGENT_USER}\n\
         \x20   cwd: {work}\n    backend: lab\n    env:\n      SIM_AGENT_SCRIPT: shell\n      SIM_AGENT_WORK_MS: \"100\"\n\
         \x20 stranger:\n    agent: custom\n    command: {sim}\n    runAs: no-such-user-here\n",
        sim = reachable.join("sim-agent").display(),
        work = work.display(),
    ))?;
    Some(Apart {
        rig,
        reachable,
        model,
        uid,
        gid,
        files,
    })
}

impl Apart {
    /// The processes the agent user has now.
    fn processes(&self) -> Vec<String> {
        let out = Command::new("pgrep")
            .args(["-a", "-u", &self.uid.to_string()])
            .output()
            .expect("pgrep runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `mcp-call` as the agent user from this process (in no pane).
    fn call_as_agent_user(&self, tool: &str, args: &Value) -> Value {
        self.call_as((self.uid, self.gid), tool, args)
    }

    /// `mcp-call` as uid and gid `ids` from this process (in no pane).
    fn call_as(&self, (uid, gid): (u32, u32), tool: &str, args: &Value) -> Value {
        let out = Command::new("setpriv")
            .args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_owned(),
                "--".to_owned(),
            ])
            .arg(self.reachable.join("mcp-call"))
            .args(["--print", tool, &args.to_string()])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("FLEETD_URL", format!("http://{}", self.rig.daemon.addr))
            .current_dir("/")
            .output()
            .expect("setpriv runs");
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn e2e_run_as_a_member_is_its_own_user_and_the_kernel_keeps_it_out() {
    let Some(fleet) = start() else {
        return;
    };
    let rig = &fleet.rig;
    let apart = rig.profile("apart");
    assert_eq!(apart["runAs"], AGENT_USER, "{apart}");
    rig.spawn("apart", "ann");
    let ann = rig.member("ann");
    assert_eq!(ann["runAs"], AGENT_USER, "{ann}");
    let who = rig.run_task("ann", "id -un && pwd && echo $HOME");
    let work = fleet.reachable.join("work");
    assert!(
        who.starts_with("exit 0")
            && who.lines().any(|l| l == AGENT_USER)
            && who.lines().any(|l| Path::new(l) == work),
        "ann runs as {AGENT_USER} in her directory: {who}"
    );

    // Refused by the kernel: fleetd's state, the user's files, fleetd's process, the user's
    // tmux server (so nothing typed into the lead, and no pane of its own).
    let denied = "Permission denied";
    let state = state_dir(rig.dir());
    rig.refused_in("ann", &format!("ls {}", state.display()), denied);
    rig.refused_in(
        "ann",
        &format!("cat {}", state.join("inbox.db").display()),
        denied,
    );
    // The user's own files, as their modes keep them (a home of 0700, as Debian makes them;
    // a file of 0600): what the user lets every user read, the member reads too.
    let private = rig.dir().join("home");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::write(private.join("user-secret.txt"), "the user's own\n").expect("write");
    rig.refused_in(
        "ann",
        &format!("cat {}", private.join("user-secret.txt").display()),
        denied,
    );
    let token_file = fleet.files.path().join("lab-token");
    rig.refused_in("ann", &format!("cat {}", token_file.display()), denied);
    rig.refused_in(
        "ann",
        &format!("touch {}", rig.dir().join("ann-was-here").display()),
        denied,
    );
    let daemon = rig.daemon.pid();
    rig.refused_in("ann", &format!("kill -0 {daemon}"), "not permitted");
    rig.refused_in("ann", &format!("cat /proc/{daemon}/environ"), denied);
    rig.refused_the_tmux_server("ann");

    // Working: its directory, and its model through fleetd, known by its user.
    let call = rig.run_task(
        "ann",
        &format!(
            "echo mine > note && cat note && {} --prompt hello --out answer.json && cat answer.json",
            fleet.reachable.join("model-call").display()
        ),
    );
    assert!(
        call.starts_with("exit 0") && call.contains("mine") && call.contains("\"status\":200"),
        "ann's own file and model call: {call}"
    );
    assert!(fleet.model.served().len() == 1, "the model served ann once");
    let ann = rig.member("ann");
    assert!(
        ann["usage"]["totalTokens"].as_u64().is_some_and(|t| t > 0),
        "ann's model call counted on her: {ann}"
    );

    // Released, whatever still ran as its user is ended, and that user is nobody to fleetd.
    rig.run_task("ann", "setsid sleep 600 > /dev/null 2>&1 < /dev/null &");
    assert!(
        fleet.processes().iter().any(|p| p.contains("sleep 600")),
        "ann left a process behind: {:?}",
        fleet.processes()
    );
    structured_ok(&rig.lead("fleet_stop", &json!({ "target": "ann" })));
    wait_until("ann's user to have no processes left", PATIENCE, || {
        fleet.processes().is_empty()
    });
    let answer = fleet.call_as_agent_user("fleet_reply", &json!({ "text": "forged" }));
    assert_eq!(
        answer["result"]["structuredContent"]["code"], "anonymous_caller",
        "{answer}"
    );
}

#[test]
fn e2e_run_as_one_member_per_user_and_refusals_that_say_why() {
    let Some(fleet) = start() else {
        return;
    };
    let rig = &fleet.rig;
    rig.spawn("apart", "ann");
    // A second member of the same user would be the first one to fleetd: refused, naming it.
    let second = rig.lead("fleet_spawn", &json!({ "profile": "apart", "name": "bob" }));
    assert_eq!(error_code(&second), "sandbox_unavailable", "{second}");
    let text = second.to_string();
    assert!(
        text.contains("already runs member ann") && text.contains(AGENT_USER),
        "{text}"
    );
    // A user the machine does not have: refused, saying how to make it.
    let stranger = rig.lead(
        "fleet_spawn",
        &json!({ "profile": "stranger", "name": "cy" }),
    );
    assert_eq!(error_code(&stranger), "sandbox_unavailable", "{stranger}");
    assert!(
        stranger
            .to_string()
            .contains("useradd --create-home no-such-user-here"),
        "{stranger}"
    );
    // Neither refused spawn left a member behind, and ann still works, as her user.
    let members = rig.members();
    assert_eq!(members.len(), 1, "{members:?}");
    let out = rig.run_task("ann", "id -un");
    assert!(out.contains(AGENT_USER), "{out}");
    // fleetd killed and started again: ann is still known by her user, and her processes live.
    let mut fleet = fleet;
    fleet.rig.kill_daemon();
    fleet.rig.restart_daemon();
    let rig = &fleet.rig;
    let out = rig.run_task("ann", "id -un");
    assert!(out.contains(AGENT_USER), "after the restart: {out}");
    // Any process of ann's user is ann — even one in no pane: the user is her identity.
    let answer = fleet.call_as_agent_user("fleet_reply", &json!({ "text": "from ann's user" }));
    assert_eq!(
        answer["result"]["structuredContent"]["delivered"], "inbox",
        "{answer}"
    );
    let mail = rig.lead("fleet_poll", &json!({ "target": "ann" }));
    assert!(
        mail.to_string().contains("from ann's user"),
        "the lead has it as ann's reply: {mail}"
    );
    // Any other user is still anonymous, with ann's user at work beside it.
    let answer = fleet.call_as((65534, 65534), "fleet_reply", &json!({ "text": "forged" }));
    assert_eq!(
        answer["result"]["structuredContent"]["code"], "anonymous_caller",
        "{answer}"
    );
    let mail = rig.lead("fleet_poll", &json!({ "target": "ann" }));
    assert!(!mail.to_string().contains("forged"), "{mail}");
}

/// `command` as the daemon's user `fleetd-owner` (not root), with only `env`.
fn as_owner(command: &[String], env: &[(&str, &str)]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=fleetd-owner",
            "--regid=fleetd-owner",
            "--init-groups",
            "--",
        ])
        .args(command)
        .env_clear()
        .envs(env.iter().copied())
        .current_dir("/")
        .output()
        .expect("setpriv runs")
}

#[test]
fn e2e_run_as_a_daemon_without_root_becomes_the_user_with_the_sudo_rule_readme_gives() {
    let Some(user) = agent_user() else {
        return;
    };
    let owner = Command::new("getent")
        .args(["passwd", "fleetd-owner"])
        .output()
        .is_ok_and(|o| o.status.success());
    let sudo = Command::new("sudo").arg("--version").output().is_ok();
    if require(
        "the user fleetd-owner and sudo, with the rule `fleetd-owner ALL=(fleetd-agent) NOPASSWD:SETENV: ALL`",
        owner && sudo,
        "Run .ci/run, which makes them (useradd fleetd-owner; apt-get install sudo; /etc/sudoers.d/fleetd-ci).",
    ) == Service::Skip
    {
        return;
    }
    let path = "/opt/fleet-probe:/usr/bin:/bin";
    // What a member's pane runs when fleetd is not root: it is its user, in its own home, with
    // the variables fleetd gave it and its PATH (sudo's secure_path would replace it), and
    // without the owner's per-user places.
    let probe = [
        "sh",
        "-c",
        "id -un; echo $FLEETD_TARGET; echo $PATH; echo $HOME; echo ${XDG_RUNTIME_DIR:-none}",
    ]
    .map(str::to_owned);
    let argv = user::switched(&user, path, &probe, false);
    let out = as_owner(
        &argv,
        &[
            ("PATH", "/usr/bin:/bin"),
            ("FLEETD_TARGET", "ann"),
            ("HOME", "/home/fleetd-agent"),
            ("XDG_RUNTIME_DIR", "/run/user/0"),
        ],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        said.lines().collect::<Vec<_>>(),
        [AGENT_USER, "ann", path, "/home/fleetd-agent", "none"],
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the sweep's line ends what the member left behind.
    let mut leftover = Command::new("setpriv")
        .args([
            format!("--reuid={}", user.uid),
            format!("--regid={}", user.gid),
            "--clear-groups".to_owned(),
            "--".to_owned(),
            "sleep".to_owned(),
            "600".to_owned(),
        ])
        .spawn()
        .expect("a leftover");
    let out = as_owner(&user::ending(&user, false), &[("PATH", "/usr/bin:/bin")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = leftover.wait().expect("the leftover ends");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "killed by the sweep's line"
    );
}

#[test]
fn e2e_run_as_on_herdr_a_member_is_its_user_and_cannot_reach_herdr() {
    let Some(agent) = agent_user() else {
        return;
    };
    let files = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(files.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sim = files.path().join("sim-agent");
    std::fs::copy(bin_path("sim-agent"), &sim).expect("copy");
    let (rig, lead) = fleetd_testkit::rig_herdr::HerdrRig::with_member(
        &format!(
            "  apart:\n    agent: custom\n    command: {}\n    runAs: {AGENT_USER}\n    env:\n      HERDR_AGENT: claude\n      SIM_AGENT_WORK_MS: \"100\"\n      SIM_AGENT_SCRIPT: shell\n",
            sim.display()
        ),
        ["apart", "ann"],
    );
    // Its own user, in its own home (no cwd given), and herdr's socket is the user's: no
    // pane.create, no pane.send_text into the lead.
    let socket = rig.herdr.socket().display().to_string();
    let reply = rig.run_task(
        &lead,
        "ann",
        &format!(
            "id -un; pwd; /usr/bin/python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{socket}')\""
        ),
    );
    assert!(
        reply.lines().any(|l| l == AGENT_USER)
            && reply.lines().any(|l| std::path::Path::new(l) == agent.home)
            && reply.contains("Permission denied"),
        "as ann's user: {reply}"
    );
}

//! A rig for the real agent CLIs: one private "user" — a HOME of its own shared by a private tmux
//! server, fleetd and every agent, as on a user's machine — with fleetd on a fixed loopback port
//! (so `fleetd install` writes the URL a user's would), two scripted model backends (the lead's
//! own, standing in for the user's subscription, and the members' backend, which members reach
//! through fleetd's model gateway, fleetd adding its token) and the real CLIs from the cache on
//! `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::Cli;
use super::panes::{KEYS_THEN_ENTER, Mux, Panes};
use crate::daemon::{Daemon, write_config};
use crate::fake_model::FakeModel;
use crate::wait_until;

/// The lead's own API key (the user's subscription stand-in).
pub const LEAD_KEY: &str = "sk-ant-lead-0123456789abcdefLEADKEY";
/// The members' backend token: fleetd adds it to members' requests on their way to the members'
/// model; no process of the user's holds it (see [`super::gateway`]).
pub const MEMBER_TOKEN: &str = "sk-member-backend-SECRET-7f3c9e1d2b";
/// What the scripted models answer a member's question with.
pub const ANSWER: &str = "use the main branch";

/// A running rig.
#[derive(Debug)]
pub struct AgentRig {
    /// fleetd. Declared before the multiplexer so it is dropped first (see `Rig`).
    pub daemon: Daemon,
    /// The user's multiplexer (tmux or fake-herdr), started with the user's environment.
    pub panes: Panes,
    /// The lead's own model backend.
    pub lead_model: FakeModel,
    /// The members' model backend (served through fleetd's backend config).
    pub member_model: FakeModel,
    /// The user's HOME.
    home: tempfile::TempDir,
    /// The lead's working directory.
    pub work: PathBuf,
    /// The user's environment (what tmux was started with).
    env: Vec<(String, String)>,
    /// The log lines of daemons this rig restarted.
    previous_logs: Vec<String>,
}

impl AgentRig {
    /// Starts the user's tmux, both models and fleetd with `profiles` (a YAML block of profile
    /// entries, indented two spaces, or empty; `{work}` stands for the lead's working
    /// directory) and `extra` top-level config; `clis` go on PATH.
    pub fn start(clis: &[&Cli], profiles: &str, extra: &str) -> Self {
        Self::start_on(Mux::Tmux, clis, profiles, extra)
    }

    /// [`AgentRig::start`] on `mux`.
    pub fn start_on(mux: Mux, clis: &[&Cli], profiles: &str, extra: &str) -> Self {
        let home = tempfile::tempdir().expect("tempdir");
        let h = home.path().to_owned();
        let work = h.join("work");
        std::fs::create_dir_all(&work).expect("work dir");
        let lead_model = FakeModel::start(&h, "lead-model", ANSWER);
        let member_model = FakeModel::start(&h, "member-model", ANSWER);
        let mut path: Vec<String> = clis
            .iter()
            .filter_map(|c| c.bin.parent().map(|p| p.display().to_string()))
            .collect();
        // fleetd is on the user's PATH, as installed (the stdio shim is `fleetd mcp`).
        if let Some(dir) = crate::daemon::fleetd_binary().parent() {
            path.push(dir.display().to_string());
        }
        path.push(std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".to_owned()));
        let mut env = vec![
            ("HOME".to_owned(), h.display().to_string()),
            ("PATH".to_owned(), path.join(":")),
            (
                "XDG_CONFIG_HOME".to_owned(),
                h.join("config").display().to_string(),
            ),
            (
                "XDG_STATE_HOME".to_owned(),
                h.join("state").display().to_string(),
            ),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ];
        for (k, v) in super::claude::ENV {
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        let panes = Panes::start(mux, &h, &env);
        let secrets = h.join("secrets");
        std::fs::create_dir_all(&secrets).expect("secrets dir");
        let token_file = crate::secret_file(&secrets, "member-token", MEMBER_TOKEN);
        let port = crate::free_port();
        let listen = format!("127.0.0.1:{port}");
        let profiles = if profiles.is_empty() {
            String::new()
        } else {
            format!(
                "profiles:\n{}",
                profiles.replace("{work}", &work.display().to_string())
            )
        };
        let config = format!(
            "listen: {listen}\n{mux}membersWorkspace: fleet\nlog:\n  level: fleetd=debug,info\nbackends:\n  model:\n    baseUrl: {model}\n    authTokenSecret: member_token\nsecrets:\n  member_token:\n    file: {token}\n{profiles}{extra}",
            mux = panes.config(),
            model = member_model.url(),
            token = token_file.display(),
        );
        write_config(&h, &config);
        let daemon = Daemon::start_with_env(&h, &listen, &[], &env);
        Self {
            daemon,
            panes,
            lead_model,
            member_model,
            home,
            work,
            env,
            previous_logs: Vec::new(),
        }
    }

    /// Kills fleetd with SIGKILL and starts it again on the same HOME, address and
    /// environment (as a service manager restarts it); returns once it listens. The previous
    /// daemon's log is kept in `previous_logs`.
    pub fn restart_daemon(&mut self) {
        self.daemon.signal("KILL");
        self.daemon.wait_exit(Duration::from_secs(30));
        self.previous_logs
            .extend(self.daemon.logs_so_far().iter().cloned());
        let listen = self.daemon.addr.to_string();
        self.daemon = Daemon::start_with_env(self.home.path(), &listen, &[], &self.env);
    }

    /// The user's HOME.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// fleetd's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.daemon.addr)
    }

    /// Runs `fleetd ARGS` as the user would in the lead's working directory; panics with its
    /// output unless it succeeds. Returns stdout.
    pub fn fleetd(&self, args: &[&str]) -> String {
        self.fleetd_with(&[], args)
    }

    /// [`AgentRig::fleetd`] with `env` over the user's environment (another `HOME`, say).
    pub fn fleetd_with(&self, env: &[(&str, &str)], args: &[&str]) -> String {
        let out = crate::run_ok(
            &mut self.fleetd_command(env, args),
            &format!("fleetd {args:?}"),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `fleetd ARGS` as the user would and returns how it ended, whatever that was.
    pub fn fleetd_output(&self, args: &[&str]) -> std::process::Output {
        self.fleetd_command(&[], args)
            .output()
            .expect("fleetd runs")
    }

    fn fleetd_command(&self, env: &[(&str, &str)], args: &[&str]) -> Command {
        let mut command = Command::new(crate::daemon::fleetd_binary());
        command
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().copied())
            .current_dir(&self.work)
            .args(args);
        command
    }

    /// Opens window (tmux) or tab (herdr) `name` running `argv` in the lead's working directory
    /// with `env` added; returns its target.
    pub fn open(&self, name: &str, env: &[(&str, &str)], argv: &[&str]) -> String {
        self.panes.open(name, &self.work, &self.env, env, argv)
    }

    /// Types `text` into `target` the way a person does: the keys, then, a moment later, Enter.
    pub fn say(&self, target: &str, text: &str) {
        self.panes.type_text(target, text);
        pause(KEYS_THEN_ENTER);
        self.panes.enter(target);
    }

    /// What `target` shows now.
    pub fn screen(&self, target: &str) -> String {
        self.panes.screen(target)
    }

    /// Waits for `what` on `target`'s screen; on a timeout prints every pane and both models'
    /// logs before failing.
    pub fn wait_screen(
        &self,
        target: &str,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&str) -> bool,
    ) {
        self.wait(what, timeout, || cond(&self.screen(target)));
    }

    /// Waits for `cond`; on a timeout prints what a reader needs to see why.
    pub fn wait(&self, what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(what, timeout, cond);
        }));
        if let Err(panic) = waited {
            self.dump();
            std::panic::resume_unwind(panic);
        }
    }

    /// Waits for a line of fleetd's log; on a timeout prints what a reader needs to see why.
    pub fn wait_log(&mut self, what: &str, timeout: Duration, matches: impl FnMut(&str) -> bool) {
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.daemon.wait_for_log(what, timeout, matches);
        }));
        if let Err(panic) = waited {
            self.dump();
            std::panic::resume_unwind(panic);
        }
    }

    /// Waits until the lead has listed fleetd's tools, then a little longer than fleetd waits
    /// before it counts a lister ready ([`fleetd::mcp::TOOLS_SETTLE`]): typing earlier would
    /// start a turn without them.
    pub fn wait_lead_tools(&mut self) {
        self.wait_log(
            "the lead to list fleetd's tools",
            Duration::from_secs(60),
            |line| line.contains("MCP tools listed") && line.contains("\"caller\":\"lead "),
        );
        pause(Duration::from_millis(600));
    }

    /// fleetd's log so far (every daemon's this rig ran), one JSON object per line.
    pub fn log(&mut self) -> Vec<Value> {
        let current: Vec<String> = self.daemon.logs_so_far().to_vec();
        self.previous_logs
            .iter()
            .chain(&current)
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Asserts, from fleetd's log, that `target`'s task was typed only once its agent had had
    /// fleetd's tools for [`fleetd::mcp::TOOLS_SETTLE`] (fix 2 of the real-agents issue).
    pub fn assert_task_typed_after_tools(&mut self, target: &str) {
        let pane = self
            .member(target)
            .and_then(|m| m["paneId"].as_str().map(str::to_owned))
            .expect("the member's pane");
        let log = self.log();
        let at = |pred: &dyn Fn(&Value) -> bool| -> jiff::Timestamp {
            log.iter()
                .find(|l| pred(l))
                .and_then(|l| l["timestamp"].as_str()?.parse().ok())
                .unwrap_or_else(|| panic!("no such line in fleetd's log for {target}"))
        };
        let listed = at(&|l| {
            l["message"] == "MCP tools listed"
                && l["pane"].as_str().is_some_and(|p| p.contains(&pane))
        });
        let typed = at(&|l| l["message"] == "typing a task" && l["member"] == target);
        let gap = typed.duration_since(listed);
        assert!(
            !gap.is_negative(),
            "{target}'s task was typed {:#} before its agent listed fleetd's tools",
            gap.abs()
        );
        let gap = Duration::try_from(gap).expect("a positive gap");
        assert!(
            gap >= fleetd::mcp::TOOLS_SETTLE,
            "typed {gap:?} after the tools were listed"
        );
    }

    /// The names of the user's windows (tmux) or tabs (herdr).
    pub fn windows(&self) -> Vec<String> {
        self.panes.names()
    }

    /// Everything `target` showed, its scrollback included.
    pub fn history(&self, target: &str) -> String {
        self.panes.history(target)
    }

    /// The environment of `target`'s process and every process under it, one string per
    /// process (`/proc/PID/environ`, NULs as newlines).
    pub fn environments(&self, target: &str) -> Vec<String> {
        crate::tree_environments(self.panes.pid(target))
    }

    /// Each process in pane `target`'s tree: its uid and command line.
    pub fn processes(&self, target: &str) -> Vec<(u32, String)> {
        crate::tree_pids(self.panes.pid(target))
            .into_iter()
            .filter_map(|p| {
                let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
                let uid = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Uid:"))?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()?;
                let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).ok()?;
                Some((uid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
            })
            .collect()
    }

    /// Prints every pane's screen and what each model was asked.
    pub fn dump(&self) {
        for (target, what) in self.panes.list() {
            eprintln!("---- {what} ----\n{}", self.screen(&target));
        }
        for (name, model) in [("lead", &self.lead_model), ("member", &self.member_model)] {
            for r in model.requests() {
                eprintln!(
                    "{name} model #{}: prompt {:?} steps {} tools {} -> {}",
                    r["n"],
                    r["prompt"]
                        .as_str()
                        .map(|p| p.chars().take(120).collect::<String>()),
                    r["steps"],
                    r["tools"].as_array().map_or(0, Vec::len),
                    r["answer"]
                );
            }
        }
    }

    /// The Codex `app-server` daemons of this rig's user: processes whose arguments are
    /// `codex app-server …` and whose program lies under the rig's HOME (where Codex installs
    /// its daemon).
    pub fn codex_daemons(&self) -> Vec<u32> {
        let home = self.home.path().display().to_string();
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                    return false;
                };
                let argv: Vec<String> = raw
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                argv.first().is_some_and(|p| p.starts_with(&home))
                    && argv.get(1).is_some_and(|a| a == "app-server")
            })
            .collect()
    }

    /// The fleet's members as the operator sees them (`GET /sessions`).
    pub fn members(&self) -> Value {
        crate::http::get(self.daemon.operator(), "/sessions")
            .expect("GET /sessions")
            .json()
    }

    /// One member's state (`GET /sessions/{target}`), or `None` before it exists.
    pub fn member(&self, target: &str) -> Option<Value> {
        let r = crate::http::get(self.daemon.operator(), &format!("/sessions/{target}")).ok()?;
        (r.status == 200).then(|| r.json())
    }
}

impl Drop for AgentRig {
    /// A Codex daemon outlives its pane and the tmux server: it goes with the rig.
    fn drop(&mut self) {
        for pid in self.codex_daemons() {
            if let Some(pid) = rustix::process::Pid::from_raw(pid.cast_signed()) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A person's pause (between typing and Enter, or before typing at all).
#[expect(
    clippy::disallowed_methods,
    reason = "a person's pause between typing and Enter is wall-clock time"
)]
pub fn pause(d: Duration) {
    std::thread::sleep(d);
}

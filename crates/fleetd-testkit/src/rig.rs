//! An end-to-end rig: a private tmux server, a `fleetd` process configured for it, and a lead
//! pane (a shell) from which MCP calls are made with `mcp-call`, so fleetd identifies them as the
//! lead's. Members are spawned through `fleet_spawn` like a user would. Used by the end-to-end
//! tests and the demo; never by the daemon.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::daemon::{Daemon, write_config};
use crate::tmux::TmuxServer;
use crate::{bin_path, wait_until};

/// The tmux target of the lead pane.
pub const LEAD: &str = "base:lead";

/// A running rig.
#[derive(Debug)]
pub struct Rig {
    /// The daemon. Declared (so dropped) before the tmux server: a server killed while the
    /// daemon's control clients are attached is reconnected to as it exits, and those clients,
    /// orphaned by the daemon's SIGKILL a moment later, kept the dying server alive (a tmux
    /// server leaked per test).
    pub daemon: Daemon,
    /// The private tmux server.
    pub tmux: TmuxServer,
    home: tempfile::TempDir,
    calls: AtomicUsize,
}

/// A profile for a `sim-agent` member with the given extra environment.
pub fn sim_profile(name: &str, env: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "  {name}:\n    agent: custom\n    command: {}\n    env:\n",
        bin_path("sim-agent").display()
    );
    for (k, v) in env {
        yaml.push_str(&format!("      {k}: \"{v}\"\n"));
    }
    if env.is_empty() {
        yaml.push_str("      SIM_AGENT_WORK_MS: \"300\"\n");
    }
    yaml
}

impl Rig {
    /// Starts tmux, fleetd with `extra` config appended (e.g. a `profiles:` block), and the lead
    /// pane.
    pub fn start(extra: &str) -> Self {
        Self::start_on(extra, "127.0.0.1:0")
    }

    /// [`Rig::start`] where tmux is there; `None` (the test returns, having said why) where it
    /// is not, outside CI (under CI a missing tmux fails the test).
    pub fn start_if_tmux(extra: &str) -> Option<Self> {
        (crate::require_tmux() == crate::Service::Present).then(|| Self::start(extra))
    }

    /// Like [`Rig::start`], with fleetd listening on `listen` (port 0: a free port, picked
    /// before fleetd starts).
    ///
    /// The lead window opens before fleetd does: tmux before 3.7 crashes when a window opens
    /// while a control client attaches, and fleetd attaches its control clients as it starts
    /// (fleetd keeps its own changes away from them; the rig's tmux commands it cannot see).
    pub fn start_on(extra: &str, listen: &str) -> Self {
        Self::start_with_env(extra, listen, &[])
    }

    /// [`Rig::start_on`] with `env` added to fleetd's own environment (a `PATH` holding a
    /// stand-in for a program it runs, say).
    pub fn start_with_env(extra: &str, listen: &str, env: &[(String, String)]) -> Self {
        let tmux = TmuxServer::start().expect("private tmux server");
        let home = tempfile::tempdir().expect("tempdir");
        let config = format!(
            "multiplexer: tmux\ntmuxSocket: {}\nmembersWorkspace: fleet\nlog:\n  level: fleetd=debug,info\n{extra}",
            tmux.socket().display()
        );
        write_config(home.path(), &config);
        let listen = match listen.strip_suffix(":0") {
            Some(host) => format!("{host}:{}", crate::free_port()),
            None => listen.to_owned(),
        };
        let url = format!("FLEETD_URL=http://{listen}");
        tmux.run_ok(&[
            "new-window",
            "-d",
            "-t",
            "base",
            "-n",
            "lead",
            "-e",
            &url,
            "bash",
            "--norc",
            "--noprofile",
        ]);
        let daemon = Daemon::start_with_env(home.path(), &listen, &[], env);
        Self {
            tmux,
            daemon,
            home,
            calls: AtomicUsize::new(0),
        }
    }

    /// Kills the daemon with SIGKILL (no clean shutdown) and waits until it is gone.
    pub fn kill_daemon(&mut self) {
        self.daemon.signal("KILL");
        self.daemon.wait_exit(Duration::from_secs(30));
    }

    /// Starts a new daemon on the same HOME — the same config file and state directory, so the
    /// embedded inbox is the one the previous daemon wrote — and the same address, so every
    /// pane's `FLEETD_URL` reaches it. The previous daemon must have exited
    /// ([`Rig::kill_daemon`]).
    pub fn restart_daemon(&mut self) {
        let listen = self.daemon.addr.to_string();
        self.daemon = Daemon::start_on(self.home.path(), &listen, &[]);
    }

    /// The rig's scratch directory.
    pub fn dir(&self) -> &Path {
        self.home.path()
    }

    /// Calls `tool` with `args` from the lead pane and returns the JSON-RPC result (a
    /// `CallToolResult`); panics with the output when the call itself failed.
    pub fn lead(&self, tool: &str, args: &Value) -> Value {
        self.call_from(LEAD, tool, args, Duration::from_secs(120))
    }

    /// Sends `task` to `target` from the lead pane without waiting (`fleet_send`,
    /// `wait: false`); its ticket.
    pub fn send_task(&self, target: &str, task: &str) -> String {
        let sent = structured_ok(&self.lead(
            "fleet_send",
            &serde_json::json!({ "target": target, "task": task, "wait": false }),
        ));
        sent["ticket"].as_str().expect("ticket").to_owned()
    }

    /// Polls `ticket` from the lead until it is replied (or 90 s pass); the reply's text.
    pub fn reply_of(&self, ticket: &str) -> String {
        let mut last = Value::Null;
        wait_until("the member's reply", Duration::from_secs(90), || {
            last =
                structured_ok(&self.lead("fleet_poll", &serde_json::json!({ "ticket": ticket })));
            last["state"] == "replied"
        });
        last["reply"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Polls `target`'s inbox from the lead until it holds an open question (or 90 s pass); the
    /// first one (`questionId`, `question`).
    pub fn question_from(&self, target: &str) -> Value {
        let mut inbox = Value::Null;
        wait_until(
            &format!("a question from {target}"),
            Duration::from_secs(90),
            || {
                inbox = structured_ok(
                    &self.lead("fleet_poll", &serde_json::json!({ "target": target })),
                );
                inbox["questions"].as_array().is_some_and(|q| !q.is_empty())
            },
        );
        inbox["questions"][0].clone()
    }

    /// Sends `task` to member `target` and waits for its reply's text: for a sim-agent that
    /// runs its tasks as shell commands (`SIM_AGENT_SCRIPT=shell`), `exit N` and the output.
    pub fn run_task(&self, target: &str, task: &str) -> String {
        self.reply_of(&self.send_task(target, task))
    }

    /// `command`, run by such a member `target`, fails, and its output says `why`.
    pub fn refused_in(&self, target: &str, command: &str, why: &str) {
        let out = self.run_task(target, command);
        assert!(
            !out.starts_with("exit 0") && out.contains(why),
            "{command:?} as member {target}: {out}"
        );
    }

    /// Member `target` (such a shell member) cannot reach the rig's tmux server, the user's:
    /// it types nothing into the lead and opens no window there.
    pub fn refused_the_tmux_server(&self, target: &str) {
        let socket = self.tmux.socket().display().to_string();
        self.refused_in(
            target,
            &format!("tmux -S {socket} send-keys -t {LEAD} 'echo owned' Enter"),
            "",
        );
        self.refused_in(target, &format!("tmux -S {socket} new-window"), "");
        assert!(
            !self.history(LEAD).contains("owned"),
            "{target} typed into the lead"
        );
    }

    /// Calls `tool` from the shell in tmux target `pane`.
    pub fn call_from(&self, pane: &str, tool: &str, args: &Value, timeout: Duration) -> Value {
        let out_file = self.start_call(pane, tool, args);
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(&format!("{tool} from {pane}"), timeout, || {
                out_file.exists()
            });
        }));
        if let Err(panic) = waited {
            eprintln!("---- lead pane ----\n{}", self.screen(pane));
            eprintln!("---- members ----\n{}", self.screen("fleet:"));
            std::panic::resume_unwind(panic);
        }
        let body: Value = serde_json::from_slice(&std::fs::read(&out_file).expect("read out"))
            .expect("out is JSON");
        match body.get("result") {
            Some(result) => result.clone(),
            None => panic!("{tool} failed: {body}"),
        }
    }

    /// Starts a call from the lead pane without waiting; returns the file its result lands in.
    pub fn lead_async(&self, tool: &str, args: &Value) -> PathBuf {
        self.start_call(LEAD, tool, args)
    }

    /// Types an `mcp-call` command line into `pane`; returns the file its result lands in.
    /// Sends one JSON-RPC request from tmux target `pane` as an MCP 2026-07-28 client that
    /// takes MCP tasks (`mcp-call --rpc-file`); returns `{"status", "result"|"error"}`.
    pub fn rpc_from(&self, pane: &str, method: &str, params: &Value) -> Value {
        let out_file = self.type_mcp_call(
            pane,
            &format!("--rpc-file {method}"),
            params,
            ["rpc", "rpc-out"],
        );
        wait_until(
            &format!("{method} from {pane}"),
            Duration::from_secs(60),
            || out_file.exists(),
        );
        serde_json::from_str(&std::fs::read_to_string(&out_file).expect("rpc answer"))
            .expect("rpc answer is JSON")
    }

    fn start_call(&self, pane: &str, tool: &str, args: &Value) -> PathBuf {
        self.type_mcp_call(pane, tool, args, ["args", "out"])
    }

    /// Writes `input` to a file of this call's own and types `mcp-call WORDS INPUT OUT` into
    /// `pane`; the file `OUT` its answer lands in. The files are named `{stem}-{n}.json` by
    /// `stems` (the input's, the answer's), `n` counting the rig's calls.
    fn type_mcp_call(&self, pane: &str, words: &str, input: &Value, stems: [&str; 2]) -> PathBuf {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let [input_file, out_file] = stems.map(|stem| self.dir().join(format!("{stem}-{n}.json")));
        std::fs::write(&input_file, input.to_string()).expect("write the call's input");
        self.type_keys(
            pane,
            &format!(
                "{} {words} {} {}",
                bin_path("mcp-call").display(),
                input_file.display(),
                out_file.display()
            ),
            true,
        );
        out_file
    }

    /// Types `line` into tmux target `pane` and presses Enter, both in one tmux command list:
    /// the server runs a client's list whole, so a nudge fleetd types meanwhile cannot land
    /// between the line and its Enter (which would corrupt the call, and the test would wait
    /// for it forever).
    pub fn type_line(&self, pane: &str, line: &str) {
        self.type_keys(pane, line, false);
    }

    /// [`Rig::type_line`], with `enter_first` an Enter before the line in the same list. fleetd
    /// pastes a nudge and presses its Enter only once the pane shows the paste, so a shell
    /// lead's command typed in between would be glued to the nudge's text; the Enter first
    /// submits that text on its own line (the shell refuses it) and the command runs whole.
    fn type_keys(&self, pane: &str, line: &str, enter_first: bool) {
        let mut args = vec!["send-keys", "-t", pane, "Enter"];
        // tmux reads an argument ending in `;` as the end of a command, and `\;` as a `;`
        // (tmux 3.3a cmd-parse.c, cmd_parse_from_arguments): a backslash keeps it literal.
        let literal = match line.strip_suffix(';') {
            Some(head) => format!("{head}\\;"),
            None => line.to_owned(),
        };
        if !line.is_empty() {
            args.splice(0..0, ["send-keys", "-t", pane, "-l", "--", &literal, ";"]);
        }
        if enter_first {
            args.splice(0..0, ["send-keys", "-t", pane, "Enter", ";"]);
        }
        self.tmux.run_ok(&args);
    }

    /// The pid of the process tmux started in target `pane` (a member's agent, once its
    /// launcher has exec'd it).
    pub fn pane_pid(&self, pane: &str) -> u32 {
        self.list_panes(pane, "#{pane_pid}")
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no pane pid for {pane}"))
    }

    /// The tmux pane ids (`%N`) in window `window`, in order.
    pub fn pane_ids(&self, window: &str) -> Vec<String> {
        self.list_panes(window, "#{pane_id}")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `tmux list-panes -t target -F format`: a line for each pane of `target`'s window.
    fn list_panes(&self, target: &str, format: &str) -> String {
        let out = self
            .tmux
            .run(&["list-panes", "-t", target, "-F", format])
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What tmux target `pane` shows now.
    pub fn screen(&self, pane: &str) -> String {
        let out = self
            .tmux
            .run(&["capture-pane", "-p", "-t", pane])
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Everything tmux target `pane` printed, scrollback included, wrapped lines joined.
    pub fn history(&self, pane: &str) -> String {
        let out = self
            .tmux
            .run(&["capture-pane", "-p", "-J", "-S", "-", "-t", pane])
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Opens window `name` in the `base` session running a `sim-agent` lead in `call` mode (each
    /// line typed into it is `TOOL {json}`, which it calls over MCP, so fleetd sees an agent lead
    /// with a real status in that pane); returns its tmux target once the agent is ready.
    pub fn agent_lead(&self, name: &str) -> String {
        self.agent_lead_with(name, &[])
    }

    /// Like [`Rig::agent_lead`] with extra `KEY=value` environment (e.g. `SIM_AGENT_LOG=...`).
    pub fn agent_lead_with(&self, name: &str, env: &[String]) -> String {
        let url = format!("FLEETD_URL=http://{}", self.daemon.addr);
        let sim = bin_path("sim-agent").display().to_string();
        let mut args = vec![
            "new-window",
            "-d",
            "-t",
            "base",
            "-n",
            name,
            "-e",
            &url,
            "-e",
            "SIM_AGENT_SCRIPT=call",
            "-e",
            "SIM_AGENT_WORK_MS=100",
        ];
        for kv in env {
            args.extend(["-e", kv.as_str()]);
        }
        args.push(&sim);
        self.tmux.run_ok(&args);
        let target = format!("base:{name}");
        wait_until("the agent lead to start", Duration::from_secs(30), || {
            self.screen(&target).contains("sim-agent ready")
        });
        target
    }

    /// The members the lead's `fleet_list` shows now.
    pub fn members(&self) -> Vec<Value> {
        let listed = structured_ok(&self.lead("fleet_list", &serde_json::json!({})));
        listed["members"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| panic!("fleet_list lists no members array: {listed}"))
    }

    /// Member `name` as the lead's `fleet_list` shows it now; panics with the list when it is
    /// not there.
    pub fn member(&self, name: &str) -> Value {
        let members = self.members();
        members
            .iter()
            .find(|m| m["target"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} is not in the fleet: {members:?}"))
    }

    /// Profile `name` as the lead's `fleet_profiles` shows it now; panics with the list when it
    /// is not there.
    pub fn profile(&self, name: &str) -> Value {
        let listed = structured_ok(&self.lead("fleet_profiles", &serde_json::json!({})));
        listed["profiles"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no profile {name}: {listed}"))
    }

    /// Spawns a member from `profile` named `name` and returns the tool's structured result.
    pub fn spawn(&self, profile: &str, name: &str) -> Value {
        let result = self.lead(
            "fleet_spawn",
            &serde_json::json!({ "profile": profile, "name": name }),
        );
        structured_ok(&result)
    }
}

/// The `structuredContent` of a successful tool result; panics with the result otherwise.
pub fn structured_ok(result: &Value) -> Value {
    assert_eq!(result["isError"], false, "tool failed: {result}");
    result["structuredContent"].clone()
}

/// The error code of a failed tool result; panics when it succeeded.
pub fn error_code(result: &Value) -> String {
    assert_eq!(result["isError"], true, "expected a tool error: {result}");
    result["structuredContent"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

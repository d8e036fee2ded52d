//! The end-to-end rig on herdr: a `fake-herdr` process (real PTY panes, herdr's protocol and
//! agent detection, fault injection), a `fleetd` configured for it, and lead agents opened the
//! way a user would — a tab with a shell, then the agent started in it. Members are spawned
//! through `fleet_spawn` typed into a lead. Used by the end-to-end tests; never by the daemon.

use std::time::Duration;

use serde_json::{Value, json};

use crate::daemon::{Daemon, write_config};
use crate::fake_herdr::HerdrVersion;
use crate::fake_herdr::process::FakeHerdrProcess;
use crate::{bin_path, wait_until};

/// A running herdr rig.
#[derive(Debug)]
pub struct HerdrRig {
    /// The daemon (dropped first: it talks to the fake).
    pub daemon: Daemon,
    /// The fake herdr server (the lead daemon).
    pub herdr: FakeHerdrProcess,
    /// The members' fake herdr server, when the rig has two.
    pub member: Option<FakeHerdrProcess>,
    home: tempfile::TempDir,
}

/// A `sim-agent` profile for herdr: `HERDR_AGENT=claude` makes herdr detect it as an agent.
pub fn sim_profile(name: &str, work_ms: u32) -> String {
    format!(
        "  {name}:\n    agent: custom\n    command: {}\n    env:\n      HERDR_AGENT: claude\n      SIM_AGENT_WORK_MS: \"{work_ms}\"\n",
        bin_path("sim-agent").display()
    )
}

impl HerdrRig {
    /// Starts fake-herdr and fleetd on it with `extra` config appended.
    pub fn start(extra: &str) -> Self {
        Self::start_with(extra, false, &[], None)
    }

    /// A rig whose primary tab is `w1:t1` (its lead never reminded), with `profiles` (the YAML
    /// under `profiles:`), a lead agent `boss`, and a member `member` that lead spawned from
    /// `profile`; the rig and the lead's pane.
    pub fn with_member(profiles: &str, [profile, member]: [&str; 2]) -> (Self, String) {
        let rig = Self::start(&format!(
            "primary:\n  tab: w1:t1\n  pushReminders: 0\nprofiles:\n{profiles}"
        ));
        let (_, lead) = rig.agent_lead("boss");
        rig.spawned(&lead, profile, member);
        (rig, lead)
    }

    /// Like [`HerdrRig::start`] with fake-herdr behaving as herdr `herdr` (0.8.2 or 0.9).
    pub fn start_as(extra: &str, herdr: HerdrVersion) -> Self {
        Self::start_with(extra, false, &[], Some(herdr))
    }

    /// Like [`HerdrRig::start`] with new panes running `shell` (a path) instead of `/bin/sh`.
    pub fn start_with_shell(extra: &str, shell: &str) -> Self {
        Self::start_with(extra, false, &["--shell", shell], None)
    }

    /// Like [`HerdrRig::start`] with every pane `rows` rows tall (as when a tall client is
    /// attached to herdr).
    pub fn start_with_rows(extra: &str, rows: u16) -> Self {
        let rows = rows.to_string();
        Self::start_with(extra, false, &["--rows", &rows], None)
    }

    /// Like [`HerdrRig::start`] with fake-herdr writing each agent status it reports to
    /// `status_log` (`--status-log`), when it reports it.
    pub fn start_with_status_log(extra: &str, status_log: &std::path::Path) -> Self {
        let path = status_log.display().to_string();
        Self::start_with(extra, false, &["--status-log", &path], None)
    }

    /// Like [`HerdrRig::start`] with a second fake-herdr for members (`memberHerdrSocket`):
    /// both number their panes from `w1:p1`, so pane ids collide and only the daemon-qualified
    /// form (`lead:` / `member:`) tells them apart.
    pub fn start_two(extra: &str) -> Self {
        Self::start_with(extra, true, &[], None)
    }

    /// `herdr`: the herdr the fake behaves as (`None`: `FAKE_HERDR_VERSION`, else 0.8.2).
    fn start_with(extra: &str, two: bool, fake_args: &[&str], herdr: Option<HerdrVersion>) -> Self {
        let home = tempfile::tempdir().expect("tempdir");
        let socket = home.path().join("herdr.sock");
        let binary = bin_path("fake-herdr");
        let herdr = match herdr {
            Some(version) => FakeHerdrProcess::start_as(&binary, &socket, version, fake_args),
            None => FakeHerdrProcess::start_with_args(&binary, &socket, fake_args),
        }
        .expect("fake-herdr starts");
        let mut config = format!(
            "multiplexer: herdr\nherdrSocket: {}\nmembersWorkspace: fleet\nlog:\n  level: fleetd=debug,info\n{extra}",
            socket.display()
        );
        let member = two.then(|| {
            let socket = home.path().join("member-herdr.sock");
            config.push_str(&format!("memberHerdrSocket: {}\n", socket.display()));
            FakeHerdrProcess::start(&bin_path("fake-herdr"), &socket)
                .expect("member fake-herdr starts")
        });
        write_config(home.path(), &config);
        let daemon = Daemon::start(home.path(), &[]);
        Self {
            daemon,
            herdr,
            member,
            home,
        }
    }

    /// One API call that must succeed; returns its `result`.
    pub fn call(&self, method: &str, params: &Value) -> Value {
        call(&self.herdr, method, params)
    }

    /// Opens a tab labelled `label` (the first one in a new workspace `main`) and starts a
    /// `sim-agent` lead in `call` mode in it; returns `(tab id, pane id)`.
    pub fn agent_lead(&self, label: &str) -> (String, String) {
        self.agent_lead_with(label, &[])
    }

    /// Like [`HerdrRig::agent_lead`] with extra `KEY=value` environment for the agent.
    pub fn agent_lead_with(&self, label: &str, env: &[String]) -> (String, String) {
        let root = self.herdr.open_tab(label).expect("a tab opens");
        let pane = root["pane_id"].as_str().expect("root pane id").to_owned();
        let tab = root["tab_id"].as_str().expect("tab id").to_owned();
        self.start_agent_with(&pane, env);
        (tab, pane)
    }

    /// Starts a `sim-agent` lead in the shell of `pane` and waits until it is ready.
    pub fn start_agent(&self, pane: &str) {
        self.start_agent_with(pane, &[]);
    }

    /// Like [`HerdrRig::start_agent`] with extra `KEY=value` environment (no spaces or quotes).
    pub fn start_agent_with(&self, pane: &str, env: &[String]) {
        start_sim_lead(&self.herdr, self.daemon.addr, pane, env);
    }

    /// Types `line` into `pane` and presses Enter.
    pub fn type_line(&self, pane: &str, line: &str) {
        type_line(&self.herdr, pane, line);
    }

    /// Everything `pane` printed (its recent scrollback).
    pub fn history(&self, pane: &str) -> String {
        history(&self.herdr, pane)
    }

    /// Types a tool call into an agent lead and waits until the turn that made it ends.
    pub fn call_from(&self, pane: &str, line: &str) {
        let done = self.history(pane).matches("turn done").count();
        self.type_line(pane, line);
        wait_until(
            &format!("the lead's turn `{line}` to end"),
            Duration::from_secs(60),
            || self.history(pane).matches("turn done").count() > done,
        );
    }

    /// Has lead `lead` spawn `name` from `profile` (`fleet_spawn`, its turn waited out); the
    /// member's herdr pane, once the operator lists it (panics with the lead's screen if not).
    pub fn spawned(&self, lead: &str, profile: &str, name: &str) -> String {
        self.call_from(
            lead,
            &format!(r#"fleet_spawn {{"profile":"{profile}","name":"{name}"}}"#),
        );
        let member = crate::http::get(self.daemon.operator(), &format!("/sessions/{name}"))
            .expect("session");
        assert_eq!(
            member.status,
            200,
            "{name} was spawned and became ready: {}",
            self.history(lead)
        );
        member.json()["paneId"]
            .as_str()
            .and_then(|p| p.strip_prefix("lead:"))
            .expect("a pane id")
            .to_owned()
    }

    /// Has lead `lead` send `task` to member `member` without waiting (`fleet_send`, its turn
    /// waited out), then waits up to 90 s for the member's first reply in its inbox; its text.
    pub fn run_task(&self, lead: &str, member: &str, task: &str) -> String {
        let args = json!({ "target": member, "task": task, "wait": false });
        self.call_from(lead, &format!("fleet_send {args}"));
        let mut texts = Vec::new();
        wait_until(
            &format!("{member}'s reply"),
            Duration::from_secs(90),
            || {
                texts = crate::http::reply_texts(self.daemon.operator(), member);
                !texts.is_empty()
            },
        );
        texts.swap_remove(0)
    }

    /// The rig's scratch directory.
    pub fn dir(&self) -> &std::path::Path {
        self.home.path()
    }
}

/// Starts a `sim-agent` lead in `call` mode (talking to the fleetd at `fleetd`) in the shell of
/// `pane` of `herdr`, with extra `KEY=value` environment (no spaces or quotes), and waits until
/// it is ready.
pub fn start_sim_lead(
    herdr: &FakeHerdrProcess,
    fleetd: std::net::SocketAddr,
    pane: &str,
    env: &[String],
) {
    let before = history(herdr, pane).matches("sim-agent ready").count();
    let line = format!(
        "exec env HERDR_AGENT=claude SIM_AGENT_SCRIPT=call SIM_AGENT_WORK_MS=100 FLEETD_URL=http://{fleetd} {} {}",
        env.join(" "),
        bin_path("sim-agent").display()
    );
    type_line(herdr, pane, &line);
    wait_until("the lead agent to start", Duration::from_secs(30), || {
        history(herdr, pane).matches("sim-agent ready").count() > before
    });
}

/// Types `line` into `pane` of `herdr` and presses Enter.
pub fn type_line(herdr: &FakeHerdrProcess, pane: &str, line: &str) {
    call(
        herdr,
        "pane.send_input",
        &json!({ "pane_id": pane, "text": line, "keys": ["Enter"] }),
    );
}

/// Everything `pane` of `herdr` printed (its recent scrollback).
pub fn history(herdr: &FakeHerdrProcess, pane: &str) -> String {
    call(
        herdr,
        "pane.read",
        &json!({ "pane_id": pane, "source": "recent", "lines": 2000 }),
    )["read"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// One API call to `herdr` that must succeed; returns its `result`.
fn call(herdr: &FakeHerdrProcess, method: &str, params: &Value) -> Value {
    let reply = herdr.call(method, params).expect("fake-herdr answers");
    match reply.get("result") {
        Some(result) => result.clone(),
        None => panic!("{method} failed: {reply}"),
    }
}

//! `fleetd demo` (run as the `fleetd-demo` binary, which `fleetd demo` execs): a scripted
//! session a newcomer can watch. A private tmux server and a fleetd on a temporary state dir, a
//! lead agent pane and two member agents (`sim-agent`s), then: two tasks delegated, a reply that
//! lands while the lead is busy, the nudge when it goes idle, a question answered, a member
//! stopped, fleetd killed with SIGKILL while a reply is unread and restarted on the same state,
//! and every reply accounted for. Prints each step as it plays and a report with timings; exits
//! 0 only if every step happened and no reply was lost. Owns the scenario's frame (options,
//! start-up, the step runner, cleanup on the way out); `steps` holds the steps themselves, `log`
//! reads the agents, `report` counts and prints, and the rig (`crate::rig`) starts and drives
//! the processes.

mod cleanup;
pub(crate) mod log;
mod report;
mod steps;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use self::log::{AgentLog, Lead, between, now_us};
use self::report::{Found, StepRecord};
use crate::http;
use crate::rig::{Rig, sim_profile};

/// How long the newcomer gets to attach before the session starts.
const ATTACH_PAUSE: Duration = Duration::from_secs(5);
/// The pause between steps when someone is watching, so each is seen.
const STEP_PAUSE: Duration = Duration::from_millis(1500);
/// alice's turn: short, so her reply lands while the lead still waits on bob.
const ALICE_WORK_MS: &str = "1000";
/// bob's turn: long enough for alice to finish first with a wide margin.
const BOB_WORK_MS: &str = "3000";
/// The first step, which runs before the session exists.
const START_TITLE: &str = "Start a private tmux server, fleetd and the lead";
/// The tmux window of the lead (and the primary lead tab in fleetd's config).
const LEAD_WINDOW: &str = "lead";

/// Command-line options of `fleetd-demo`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Start at once and do not pace the steps (for tests and impatient people).
    pub no_pause: bool,
    /// The `fleetd` binary to run (default: the one next to this executable).
    pub fleetd: Option<PathBuf>,
    /// Follow the demo in a headless Chromium signed in to the dashboard and save a screenshot
    /// of it here while bob's question is open (how `docs/dashboard.png` is made).
    pub screenshot: Option<PathBuf>,
}

impl Options {
    /// Parses `[--no-pause] [--fleetd PATH] [--screenshot PNG]`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut options = Self::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--no-pause" => options.no_pause = true,
                "--fleetd" => {
                    let path = args.next().context("--fleetd needs the binary's path")?;
                    options.fleetd = Some(PathBuf::from(path));
                }
                "--screenshot" => {
                    let path = args.next().context("--screenshot needs a .png path")?;
                    options.screenshot = Some(PathBuf::from(path));
                }
                "-h" | "--help" => bail!(
                    "usage: fleetd-demo [--no-pause] [--fleetd PATH] [--screenshot PNG] (normally run as `fleetd demo`)"
                ),
                other => bail!(
                    "unknown argument {other:?}; usage: fleetd-demo [--no-pause] [--fleetd PATH] [--screenshot PNG]"
                ),
            }
        }
        Ok(options)
    }
}

/// Entry point of the `fleetd-demo` binary.
pub fn main(args: &[String]) -> ExitCode {
    let outcome = Options::parse(args).and_then(|options| run(&options));
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fleetd demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; true when every step happened and no reply was lost.
pub fn run(options: &Options) -> anyhow::Result<bool> {
    cleanup::install()?;
    if let Some(fleetd) = &options.fleetd {
        crate::daemon::use_fleetd_binary(fleetd.clone());
    }
    let tmux_found = std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(
        tmux_found,
        "fleetd demo needs tmux on PATH (e.g. `apt-get install tmux`)"
    );
    let scratch = tempfile::Builder::new()
        .prefix("fleetd-demo-")
        .tempdir()
        .context("failed to create the demo's temp dir")?;
    let logs = Logs {
        lead: AgentLog::new(&scratch.path().join("lead.log")),
        alice: AgentLog::new(&scratch.path().join("alice.log")),
        bob: AgentLog::new(&scratch.path().join("bob.log")),
    };
    println!("fleetd demo: a lead agent delegates to two member agents through fleetd.");
    println!("Starting a private tmux server and fleetd...");
    let started = now_us();
    let setup = std::panic::catch_unwind(|| start(&logs));
    let (rig, lead, listen) = match setup {
        Ok(Ok(parts)) => parts,
        Ok(Err(e)) => return fail_early(started, &format!("{e:#}")),
        Err(panic) => return fail_early(started, &panic_text(&*panic)),
    };
    cleanup::register(
        rig.tmux.socket().to_owned(),
        rig.daemon.child.id(),
        vec![
            rig.tmux.dir().to_owned(),
            rig.dir().to_owned(),
            scratch.path().to_owned(),
        ],
    );
    let mut session = Session {
        rig,
        lead,
        logs,
        options: options.clone(),
        steps: Vec::new(),
        notes: Vec::new(),
        facts: Facts::default(),
        browser: None,
    };
    if options.screenshot.is_some() {
        match session.open_dashboard() {
            Ok(browser) => session.browser = Some(browser),
            Err(e) => session
                .notes
                .push(format!("no dashboard screenshot: {e:#}")),
        }
    }
    let detail = format!(
        "fleetd on {listen}, state in {}; the lead is a sim-agent in tmux window {LEAD_WINDOW}",
        crate::daemon::state_dir(session.rig.dir()).display()
    );
    session.steps.push(StepRecord {
        title: START_TITLE.to_owned(),
        took: between(started, now_us()),
        outcome: Ok(detail.clone()),
    });
    session.invite();
    println!("\n[1] {START_TITLE}\n    {detail}");
    let played = session.play();
    if let Err(e) = &played {
        session.diagnose(e);
    }
    let tally = played.is_ok().then(|| session.tally()).transpose();
    let tally = match tally {
        Ok(t) => t,
        Err(e) => {
            session
                .notes
                .push(format!("could not count replies: {e:#}"));
            None
        }
    };
    print!(
        "{}",
        report::render(&session.steps, &session.notes, tally.as_ref())
    );
    session.linger();
    let socket_dir = session.rig.tmux.dir().to_owned();
    drop(session);
    drop(scratch);
    println!(
        "cleaned up: tmux server killed, fleetd stopped, {} removed",
        socket_dir.display()
    );
    Ok(played.is_ok() && tally.is_some_and(|t| t.lost.is_empty() && t.failed == 0))
}

/// Reports a failure before the session existed (nothing to count) and returns false.
fn fail_early(started: i64, why: &str) -> anyhow::Result<bool> {
    let step = StepRecord {
        title: START_TITLE.to_owned(),
        took: between(started, now_us()),
        outcome: Err(why.to_owned()),
    };
    print!("{}", report::render(&[step], &[], None));
    Ok(false)
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a step panicked".to_owned())
}

/// A free loopback port for fleetd, chosen once so the restarted daemon listens where the
/// panes' `FLEETD_URL` points.
fn free_listen_addr() -> anyhow::Result<String> {
    let probe = TcpListener::bind("127.0.0.1:0").context("failed to find a free port")?;
    Ok(probe.local_addr()?.to_string())
}

/// The agents' event logs.
#[derive(Debug)]
struct Logs {
    lead: AgentLog,
    alice: AgentLog,
    bob: AgentLog,
}

/// Starts the rig: tmux, fleetd on a fixed free port with two member profiles, the lead agent.
fn start(logs: &Logs) -> anyhow::Result<(Rig, Lead, String)> {
    let listen = free_listen_addr()?;
    let config = format!(
        "primary:\n  tab: base:{LEAD_WINDOW}\n  pushReminders: 1\n  pushBackoffMs: 60000\nprofiles:\n{}{}",
        sim_profile(
            "writer",
            &[
                ("SIM_AGENT_WORK_MS", ALICE_WORK_MS),
                ("SIM_AGENT_LOG", &logs.alice.path().display().to_string()),
            ],
        ),
        sim_profile(
            "reviewer",
            &[
                ("SIM_AGENT_SCRIPT", "reply,ask"),
                ("SIM_AGENT_WORK_MS", BOB_WORK_MS),
                ("SIM_AGENT_LOG", &logs.bob.path().display().to_string()),
            ],
        ),
    );
    let rig = Rig::start_on(&config, &listen);
    // The rig's own lead is a plain shell for `mcp-call`; the demo's lead is an agent, whose
    // status fleetd reads and into which it types nudges. It takes the shell's window name.
    tmux(&rig, &["kill-window", "-t", &format!("base:{LEAD_WINDOW}")])?;
    let pane = rig.agent_lead_with(
        LEAD_WINDOW,
        &[format!("SIM_AGENT_LOG={}", logs.lead.path().display())],
    );
    // Only the lead's window stays in the session a newcomer attaches to.
    tmux(&rig, &["kill-window", "-t", "base:0"])?;
    // Members open as windows of the `fleet` session; it exists from the start so it can be
    // attached to before the first spawn.
    tmux(
        &rig,
        &[
            "new-session",
            "-d",
            "-s",
            "fleet",
            "-n",
            "about",
            "sh",
            "-c",
            "printf 'fleetd demo: each member opens as a window of this session (C-b n / C-b p)\\n'; exec tail -f /dev/null",
        ],
    )?;
    Ok((
        rig,
        Lead {
            pane,
            log: logs.lead.clone(),
        },
        listen,
    ))
}

fn tmux(rig: &Rig, args: &[&str]) -> anyhow::Result<String> {
    let out = rig.tmux.run(args)?;
    ensure!(
        out.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What earlier steps learned that later ones need.
#[derive(Debug, Default)]
struct Facts {
    alice_pane: String,
    alice_msg: String,
    bob_send_mark: usize,
    unread_at_kill: Vec<String>,
    restart_started: i64,
    restarted_at: i64,
    restart_mark: usize,
}

/// The running demo.
struct Session {
    rig: Rig,
    lead: Lead,
    logs: Logs,
    options: Options,
    steps: Vec<StepRecord>,
    notes: Vec<String>,
    facts: Facts,
    /// The dashboard in a headless Chromium, with `--screenshot`.
    browser: Option<crate::browser::Browser>,
}

impl Session {
    /// A headless Chromium signed in to the demo's dashboard (a key from the operator's
    /// socket, as `fleetd dashboard` gets one), following the stream.
    fn open_dashboard(&self) -> anyhow::Result<crate::browser::Browser> {
        let browser = crate::browser::Browser::start(1440, 1000)?;
        let key = http::request(self.rig.daemon.operator(), "POST", "/dashboard/keys", None)?;
        ensure!(key.status == 200, "POST /dashboard/keys: {}", key.body);
        let url = key.json()["url"]
            .as_str()
            .context("no url in the key's answer")?
            .to_owned();
        browser.goto(&url)?;
        browser.wait_for(
            "the dashboard to go live",
            Duration::from_secs(30),
            "return document.getElementById('conn').dataset.state === 'live';",
        );
        Ok(browser)
    }

    /// With `--screenshot`: the dashboard once it shows `question`'s card (or after 5 s).
    fn capture_dashboard(&mut self) {
        let (Some(browser), Some(path)) = (&self.browser, &self.options.screenshot) else {
            return;
        };
        let shown = "return [...document.querySelectorAll('#questions li .ask')].some((e) => e.textContent.length > 1);";
        for _ in 0..100 {
            if browser.eval(shown, &[]).ok() == Some(Value::Bool(true)) {
                break;
            }
            self.sleep(Duration::from_millis(50));
        }
        let note = match browser.screenshot(path) {
            Ok(()) => format!("dashboard screenshot saved to {}", path.display()),
            Err(e) => format!("no dashboard screenshot: {e:#}"),
        };
        self.notes.push(note);
    }

    /// Prints how to watch, and gives the newcomer time to attach.
    fn invite(&self) {
        let socket = self.rig.tmux.socket().display();
        println!("\nWatch it live from another terminal:");
        println!("  tmux -S {socket} attach -t base     # the lead");
        println!("  tmux -S {socket} attach -t fleet    # the members (or C-b s from the lead)");
        if !self.options.no_pause {
            println!("Starting in {} s...", ATTACH_PAUSE.as_secs());
            self.sleep(ATTACH_PAUSE);
        }
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "the demo paces its steps so a person watching can follow them"
    )]
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    /// Runs one step: prints it, times it, records what happened. A panic inside (the rig's
    /// helpers assert) is a failed step like any error.
    fn step(
        &mut self,
        title: &str,
        body: impl FnOnce(&mut Self) -> anyhow::Result<String>,
    ) -> anyhow::Result<()> {
        if !self.options.no_pause && self.steps.len() > 1 {
            self.sleep(STEP_PAUSE);
        }
        println!("[{}] {title}", self.steps.len() + 1);
        let started = now_us();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(self)))
            .unwrap_or_else(|panic| Err(anyhow::anyhow!(panic_text(&*panic))));
        let took = between(started, now_us());
        let outcome = match &result {
            Ok(detail) => {
                for line in detail.lines() {
                    println!("    {line}");
                }
                Ok(detail.clone())
            }
            Err(e) => {
                println!("    FAILED: {e:#}");
                Err(format!("{e:#}"))
            }
        };
        self.steps.push(StepRecord {
            title: title.to_owned(),
            took,
            outcome,
        });
        result
            .map(|_| ())
            .with_context(|| format!("step {title:?}"))
    }

    fn play(&mut self) -> anyhow::Result<()> {
        self.step(
            "Lead spawns two members (fleet_spawn): alice, bob",
            Self::spawn_members,
        )?;
        self.step(
            "Lead delegates: alice without waiting, then bob while it waits",
            Self::delegate,
        )?;
        self.step(
            "alice replies while the lead is busy: inbox, no nudge",
            Self::reply_while_busy,
        )?;
        self.step("The lead goes idle and is nudged", Self::nudge_when_idle)?;
        self.step(
            "Lead reads and acknowledges alice's reply (fleet_poll, fleet_ack)",
            Self::read_alice,
        )?;
        self.step("Lead stops alice (fleet_stop)", Self::stop_alice)?;
        self.step(
            "bob asks a question (fleet_ask); the lead answers (fleet_answer)",
            Self::question,
        )?;
        self.step(
            "SIGKILL fleetd as soon as bob's reply is stored, unread",
            Self::kill,
        )?;
        self.step(
            "Restart fleetd on the same state dir and port",
            Self::restart,
        )?;
        self.step(
            "The restarted fleetd nudges the lead; it reads and acks",
            Self::after_restart,
        )?;
        Ok(())
    }

    /// Counts the replies: what members' logs say they sent against what the lead's log and
    /// the inboxes show.
    fn tally(&self) -> anyhow::Result<report::Tally> {
        let (mut sent, mut failed) = report::sent_replies("alice", &self.logs.alice.events());
        let (bob, bob_failed) = report::sent_replies("bob", &self.logs.bob.events());
        sent.extend(bob);
        failed += bob_failed;
        let mut found = Found::from_lead_log(&self.lead.log.events());
        for member in ["alice", "bob"] {
            for r in replies(&self.rig, member)? {
                if let Some(id) = r["msgId"].as_str() {
                    found.in_inbox.insert(id.to_owned());
                }
            }
        }
        Ok(report::tally(&sent, failed, &found))
    }

    /// After a failure: what the lead's pane and fleetd said last.
    fn diagnose(&mut self, error: &anyhow::Error) {
        eprintln!("\nfleetd demo failed: {error:#}");
        eprintln!("---- lead pane ----\n{}", self.rig.screen(&self.lead.pane));
        let mut lines: Vec<String> = self.rig.daemon.seen_logs().to_vec();
        while let Ok(line) = self.rig.daemon.logs.try_recv() {
            lines.push(line);
        }
        eprintln!("---- fleetd log (last 40 lines) ----");
        for line in lines.iter().rev().take(40).rev() {
            eprintln!("{line}");
        }
    }

    /// Leaves the final state on screen a moment for whoever watches.
    fn linger(&self) {
        if !self.options.no_pause {
            self.sleep(Duration::from_secs(3));
        }
    }
}

/// The pending replies in `target`'s inbox, via the REST API (non-destructive).
fn replies(rig: &Rig, target: &str) -> anyhow::Result<Vec<Value>> {
    let response = http::get(
        rig.daemon.operator(),
        &format!("/sessions/{target}/replies"),
    )
    .with_context(|| format!("GET /sessions/{target}/replies"))?;
    ensure!(
        response.status == 200,
        "GET /sessions/{target}/replies: {} {}",
        response.status,
        response.body
    );
    let body: Value = serde_json::from_str(&response.body).context("replies are not JSON")?;
    Ok(body["replies"].as_array().cloned().unwrap_or_default())
}

/// `text` cut to `max` characters.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut}…")
}

//! `fleetd demo` (run as the `fleetd-demo` binary, which `fleetd demo` execs): a scripted
//! session a newcomer can watch. A private tmux server and a fleetd on a temporary state dir, a
//! lead agent pane and two member agents (`sim-agent`s), then: two tasks delegated, a reply that
//! lands while the lead is busy, the nudge when it goes idle, a question answered, a member
//! stopped, fleetd killed with SIGKILL while a reply is unread and restarted on the same state,
//! and every reply accounted for. Prints each step as it plays and a report with timings; exits
//! 0 only if every step happened and no reply was lost. Owns the scenario only: the rig
//! (`crate::rig`) starts and drives the processes, `report` counts and prints.

mod cleanup;
mod log;
mod report;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use self::log::{
    AgentLog, Lead, at_us, between, is_call_of, is_nudge, now_us, structured, wait_for,
};
use self::report::{Found, StepRecord, human};
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

const ALICE_TASK: &str = "write the release notes";
const BOB_TASK: &str = "review the parser change";
const BOB_QUESTION_TASK: &str = "migrate the test database";
const ANSWER: &str = "use a copy, never the live one";

/// Command-line options of `fleetd-demo`.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Start at once and do not pace the steps (for tests and impatient people).
    pub no_pause: bool,
    /// The `fleetd` binary to run (default: the one next to this executable).
    pub fleetd: Option<PathBuf>,
}

impl Options {
    /// Parses `[--no-pause] [--fleetd PATH]`.
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
                "-h" | "--help" => bail!(
                    "usage: fleetd-demo [--no-pause] [--fleetd PATH] (normally run as `fleetd demo`)"
                ),
                other => bail!(
                    "unknown argument {other:?}; usage: fleetd-demo [--no-pause] [--fleetd PATH]"
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
    };
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
}

impl Session {
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

    fn spawn_members(&mut self) -> anyhow::Result<String> {
        let alice = self.lead.call(
            &self.rig,
            "fleet_spawn",
            &json!({ "profile": "writer", "name": "alice" }),
        )?;
        let bob = self.lead.call(
            &self.rig,
            "fleet_spawn",
            &json!({ "profile": "reviewer", "name": "bob" }),
        )?;
        self.facts.alice_pane = alice["paneId"].as_str().unwrap_or_default().to_owned();
        for (name, log) in [("alice", &self.logs.alice), ("bob", &self.logs.bob)] {
            log.wait(&format!("{name}'s agent to connect to fleetd"), 0, |e| {
                e["event"] == "mcp_initialized"
            })?;
        }
        Ok(format!(
            "alice (profile writer, {ALICE_WORK_MS} ms turns) in pane {}, bob (profile reviewer, \
             {BOB_WORK_MS} ms turns) in pane {}; both agents connected over MCP",
            self.facts.alice_pane,
            bob["paneId"].as_str().unwrap_or("?")
        ))
    }

    fn delegate(&mut self) -> anyhow::Result<String> {
        let sent = self.lead.call(
            &self.rig,
            "fleet_send",
            &json!({ "target": "alice", "task": ALICE_TASK, "wait": false }),
        )?;
        ensure!(sent["status"] == "queued", "alice's task: {sent}");
        // The lead now waits on bob: its turn lasts until bob replies.
        self.facts.bob_send_mark = self.lead.type_call(
            &self.rig,
            "fleet_send",
            &json!({ "target": "bob", "task": BOB_TASK, "timeoutSecs": 60 }),
        );
        self.lead.log.wait(
            "the lead to start its fleet_send to bob",
            self.facts.bob_send_mark,
            |e| e["event"] == "turn",
        )?;
        Ok(format!(
            "alice: \"{ALICE_TASK}\" (ticket {}, queued); bob: \"{BOB_TASK}\" — the lead's \
             fleet_send waits for bob's reply",
            sent["ticket"].as_str().unwrap_or("?")
        ))
    }

    fn reply_while_busy(&mut self) -> anyhow::Result<String> {
        let (_, reply) = self
            .logs
            .alice
            .wait("alice's fleet_reply", 0, |e| is_call_of(e, "fleet_reply"))?;
        let result = structured(&reply)?;
        let msg = result["msgId"]
            .as_str()
            .context("alice's reply has no msgId")?;
        self.facts.alice_msg = msg.to_owned();
        ensure!(
            result["delivered"] == "inbox",
            "alice's reply went to {} (expected the inbox: nobody waits for it)",
            result["delivered"]
        );
        let mark = self.facts.bob_send_mark;
        let lead = &self.lead.log;
        ensure!(
            lead.find(mark, |e| is_call_of(e, "fleet_send")).is_none(),
            "the lead was no longer busy when alice replied (bob answered first)"
        );
        ensure!(
            lead.find(mark, is_nudge).is_none(),
            "the lead was nudged while it was busy"
        );
        let inbox = replies(&self.rig, "alice")?;
        ensure!(
            inbox.iter().any(|r| r["msgId"] == msg),
            "alice's reply is not in her inbox: {inbox:?}"
        );
        let (_, sent) = lead
            .find(0, |e| {
                e["event"] == "turn" && e["prompt"].as_str().is_some_and(|p| p.contains(ALICE_TASK))
            })
            .context("the lead's turn for alice's task is not in its log")?;
        Ok(format!(
            "alice replied {} after delegation; fleetd stored it (msgId {msg}) and, the lead \
             being mid-turn, typed nothing",
            human(between(at_us(&sent), at_us(&reply)))
        ))
    }

    fn nudge_when_idle(&mut self) -> anyhow::Result<String> {
        let mark = self.facts.bob_send_mark;
        let ((_, result), (idle_at, idle)) = self.lead.finish_call("fleet_send", mark)?;
        let replied = structured(&result)?;
        ensure!(
            replied["status"] == "replied",
            "bob's fleet_send ended {}",
            replied["status"]
        );
        let (nudge_at, nudge) = self
            .lead
            .log
            .wait("the nudge about alice's reply", mark, |e| {
                is_nudge(e) && e["prompt"].as_str().is_some_and(|p| p.contains("alice"))
            })?;
        ensure!(
            nudge_at > idle_at,
            "the nudge was typed before the lead's turn ended"
        );
        let text = nudge["prompt"].as_str().unwrap_or_default().to_owned();
        ensure!(
            !text.contains(ALICE_TASK),
            "the nudge carries the reply's text: {text}"
        );
        self.lead.log.wait_turn_done("the nudge's turn", nudge_at)?;
        let (_, alice_reply) = self
            .logs
            .alice
            .find(0, |e| is_call_of(e, "fleet_reply"))
            .context("alice's reply vanished from her log")?;
        let latency = between(at_us(&idle), at_us(&nudge));
        self.notes.push(format!(
            "nudge latency seen: {} from the lead going idle to the nudge's turn starting",
            human(latency)
        ));
        Ok(format!(
            "bob's reply came back to the waiting fleet_send (msgId {}); the lead went idle and \
             {} later got:\n  {}\nalice's reply had waited {} for it",
            replied["msgId"].as_str().unwrap_or("?"),
            human(latency),
            shorten(&text, 100),
            human(between(at_us(&alice_reply), at_us(&nudge)))
        ))
    }

    fn read_alice(&mut self) -> anyhow::Result<String> {
        let polled = self
            .lead
            .call(&self.rig, "fleet_poll", &json!({ "target": "alice" }))?;
        let msg = self.facts.alice_msg.clone();
        ensure!(
            polled["replies"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["msgId"] == msg.as_str())),
            "fleet_poll did not show alice's reply: {polled}"
        );
        let acked = self.lead.call(
            &self.rig,
            "fleet_ack",
            &json!({ "target": "alice", "msgId": msg }),
        )?;
        ensure!(acked["acked"][0]["acked"] == true, "fleet_ack: {acked}");
        let left = replies(&self.rig, "alice")?;
        ensure!(left.is_empty(), "alice's inbox still holds {left:?}");
        Ok(
            "fleet_poll showed it; fleet_ack removed it; alice's inbox is empty, so the \
            reminders stop"
                .to_owned(),
        )
    }

    fn stop_alice(&mut self) -> anyhow::Result<String> {
        let stopped = self
            .lead
            .call(&self.rig, "fleet_stop", &json!({ "target": "alice" }))?;
        ensure!(stopped["paneClosed"] == true, "fleet_stop: {stopped}");
        let pane = self
            .facts
            .alice_pane
            .rsplit(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let panes = tmux(&self.rig, &["list-panes", "-a", "-F", "#{pane_id}"])?;
        ensure!(
            !panes.lines().any(|p| p == pane),
            "alice's pane {pane} is still open"
        );
        Ok(format!(
            "alice's pane {} is closed and her session released",
            self.facts.alice_pane
        ))
    }

    fn question(&mut self) -> anyhow::Result<String> {
        let mark = self.lead.log.mark();
        self.lead.call(
            &self.rig,
            "fleet_send",
            &json!({ "target": "bob", "task": BOB_QUESTION_TASK, "wait": false }),
        )?;
        let (_, asked) = self.logs.bob.wait("bob's fleet_ask", 0, |e| {
            e["event"] == "tool_start" && e["name"] == "fleet_ask"
        })?;
        let (nudge_at, nudge) =
            self.lead
                .log
                .wait("the nudge about bob's question", mark, |e| {
                    is_nudge(e) && e["prompt"].as_str().is_some_and(|p| p.contains("question"))
                })?;
        self.lead.log.wait_turn_done("the nudge's turn", nudge_at)?;
        let polled = self
            .lead
            .call(&self.rig, "fleet_poll", &json!({ "target": "bob" }))?;
        let question = &polled["questions"][0];
        let id = question["questionId"]
            .as_str()
            .with_context(|| format!("fleet_poll shows no open question: {polled}"))?;
        let answered = self.lead.call(
            &self.rig,
            "fleet_answer",
            &json!({ "questionId": id, "answer": ANSWER }),
        )?;
        ensure!(
            answered["deliveredTo"] == "waiter",
            "fleet_answer: {answered}"
        );
        let (_, got) = self.logs.bob.wait("bob's fleet_ask to return", 0, |e| {
            is_call_of(e, "fleet_ask")
        })?;
        let returned_at = at_us(&got);
        let got = structured(&got)?;
        ensure!(got["answer"] == ANSWER, "bob's fleet_ask returned {got}");
        Ok(format!(
            "bob asked \"{}\"; the lead was nudged {} later, read it with fleet_poll and \
             answered \"{ANSWER}\"; bob's fleet_ask returned it {} after he asked",
            question["question"].as_str().unwrap_or("?"),
            human(between(at_us(&asked), at_us(&nudge))),
            human(between(at_us(&asked), returned_at)),
        ))
    }

    fn kill(&mut self) -> anyhow::Result<String> {
        let lead_mark = self.lead.log.mark();
        // bob replies right after the answer: kill the moment fleetd has acknowledged it to him
        // and it is in the store, before the lead has read it.
        let (stored, reply) = wait_for("bob's reply to the answer", log::EVENT_TIMEOUT, || {
            let (_, reply) = self.logs.bob.find(0, |e| {
                is_call_of(e, "fleet_reply")
                    && e["result"]["structuredContent"]["delivered"] == "inbox"
            })?;
            let stored = replies(&self.rig, "bob").ok()?;
            (!stored.is_empty()).then_some((stored, reply))
        })?;
        self.rig.kill_daemon();
        let killed_at = now_us();
        self.facts.unread_at_kill = stored
            .iter()
            .filter_map(|r| r["msgId"].as_str().map(ToOwned::to_owned))
            .collect();
        let nudged = self
            .lead
            .log
            .find(lead_mark, |e| {
                is_nudge(e) && e["prompt"].as_str().is_some_and(|p| p.contains("bob"))
            })
            .is_some();
        Ok(format!(
            "bob's reply {} was stored {} before the SIGKILL; the lead {}",
            self.facts.unread_at_kill.join(", "),
            human(between(at_us(&reply), killed_at)),
            if nudged {
                "had just been nudged about it, but had not read it"
            } else {
                "had not been nudged about it yet"
            }
        ))
    }

    fn restart(&mut self) -> anyhow::Result<String> {
        // Marks taken before the new daemon exists, so even its fastest nudge is seen; a nudge
        // is the new daemon's only if the lead got it after this moment.
        self.facts.restart_mark = self.lead.log.mark();
        let started = now_us();
        self.facts.restart_started = started;
        self.rig.restart_daemon();
        self.facts.restarted_at = now_us();
        cleanup::daemon_restarted(self.rig.daemon.child.id());
        let stored = replies(&self.rig, "bob")?;
        let still: Vec<&String> = self
            .facts
            .unread_at_kill
            .iter()
            .filter(|id| stored.iter().any(|r| r["msgId"] == id.as_str()))
            .collect();
        ensure!(
            still.len() == self.facts.unread_at_kill.len(),
            "replies unread at the kill are missing after the restart: had {:?}, now {stored:?}",
            self.facts.unread_at_kill
        );
        Ok(format!(
            "fleetd listened again on {} after {}; GET /sessions/bob/replies: {} of the {} \
             unread at the kill still there",
            self.rig.daemon.addr,
            human(between(started, self.facts.restarted_at)),
            still.len(),
            self.facts.unread_at_kill.len()
        ))
    }

    fn after_restart(&mut self) -> anyhow::Result<String> {
        let (nudge_at, nudge) = self.lead.log.wait(
            "the restarted fleetd's nudge about bob's reply",
            self.facts.restart_mark,
            |e| {
                is_nudge(e)
                    && at_us(e) > self.facts.restart_started
                    && e["prompt"].as_str().is_some_and(|p| p.contains("from bob"))
            },
        )?;
        self.lead.log.wait_turn_done("the nudge's turn", nudge_at)?;
        let polled = self
            .lead
            .call(&self.rig, "fleet_poll", &json!({ "target": "bob" }))?;
        let ids: Vec<String> = polled["replies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["msgId"].as_str().map(ToOwned::to_owned))
            .collect();
        ensure!(
            self.facts.unread_at_kill.iter().all(|id| ids.contains(id)),
            "fleet_poll after the restart lacks replies: {polled}"
        );
        let acked = self.lead.call(
            &self.rig,
            "fleet_ack",
            &json!({ "target": "bob", "msgIds": ids }),
        )?;
        let all = acked["acked"]
            .as_array()
            .is_some_and(|a| a.iter().all(|a| a["acked"] == true));
        ensure!(all, "fleet_ack after the restart: {acked}");
        let latency = between(self.facts.restarted_at, at_us(&nudge));
        self.notes.push(format!(
            "nudge after the restart: {} from fleetd listening again to the nudge's turn \
             (the mail was read back from the inbox at start)",
            human(latency)
        ));
        Ok(format!(
            "nudged {} after fleetd listened again; fleet_poll returned bob's reply, fleet_ack \
             removed it",
            human(latency)
        ))
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
    let response = http::get(rig.daemon.addr, &format!("/sessions/{target}/replies"))
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

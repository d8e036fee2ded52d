//! The crash-recovery suite (issue 14, SPEC §13.8, §15): a scripted fleet session on real tmux
//! with the built `fleetd`, killed with SIGKILL at a random moment of every round and restarted
//! on the same state, then checked against what the agents' own logs say happened:
//! - every ticket a send returned polls its true state, and ends;
//! - every task is typed into its member at most once, and exactly once when its send was
//!   answered with a ticket;
//! - every open question can be answered after the restart, and the member gets the answer (an
//!   asker whose `fleet_ask` failed because the daemon died before it stored the question was
//!   told so by the failed call, and is counted apart);
//! - nudges about a member go to the lead that delegated to it, never to another;
//! - every reply a member was told is stored is read exactly once (none lost, none twice).
//!
//! The session: two sim-agent leads (`boss`, the pinned primary, and `alt`), members `w1`
//! (spawned by `alt`, so bound to it) and `w2` (spawned by `boss`), and per question round an
//! asker `qN`. After the set-up the test acts as the operator (fleetd's unix socket: REST and
//! MCP), so it never types into a lead while fleetd may be nudging it. Used by
//! `tests/it/recovery.rs` (a short run in CI; `FLEETD_RECOVERY_KILLS` sets the count).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use serde_json::{Value, json};

use crate::demo::log::{AgentLog, Lead, is_nudge, wait_for};
use crate::http::{self, Endpoint};
use crate::rig::{Rig, sim_profile};

/// How long the fleet may take to settle after a restart.
const SETTLE: Duration = Duration::from_secs(90);

/// What a run counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    /// SIGKILLs of the daemon (each followed by a restart on the same state).
    pub kills: usize,
    /// Tasks sent (answered with a ticket, or lost with the daemon's answer).
    pub tasks_sent: usize,
    /// Of those, answered with a ticket.
    pub tickets: usize,
    /// Tasks typed into a member (each at most once).
    pub tasks_delivered: usize,
    /// Tickets that ended, by final state.
    pub ended: BTreeMap<String, usize>,
    /// Questions answered after a restart and received by their member.
    pub questions_answered: usize,
    /// Askers whose `fleet_ask` failed (the daemon was down or died before storing the
    /// question, so none was open after the restart): the failed call told them.
    pub asks_refused_by_the_kill: usize,
    /// Replies members were told were stored, all read exactly once.
    pub replies: usize,
    /// Nudges seen in each lead's pane.
    pub nudges: BTreeMap<String, usize>,
}

/// The operator's side of the session: fleetd's unix socket.
struct Operator {
    endpoint: Endpoint,
}

impl Operator {
    /// An MCP tool call (JSON-RPC over `/mcp`); the `structuredContent`, or an error naming the
    /// refusal.
    fn tool(&self, name: &str, args: &Value) -> anyhow::Result<Value> {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": name, "arguments": args } });
        let response = http::request(&self.endpoint, "POST", "/mcp", Some(&body.to_string()))
            .with_context(|| format!("{name}: the daemon does not answer"))?;
        let value: Value = serde_json::from_str(&response.body)
            .with_context(|| format!("{name}: not JSON: {}", response.body))?;
        let result = &value["result"];
        if result["isError"] != false {
            bail!("{name} {args}: {value}");
        }
        Ok(result["structuredContent"].clone())
    }

    /// `fleet_send` without waiting: the ticket, or an error (the daemon died under it).
    fn send(&self, target: &str, task: &str) -> anyhow::Result<String> {
        let out = self.tool(
            "fleet_send",
            &json!({ "target": target, "task": task, "wait": false }),
        )?;
        out["ticket"]
            .as_str()
            .map(str::to_owned)
            .context("fleet_send returned no ticket")
    }

    /// The replies pending in `target`'s inbox.
    fn replies(&self, target: &str) -> Vec<Value> {
        self.tool("fleet_poll", &json!({ "target": target }))
            .map(|v| v["replies"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    }
}

/// One member's log and the tasks it was typed.
struct Member {
    name: String,
    log: AgentLog,
}

impl Member {
    /// Its events (a log several askers share is filtered by who wrote each line).
    fn events(&self) -> Vec<Value> {
        self.log
            .events()
            .into_iter()
            .filter(|e| e["who"].as_str().is_none_or(|w| w == self.name))
            .collect()
    }

    /// How many times each prompt was typed into it.
    fn prompts(&self) -> BTreeMap<String, usize> {
        let mut seen = BTreeMap::new();
        for e in self.events() {
            if e["event"] == "turn"
                && let Some(prompt) = e["prompt"].as_str()
            {
                *seen.entry(prompt.to_owned()).or_insert(0) += 1;
            }
        }
        seen
    }

    /// Whether one of its `fleet_ask` calls failed (the daemon died under it, or was down).
    fn ask_failed(&self) -> bool {
        self.events()
            .iter()
            .any(|e| e["event"] == "tool_error" && e["name"] == "fleet_ask")
    }

    /// The msgIds `fleet_reply` answered it with (each stored durably before that answer).
    fn stored_replies(&self) -> BTreeSet<String> {
        self.events()
            .iter()
            .filter(|e| e["event"] == "tool" && e["name"] == "fleet_reply")
            .filter_map(|e| {
                e["result"]["structuredContent"]["msgId"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// The whole run's bookkeeping.
struct Session {
    rig: Rig,
    dir: PathBuf,
    operator: Operator,
    leads: BTreeMap<String, Lead>,
    members: BTreeMap<String, Member>,
    /// Every task sent: (member, text) → its ticket when the send was answered.
    tasks: BTreeMap<(String, String), Option<String>>,
    /// msgIds read (and acknowledged) from inboxes.
    read: BTreeSet<String>,
    /// Askers with a question seen open (so one was stored and must be answered).
    asked: BTreeSet<String>,
    /// Tickets seen in a final state: a final state never changes, so they are not polled
    /// again (polling every ticket of the run on every settle check made a round take longer
    /// the longer the run, up to the settle timeout by round 100).
    ended: std::cell::RefCell<BTreeSet<String>>,
    counts: Counts,
}

/// Runs the suite with `kills` SIGKILLs and returns what it counted; an error names the first
/// broken promise.
pub fn run(kills: usize) -> anyhow::Result<Counts> {
    let mut session = Session::start()?;
    for round in 0..kills {
        session
            .round(round)
            .with_context(|| format!("round {round}"))?;
    }
    session.finish()
}

fn profile(dir: &Path, name: &str, extra: &[(&str, &str)]) -> String {
    let log = dir.join(format!("{name}.log")).display().to_string();
    let mut env = vec![("SIM_AGENT_LOG", log.as_str())];
    env.extend_from_slice(extra);
    sim_profile(name, &env)
}

impl Session {
    fn start() -> anyhow::Result<Self> {
        let logs = tempfile::tempdir()?;
        let dir = logs.keep();
        let config = format!(
            "primary:\n  tab: base:boss\n  pushReminders: 2\n  pushBackoffMs: 2000\nprofiles:\n{}{}{}",
            profile(&dir, "w1", &[("SIM_AGENT_WORK_MS", "700")]),
            profile(&dir, "w2", &[("SIM_AGENT_WORK_MS", "700")]),
            // One asker per question round, each asking once: `qlog` is shared, tagged by name.
            sim_profile(
                "asker",
                &[
                    ("SIM_AGENT_SCRIPT", "ask,reply"),
                    ("SIM_AGENT_WORK_MS", "200"),
                    (
                        "SIM_AGENT_LOG",
                        &dir.join("askers.log").display().to_string()
                    ),
                ]
            ),
        );
        let rig = Rig::start(&config);
        let mut leads = BTreeMap::new();
        for name in ["boss", "alt"] {
            let log = AgentLog::new(&dir.join(format!("{name}.log")));
            let pane =
                rig.agent_lead_with(name, &[format!("SIM_AGENT_LOG={}", log.path().display())]);
            leads.insert(name.to_owned(), Lead { pane, log });
        }
        // The delegating leads: alt spawns w1, boss spawns w2 (the only typing into leads).
        for (lead, member) in [("alt", "w1"), ("boss", "w2")] {
            leads[lead]
                .call(
                    &rig,
                    "fleet_spawn",
                    &json!({ "profile": member, "name": member }),
                )
                .with_context(|| format!("{lead} spawns {member}"))?;
        }
        let members = ["w1", "w2"]
            .into_iter()
            .map(|m| {
                (
                    m.to_owned(),
                    Member {
                        name: m.to_owned(),
                        log: AgentLog::new(&dir.join(format!("{m}.log"))),
                    },
                )
            })
            .collect();
        let operator = Operator {
            endpoint: rig.daemon.operator(),
        };
        Ok(Self {
            rig,
            dir,
            operator,
            leads,
            members,
            tasks: BTreeMap::new(),
            read: BTreeSet::new(),
            asked: BTreeSet::new(),
            ended: std::cell::RefCell::default(),
            counts: Counts::default(),
        })
    }

    /// Sends `text` to `member`, recording whether a ticket came back.
    fn send(&mut self, member: &str, text: String) {
        let ticket = self.operator.send(member, &text).ok();
        self.counts.tasks_sent += 1;
        self.tasks.insert((member.to_owned(), text), ticket);
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "the kill lands at a random wall-clock moment of the round"
    )]
    fn round(&mut self, round: usize) -> anyhow::Result<()> {
        let asker = round.is_multiple_of(3).then(|| format!("q{round}"));
        if let Some(q) = &asker {
            self.operator
                .tool("fleet_spawn", &json!({ "profile": "asker", "name": q }))
                .with_context(|| format!("spawn {q}"))?;
            self.members.insert(
                q.clone(),
                Member {
                    name: q.clone(),
                    log: AgentLog::new(&self.dir.join("askers.log")),
                },
            );
        }
        // w1 gets two tasks (the second waits in its queue while it works), w2 one.
        self.send("w1", format!("r{round}-a"));
        self.send("w1", format!("r{round}-b"));
        self.send("w2", format!("r{round}-c"));
        if let Some(q) = &asker {
            self.send(q, format!("r{round}-q"));
        }
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..2500)));
        self.rig.kill_daemon();
        self.counts.kills += 1;
        self.rig.restart_daemon();
        self.settle(asker.as_deref())
    }

    /// After a restart: answers the round's open question, reads (and acknowledges) every reply,
    /// and waits until every ticket has ended, every answered send was typed, and the asker (if
    /// its task was answered with a ticket) got its answer.
    fn settle(&mut self, asker: Option<&str>) -> anyhow::Result<()> {
        let asker = asker.filter(|q| {
            self.tasks
                .iter()
                .any(|((m, _), ticket)| m == q && ticket.is_some())
        });
        let waited = wait_for("the fleet to settle after the restart", SETTLE, || {
            if let Some(q) = asker {
                self.answer_questions(q);
            }
            self.read_inboxes();
            self.settled(asker).then_some(())
        });
        if let Err(e) = waited {
            let detail = self.unsettled(asker);
            self.rig.daemon.print_logs();
            return Err(e.context(format!("still unsettled: {detail}")));
        }
        if let Some(q) = asker {
            if self.answer_seen(q) {
                self.counts.questions_answered += 1;
            } else {
                self.counts.asks_refused_by_the_kill += 1;
            }
            let _ = self.operator.tool("fleet_stop", &json!({ "target": q }));
        }
        Ok(())
    }

    /// Answers `q`'s open questions, as the operator.
    fn answer_questions(&mut self, q: &str) {
        let Ok(status) = self.operator.tool("fleet_status", &json!({ "target": q })) else {
            return;
        };
        for question in status["questions"].as_array().into_iter().flatten() {
            self.asked.insert(q.to_owned());
            let id = question["questionId"].as_str().unwrap_or_default();
            let _ = self.operator.tool(
                "fleet_answer",
                &json!({ "questionId": id, "answer": format!("answer-for-{q}") }),
            );
        }
    }

    /// Whether asker `q` is done with its question: it got the answer (in its `fleet_ask`'s
    /// result, or as a task), or its `fleet_ask` failed with the daemon and no question of it was
    /// ever open afterwards (nothing stored, and the caller was told by the failure).
    fn asker_done(&self, q: &str) -> bool {
        self.answer_seen(q)
            || (!self.asked.contains(q) && self.members.get(q).is_some_and(Member::ask_failed))
    }

    /// Whether asker `q` got the answer: in its `fleet_ask`'s result, or as a task.
    fn answer_seen(&self, q: &str) -> bool {
        let needle = format!("answer-for-{q}");
        self.members
            .get(q)
            .is_some_and(|m| m.events().iter().any(|e| e.to_string().contains(&needle)))
    }

    fn read_inboxes(&mut self) {
        let names: Vec<String> = self.members.keys().cloned().collect();
        for name in names {
            for reply in self.operator.replies(&name) {
                let Some(id) = reply["msgId"].as_str() else {
                    continue;
                };
                // Read again after it was acknowledged only if the ack was lost with the
                // daemon before it committed: the set keeps it once, and it is acked again.
                self.read.insert(id.to_owned());
                let _ = self
                    .operator
                    .tool("fleet_ack", &json!({ "target": name, "msgId": id }));
            }
        }
    }

    /// Every ticket ended, and every send that got a ticket was typed into its member.
    fn settled(&self, asker: Option<&str>) -> bool {
        if asker.is_some_and(|q| !self.asker_done(q)) {
            return false;
        }
        // Each member's log is read once per check, and only for members with a task still
        // to settle (typed and ended stay so).
        let mut delivered: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
        self.tasks.iter().all(|((member, text), ticket)| {
            let Some(ticket) = ticket else { return true };
            if self.ended.borrow().contains(ticket.as_str()) {
                return true;
            }
            let prompts = delivered.entry(member.as_str()).or_insert_with(|| {
                self.members
                    .get(member)
                    .map(Member::prompts)
                    .unwrap_or_default()
            });
            let typed = prompts.get(text).copied().unwrap_or(0);
            typed >= 1 && self.ended(ticket)
        })
    }

    /// What [`Self::settled`] still waits for, in words: each unended ticket with its state
    /// and how often its task was typed, and an asker without its answer.
    fn unsettled(&self, asker: Option<&str>) -> String {
        let mut out = Vec::new();
        if let Some(q) = asker.filter(|q| !self.asker_done(q)) {
            let asked = if self.asked.contains(q) {
                "a question of it was open after the restart"
            } else {
                "no question of it was seen open, and its fleet_ask did not fail"
            };
            out.push(format!("{q} never got its answer ({asked})"));
        }
        for ((member, text), ticket) in &self.tasks {
            let Some(ticket) = ticket else { continue };
            let typed = self
                .members
                .get(member)
                .and_then(|m| m.prompts().get(text).copied())
                .unwrap_or(0);
            let state = self
                .operator
                .tool("fleet_poll", &json!({ "ticket": ticket }))
                .map_or_else(
                    |e| format!("poll failed: {e:#}"),
                    |v| v["state"].to_string(),
                );
            if typed == 0 || !self.ended(ticket) {
                out.push(format!(
                    "{member} {text:?} ticket {ticket}: {state}, typed {typed}x"
                ));
            }
        }
        out.join("; ")
    }

    fn ended(&self, ticket: &str) -> bool {
        if self.ended.borrow().contains(ticket) {
            return true;
        }
        let ended = self
            .operator
            .tool("fleet_poll", &json!({ "ticket": ticket }))
            .is_ok_and(|v| {
                v["state"]
                    .as_str()
                    .is_some_and(|s| !matches!(s, "queued" | "delivered" | "working"))
            });
        if ended {
            self.ended.borrow_mut().insert(ticket.to_owned());
        }
        ended
    }

    /// The checks over the whole run.
    fn finish(mut self) -> anyhow::Result<Counts> {
        // Exactly once: no task typed twice; every answered send typed once.
        for ((member, text), ticket) in &self.tasks {
            let Some(m) = self.members.get(member) else {
                continue;
            };
            let typed = m.prompts().get(text).copied().unwrap_or(0);
            ensure!(typed <= 1, "{member} was typed {text:?} {typed} times");
            if ticket.is_some() {
                ensure!(
                    typed == 1,
                    "{member} never got {text:?} (ticket {ticket:?})"
                );
                self.counts.tickets += 1;
            }
            self.counts.tasks_delivered += typed;
        }
        // Every ticket polls its true, final state.
        for ticket in self.tasks.values().flatten() {
            let state = self
                .operator
                .tool("fleet_poll", &json!({ "ticket": ticket }))
                .with_context(|| format!("ticket {ticket} after the last restart"))?;
            let state = state["state"].as_str().unwrap_or("?").to_owned();
            *self.counts.ended.entry(state).or_insert(0) += 1;
        }
        // No reply lost: every reply a member was told is stored was read. The last round
        // settled once its tickets ended, and a ticket ends with its reply's commit, which can
        // come between that round's last read and its settled check: read once more.
        self.read_inboxes();
        for m in self.members.values() {
            let stored = m.stored_replies();
            let lost: Vec<&String> = stored.difference(&self.read).collect();
            ensure!(lost.is_empty(), "{}'s replies never read: {lost:?}", m.name);
            self.counts.replies += stored.len();
        }
        // Nudges go to the delegating lead: w1's to alt, never to boss.
        for (name, lead) in &self.leads {
            let nudges: Vec<String> = lead
                .log
                .events()
                .iter()
                .filter(|e| is_nudge(e))
                .filter_map(|e| e["prompt"].as_str().map(str::to_owned))
                .collect();
            if name == "boss" {
                ensure!(
                    !nudges.iter().any(|n| n.contains("w1")),
                    "boss was nudged about alt's member w1: {nudges:?}"
                );
            }
            self.counts.nudges.insert(name.clone(), nudges.len());
        }
        ensure!(
            self.counts.nudges.get("alt").copied().unwrap_or(0) > 0,
            "alt was never nudged about w1"
        );
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(self.counts)
    }
}

//! The scenario's steps after start-up, one method each, in the order `Session::play` runs
//! them: each drives the lead by typing tool calls into its pane, waits for what the agents'
//! logs and fleetd's REST API show, checks that the step really happened (an `Err` when not),
//! and returns one sentence of what happened with its timings.

use anyhow::{Context as _, ensure};
use serde_json::json;

use super::log::{self, at_us, between, is_call_of, is_nudge, now_us, structured, wait_for};
use super::report::human;
use super::{ALICE_WORK_MS, BOB_WORK_MS, Session, cleanup, replies, shorten, tmux};

const ALICE_TASK: &str = "write the release notes";
const BOB_TASK: &str = "review the parser change";
const BOB_QUESTION_TASK: &str = "migrate the test database";
const ANSWER: &str = "use a copy, never the live one";

impl Session {
    pub(super) fn spawn_members(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn delegate(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn reply_while_busy(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn nudge_when_idle(&mut self) -> anyhow::Result<String> {
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
            "nudge latency seen: {} from the lead going idle to the nudge's turn starting \
             (what `fleetd-bench wake` reports as \"lead goes idle → the nudge's turn starts\")",
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

    pub(super) fn read_alice(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn stop_alice(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn question(&mut self) -> anyhow::Result<String> {
        let mark = self.lead.log.mark();
        self.lead.call(
            &self.rig,
            "fleet_send",
            &json!({ "target": "bob", "task": BOB_QUESTION_TASK, "wait": false }),
        )?;
        let (_, asked) = self.logs.bob.wait("bob's fleet_ask", 0, |e| {
            e["event"] == "tool_start" && e["name"] == "fleet_ask"
        })?;
        self.capture_dashboard();
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

    pub(super) fn kill(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn restart(&mut self) -> anyhow::Result<String> {
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

    pub(super) fn after_restart(&mut self) -> anyhow::Result<String> {
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
        let latency = between(self.facts.restart_started, at_us(&nudge));
        self.notes.push(format!(
            "nudge after the restart: {} from fleetd starting to the nudge's turn (what \
             `fleetd-bench wake` reports as \"fleetd restarted (kill -9) with a nudge due → the \
             nudge's turn starts\"; the mail was read back from the inbox at start)",
            human(latency)
        ));
        Ok(format!(
            "nudged {} after fleetd started again; fleet_poll returned bob's reply, fleet_ack \
             removed it",
            human(latency)
        ))
    }
}

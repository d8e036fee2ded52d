//! Wake-up benchmark (issue 21): the reply lands while the lead is **busy**, and what is measured
//! is how soon after the lead's turn ends the nudge reaches it — the latency a user feels. Built
//! binary, real tmux server and fake-herdr, `sim-agent`s at both ends logging each event with a
//! microsecond timestamp.
//!
//! One round: the lead sends a task (`wait: false`); the member works briefly and replies; the
//! lead meanwhile works on something else (`@busy=MS`, a turn that only shows working), so the
//! nudge is deferred; the lead's turn ends ("goes idle", its own log's `turn_done`), and the
//! series run from that moment to (a) the nudge's text visible in the lead's pane (on tmux the
//! pane's output as a control client of the bench's own gets it, on herdr the pane read as fast
//! as it can be) and (b) the lead starting the nudge's turn. A round whose reply did not
//! land before the lead went idle is not counted (it measures the idle-lead path, which
//! `fleetd-bench nudge` covers).
//!
//! On fake-herdr the lead's status comes from herdr, so herdr's own part is measured apart: a
//! subscriber of the bench's own (`pane.agent_status_changed` on the lead's pane) notes when
//! herdr reported the lead idle, and fleetd's part is what follows. Its `agent.prompt` presses
//! Enter 300 ms after the paste by design (herdr's `PROMPT_ENTER_DELAY`), which is in the
//! "turn starts" series and is herdr's, not fleetd's.
//!
//! The restart case (tmux): the reply lands while the lead is busy, fleetd is killed (-9), the
//! lead goes idle while no fleetd runs, and fleetd is started again: from its start to the nudge
//! visible (fleetd's start-up included).
//!
//! `fleetd-bench wake [--rounds N] [--restarts N]`. Prints; never asserts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use super::nudge::{Sight, config, events, guarded, line_count, now_us, read_mail_and_pause};
use super::{Met, Row, Summary, progress};
use crate::http;

const DEFAULT_ROUNDS: usize = 30;
const DEFAULT_RESTARTS: usize = 8;
/// The member's turn: short, so its reply lands well inside the lead's busy turn.
const MEMBER_WORK_MS: u32 = 150;
/// The lead's busy turn after sending.
const LEAD_BUSY_MS: u32 = 1200;
/// Issue 21's target for fleetd's part.
const TARGET: Duration = Duration::from_millis(50);

/// A lead agent's pane, as the rig of one backend drives it.
struct Lead<'a> {
    /// Types a line into it (and presses Enter).
    type_line: Box<dyn Fn(&str) + 'a>,
    /// How the bench sees a nudge show in it.
    sight: Sight<'a>,
}

/// One backend's series.
#[derive(Default)]
struct Series {
    visible: Vec<Duration>,
    turn: Vec<Duration>,
    /// fake-herdr only: lead idle → herdr reports it idle (herdr's part).
    herdr: Vec<Duration>,
    /// fake-herdr only: herdr reported idle → nudge visible (fleetd's part).
    fleetd: Vec<Duration>,
    /// Rounds not counted because the reply landed after the lead went idle.
    late: usize,
}

/// Runs the benchmark, prints its tables and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = super::arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    let restarts = super::arg_number(args, "--restarts", DEFAULT_RESTARTS)?;
    let has_tmux = crate::require_tmux() == crate::Service::Present;
    let tmux = if has_tmux {
        guarded(|| on_tmux(rounds))
    } else {
        Err("not measured: tmux not found".to_owned())
    };
    let herdr = guarded(|| on_herdr(rounds));
    let restart = if has_tmux {
        guarded(|| restart_on_tmux(restarts))
    } else {
        Err("not measured: tmux not found".to_owned())
    };

    let mut rows = Vec::new();
    println!(
        "\nLead busy when the reply lands → lead goes idle → nudge ({rounds} rounds each; \
         lead busy {LEAD_BUSY_MS} ms, member works {MEMBER_WORK_MS} ms)\n"
    );
    println!("| backend | from → until | p50 | p99 | max | n | target | met |");
    println!("|---|---|---|---|---|---|---|---|");
    let line = |name: &str, what: &str, samples: &[Duration], target: bool| {
        if samples.is_empty() {
            println!("| {name} | {what} | no samples | | | 0 | | |");
            return None;
        }
        let s = Summary::of(samples.to_vec());
        let (t, met) = if target {
            let met = s.p99 <= TARGET;
            ("p99 ≤ 50 ms", if met { "yes" } else { "no" })
        } else {
            ("", "")
        };
        println!(
            "| {name} | {what} | {} | {} | {} | {} | {t} | {met} |",
            super::ms(s.p50),
            super::ms(s.p99),
            super::ms(s.max),
            samples.len()
        );
        Some(s)
    };
    for (name, series) in [("tmux", &tmux), ("fake-herdr", &herdr)] {
        let series = match series {
            Ok(s) => s,
            Err(why) => {
                println!("| {name} | {why} | | | | | | |");
                rows.push(Row::new(
                    "wake-up",
                    format!("lead goes idle → nudge visible, {name}"),
                    why.clone(),
                ));
                continue;
            }
        };
        let herdr_side = name == "fake-herdr";
        // On tmux every millisecond from idle on is fleetd's (tmux reports no status).
        let visible = line(
            name,
            "lead idle → nudge visible",
            &series.visible,
            !herdr_side,
        );
        let turn = line(name, "lead idle → nudge's turn starts", &series.turn, false);
        let (herdr_part, fleetd_part) = if herdr_side {
            (
                line(
                    name,
                    "lead idle → herdr reports idle (herdr's part)",
                    &series.herdr,
                    false,
                ),
                line(
                    name,
                    "herdr reports idle → nudge visible (fleetd's part)",
                    &series.fleetd,
                    true,
                ),
            )
        } else {
            (None, None)
        };
        if series.late > 0 {
            println!(
                "| {name} | {} round(s) not counted: the reply landed after the lead went idle | | | | | | |",
                series.late
            );
        }
        let cell = |s: Option<Summary>| s.map_or_else(|| "no samples".to_owned(), |s| s.cell());
        let mut row = Row::new(
            "wake-up",
            format!("lead goes idle → nudge visible, {name}"),
            cell(visible),
        );
        if !herdr_side && let Some(s) = visible {
            row = row.target("p99 ≤ 50 ms (#21)", Met::from_bool(s.p99 <= TARGET));
        }
        rows.push(row);
        rows.push(Row::new(
            "wake-up",
            format!("lead goes idle → the nudge's turn starts, {name}"),
            cell(turn),
        ));
        if herdr_side {
            rows.push(Row::new(
                "wake-up",
                "lead goes idle → herdr reports it idle (herdr's part), fake-herdr",
                cell(herdr_part),
            ));
            let mut row = Row::new(
                "wake-up",
                "herdr reports idle → nudge visible (fleetd's part), fake-herdr",
                cell(fleetd_part),
            );
            if let Some(s) = fleetd_part {
                row = row.target("p99 ≤ 50 ms (#21)", Met::from_bool(s.p99 <= TARGET));
            }
            rows.push(row);
        }
    }
    match &restart {
        Ok((samples, turns)) => {
            // From the new process's start: all of it is fleetd's (start-up, the store, the
            // first reading of the lead's status, the nudge).
            let s = line("tmux", "fleetd (re)started → nudge visible", samples, true);
            let mut row = Row::new(
                "wake-up",
                "fleetd restarted (kill -9) with a nudge due → nudge visible, tmux",
                s.map_or_else(|| "no samples".to_owned(), |s| s.cell()),
            );
            if let Some(s) = s {
                row = row.target("p99 ≤ 50 ms (#21)", Met::from_bool(s.p99 <= TARGET));
            }
            rows.push(row);
            let t = line(
                "tmux",
                "fleetd (re)started → nudge's turn starts",
                turns,
                false,
            );
            rows.push(Row::new(
                "wake-up",
                "fleetd restarted (kill -9) with a nudge due → the nudge's turn starts, tmux",
                t.map_or_else(|| "no samples".to_owned(), |s| s.cell()),
            ));
        }
        Err(why) => {
            println!("| tmux | restart: {why} | | | | | | |");
            rows.push(Row::new(
                "wake-up",
                "fleetd restarted (kill -9) with a nudge due → nudge visible, tmux",
                why.clone(),
            ));
        }
    }
    Ok(rows)
}

/// The two agents' logs.
struct Logs {
    dir: tempfile::TempDir,
    member: PathBuf,
    lead: PathBuf,
}

impl Logs {
    fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        Ok(Self {
            member: dir.path().join("member.log"),
            lead: dir.path().join("lead.log"),
            dir,
        })
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn on_tmux(rounds: usize) -> anyhow::Result<Series> {
    let logs = Logs::new()?;
    let profile = crate::rig::sim_profile(
        "bench",
        &[
            ("SIM_AGENT_WORK_MS", &MEMBER_WORK_MS.to_string()),
            ("SIM_AGENT_LOG", &logs.member.display().to_string()),
        ],
    );
    let rig = crate::rig::Rig::start(&config("base:boss", &profile));
    let pane = rig.agent_lead_with("boss", &[format!("SIM_AGENT_LOG={}", logs.lead.display())]);
    rig.spawn("bench", "nia");
    let sight = Sight::tmux(&rig, &pane)?;
    let lead = Lead {
        type_line: Box::new(|line| rig.type_line(&pane, line)),
        sight,
    };
    let mut series = Series::default();
    for round in 0..rounds {
        progress(&format!("wake-up, tmux: round {round}"));
        measure_round(
            round,
            &rig.daemon.operator(),
            &logs,
            &lead,
            None,
            &mut series,
        )?;
    }
    Ok(series)
}

fn on_herdr(rounds: usize) -> anyhow::Result<Series> {
    let logs = Logs::new()?;
    let profile = format!(
        "{}      SIM_AGENT_LOG: \"{}\"\n",
        crate::rig_herdr::sim_profile("bench", MEMBER_WORK_MS),
        logs.member.display()
    );
    let status_log = logs.dir().join("herdr-status.jsonl");
    let mut rig =
        crate::rig_herdr::HerdrRig::start_with_status_log(&config("w1:t1", &profile), &status_log);
    let (_, pane) =
        rig.agent_lead_with("boss", &[format!("SIM_AGENT_LOG={}", logs.lead.display())]);
    rig.call_from(&pane, r#"fleet_spawn {"profile":"bench","name":"nia"}"#);
    let statuses = StatusLog {
        path: status_log,
        pane: pane.clone(),
    };
    let history = {
        let (rig, pane) = (&rig, pane.clone());
        move || rig.history(&pane)
    };
    let lead = Lead {
        type_line: Box::new(|line| rig.type_line(&pane, line)),
        sight: Sight::Poll(Box::new(history)),
    };
    let mut series = Series::default();
    let mut measured = Ok(());
    for round in 0..rounds {
        progress(&format!("wake-up, fake-herdr: round {round}"));
        measured = measure_round(
            round,
            &rig.daemon.operator(),
            &logs,
            &lead,
            Some(&statuses),
            &mut series,
        );
        if measured.is_err() {
            break;
        }
    }
    drop(lead);
    super::nudge::keep_logs(
        "wake-herdr",
        &mut rig.daemon,
        &[&logs.member, &logs.lead, &statuses.path],
    );
    measured.map(|()| series)
}

/// The restart case on tmux: returns fleetd start → nudge visible, one sample per restart.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark compares its timings with the agents wall-clock logs"
)]
fn restart_on_tmux(restarts: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let logs = Logs::new()?;
    let profile = crate::rig::sim_profile(
        "bench",
        &[
            ("SIM_AGENT_WORK_MS", &MEMBER_WORK_MS.to_string()),
            ("SIM_AGENT_LOG", &logs.member.display().to_string()),
        ],
    );
    let mut rig = crate::rig::Rig::start(&config("base:boss", &profile));
    let pane = rig.agent_lead_with("boss", &[format!("SIM_AGENT_LOG={}", logs.lead.display())]);
    rig.spawn("bench", "nia");
    // The bench's own control client: it stays attached while fleetd is killed and restarted.
    let sight = Sight::tmux(&rig, &pane)?;
    let (mut samples, mut turns) = (Vec::new(), Vec::new());
    for round in 0..restarts {
        progress(&format!("wake-up, tmux restart: round {round}"));
        let (member_from, lead_from) = (line_count(&logs.member), line_count(&logs.lead));
        let seen = sight.before();
        send_then_busy(
            round,
            &logs,
            lead_from,
            &|l| rig.type_line(&pane, l),
            LEAD_BUSY_MS + 1500,
        )?;
        // The reply is in the inbox while the lead is still busy: kill fleetd now.
        wait_for(&logs.member, member_from, Duration::from_secs(30), |e| {
            e["event"] == "tool" && e["name"] == "fleet_reply"
        })?;
        rig.kill_daemon();
        // The lead goes idle while no fleetd runs.
        wait_for(&logs.lead, lead_from, Duration::from_secs(30), |e| {
            e["event"] == "turn_done" && after_busy(&logs.lead, lead_from, e)
        })?;
        std::thread::sleep(Duration::from_millis(300));
        let started_us = now_us();
        rig.restart_daemon();
        let visible_at = sight
            .shown(seen)
            .context("no nudge in the lead's pane 60 s after the restart")?;
        samples.push(Duration::from_micros(
            u64::try_from(visible_at - started_us).unwrap_or(0),
        ));
        let turn_at = nudge_turn(&logs, lead_from)?;
        turns.push(Duration::from_micros(
            u64::try_from(turn_at - started_us).unwrap_or(0),
        ));
        settle(&rig.daemon.operator(), &logs.lead, lead_from)?;
    }
    Ok((samples, turns))
}

/// Types the task and, once the lead's send turn is over, the busy turn.
fn send_then_busy(
    round: usize,
    logs: &Logs,
    lead_from: usize,
    type_into_lead: &dyn Fn(&str),
    busy_ms: u32,
) -> anyhow::Result<()> {
    type_into_lead(&format!(
        r#"fleet_send {{"target":"nia","task":"round {round}","wait":false}}"#
    ));
    wait_for(&logs.lead, lead_from, Duration::from_secs(30), |e| {
        e["event"] == "turn_done"
    })?;
    type_into_lead(&format!("@busy={busy_ms} round {round}"));
    Ok(())
}

/// Whether `event` of the lead's log comes after its busy turn started.
fn after_busy(log: &Path, from: usize, event: &Value) -> bool {
    let all = events(log, from);
    let busy = all.iter().position(|e| e["action"] == "Busy");
    let this = all.iter().position(|e| e == event);
    matches!((busy, this), (Some(b), Some(t)) if t > b)
}

fn measure_round(
    round: usize,
    operator: &http::Endpoint,
    logs: &Logs,
    lead: &Lead<'_>,
    statuses: Option<&StatusLog>,
    series: &mut Series,
) -> anyhow::Result<()> {
    let (member_from, lead_from) = (line_count(&logs.member), line_count(&logs.lead));
    let seen = lead.sight.before();
    send_then_busy(round, logs, lead_from, &*lead.type_line, LEAD_BUSY_MS)?;
    let visible_at = lead.sight.shown(seen)?;
    let turn_at = nudge_turn(logs, lead_from)?;
    let lead_events = events(&logs.lead, lead_from);
    let busy = lead_events
        .iter()
        .position(|e| e["action"] == "Busy")
        .context("the lead's busy turn is not in its log")?;
    let idle_at = lead_events
        .iter()
        .skip(busy)
        .find(|e| e["event"] == "turn_done")
        .and_then(|e| e["at_us"].as_i64())
        .context("the lead's busy turn did not end")?;
    let reply_at = events(&logs.member, member_from)
        .iter()
        .find_map(|e| {
            (e["event"] == "tool" && e["name"] == "fleet_reply")
                .then(|| e["at_us"].as_i64())
                .flatten()
        })
        .context("the member's fleet_reply is not in its log")?;
    if reply_at < idle_at {
        let since = |at: i64| Duration::from_micros(u64::try_from(at - idle_at).unwrap_or(0));
        series.visible.push(since(visible_at));
        series.turn.push(since(turn_at));
        if let Some(statuses) = statuses {
            // herdr's idle report for this idle moment: the first one at or after it.
            if let Some(reported) = statuses.first_idle_after(idle_at - 1_000) {
                series.herdr.push(since(reported.max(idle_at)));
                series.fleetd.push(Duration::from_micros(
                    u64::try_from(visible_at - reported.max(idle_at)).unwrap_or(0),
                ));
            }
        }
    } else {
        series.late += 1;
    }
    settle(operator, &logs.lead, lead_from)
}

/// Waits for the nudge's turn, then reads the mail so the next round starts a fresh batch.
fn settle(operator: &http::Endpoint, lead_log: &Path, lead_from: usize) -> anyhow::Result<()> {
    wait_for(lead_log, lead_from, Duration::from_secs(60), |e| {
        e["event"] == "turn"
            && e["prompt"]
                .as_str()
                .is_some_and(|p| p.starts_with("[fleet]"))
    })?;
    read_mail_and_pause(operator, "nia")
}

/// Waits until the log at `path` (from line `from`) has an event matching `pred`; returns its
/// `at_us`.
/// When the lead's log shows the turn a `[fleet]` nudge started, after its line `from` (60 s at
/// most).
fn nudge_turn(logs: &Logs, from: usize) -> anyhow::Result<i64> {
    wait_for(&logs.lead, from, Duration::from_secs(60), |e| {
        e["event"] == "turn"
            && e["prompt"]
                .as_str()
                .is_some_and(|p| p.starts_with("[fleet]"))
    })
}

fn wait_for(
    path: &Path,
    from: usize,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<i64> {
    let mut found = None;
    crate::wait_until("an agent's log event", timeout, || {
        found = events(path, from)
            .iter()
            .find(|e| pred(e))
            .and_then(|e| e["at_us"].as_i64());
        found.is_some()
    });
    found.context("the event has no timestamp")
}

/// fake-herdr's own record of the statuses it reported (`--status-log`), written as it pushes
/// each event: when herdr said the lead was at rest, without the lag of a reader of its own on
/// a busy machine (the bench's own subscriber used to see some reports after fleetd had already
/// acted on them, which made fleetd's part look negative).
struct StatusLog {
    path: std::path::PathBuf,
    pane: String,
}

impl StatusLog {
    /// The first report of the agent at rest (`idle`, or `done`: herdr's idle for a turn nobody
    /// has looked at yet) at or after `at`.
    fn first_idle_after(&self, at: i64) -> Option<i64> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["pane_id"] == self.pane.as_str()
                    && matches!(v["agent_status"].as_str(), Some("idle" | "done"))
            })
            .filter_map(|v| v["at_us"].as_i64())
            .find(|&t| t >= at)
    }
}

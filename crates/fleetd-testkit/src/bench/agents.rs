//! Real-agent wake-up (issue 32): from a member's reply stored to the lead's next model request,
//! with the real Claude Code (the newest pin of `agents/pins`) as lead and member on tmux, against
//! the scripted model (`fake_model`), set up as the README tells a user to (`AgentRig`).
//!
//! One round: the lead sends its member a task without waiting (`@send-nowait`), and its turn
//! ends; the member's model takes 2 s before it answers with `fleet_reply`, so the reply lands
//! while the lead is idle. The series runs from the reply's `reply.stored` event (fleetd's clock,
//! on the operator's `/events` stream) to the lead's model receiving the request of the turn
//! the nudge started (the scripted model's clock, the same machine's): fleetd's push decision,
//! the text typed into the pane and seen there, Enter, and Claude Code starting its turn and
//! sending the request — the whole of what the user waits for. The round ends once the lead has
//! read and acknowledged the reply.
//!
//! The same series for the keystroke-free wake (issue 33), beside it: the lead sends with
//! `fleet_send`'s default wait, which Claude Code takes as an MCP task; the series runs from
//! `reply.stored` to the request of the turn the task's completion started (Claude Code's next
//! `tasks/get` after the reply, at fleetd's `pollIntervalMs`, then its turn).
//!
//! `fleetd-bench agents [--rounds N]`. Prints; never asserts. Needs tmux and the real CLIs
//! (`scripts/install-agents`).

use std::time::Duration;

use anyhow::Context as _;

use super::{Met, Row, Summary, progress};
use crate::agents::claude::{self, Transport};
use crate::agents::rig::{AgentRig, pause};
use crate::agents::turns::{finished, nudges, prompt, read_on_nudge};
use crate::agents::{Cli, versions};
use crate::http::Endpoint;
use crate::http::events::SseReader;

const DEFAULT_ROUNDS: usize = 20;
/// Issue 32's target, for p99.
const TARGET: Duration = Duration::from_millis(500);
const AREA: &str = "real agents";

/// Runs the benchmark, prints its table and returns its row.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = super::arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    anyhow::ensure!(
        crate::require_tmux() == crate::Service::Present,
        "not measured: tmux not found"
    );
    let version = versions("claude-code")
        .into_iter()
        .next()
        .context("no Claude Code pin in agents/pins")?;
    let cli = Cli::find("claude-code", &version).with_context(|| {
        format!("not measured: Claude Code {version} is not installed (run scripts/install-agents)")
    })?;
    let mut rows = Vec::new();
    for path in [Path::Nudge, Path::Task] {
        let measurement = format!(
            "member's reply stored → the lead's next model request, {} (real Claude Code {version}, tmux)",
            path.name()
        );
        let samples = measure(&cli, rounds, path)?;
        let summary = Summary::of(samples);
        println!("\n## {measurement}, {rounds} rounds\n");
        println!("{}", summary.cell());
        let row = Row::new(AREA, measurement, summary.cell());
        rows.push(match path {
            Path::Nudge => row.target(
                format!("p99 ≤ {} ms (issue 32)", TARGET.as_millis()),
                Met::from_bool(summary.p99 <= TARGET),
            ),
            Path::Task => {
                let bound = fleetd::mcp::wake::TASK_POLL + Duration::from_millis(300);
                row.target(
                    format!(
                        "≤ pollIntervalMs + 300 ms = {} ms (issue 33)",
                        bound.as_millis()
                    ),
                    Met::from_bool(summary.p99 <= bound),
                )
            }
        });
    }
    Ok(rows)
}

/// How the lead learns of the reply.
#[derive(Debug, Clone, Copy)]
enum Path {
    /// `fleet_send` without a wait; the reply is nudged about.
    Nudge,
    /// `fleet_send` with its wait, as an MCP task.
    Task,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Self::Nudge => "nudge typed",
            Self::Task => "MCP task, nothing typed",
        }
    }

    /// The lead's turns this path started (their first request).
    fn turns(self, rig: &AgentRig) -> Vec<crate::fake_model::Logged> {
        let turns = rig.lead_model.turns();
        match self {
            Self::Nudge => nudges(&turns),
            Self::Task => turns
                .into_iter()
                .filter(|r| prompt(r).contains("<task-notification>") && r["steps"] == 0)
                .collect(),
        }
    }
}

fn measure(cli: &Cli, rounds: usize, path: Path) -> anyhow::Result<Vec<Duration>> {
    let mut rig = AgentRig::start(&[cli], &claude::profile("claude"), "");
    let lead = claude::start_lead(&mut rig, cli, Transport::Http);
    let Endpoint::Unix(socket) = rig.daemon.operator() else {
        anyhow::bail!("the operator's endpoint is not a unix socket");
    };
    let mut events = SseReader::unix(&socket, None).context("GET /events")?;
    anyhow::ensure!(events.status == 200, "GET /events: {}", events.refusal);
    rig.say(&lead, "@spawn claude alice");
    rig.wait("the spawn turn to end", Duration::from_secs(90), || {
        finished(&rig.lead_model.turns(), |r| {
            prompt(r) == "@spawn claude alice"
        })
    });
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let seen = path.turns(&rig).len();
        let text = format!("round {round} done");
        let send = match path {
            Path::Nudge => "@send-nowait",
            Path::Task => "@send",
        };
        rig.say(&lead, &format!("{send} alice @sleep 2 @reply {text}"));
        let stored = events.until("alice's reply to be stored", |e| {
            e.event == "reply.stored" && e.data["target"] == "alice"
        });
        let at: jiff::Timestamp = stored
            .last()
            .and_then(|e| e.data["at"].as_str()?.parse().ok())
            .context("a reply.stored event without its time")?;
        rig.wait("the lead's next turn", Duration::from_secs(30), || {
            path.turns(&rig).len() > seen
        });
        let asked = path.turns(&rig)[seen]["t"]
            .as_i64()
            .context("a request without its time")?;
        let gap = asked - at.as_millisecond();
        samples.push(Duration::from_millis(u64::try_from(gap).unwrap_or(0)));
        progress(&format!("round {round}: {gap} ms"));
        rig.wait(
            "the lead to read the reply",
            Duration::from_secs(60),
            || {
                let turns = rig.lead_model.turns();
                match path {
                    Path::Nudge => read_on_nudge(&turns, &text),
                    Path::Task => finished(&turns, |r| {
                        prompt(r).contains("<task-notification>") && prompt(r).contains(&text)
                    }),
                }
            },
        );
        pause(Duration::from_millis(500));
    }
    Ok(samples)
}

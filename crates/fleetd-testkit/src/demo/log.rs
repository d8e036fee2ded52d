//! What the demo reads and how it waits: `sim-agent` event logs (one JSON line per event, each
//! with its `at_us` timestamp), the lead agent driven by typing `TOOL {json}` lines into its pane,
//! and a polling wait that fails with what it waited for. Reads and types only; it decides
//! nothing about the scenario (that is `demo::play`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::rig::Rig;

/// How long one wait for an agent's event may take before the demo gives up.
pub(crate) const EVENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a wait polls.
const POLL: Duration = Duration::from_millis(20);

/// Now, in µs since the epoch: the clock `sim-agent` stamps its log lines with, so the demo's
/// own timings and the agents' events compare directly.
#[expect(
    clippy::disallowed_methods,
    reason = "the demo compares its timings with the agents wall-clock logs"
)]
pub(crate) fn now_us() -> i64 {
    jiff::Timestamp::now().as_microsecond()
}

/// The time from `from_us` to `to_us` (zero when negative).
pub(crate) fn between(from_us: i64, to_us: i64) -> Duration {
    Duration::from_micros(u64::try_from(to_us.saturating_sub(from_us)).unwrap_or(0))
}

/// Polls `probe` until it yields a value or `timeout` passes; the error names `what`.
#[expect(
    clippy::disallowed_methods,
    reason = "the demo waits for real processes (tmux, fleetd, agents) on the wall clock"
)]
pub(crate) fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = now_us().saturating_add(i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX));
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if now_us() > deadline {
            bail!("timed out after {} s waiting for {what}", timeout.as_secs());
        }
        std::thread::sleep(POLL);
    }
}

/// One agent's event log (`SIM_AGENT_LOG`).
#[derive(Debug, Clone)]
pub(crate) struct AgentLog {
    path: PathBuf,
}

impl AgentLog {
    /// The log at `path` (it need not exist yet).
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
        }
    }

    /// The log's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Every complete event so far, in order.
    pub(crate) fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// How many events there are now: a mark to look for later events from.
    pub(crate) fn mark(&self) -> usize {
        self.events().len()
    }

    /// The first event at or after index `from` that `matches`, if any, with its index.
    pub(crate) fn find(
        &self,
        from: usize,
        mut matches: impl FnMut(&Value) -> bool,
    ) -> Option<(usize, Value)> {
        self.events()
            .into_iter()
            .enumerate()
            .skip(from)
            .find(|(_, e)| matches(e))
    }

    /// Waits for the first event at or after `from` that `matches`.
    pub(crate) fn wait(
        &self,
        what: &str,
        from: usize,
        mut matches: impl FnMut(&Value) -> bool,
    ) -> anyhow::Result<(usize, Value)> {
        wait_for(what, EVENT_TIMEOUT, || self.find(from, &mut matches))
    }

    /// Waits for the end of the turn that logged event `index` (its `turn_done`).
    pub(crate) fn wait_turn_done(
        &self,
        what: &str,
        index: usize,
    ) -> anyhow::Result<(usize, Value)> {
        self.wait(what, index + 1, |e| e["event"] == "turn_done")
    }
}

/// The `at_us` of an event (0 when missing).
pub(crate) fn at_us(event: &Value) -> i64 {
    event["at_us"].as_i64().unwrap_or(0)
}

/// Whether `event` is the result (or failure) of a call to `tool`.
pub(crate) fn is_call_of(event: &Value, tool: &str) -> bool {
    (event["event"] == "tool" || event["event"] == "tool_error") && event["name"] == tool
}

/// Whether `event` is a turn the push loop started: a nudge typed into the lead.
pub(crate) fn is_nudge(event: &Value) -> bool {
    event["event"] == "turn"
        && event["prompt"]
            .as_str()
            .is_some_and(|p| p.starts_with("[fleet]"))
}

/// The `structuredContent` of a logged tool call; an error when the call failed or was refused.
pub(crate) fn structured(event: &Value) -> anyhow::Result<Value> {
    let name = event["name"].as_str().unwrap_or("?");
    if event["event"] == "tool_error" {
        bail!("{name} failed: {}", event["error"]);
    }
    let result = &event["result"];
    if result["isError"] == true {
        bail!("{name} was refused: {}", result["structuredContent"]);
    }
    Ok(result["structuredContent"].clone())
}

/// The lead: a `sim-agent` in call mode in a pane of the rig. A tool call is a line typed into
/// its pane, so fleetd sees a real agent lead make it (and reads its status from the pane).
#[derive(Debug)]
pub(crate) struct Lead {
    /// The lead's tmux target.
    pub(crate) pane: String,
    /// Its event log.
    pub(crate) log: AgentLog,
}

impl Lead {
    /// Types `tool {args}` into the lead's pane; returns the log mark to find its result from.
    pub(crate) fn type_call(&self, rig: &Rig, tool: &str, args: &Value) -> usize {
        let from = self.log.mark();
        rig.type_line(&self.pane, &format!("{tool} {args}"));
        from
    }

    /// Waits for the result of the lead's `tool` call typed at mark `from`, then for the end of
    /// that turn (so the next typed line starts a new turn); returns the result event and the
    /// `turn_done` event.
    pub(crate) fn finish_call(
        &self,
        tool: &str,
        from: usize,
    ) -> anyhow::Result<((usize, Value), (usize, Value))> {
        let what = format!("the lead's {tool} call");
        let result = self.log.wait(&what, from, |e| is_call_of(e, tool))?;
        let done = self.log.wait_turn_done(&what, result.0)?;
        Ok((result, done))
    }

    /// Makes the lead call `tool` and returns its `structuredContent` once the turn is over.
    pub(crate) fn call(&self, rig: &Rig, tool: &str, args: &Value) -> anyhow::Result<Value> {
        let from = self.type_call(rig, tool, args);
        let ((_, event), _) = self.finish_call(tool, from)?;
        structured(&event).with_context(|| format!("the lead's {tool} {args}"))
    }
}

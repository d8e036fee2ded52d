//! Peers side by side (issue 17): the tools a user would pick instead of fleetd to let agents
//! message each other, each installed from its own registry package into a throwaway
//! environment at bench time (hcom from PyPI, Agent Relay from npm) and measured on the same work
//! as fleetd: a message from one agent to another until the receiver can read it, and — where
//! the peer has one — its own wake-up of an idle receiving agent. A peer that cannot be installed
//! or run here gets the reason in its cell, never a number. Nothing is asserted.
//!
//! fleetd's send → read is measured in the same run by the mailbox benchmark's own code
//! (`fleet_reply` + `fleet_poll`, the first two of its three calls); fleetd's wake-up is the
//! push benchmark's "the nudge's turn starts" rows, copied into this table by `fleetd-bench all`
//! ([`fill_fleetd_wakeup`]) rather than measured a second way.
//!
//! `FLEETD_BENCH_PEERS_DIR=DIR` installs the peers under `DIR` and keeps them there for the next
//! run (reused when present); without it everything lives in a temp dir removed afterwards.
//!
//! `fleetd-bench peers [--rounds N] [--wake-rounds N]`.

mod agent_relay;
mod hcom;

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Row, Summary, arg_number, progress};

const DEFAULT_ROUNDS: usize = 100;
/// The push benchmark's number of rounds, so the wake-up series are the same size.
const DEFAULT_WAKE_ROUNDS: usize = 30;
/// Rounds run first and not counted (connections, caches, SQLite pages warm up).
const WARMUP: usize = 5;
/// The same ~200 B reply as the mailbox and inbox benchmarks send.
const TEXT: &str = "benchmark reply: the task is done, see the diff in the branch; nothing else changed. \
                    This sentence pads the reply to about two hundred bytes like a short real answer.";
/// The measurement of the wake-up row, matched by `fill_fleetd_wakeup`.
const WAKE_ROW: &str =
    "a peer's own wake-up of an idle receiving agent (message → the agent reads it)";
/// The push benchmark's rows that measure the same moment for fleetd.
const FLEETD_WAKE_PREFIX: &str = "reply → the nudge's turn starts in the lead, ";
const FLEETD_WAKE_UNFILLED: &str =
    "see the push rows (`fleetd-bench nudge`: reply → the nudge's turn starts)";

/// One series on one system: how it was driven, and its numbers or why there are none.
struct Series {
    how: String,
    result: Result<Summary, String>,
}

impl Series {
    fn new(how: impl Into<String>, result: anyhow::Result<Summary>) -> Self {
        Self {
            how: how.into(),
            result: result.map_err(|e| one_line(&e)),
        }
    }

    fn not_measured(how: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            how: how.into(),
            result: Err(why.into()),
        }
    }

    fn cell(&self) -> String {
        match &self.result {
            Ok(s) => format!("{}: {}", self.how, s.cell()),
            Err(why) => format!("{}: not measured — {why}", self.how),
        }
    }
}

/// What one peer did in this run.
struct Peer {
    /// `name version`, as the tables show it.
    name: String,
    /// A message until the receiver can read it, one or more ways.
    readable: Vec<Series>,
    /// Whether the message was on disk before the send returned, and how that is known.
    durable: String,
    /// Its own wake-up of an idle receiving agent.
    wake: Series,
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    let wake_rounds = arg_number(args, "--wake-rounds", DEFAULT_WAKE_ROUNDS)?;
    let scratch = Scratch::new()?;
    progress("peers: fleetd send → read (the mailbox benchmark's fleet_reply + fleet_poll)…");
    let fleetd = Series::new(
        "fleet_reply + fleet_poll",
        guarded(|| fleetd_send_read(rounds)),
    );
    progress("peers: hcom (venv + pip install)…");
    let hcom = guarded_peer("hcom", || hcom::measure(&scratch.dir("hcom")?, rounds));
    progress("peers: Agent Relay (npm install; the 1.x build compiles native modules, minutes)…");
    let relay = guarded_peers("Agent Relay", || {
        agent_relay::measure(&scratch, rounds, wake_rounds)
    });
    let peers: Vec<Peer> = std::iter::once(hcom).chain(relay).collect();
    print_table(rounds, wake_rounds, &fleetd, &peers);
    Ok(rows(&fleetd, &peers))
}

fn fleetd_send_read(rounds: usize) -> anyhow::Result<Summary> {
    let samples = super::mailbox::fleetd_samples(rounds)?;
    Ok(Summary::of(samples.iter().map(|s| s[0] + s[1]).collect()))
}

fn print_table(rounds: usize, wake_rounds: usize, fleetd: &Series, peers: &[Peer]) {
    println!(
        "\nPeers side by side ({rounds} rounds after {WARMUP} warm-up; wake-up {wake_rounds} rounds)\n"
    );
    println!(
        "| system | message → receiver can read it | durable when the send returns | own wake-up of an idle receiver |"
    );
    println!("|---|---|---|---|");
    println!(
        "| fleetd | {} | yes: `fleet_reply` returns after the SQLite commit (WAL, synchronous=FULL) | {FLEETD_WAKE_UNFILLED} |",
        cell(&fleetd.cell())
    );
    for peer in peers {
        let readable: Vec<String> = peer.readable.iter().map(Series::cell).collect();
        println!(
            "| {} | {} | {} | {} |",
            peer.name,
            cell(&readable.join("; ")),
            cell(&peer.durable),
            cell(&peer.wake.cell())
        );
    }
}

fn rows(fleetd: &Series, peers: &[Peer]) -> Vec<Row> {
    let readable: Vec<String> = peers
        .iter()
        .map(|p| {
            let series: Vec<String> = p.readable.iter().map(Series::cell).collect();
            format!(
                "{} ({}): {}",
                p.name,
                durability(&p.durable),
                series.join(", ")
            )
        })
        .collect();
    let wake: Vec<String> = peers
        .iter()
        .map(|p| format!("{}: {}", p.name, p.wake.cell()))
        .collect();
    let fleetd_cell = match &fleetd.result {
        Ok(s) => s.cell(),
        Err(why) => format!("not measured — {why}"),
    };
    vec![
        Row::new(
            "peers",
            "message → the receiver can read it (fleetd: durable before the send returns)",
            cell(&fleetd_cell),
        )
        .alternatives(cell(&readable.join("; "))),
        Row::new("peers", WAKE_ROW, FLEETD_WAKE_UNFILLED).alternatives(cell(&wake.join("; "))),
    ]
}

/// The first word of a durability note (`yes` / `no` / `unknown`), for the combined table.
fn durability(note: &str) -> String {
    let word = note.split([':', ' ']).next().unwrap_or_default();
    match word {
        "yes" => "durable".to_owned(),
        "no" => "not durable".to_owned(),
        _ => "durability unknown".to_owned(),
    }
}

/// Puts fleetd's own wake-up numbers from the push rows of the same run into the peers' wake-up
/// row, so the two read side by side without measuring fleetd's nudge a second way.
pub fn fill_fleetd_wakeup(rows: &mut [Row]) {
    let found: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let backend = r.measurement.strip_prefix(FLEETD_WAKE_PREFIX)?;
            Some(format!("{backend}: {}", r.fleetd))
        })
        .collect();
    if found.is_empty() {
        return;
    }
    let text = format!(
        "nudge → the lead's turn starts (push rows) — {}",
        found.join("; ")
    );
    for row in rows.iter_mut().filter(|r| r.measurement == WAKE_ROW) {
        row.fleetd = text.clone();
    }
}

/// A table cell: no pipes or line breaks.
fn cell(text: &str) -> String {
    text.replace('|', "/").replace('\n', " ")
}

fn one_line(e: &anyhow::Error) -> String {
    cell(&format!("{e:#}"))
}

/// Runs one measurement; an error or a panic becomes the reason in its cell.
fn guarded<T>(run: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        Ok(result) => result,
        Err(_) => Err(anyhow::anyhow!("the benchmark panicked (see stderr)")),
    }
}

fn guarded_peer(name: &str, run: impl FnOnce() -> anyhow::Result<Peer>) -> Peer {
    guarded(run).unwrap_or_else(|e| failed_peer(name, &e))
}

fn guarded_peers(name: &str, run: impl FnOnce() -> anyhow::Result<Vec<Peer>>) -> Vec<Peer> {
    guarded(run).unwrap_or_else(|e| vec![failed_peer(name, &e)])
}

fn failed_peer(name: &str, e: &anyhow::Error) -> Peer {
    let why = one_line(e);
    Peer {
        name: name.to_owned(),
        readable: vec![Series::not_measured("send → read", why.clone())],
        durable: "unknown: it did not run".to_owned(),
        wake: Series::not_measured("wake-up", why),
    }
}

/// Where the peers are installed: a temp dir removed afterwards, or `FLEETD_BENCH_PEERS_DIR`.
struct Scratch {
    root: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl Scratch {
    fn new() -> anyhow::Result<Self> {
        if let Some(dir) = std::env::var_os("FLEETD_BENCH_PEERS_DIR") {
            let root = PathBuf::from(dir);
            std::fs::create_dir_all(&root)?;
            return Ok(Self { root, _temp: None });
        }
        let temp = tempfile::Builder::new()
            .prefix("fleetd-bench-peers-")
            .tempdir()?;
        Ok(Self {
            root: temp.path().to_owned(),
            _temp: Some(temp),
        })
    }

    /// A directory of its own for one peer (created).
    fn dir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let dir = self.root.join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

/// Whether `dir` already holds a finished install (a marker written after one succeeded).
fn installed(dir: &Path) -> bool {
    dir.join(".fleetd-bench-installed").exists()
}

fn mark_installed(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(dir.join(".fleetd-bench-installed"), b"")?;
    Ok(())
}

/// Percentiles of samples in microseconds.
fn summary_us(samples_us: &[f64]) -> anyhow::Result<Summary> {
    anyhow::ensure!(!samples_us.is_empty(), "no samples");
    Ok(Summary::of(
        samples_us
            .iter()
            .map(|us| Duration::from_secs_f64(us.max(0.0) / 1e6))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(ms: u64) -> Summary {
        Summary::of(vec![Duration::from_millis(ms)])
    }

    #[test]
    fn the_wake_row_gets_fleetds_push_numbers_of_the_same_run() {
        let mut rows = vec![
            Row::new("push", format!("{FLEETD_WAKE_PREFIX}tmux"), "p50 1 / p99 2"),
            Row::new(
                "push",
                "reply → nudge text visible in an idle lead pane, tmux",
                "x",
            ),
            Row::new(
                "push",
                format!("{FLEETD_WAKE_PREFIX}fake-herdr"),
                "p50 3 / p99 4",
            ),
            Row::new("peers", WAKE_ROW, FLEETD_WAKE_UNFILLED),
        ];
        fill_fleetd_wakeup(&mut rows);
        assert_eq!(
            rows[3].fleetd,
            "nudge → the lead's turn starts (push rows) — tmux: p50 1 / p99 2; fake-herdr: p50 3 / p99 4"
        );
    }

    #[test]
    fn without_push_rows_the_wake_row_points_at_the_push_benchmark() {
        let mut rows = vec![Row::new("peers", WAKE_ROW, FLEETD_WAKE_UNFILLED)];
        fill_fleetd_wakeup(&mut rows);
        assert_eq!(rows[0].fleetd, FLEETD_WAKE_UNFILLED);
    }

    #[test]
    fn a_peer_that_did_not_run_says_why_in_both_rows() {
        let fleetd = Series::new("fleet_reply + fleet_poll", Ok(summary(2)));
        let peer = failed_peer("hcom", &anyhow::anyhow!("pip install hcom failed: a | b"));
        let rows = rows(&fleetd, &[peer]);
        assert!(
            rows[0].fleetd.starts_with("p50 2.000 ms"),
            "{}",
            rows[0].fleetd
        );
        assert_eq!(
            rows[0].alternatives,
            "hcom (durability unknown): send → read: not measured — pip install hcom failed: a / b"
        );
        assert_eq!(
            rows[1].alternatives,
            "hcom: wake-up: not measured — pip install hcom failed: a / b"
        );
    }

    #[test]
    fn durability_notes_shorten_to_their_verdict() {
        assert_eq!(durability("yes: WAL fsync"), "durable");
        assert_eq!(durability("no: stored after delivery"), "not durable");
        assert_eq!(durability("unknown: did not run"), "durability unknown");
    }
}

//! Which tmux event source tells of a pane's change soonest, and what each costs with 200 panes
//! (issue 21): the `%output` notification a control client with output on gets (fleetd's status
//! source), against a format subscription (`refresh-client -B`, `%subscription-changed`) on the
//! pane's title. A private tmux server with 200 panes, each running `cat` with echo off (it
//! writes back each line typed, so one line holding an OSC 2 sequence both prints and sets the
//! title, in one write). Each
//! round types a title into one pane through a control client of the bench's own and times both
//! notifications from the moment the command was written. Then the tmux server's CPU over an
//! idle window, without and with the subscription on every pane.
//!
//! `fleetd-bench tmux-events [--rounds N] [--panes N]`. Prints; never asserts.
#![expect(
    clippy::disallowed_methods,
    reason = "a benchmark times notifications and idle windows on the wall clock"
)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{Row, Summary};
use crate::tmux::TmuxServer;

const DEFAULT_ROUNDS: usize = 60;
const DEFAULT_PANES: usize = 200;
/// The idle window each CPU figure is taken over.
const IDLE: Duration = Duration::from_secs(20);

/// A notification, as the reader thread saw it.
enum Seen {
    Output { pane: String, at: Instant },
    Subscription { pane: String, at: Instant },
}

/// A control client of the bench's own, attached to the session of the panes.
struct Client {
    child: Child,
    stdin: ChildStdin,
    seen: mpsc::Receiver<Seen>,
}

impl Client {
    fn attach(server: &TmuxServer, session: &str) -> anyhow::Result<Self> {
        let mut child = crate::tmux::attach_control(server.command(), session)?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = Instant::now();
                let mut words = line.split(' ');
                let seen = match words.next() {
                    Some("%output") => words.next().map(|p| Seen::Output {
                        pane: p.to_owned(),
                        at,
                    }),
                    // `%subscription-changed name $session @window index %pane - value`
                    Some("%subscription-changed") => words.nth(4).map(|p| Seen::Subscription {
                        pane: p.to_owned(),
                        at,
                    }),
                    _ => None,
                };
                if let Some(seen) = seen
                    && tx.send(seen).is_err()
                {
                    return;
                }
            }
        });
        Ok(Self { child, stdin, seen })
    }

    fn send(&mut self, line: &str) -> anyhow::Result<Instant> {
        let at = Instant::now();
        writeln!(self.stdin, "{line}").context("write to the control client")?;
        self.stdin.flush()?;
        Ok(at)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tmux server's CPU over [`IDLE`], as a percentage of one core.
fn idle_cpu(pid: u32) -> anyhow::Result<f64> {
    let before = super::cpu_ticks(pid)?;
    std::thread::sleep(IDLE);
    let used = super::cpu_ticks(pid)? - before;
    #[expect(
        clippy::cast_precision_loss,
        reason = "a percentage of a few thousand ticks"
    )]
    Ok(used as f64 / 100.0 / IDLE.as_secs_f64() * 100.0)
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = super::arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    let panes = super::arg_number(args, "--panes", DEFAULT_PANES)?.max(1);
    if crate::require_tmux() == crate::Service::Skip {
        return Ok(vec![Row::new(
            "wake-up",
            "tmux event sources",
            "not measured: tmux not found",
        )]);
    }
    let server = TmuxServer::start()?;
    for n in 0..panes {
        // No echo: what shows is what `cat` writes back, the title sequence included.
        let out = server.run(&[
            "new-window",
            "-d",
            "-t",
            "base",
            "-n",
            &format!("p{n}"),
            "sh -c 'stty -echo; exec cat'",
        ])?;
        anyhow::ensure!(out.status.success(), "new-window: {out:?}");
    }
    let listed = server.run(&[
        "list-panes",
        "-s",
        "-t",
        "base",
        "-F",
        "#{pane_id} #{window_name}",
    ])?;
    let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| {
            let (id, name) = l.split_once(' ')?;
            name.starts_with('p').then(|| id.to_owned())
        })
        .collect();
    anyhow::ensure!(ids.len() == panes, "{} panes listed of {panes}", ids.len());
    let pid: u32 =
        String::from_utf8_lossy(&server.run(&["display-message", "-p", "#{pid}"])?.stdout)
            .trim()
            .parse()
            .context("the server's pid")?;

    // Idle, no subscription: the control client attached with output on, as fleetd's is.
    let mut client = Client::attach(&server, "base")?;
    let cpu_plain = idle_cpu(pid)?;
    // Quoted: an unquoted `#` starts a comment in tmux's command syntax.
    client.send("refresh-client -B 'title:%*:#{pane_title}'")?;
    std::thread::sleep(Duration::from_millis(500));
    while client.seen.try_recv().is_ok() {}
    let cpu_subscribed = idle_cpu(pid)?;

    let (mut output, mut subscribed) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let pane = &ids[round * 7 % ids.len()];
        while client.seen.try_recv().is_ok() {}
        // An OSC 2 title and a newline: `cat` writes it back, so the pane prints and its title
        // changes in the same write (tmux's parser reads `\ooo` in double quotes as that byte).
        let title = format!("t{round}");
        let sent = client.send(&format!(
            "send-keys -t {pane} -l \"\\033]2;{title}\\007\\015\""
        ))?;
        let (mut out_at, mut sub_at): (Option<Instant>, Option<Instant>) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(5);
        while out_at.is_none() || sub_at.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            match client.seen.recv_timeout(left) {
                Ok(Seen::Output { pane: p, at }) if &p == pane => {
                    out_at.get_or_insert(at);
                }
                Ok(Seen::Subscription { pane: p, at }) if &p == pane => {
                    sub_at.get_or_insert(at);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if let Some(at) = out_at {
            output.push(at - sent);
        }
        if let Some(at) = sub_at {
            subscribed.push(at - sent);
        }
        // Rounds apart by more than tmux's one-second subscription timer (so each is its own
        // change), at a random phase of it.
        std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(0..1000)));
    }
    let mut missing = HashMap::new();
    missing.insert("output", rounds - output.len());
    missing.insert("subscription", rounds - subscribed.len());
    let cell = |samples: Vec<Duration>, what: &str| {
        if samples.is_empty() {
            format!("never within 5 s ({rounds} rounds)")
        } else {
            let n = samples.len();
            let s = Summary::of(samples);
            let lost = missing.get(what).copied().unwrap_or(0);
            format!(
                "p50 {} / p99 {} / max {} (n {n}{})",
                super::ms(s.p50),
                super::ms(s.p99),
                super::ms(s.max),
                if lost > 0 {
                    format!(", {lost} never")
                } else {
                    String::new()
                }
            )
        }
    };
    let output = cell(output, "output");
    let subscribed = cell(subscribed, "subscription");
    println!(
        "\ntmux event sources, {panes} panes ({rounds} rounds, a title typed into one pane)\n"
    );
    println!(
        "| source | typed → notified | tmux server CPU, idle {} s |",
        IDLE.as_secs()
    );
    println!("|---|---|---|");
    println!(
        "| `%output` (control client, output on: fleetd's) | {output} | {cpu_plain:.2} % of a core |"
    );
    println!(
        "| format subscription on every pane's title (`refresh-client -B`) | {subscribed} | {cpu_subscribed:.2} % of a core (with the subscription) |"
    );
    drop(client);
    Ok(vec![
        Row::new(
            "wake-up",
            format!(
                "a pane's change → tmux's %output notification, {panes} panes (fleetd's status source)"
            ),
            format!("{output}; tmux server idle {cpu_plain:.2} % of a core"),
        ),
        Row::new(
            "wake-up",
            format!("a pane's title change → a format subscription's notification, {panes} panes"),
            format!(
                "{subscribed}; tmux server idle {cpu_subscribed:.2} % of a core with it on every pane"
            ),
        ),
    ])
}

//! Caller-locator benchmark: 200 panes in an in-process fake-herdr (real PTYs), each running a
//! process that holds a loopback TCP connection to us; then the locator finds the pane behind
//! each connection. Prints p50/p99 (target of issue 17: a new caller's p99 ≤ 2 ms) and where the
//! time goes, step by step; never asserts timings.
//!
//! `fleetd-bench locate [--panes N] [--under-shell]`. The pane processes are this binary again,
//! run as `fleetd-bench locate --hold ADDR`; with `--under-shell` each runs as a child of a shell
//! that is the pane's own process (`sh -c '…; exit'`), as an agent started from a shell prompt
//! does, so the search walks one level of each pane's tree.

use std::io::Read as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fleetd::locate::{Locator, LocatorConfig};
use fleetd::mux::herdr::{Herdr, HerdrConfig};
use fleetd::mux::{Launch, Multiplexer, MuxRouter, OpenPane, Placement};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::{Met, Row};
use crate::fake_herdr::{Options, Server};

const DEFAULT_PANES: usize = 200;
/// Repeat lookups measured per caller in the warm phase.
const WARM_ROUNDS: usize = 5;

/// Issue 17's target for a new caller's lookup.
const TARGET_P99: Duration = Duration::from_millis(2);

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    if let Some(i) = args.iter().position(|a| a == "--hold") {
        hold(args.get(i + 1).context("--hold needs an address")?)?;
        return Ok(Vec::new());
    }
    let panes = super::arg_number(args, "--panes", DEFAULT_PANES)?;
    let under_shell = args.iter().any(|a| a == "--under-shell");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(bench(panes, under_shell))
}

/// Pane mode: connect and hold the connection until the other side closes it, then connect
/// once more (an agent's later connection: the closed one's fd number is reused) and hold that.
fn hold(addr: &str) -> anyhow::Result<()> {
    for _ in 0..2 {
        let mut stream = std::net::TcpStream::connect(addr)?;
        let mut sink = [0u8; 64];
        while stream.read(&mut sink)? > 0 {}
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round();
    sorted[(rank as usize).min(sorted.len() - 1)]
}

/// Prints one line; returns its p50 and p99.
fn row(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<40} {:>6} {:>9.3} {:>9.3} {:>9.3}",
        samples.len(),
        ms(percentile(&samples, 50.0)),
        ms(percentile(&samples, 99.0)),
        ms(samples.last().copied().unwrap_or_default()),
    );
    (percentile(&samples, 50.0), percentile(&samples, 99.0))
}

async fn bench(panes: usize, under_shell: bool) -> anyhow::Result<Vec<Row>> {
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("herdr.sock");
    let server = Server::new(Options::new(&socket));
    let serving = Arc::clone(&server);
    tokio::spawn(async move { serving.run().await });
    let herdr = Herdr::new(HerdrConfig::new(&socket));
    for _ in 0..100 {
        if herdr.check_protocol().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let result = measure(&herdr, panes, under_shell).await;
    server.stop();
    result
}

async fn measure(herdr: &Herdr, panes: usize, under_shell: bool) -> anyhow::Result<Vec<Row>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let local = listener.local_addr()?;
    let exe = std::env::current_exe()?.display().to_string();
    let argv = if under_shell {
        // The trailing `exit` keeps the shell from exec'ing the holder in its place.
        vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            format!("'{exe}' locate --hold {local}; exit"),
        ]
    } else {
        vec![exe, "locate".into(), "--hold".into(), local.to_string()]
    };

    let started = Instant::now();
    for _ in 0..panes {
        herdr
            .open_pane(OpenPane {
                placement: Placement::NewTab {
                    workspace: "bench".to_owned(),
                },
                label: None,
                cwd: None,
                env: Default::default(),
                launch: Launch::Argv(argv.clone()),
            })
            .await?;
    }
    let held = accept_all(&listener, panes, "pane processes did not all connect").await?;
    println!(
        "locate benchmark: {panes} fake-herdr panes (real PTYs), {} connected callers{}, set up in {:.1} s",
        held.len(),
        if under_shell {
            " (each a shell's child)"
        } else {
            " (each its pane's own process)"
        },
        started.elapsed().as_secs_f64()
    );

    let router = MuxRouter::new(Arc::new(herdr.clone()), None);
    let locator = Locator::new(
        router,
        LocatorConfig {
            pane_ttl: Duration::from_secs(3600),
            ..LocatorConfig::default()
        },
    );
    // The pane map is built once (one pane.list plus one pane.process_info per new pane).
    let (_, first_peer) = &held[0];
    let build = Instant::now();
    let first = locator.locate_tcp(*first_peer, local).await?;
    let build = build.elapsed();
    let first_pid = first.pid.context("the first caller's pid")?;
    anyhow::ensure!(
        first.pane.is_some(),
        "the first caller was not found in a pane"
    );

    // New callers in random order, so pid order does not favour the candidate ordering.
    let mut order: Vec<usize> = (1..held.len()).collect();
    fastrand::shuffle(&mut order);
    let mut cold = Vec::new();
    let mut found = 0;
    let mut shells = vec![first.pane.as_ref().map_or(first_pid, |p| p.shell_pid)];
    for peer in order.iter().map(|&i| &held[i].1) {
        let t = Instant::now();
        let located = locator.locate_tcp(*peer, local).await?;
        cold.push(t.elapsed());
        found += usize::from(located.pane.is_some());
        shells.extend(located.pane.map(|p| p.shell_pid));
    }
    let counts = locator.search_counts();
    let mut warm = Vec::new();
    for _ in 0..WARM_ROUNDS {
        for (_, peer) in held.iter().rev().take(64) {
            let t = Instant::now();
            locator.locate_tcp(*peer, local).await?;
            warm.push(t.elapsed());
        }
    }
    let mut pid_only = Vec::new();
    for _ in 0..WARM_ROUNDS {
        for _ in 0..held.len() {
            let t = Instant::now();
            locator.locate_pid(first_pid).await?;
            pid_only.push(t.elapsed());
        }
    }

    // A caller in no pane (this process): the pane trees do not hold it, the full scan does.
    let own = tokio::net::TcpStream::connect(local).await?;
    let (_own_server_side, own_peer) = listener.accept().await?;
    let mut anonymous = Vec::new();
    for _ in 0..20 {
        let fresh = Locator::new(
            MuxRouter::new(Arc::new(herdr.clone()), None),
            LocatorConfig {
                pane_ttl: Duration::from_secs(3600),
                ..LocatorConfig::default()
            },
        );
        // The pane map is read first, so only the search is timed.
        fresh.locate_pid(first_pid).await?;
        let t = Instant::now();
        let located = fresh.locate_tcp(own_peer, local).await?;
        anonymous.push(t.elapsed());
        anyhow::ensure!(located.pane.is_none(), "this process is in no pane");
    }
    drop(own);

    // The blocking steps on their own, to show where the time goes.
    let mut inode_t = Vec::new();
    let mut ancestry_t = Vec::new();
    let mut tree_t = Vec::new();
    // Remembered across the steps, as the locator remembers them across lookups.
    let memory = Arc::default();
    let mut full_t = Vec::new();
    let mut index_t = Vec::new();
    // Callers in the same random order as the lookups above: the first 50 connected are the
    // first 50 panes opened, the lowest pids, at the front of the sorted pane trees, and timed
    // the holder search at a quarter of what a new caller pays.
    for peer in order.iter().take(50).map(|&i| &held[i].1) {
        let t = Instant::now();
        let inode = fleetd::locate::platform::client_socket(*peer, local)?
            .context("inode")?
            .inode;
        inode_t.push(t.elapsed());
        let t = Instant::now();
        let holder = fleetd::locate::process::find_holder(inode, &[], &shells, &memory)?;
        tree_t.push(t.elapsed());
        let t = Instant::now();
        let pids = fleetd::locate::platform::pids()?;
        index_t.push(t.elapsed());
        let t = Instant::now();
        fleetd::locate::process::find_socket_owner(inode, &pids);
        full_t.push(t.elapsed());
        if let Some((pid, _)) = holder {
            let t = Instant::now();
            fleetd::locate::process::ancestry(pid)?;
            fleetd::locate::platform::read_env_hints(pid);
            ancestry_t.push(t.elapsed());
        }
    }

    // Every caller's later connection: the first ones are closed, each pane process connects
    // again (on the fd number the closed one had), and those are looked up in random order.
    let before = locator.search_counts();
    let callers = held.len();
    drop(held);
    let mut again =
        accept_all(&listener, panes, "pane processes did not all connect again").await?;
    fastrand::shuffle(&mut again);
    let mut later = Vec::with_capacity(panes);
    let mut found_again = 0;
    for (_, peer) in &again {
        let t = Instant::now();
        let located = locator.locate_tcp(*peer, local).await?;
        later.push(t.elapsed());
        found_again += usize::from(located.pane.is_some());
    }
    let after = locator.search_counts();
    drop(again);

    println!(
        "{:<40} {:>6} {:>9} {:>9} {:>9}",
        "lookup", "n", "p50 ms", "p99 ms", "max ms"
    );
    row("pane map build + first lookup (once)", vec![build]);
    let cold = row("new caller: TCP peer -> pid -> pane", cold);
    let warm = row("same connection again (HTTP keep-alive)", warm);
    let later = row("a known caller's new connection", later);
    row("pid -> pane only (warm map)", pid_only);
    row("caller in no pane (full-scan fallback)", anonymous);
    row("  step: sock_diag -> inode", inode_t);
    row("  step: holder search (fds remembered)", tree_t);
    row("  step: ancestry + environment", ancestry_t);
    row("  step: /proc pid list (fallback only)", index_t);
    row("  step: fd scan of every process (old way)", full_t);
    println!(
        "found {}/{} callers in their panes; new callers' sockets found: {} among recent \
         callers, {} in pane trees, {} by the full scan, {} not at all; target p99 <= 2 ms",
        found + 1,
        callers,
        counts.first,
        counts.pane_tree,
        counts.full_scan,
        counts.not_found,
    );
    println!(
        "later connections: {found_again}/{panes} found in their panes; sockets found: {} among \
         recent callers, {} in pane trees, {} by the full scan, {} not at all",
        after.first - before.first,
        after.pane_tree - before.pane_tree,
        after.full_scan - before.full_scan,
        after.not_found - before.not_found,
    );
    let cell = |(p50, p99): (Duration, Duration)| {
        format!("p50 {} / p99 {}", super::ms(p50), super::ms(p99))
    };
    Ok(vec![
        Row::new(
            "identity",
            format!(
                "caller lookup among {panes} panes, new connection (peer → pid → pane){}",
                if under_shell {
                    ", each a shell's child"
                } else {
                    ""
                }
            ),
            cell(cold),
        )
        .target("p99 ≤ 2 ms (#17)", Met::from_bool(cold.1 <= TARGET_P99)),
        Row::new(
            "identity",
            format!("caller lookup among {panes} panes, a known caller's new connection"),
            cell(later),
        ),
        Row::new(
            "identity",
            "caller lookup, same connection again (cached)",
            cell(warm),
        ),
    ])
}

/// Accepts `n` connections on `listener`, each within a minute (`what` says which did not).
async fn accept_all(
    listener: &tokio::net::TcpListener,
    n: usize,
    what: &'static str,
) -> anyhow::Result<Vec<(tokio::net::TcpStream, std::net::SocketAddr)>> {
    let mut accepted = Vec::with_capacity(n);
    while accepted.len() < n {
        let connection = tokio::time::timeout(Duration::from_secs(60), listener.accept())
            .await
            .context(what)??;
        accepted.push(connection);
    }
    Ok(accepted)
}

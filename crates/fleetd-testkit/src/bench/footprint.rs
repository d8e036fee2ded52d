//! What the daemon costs (issue 9): cold start of the built `fleetd` to `/healthz` 200 (fresh
//! HOME and state each time, fake-herdr as the multiplexer), and its idle CPU and RSS — with only
//! a lead, with 200 idle members registered through `fleet_spawn`, and with 100,000 replies
//! queued in the embedded store before it starts. CPU is `utime + stime` from
//! `/proc/<pid>/stat` over an idle window; RSS is `VmRSS` from `/proc/<pid>/status` at its end.
//! Only fleetd's own process is counted (not fake-herdr, not the panes). Prints; never asserts.
//!
//! With tmux present, the same idle window with `--members` idle `sim-agent` members on a private
//! tmux server (issue 17's row; `--tmux-only` measures just that).
//!
//! `fleetd-bench footprint [--starts N] [--window SECS] [--members N] [--queued N] [--tmux-only]`.

use std::net::{SocketAddr, TcpListener};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fleetd::store::{InboxStore, SqliteStore, StoreOptions};
use fleetd_core::Target;

use super::pane_client::HerdrFleet;
use super::{Row, Summary, arg_number, progress};
use crate::daemon::{Daemon, command, state_dir, write_config};
use crate::fake_herdr::process::FakeHerdrProcess;
use crate::{bin_path, wait_until};

const DEFAULT_STARTS: usize = 20;
const DEFAULT_WINDOW_SECS: usize = 30;
const DEFAULT_MEMBERS: usize = 200;
const DEFAULT_QUEUED: usize = 100_000;
/// Spawns in flight at once while registering members (the lead's `fleet_spawn` calls).
const SPAWN_PARALLEL: usize = 8;
/// Targets the queued messages are spread over.
const QUEUED_TARGETS: usize = 100;
/// How long the daemon settles after its last action before an idle window starts.
const SETTLE: Duration = Duration::from_secs(5);

/// Idle cost of one process over a window.
#[derive(Debug, Clone, Copy)]
struct Idle {
    cpu_percent: f64,
    rss_kib: u64,
}

impl Idle {
    fn cell(&self) -> String {
        format!(
            "CPU {:.2} % of a core, RSS {:.1} MiB",
            self.cpu_percent,
            self.rss_kib as f64 / 1024.0
        )
    }
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let starts = arg_number(args, "--starts", DEFAULT_STARTS)?;
    let window = Duration::from_secs(arg_number(args, "--window", DEFAULT_WINDOW_SECS)? as u64);
    let members = arg_number(args, "--members", DEFAULT_MEMBERS)?;
    let queued = arg_number(args, "--queued", DEFAULT_QUEUED)?;
    if args.iter().any(|a| a == "--tmux-only") {
        let row = tmux_row(members, window);
        println!(
            "\n| {} | {} | {} |",
            row.measurement, row.fleetd, row.target
        );
        return Ok(vec![row]);
    }

    progress(&format!("cold start to /healthz 200, {starts} times…"));
    let cold = cold_starts(starts)?;
    let mut rows = vec![Row::new(
        "footprint",
        format!("cold start → /healthz 200 (fake-herdr, fresh state, {starts} starts)"),
        cold.cell(),
    )];

    progress(&format!(
        "idle with a lead only, then with {members} members…"
    ));
    // One lead spawns them all: the per-lead cap is lifted to the fleet's size.
    let mut fleet = HerdrFleet::start(&format!("maxMembersPerLead: {}\n", members + 1))?;
    fleet.wait_healthy();
    settle();
    let bare = idle(fleet.daemon_pid(), window)?;
    let spawned = timed(|| fleet.spawn("idle", "m", members, SPAWN_PARALLEL))?;
    settle();
    let crowded = idle(fleet.daemon_pid(), window)?;
    drop(fleet);

    let on_tmux = tmux_row(members, window);

    progress(&format!("idle with {queued} queued replies…"));
    let (boot, full) = with_queue(queued, window)?;

    let secs = window.as_secs();
    rows.extend([
        Row::new(
            "footprint",
            format!("idle {secs} s, a lead only"),
            bare.cell(),
        ),
        Row::new(
            "footprint",
            format!("register {members} members via fleet_spawn ({SPAWN_PARALLEL} in parallel)"),
            format!(
                "{:.1} s ({:.0} ms each)",
                spawned.as_secs_f64(),
                spawned.as_secs_f64() * 1000.0 / members.max(1) as f64
            ),
        ),
        Row::new(
            "footprint",
            format!("idle {secs} s, {members} members (fake-herdr)"),
            crowded.cell(),
        ),
        on_tmux,
        Row::new(
            "footprint",
            format!("start → /healthz 200 with {queued} queued replies"),
            format!("{:.3} s", boot.as_secs_f64()),
        ),
        Row::new(
            "footprint",
            format!("idle {secs} s, {queued} queued replies"),
            full.cell(),
        ),
    ]);
    println!("\nfleetd footprint\n");
    println!("| measurement | fleetd |");
    println!("|---|---|");
    for row in &rows {
        println!("| {} | {} |", row.measurement, row.fleetd);
    }
    Ok(rows)
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark lets the daemon settle on the wall clock"
)]
fn settle() {
    std::thread::sleep(SETTLE);
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times on the wall clock"
)]
fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let start = std::time::Instant::now();
    f()?;
    Ok(start.elapsed())
}

/// CPU share and RSS of `pid` over `window` (it is not disturbed meanwhile).
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark measures CPU over a wall-clock window"
)]
fn idle(pid: u32, window: Duration) -> anyhow::Result<Idle> {
    let process = procfs::process::Process::new(i32::try_from(pid)?)?;
    let ticks = |p: &procfs::process::Process| -> anyhow::Result<u64> {
        let stat = p.stat()?;
        Ok(stat.utime + stat.stime)
    };
    let (before, start) = (ticks(&process)?, std::time::Instant::now());
    std::thread::sleep(window);
    let (after, elapsed) = (ticks(&process)?, start.elapsed());
    let used = (after - before) as f64 / procfs::ticks_per_second() as f64;
    let rss_kib = process
        .status()?
        .vmrss
        .context("no VmRSS in /proc/<pid>/status")?;
    Ok(Idle {
        cpu_percent: used / elapsed.as_secs_f64() * 100.0,
        rss_kib,
    })
}

/// The row "idle, `members` members on tmux" (issue 17's target), or why it was not measured.
fn tmux_row(members: usize, window: Duration) -> Row {
    let measurement = format!("idle {} s, {members} members on tmux", window.as_secs());
    if crate::require_tmux() != crate::Service::Present {
        return Row::new("footprint", measurement, "not measured: tmux not found");
    }
    progress(&format!("idle with {members} members on tmux…"));
    match std::panic::catch_unwind(|| tmux_members(members, window)) {
        Ok(Ok(idle)) => Row::new("footprint", measurement, idle.cell()).target(
            "≤ 1 % of a core, RSS ≤ 64 MiB (#17)",
            super::Met::from_bool(idle.cpu_percent <= 1.0 && idle.rss_kib <= 64 * 1024),
        ),
        Ok(Err(e)) => Row::new("footprint", measurement, format!("failed: {e:#}")),
        Err(_) => Row::new(
            "footprint",
            measurement,
            "failed: the rig panicked (see stderr)",
        ),
    }
}

/// A private tmux server, the built `fleetd` on it and `members` idle `sim-agent` members
/// spawned by the lead's `fleet_spawn` one at a time: fleetd's own CPU and RSS while they idle
/// (it watches every member's status: tmux's notifications plus the safety poll).
fn tmux_members(members: usize, window: Duration) -> anyhow::Result<Idle> {
    let profile = format!(
        "maxMembersPerLead: {}\nprofiles:\n{}",
        members + 1,
        crate::rig::sim_profile("idle", &[])
    );
    let rig = crate::rig::Rig::start(&profile);
    for n in 0..members {
        rig.spawn("idle", &format!("m{n}"));
    }
    settle();
    idle(rig.daemon.child.id(), window)
}

fn herdr_config(socket: &std::path::Path) -> String {
    format!(
        "multiplexer: herdr\nherdrSocket: {}\nmembersWorkspace: fleet\n",
        socket.display()
    )
}

/// Starts the built binary `starts` times on a fresh HOME; times spawn → first `/healthz` 200.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a process start on the wall clock"
)]
fn cold_starts(starts: usize) -> anyhow::Result<Summary> {
    let scratch = tempfile::tempdir()?;
    let socket = scratch.path().join("herdr.sock");
    let _herdr = FakeHerdrProcess::start(&bin_path("fake-herdr"), &socket)?;
    let mut samples = Vec::with_capacity(starts);
    for n in 0..starts {
        let home = scratch.path().join(format!("home{n}"));
        write_config(&home, &herdr_config(&socket));
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = command(&home);
        cmd.args(["serve", "--listen", &addr.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let start = std::time::Instant::now();
        let mut child = cmd.spawn().context("fleetd starts")?;
        let healthy = loop {
            if crate::http::get(addr, "/healthz").is_ok_and(|r| r.status == 200) {
                break Ok(start.elapsed());
            }
            if let Ok(Some(status)) = child.try_wait() {
                break Err(anyhow::anyhow!(
                    "fleetd exited ({status}) before /healthz 200"
                ));
            }
            if start.elapsed() > Duration::from_secs(60) {
                break Err(anyhow::anyhow!("no /healthz 200 within 60 s"));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let _ = child.kill();
        let _ = child.wait();
        samples.push(healthy?);
    }
    Ok(Summary::of(samples))
}

/// Fills the embedded store of a fresh HOME with `count` replies (the daemon not running), then
/// starts fleetd on it; returns the time to `/healthz` 200 and the idle cost.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a process start on the wall clock"
)]
fn with_queue(count: usize, window: Duration) -> anyhow::Result<(Duration, Idle)> {
    let home = tempfile::tempdir()?;
    let db = state_dir(home.path()).join("inbox.db");
    std::fs::create_dir_all(state_dir(home.path()))?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(fill(db, count))?;
    let socket = home.path().join("herdr.sock");
    let _herdr = FakeHerdrProcess::start(&bin_path("fake-herdr"), &socket)?;
    write_config(home.path(), &herdr_config(&socket));
    let start = std::time::Instant::now();
    let daemon = Daemon::start(home.path(), &[]);
    let addr = daemon.addr;
    wait_until("fleetd /healthz 200", Duration::from_secs(120), || {
        crate::http::get(addr, "/healthz").is_ok_and(|r| r.status == 200)
    });
    let boot = start.elapsed();
    settle();
    let cost = idle(daemon.child.id(), window)?;
    Ok((boot, cost))
}

/// Publishes `count` replies over [`QUEUED_TARGETS`] targets from 64 publishers (group commit).
async fn fill(db: std::path::PathBuf, count: usize) -> anyhow::Result<()> {
    const PUBLISHERS: usize = 64;
    let store: Arc<dyn InboxStore> =
        Arc::new(SqliteStore::open(db, StoreOptions::default()).await?);
    let targets: Vec<Target> = (0..QUEUED_TARGETS)
        .map(|n| Target::new(format!("queued{n}")))
        .collect::<Result<_, _>>()?;
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..PUBLISHERS {
        let (store, targets) = (Arc::clone(&store), targets.clone());
        tasks.spawn(async move {
            let mut n = p;
            while n < count {
                store
                    .publish(super::inbox::message(&targets[n % targets.len()], n))
                    .await?;
                n += PUBLISHERS;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("publisher task")??;
    }
    let mut depth = 0;
    for target in &targets {
        depth += store.depth(target).await?;
    }
    anyhow::ensure!(depth == count as u64, "queued {depth} of {count} replies");
    store.close().await?;
    Ok(())
}

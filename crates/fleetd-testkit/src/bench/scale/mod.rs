//! A fleet of fleets, simulated (issue 36): N fleetd gateways in a vhost of their own on the local
//! RabbitMQ, each on its own fake-herdr with M `sim-agent` members (real PTY panes, herdr's agent
//! detection), each with a lead (a pane client, so fleetd finds it from its pane as it finds an
//! agent) sending tasks to the members of the other gateways at a set rate, `wait: false`. The
//! members answer each task after [`MEMBER_WORK_MS`]; the answers travel back to the leads'
//! inboxes. Presence goes out at the production interval (10 s, and at once when a member joins
//! or leaves).
//!
//! Measured per size, while that load runs:
//!
//! - cross-host reply → nudge visible: a `sim-agent` lead on gateway 0 sends to a member of
//!   gateway 1 and its pane is read every 2 ms until the nudge shows, as `fleetd-bench gateway`
//!   does on two gateways (so ±2 ms of resolution);
//! - what each gateway costs: its CPU (utime + stime over the window, % of one core) and its RSS
//!   at the end (mean and largest), the broker node's CPU and RSS, its AMQP connections and
//!   queues (`rabbitmqctl`);
//! - presence on the broker: the broadcasts and bytes one gateway receives each second (a queue
//!   of the bench's own bound to `fleet.presence`, as a gateway's is); the broker delivers each
//!   to every gateway;
//! - the load itself: tasks sent a second, and whether every ticket was answered within 60 s
//!   after the load stopped (where the fleet falls behind, that is where it bends);
//! - the time from the first `fleet_spawn` until every member of every gateway is ready.
//!
//! `fleetd-bench scale [--sizes 10x50,20x50] [--rate N] [--rounds N]` (`--rate`: tasks a second
//! from each lead). Prints; never asserts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;

use super::nudge::{Sight, guarded, measure};
use super::pane_client::HerdrFleet;
use super::{Row, Summary, arg_number, cpu_ticks, progress};
use crate::broker::{FleetVhost, require_rabbitmqctl};
use crate::http;
use crate::rig_herdr::{history, sim_profile, start_sim_lead, type_line};

const DEFAULT_SIZES: &str = "10x50";
const DEFAULT_RATE: usize = 4;
const DEFAULT_ROUNDS: usize = 20;
/// How long a member works on a task before it replies.
const MEMBER_WORK_MS: u32 = 200;
/// `fleet_spawn`s in flight at once on each gateway.
const SPAWN_PARALLEL: usize = 4;
/// The production default of `gateway.presenceIntervalSecs`.
const PRESENCE_SECS: u64 = 10;
/// How long the answers may take to come home after the load stops.
const DRAIN: Duration = Duration::from_secs(60);

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let sizes = sizes(args)?;
    let rate = arg_number(args, "--rate", DEFAULT_RATE)?.max(1);
    let rounds = arg_number(args, "--rounds", DEFAULT_ROUNDS)?.max(1);
    anyhow::ensure!(
        crate::require_rabbitmq() == crate::Service::Present
            && require_rabbitmqctl() == crate::Service::Present,
        "not measured: no RabbitMQ (and rabbitmqctl) on 127.0.0.1:5672"
    );
    let mut rows = Vec::new();
    for (gateways, members) in sizes {
        progress(&format!(
            "{gateways} gateways × {members} members, {rate} tasks/s from each lead…"
        ));
        let size = format!("{gateways} gateways × {members} members");
        match guarded(|| simulate(gateways, members, rate, rounds)) {
            Ok(seen) => {
                println!("\n### {size}, {rate} tasks/s from each lead\n");
                for (what, cell) in seen.cells() {
                    println!("- {what}: {cell}");
                    rows.push(Row::new("scale", format!("{size}: {what}"), cell));
                }
            }
            Err(why) => {
                println!("\n### {size}: {why}");
                rows.push(Row::new("scale", size, why));
            }
        }
    }
    Ok(rows)
}

/// `--sizes GxM,...`.
fn sizes(args: &[String]) -> anyhow::Result<Vec<(usize, usize)>> {
    let text = match args.iter().position(|a| a == "--sizes") {
        Some(i) => args.get(i + 1).context("--sizes needs GxM[,GxM...]")?,
        None => DEFAULT_SIZES,
    };
    text.split(',')
        .map(|size| {
            let (g, m) = size
                .split_once('x')
                .with_context(|| format!("--sizes: {size:?} is not GATEWAYSxMEMBERS (10x50)"))?;
            let (g, m): (usize, usize) = (g.trim().parse()?, m.trim().parse()?);
            anyhow::ensure!(
                g >= 2 && m >= 1,
                "--sizes: {size:?} needs 2+ gateways, 1+ member"
            );
            Ok((g, m))
        })
        .collect()
}

/// What one size showed.
struct Seen {
    spawned: Duration,
    nudge: Summary,
    after_stored: Summary,
    sent: usize,
    refused: usize,
    loaded: Duration,
    unanswered: usize,
    drained: Option<Duration>,
    gateway_cpu: Spread,
    gateway_rss_mib: Spread,
    /// % of a core, RSS in MiB, RSS before the fleet was provisioned.
    broker: (f64, f64, f64),
    presence: (f64, f64),
    queues: usize,
    connections: usize,
    gateways: usize,
    /// The share of the machine's CPU time that was busy over the window.
    machine: Option<f64>,
}

/// Mean and largest of one figure over the gateways.
struct Spread {
    mean: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Self {
        Self {
            mean: values.iter().sum::<f64>() / values.len().max(1) as f64,
            max: values.iter().copied().fold(0.0, f64::max),
        }
    }
}

impl Seen {
    fn cells(&self) -> Vec<(&'static str, String)> {
        let per = |n: usize| n as f64 / self.gateways as f64;
        vec![
            (
                "cross-host reply → nudge visible, under the load",
                format!(
                    "{} / max {} (from the reply's commit: {})",
                    self.nudge.cell(),
                    super::ms(self.nudge.max),
                    self.after_stored.cell()
                ),
            ),
            (
                "the load",
                format!(
                    "{:.1} tasks/s across ({} in {:.0} s, {} refused); {}",
                    self.sent as f64 / self.loaded.as_secs_f64(),
                    self.sent,
                    self.loaded.as_secs_f64(),
                    self.refused,
                    match self.drained {
                        Some(d) => format!(
                            "every ticket answered {:.1} s after it stopped",
                            d.as_secs_f64()
                        ),
                        None => format!(
                            "{} tickets unanswered 60 s after it stopped",
                            self.unanswered
                        ),
                    }
                ),
            ),
            (
                "each gateway",
                format!(
                    "CPU {:.1} % of a core (largest {:.1} %), RSS {:.1} MiB (largest {:.1} MiB), {:.1} AMQP connections, {:.1} queues",
                    self.gateway_cpu.mean,
                    self.gateway_cpu.max,
                    self.gateway_rss_mib.mean,
                    self.gateway_rss_mib.max,
                    per(self.connections),
                    per(self.queues),
                ),
            ),
            (
                "the broker (one RabbitMQ node)",
                format!(
                    "CPU {:.1} % of a core, RSS {:.0} MiB ({:.0} MiB before the fleet's vhost)",
                    self.broker.0, self.broker.1, self.broker.2
                ),
            ),
            (
                "presence each gateway receives",
                format!(
                    "{:.2} broadcasts/s, {:.1} KiB/s (the broker delivers each to all {} gateways)",
                    self.presence.0,
                    self.presence.1 / 1024.0,
                    self.gateways
                ),
            ),
            (
                "the machine over the window (all of it: the gateways, fake-herdr, the agents, the broker)",
                self.machine.map_or_else(
                    || "not read".to_owned(),
                    |busy| format!("{:.0} % busy on {} cores", busy * 100.0, cores()),
                ),
            ),
            (
                "every member spawned and ready",
                format!("{:.1} s", self.spawned.as_secs_f64()),
            ),
        ]
    }
}

/// The profiles every gateway has: `sim`, the members, and `probe`, the measured member.
fn profiles(member_log: &std::path::Path) -> String {
    format!(
        "{}{}      SIM_AGENT_LOG: \"{}\"\n",
        sim_profile("sim", MEMBER_WORK_MS),
        sim_profile("probe", MEMBER_WORK_MS),
        member_log.display()
    )
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times and paces a run on the wall clock"
)]
fn simulate(gateways: usize, members: usize, rate: usize, rounds: usize) -> anyhow::Result<Seen> {
    let names: Vec<String> = (0..gateways).map(|i| format!("s{i}x")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let broker_before = super::gateway::broker_pid().map_or(0.0, rss_mib);
    let vhost = FleetVhost::provision(&names)?;
    let tap = tap::Presence::start(&vhost)?;
    let logs = tempfile::tempdir()?;
    let (member_log, lead_log) = (logs.path().join("member.log"), logs.path().join("lead.log"));
    let broker = [crate::RABBITMQ_ADDR.to_owned()];
    let mut fleets = (0..gateways)
        .map(|i| {
            // Gateway 0's primary is the measured lead's tab (the second in `main`).
            let primary = if i == 0 { "w1:t2" } else { "w1:t1" };
            // Logs kept for a failed spawn (`FLEETD_BENCH_LOGS`) are worth reading at debug.
            let log = if std::env::var_os("FLEETD_BENCH_LOGS").is_some() {
                "log:\n  level: fleetd=debug,info\n"
            } else {
                ""
            };
            let extra = format!(
                "{log}primary:\n  tab: {primary}\n  pushReminders: 1\n  pushBackoffMs: 60000\nmaxMembersPerLead: {}\nlimits:\n  maxQueuedTasks: 1000\n{}",
                members + 1,
                vhost.gateway_block_among(i, "send", &broker, PRESENCE_SECS)
            );
            HerdrFleet::start_with_profiles(&extra, &profiles(&member_log))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for fleet in &fleets {
        crate::wait_until("the gateway's broker link", Duration::from_secs(60), || {
            http::get(fleet.daemon.addr, "/healthz")
                .is_ok_and(|r| r.json()["gateway"]["linked"] == true)
        });
    }

    let started = Instant::now();
    let spawned = std::thread::scope(|scope| {
        let spawns: Vec<_> = fleets
            .iter_mut()
            .map(|fleet| scope.spawn(move || fleet.spawn("sim", "m", members, SPAWN_PARALLEL)))
            .collect();
        spawns.into_iter().try_for_each(|s| {
            s.join()
                .map_err(|_| anyhow::anyhow!("a spawner panicked"))?
        })
    });
    if spawned.is_err() {
        for (i, fleet) in fleets.iter_mut().enumerate() {
            super::nudge::keep_logs(&format!("scale-{i}"), &mut fleet.daemon, &[]);
        }
    }
    spawned?;
    let spawned = started.elapsed();
    fleets[1]
        .lead
        .call("fleet_spawn", json!({ "profile": "probe", "name": "nia" }))?;
    // Every gateway hears of every other's members (presence goes out at once on a join).
    std::thread::sleep(Duration::from_secs(2));

    let probe = fleets[0].herdr.open_tab("probe")?;
    let probe = probe["pane_id"]
        .as_str()
        .context("the probe tab's pane")?
        .to_owned();
    start_sim_lead(
        &fleets[0].herdr,
        fleets[0].daemon.addr,
        &probe,
        &[
            format!("SIM_AGENT_LOG={}", lead_log.display()),
            "SIM_AGENT_KEEP_ALIVE=1".to_owned(),
        ],
    );
    let nia = format!("nia@{}", vhost.gateways[1]);

    let stop = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    let pids: Vec<u32> = fleets.iter().map(|f| f.daemon_pid()).collect();
    let broker_pid = super::gateway::broker_pid();
    let refused = AtomicUsize::new(0);
    let parts: Vec<_> = fleets
        .iter_mut()
        .map(|f| (&mut f.lead, &f.herdr, &f.daemon))
        .collect();
    let (herdr0, operator0) = (parts[0].1, parts[0].2.operator());
    let leads: Vec<_> = parts.into_iter().map(|(lead, _, _)| lead).collect();
    let (measured, window, ticks, presence, loaded, machine) = std::thread::scope(|scope| {
        // However the measurement ends (a panic included), the senders stop before the scope
        // waits for them.
        let _stop = StopOnDrop(&stop);
        let load_started = Instant::now();
        let senders: Vec<_> = leads
            .into_iter()
            .enumerate()
            .map(|(i, lead)| {
                let (stop, sent, refused, names) = (&stop, &sent, &refused, &vhost.gateways);
                scope.spawn(move || -> anyhow::Result<()> {
                    let period = Duration::from_secs_f64(1.0 / rate as f64);
                    let mut next = Instant::now();
                    let mut k = 0usize;
                    while !stop.load(Ordering::Relaxed) {
                        let other = (i + 1 + k % (names.len() - 1)) % names.len();
                        let target = format!("m{}@{}", (k / names.len()) % members, names[other]);
                        let answer = lead.call(
                            "fleet_send",
                            json!({ "target": target, "task": format!("task {k} from {i}"), "wait": false }),
                        )?;
                        // A refusal (a full queue, the outbox's backlog) is counted, not fatal.
                        match http::mcp::structured("fleet_send", &answer.result) {
                            Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                            Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                        };
                        k += 1;
                        next += period;
                        std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    }
                    Ok(())
                })
            })
            .collect();
        // The load settles before the window opens.
        std::thread::sleep(Duration::from_secs(3));
        let before: Vec<u64> = cpu_of(&pids, broker_pid);
        let machine_before = machine_ticks();
        let presence_before = tap.seen();
        let window_started = Instant::now();
        let measured = measure(
            rounds,
            &operator0,
            &nia,
            (&member_log, &lead_log),
            |line| type_line(herdr0, &probe, line),
            &Sight::Poll(Box::new(|| {
                std::thread::sleep(Duration::from_millis(2));
                history(herdr0, &probe)
            })),
        );
        let window = window_started.elapsed();
        let ticks: Vec<u64> = cpu_of(&pids, broker_pid)
            .iter()
            .zip(before)
            .map(|(after, before)| after - before)
            .collect();
        let presence_after = tap.seen();
        let machine = machine_ticks()
            .zip(machine_before)
            .map(|((busy, all), (busy0, all0))| (busy - busy0) as f64 / (all - all0).max(1) as f64);
        stop.store(true, Ordering::Relaxed);
        let loaded = load_started.elapsed();
        for s in senders {
            s.join()
                .map_err(|_| anyhow::anyhow!("a lead's sender panicked"))?
                .context("a lead's sender stopped")?;
        }
        let presence = (
            presence_after.0 - presence_before.0,
            presence_after.1 - presence_before.1,
        );
        anyhow::Ok((measured, window, ticks, presence, loaded, machine))
    })?;
    let measured = measured?;
    let stopped = Instant::now();
    let mut unanswered = open_tickets(&fleets);
    while unanswered > 0 && stopped.elapsed() < DRAIN {
        std::thread::sleep(Duration::from_millis(500));
        unanswered = open_tickets(&fleets);
    }
    let drained = (unanswered == 0).then(|| stopped.elapsed());

    let secs = window.as_secs_f64();
    // A tick is 10 ms: % of a core is ticks / seconds.
    let percent = |t: u64| t as f64 / secs;
    let rss: Vec<f64> = pids.iter().map(|&p| rss_mib(p)).collect();
    let rabbit = |args: &[&str]| vhost.ctl.run(args).unwrap_or_default();
    let queues = rabbit(&["list_queues", "-q", "-p", &vhost.vhost, "name"])
        .lines()
        .filter(|l| l.starts_with("fleet."))
        .count();
    let connections = rabbit(&["list_connections", "-q", "vhost", "user"])
        .lines()
        .filter(|l| l.starts_with(&vhost.vhost) && !l.ends_with("guest"))
        .count();
    let gateway_ticks = &ticks[..pids.len()];
    Ok(Seen {
        spawned,
        nudge: measured.visible,
        after_stored: measured.after_stored,
        sent: sent.load(Ordering::Relaxed),
        refused: refused.load(Ordering::Relaxed),
        loaded,
        unanswered,
        drained,
        gateway_cpu: Spread::of(
            &gateway_ticks
                .iter()
                .map(|&t| percent(t))
                .collect::<Vec<_>>(),
        ),
        gateway_rss_mib: Spread::of(&rss),
        broker: (
            ticks.get(pids.len()).map_or(0.0, |&t| percent(t)),
            broker_pid.map_or(0.0, rss_mib),
            broker_before,
        ),
        presence: (presence.0 as f64 / secs, presence.1 as f64 / secs),
        queues,
        connections,
        gateways,
        machine,
    })
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// CPU ticks of each gateway, then of the broker (0 when it is not found).
fn cpu_of(pids: &[u32], broker: Option<u32>) -> Vec<u64> {
    pids.iter()
        .copied()
        .chain(Some(broker.unwrap_or(0)))
        .map(|p| if p == 0 { 0 } else { cpu_ticks(p).unwrap_or(0) })
        .collect()
}

/// The machine's busy and total CPU ticks so far (`/proc/stat`; idle and iowait are not busy).
fn machine_ticks() -> Option<(u64, u64)> {
    use procfs::CurrentSI as _;
    let t = procfs::KernelStats::current().ok()?.total;
    let idle = t.idle + t.iowait.unwrap_or(0);
    let busy = t.user
        + t.nice
        + t.system
        + [t.irq, t.softirq, t.steal]
            .into_iter()
            .map(|v| v.unwrap_or(0))
            .sum::<u64>();
    Some((busy, busy + idle))
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// `VmRSS` of `pid` in MiB (0 when it cannot be read).
fn rss_mib(pid: u32) -> f64 {
    i32::try_from(pid)
        .ok()
        .and_then(|pid| procfs::process::Process::new(pid).ok())
        .and_then(|p| p.status().ok()?.vmrss)
        .map_or(0.0, |kib| kib as f64 / 1024.0)
}

/// Tickets still open on the members of every gateway.
fn open_tickets(fleets: &[HerdrFleet]) -> usize {
    fleets
        .iter()
        .map(|f| {
            http::get(f.daemon.operator(), "/sessions")
                .ok()
                .and_then(|r| {
                    r.json()["members"].as_array().map(|members| {
                        members
                            .iter()
                            .filter_map(|m| m["openTickets"].as_array().map(Vec::len))
                            .sum::<usize>()
                    })
                })
                .unwrap_or(0)
        })
        .sum()
}

mod tap;

//! Across hosts (issue 20): two fleetd gateways on this machine (each its own HOME, port and tmux
//! server) in a vhost of their own on the local RabbitMQ. Three kinds of row:
//!
//! - **reply on B → nudge visible on A**: a lead on gateway a sends `wait:false` to `nia@b`; the
//!   member's `fleet_reply` on b (its sim-agent logs the call's start) is forwarded through b's
//!   outbox and the broker into a's inbox, and a's push loop nudges a's idle lead; measured until
//!   the nudge text is in a's lead pane, as `fleetd-bench nudge` does on one host (the lead and
//!   the member keep one MCP connection each for all their calls, as real agents' clients do);
//! - **the same under load** (issue 36): while 64 senders on a send tasks as fast as they can to
//!   16 busy members on b (each queue holds 10,000, so none fills during the rounds: a full one
//!   turns every later task into a cancellation travelling back, which is another load), with
//!   the part from the reply's commit on b, and the rate the load kept. Once
//!   `gateway.peerBacklogMax` messages wait for b, a's sends wait their turn for room; one
//!   refused after that hold (`gateway_busy`) is sent again and counted;
//! - **messages/s between two gateways**: the operator on a sends tasks to a member on b that is
//!   busy for the whole run (so nothing is typed and every task waits in b's queue); from the
//!   first send until b holds every ticket. Each message is durable at every hop: a's ticket and
//!   outbox record are committed before `fleet_send` answers, the broker confirms the publish
//!   (quorum queue), and b commits the ticket before it acks the broker. Beside the rate, the CPU
//!   each message cost gateway a, gateway b and the broker's node (utime + stime from
//!   `/proc/<pid>/stat` over the run, 10 ms ticks): on a small machine the three share the
//!   cores, so that is what says which of them bounds the rate.
//!
//! `fleetd-bench gateway [--rounds N] [--messages N]`. Prints; never asserts.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::nudge::{Sight, guarded, measure};
use super::{Met, Row, Summary};
use crate::broker::{FleetVhost, require_rabbitmqctl};
use crate::http;
use crate::http::mcp::{McpConn, structured};

const DEFAULT_ROUNDS: usize = 30;
const DEFAULT_MESSAGES: usize = 1000;
/// Senders on a at once, a throughput row each (issue 36 asks for 8 and 64).
const SENDERS: [usize; 2] = [8, 64];
/// Senders of the load the nudge is measured under.
const LOADED_SENDERS: usize = 64;
/// Issue 20's target for the cross-host nudge.
const TARGET: (Duration, &str) = (Duration::from_millis(50), "p99 ≤ 50 ms (#20)");

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = super::arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    let messages = super::arg_number(args, "--messages", DEFAULT_MESSAGES)?;
    anyhow::ensure!(
        crate::require_tmux() == crate::Service::Present,
        "not measured: tmux not found"
    );
    anyhow::ensure!(
        crate::require_rabbitmq() == crate::Service::Present
            && require_rabbitmqctl() == crate::Service::Present,
        "not measured: no RabbitMQ (and rabbitmqctl) on 127.0.0.1:5672"
    );
    let nudge = guarded(|| nudge_across(rounds));
    let loaded = guarded(|| nudge_under_load(rounds));
    let rates: Vec<_> = SENDERS
        .iter()
        .map(|&senders| (senders, guarded(|| throughput(messages, senders))))
        .collect();
    println!("\nAcross two gateways on the local RabbitMQ\n");
    println!("| measurement | fleetd | target | met |");
    println!("|---|---|---|---|");
    let mut rows = Vec::new();
    let what = "reply on gateway b → nudge visible in an idle lead on gateway a";
    match nudge {
        Ok(visible) => {
            let (target, text) = TARGET;
            let met = visible.p99 <= target;
            println!(
                "| {what} | {} / max {} | {text} | {} |",
                visible.cell(),
                super::ms(visible.max),
                if met { "yes" } else { "no" }
            );
            rows.push(Row::new("gateway", what, visible.cell()).target(text, Met::from_bool(met)));
        }
        Err(why) => {
            println!("| {what} | {why} | | |");
            rows.push(Row::new("gateway", what, why));
        }
    }
    let what = format!(
        "the same, while {LOADED_SENDERS} senders on a send tasks to b as fast as they can"
    );
    let text = "p99 ≤ 50 ms under that load (#36)";
    match loaded {
        Ok(Loaded {
            visible,
            after_stored,
            rate,
            busy,
        }) => {
            let met = visible.p99 <= TARGET.0;
            let cell = format!(
                "{} / max {} (from the reply's commit on b: {}; the load meanwhile: {rate:.0} msg/s, {busy} sends answered gateway_busy after their hold and sent again)",
                visible.cell(),
                super::ms(visible.max),
                after_stored.cell(),
            );
            println!(
                "| {what} | {cell} | {text} | {} |",
                if met { "yes" } else { "no" }
            );
            rows.push(Row::new("gateway", &what, cell).target(text, Met::from_bool(met)));
        }
        Err(why) => {
            println!("| {what} | {why} | {text} | |");
            rows.push(Row::new("gateway", &what, why));
        }
    }
    for (senders, rate) in rates {
        let what = format!(
            "messages/s from gateway a to gateway b, each durable at every hop, {senders} senders"
        );
        let cell = match rate {
            Ok(Rate { n, took, cpu, busy }) => format!(
                "{:.0} msg/s ({n} tasks in {:.2} s; CPU a message: gateway a {} µs, b {} µs, RabbitMQ {} µs; {busy} sends answered gateway_busy and sent again)",
                n as f64 / took.as_secs_f64(),
                took.as_secs_f64(),
                cpu[0],
                cpu[1],
                cpu[2],
            ),
            Err(why) => why,
        };
        println!("| {what} | {cell} | ≥ 5,000 msg/s with 64 senders (#36) | — |");
        rows.push(Row::new("gateway", &what, cell));
    }
    Ok(rows)
}

/// A sim profile on b: its name and its members' environment.
type Profile<'a> = (&'a str, &'a [(&'a str, &'a str)]);

/// Gateways a (lead) and b (`profiles`, the member `nia` of the first, and `b_extra` in b's
/// config), linked.
fn two_gateways(
    profiles: &[Profile<'_>],
    b_extra: &str,
) -> anyhow::Result<(FleetVhost, crate::rig::Rig, crate::rig::Rig)> {
    let fleet = FleetVhost::provision(&["a", "b"])?;
    let broker = [crate::RABBITMQ_ADDR.to_owned()];
    let a = crate::rig::Rig::start(&format!(
        "primary:\n  tab: base:boss\n  pushReminders: 1\n  pushBackoffMs: 60000\n{}",
        fleet.gateway_block(0, "", &broker)
    ));
    let yaml: String = profiles
        .iter()
        .map(|(name, env)| crate::rig::sim_profile(name, env))
        .collect();
    let b = crate::rig::Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n{b_extra}{}profiles:\n{yaml}",
        fleet.gateway_block(1, "send, stop", &broker),
    ));
    for rig in [&a, &b] {
        crate::wait_until("the gateway's broker link", Duration::from_secs(30), || {
            http::get(rig.daemon.addr, "/healthz")
                .is_ok_and(|r| r.json()["gateway"]["linked"] == true)
        });
    }
    b.spawn(profiles.first().context("no profile for nia")?.0, "nia");
    Ok((fleet, a, b))
}

/// Reply on b → nudge visible in a's idle lead, `rounds` times.
fn nudge_across(rounds: usize) -> anyhow::Result<Summary> {
    let dir = tempfile::tempdir()?;
    let (member_log, lead_log) = (dir.path().join("member.log"), dir.path().join("lead.log"));
    let log = member_log.display().to_string();
    let (fleet, a, b) = two_gateways(
        &[(
            "bench",
            &[
                ("SIM_AGENT_WORK_MS", "900"),
                ("SIM_AGENT_LOG", &log),
                ("SIM_AGENT_KEEP_ALIVE", "1"),
            ],
        )],
        "",
    )?;
    let nia = format!("nia@{}", fleet.gateways[1]);
    let lead = a.agent_lead_with("boss", &lead_env(&lead_log));
    let measured = measure(
        rounds,
        &a.daemon.operator(),
        &nia,
        (&member_log, &lead_log),
        |line| a.type_line(&lead, line),
        &Sight::tmux(&a, &lead)?,
    )?;
    drop((a, b));
    drop(fleet);
    Ok(measured.visible)
}

/// The lead's sim-agent: its log, and one MCP connection for every call, as real agents' MCP
/// clients keep theirs (the member's profile says the same).
fn lead_env(log: &std::path::Path) -> [String; 2] {
    [
        format!("SIM_AGENT_LOG={}", log.display()),
        "SIM_AGENT_KEEP_ALIVE=1".to_owned(),
    ]
}

/// Busy members on b that take the load while the nudge is measured under it (each queues at
/// most `limits.maxQueuedTasks`, 10,000, so together they hold about 40 s at 4,000 msg/s).
const LOADED: usize = 16;
/// At most this many rounds of the nudge under load, so the busy members' queues last.
const LOADED_ROUNDS: usize = 12;

/// Reply on b → nudge visible in a's idle lead, while [`LOADED_SENDERS`] senders on a send
/// tasks to busy members on b as fast as they can; with the rate the load kept meanwhile.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a run on the wall clock"
)]
fn nudge_under_load(rounds: usize) -> anyhow::Result<Loaded> {
    let dir = tempfile::tempdir()?;
    let (member_log, lead_log) = (dir.path().join("member.log"), dir.path().join("lead.log"));
    let log = member_log.display().to_string();
    let (fleet, a, b) = two_gateways(
        &[
            (
                "bench",
                &[
                    ("SIM_AGENT_WORK_MS", "300"),
                    ("SIM_AGENT_LOG", &log),
                    ("SIM_AGENT_KEEP_ALIVE", "1"),
                ],
            ),
            ("busy", &[("SIM_AGENT_WORK_MS", "3600000")]),
        ],
        "limits:\n  maxQueuedTasks: 10000\nmaxMembersPerLead: 32\n",
    )?;
    let gateway_b = &fleet.gateways[1];
    let busy: Vec<String> = (0..LOADED).map(|i| format!("busy{i}")).collect();
    for name in &busy {
        b.spawn("busy", name);
        send(
            &a.daemon.operator(),
            &format!("{name}@{gateway_b}"),
            "warm up",
        )?;
    }
    crate::wait_until(
        "every busy member on its first task",
        Duration::from_secs(60),
        || busy.iter().all(|name| open_tickets(&b, name) == 1),
    );
    let busy: Vec<String> = busy.iter().map(|n| format!("{n}@{gateway_b}")).collect();
    let nia = format!("nia@{gateway_b}");
    let lead = a.agent_lead_with("boss", &lead_env(&lead_log));
    let sight = Sight::tmux(&a, &lead)?;
    let sessions = sessions(&a, LOADED_SENDERS)?;
    let stop = AtomicBool::new(false);
    let sent = AtomicUsize::new(0);
    let refused_busy = AtomicUsize::new(0);
    std::thread::scope(|scope| -> anyhow::Result<Loaded> {
        let workers: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(w, mut session)| {
                let (busy, stop, sent, refused_busy) = (&busy, &stop, &sent, &refused_busy);
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let refused =
                            send_on(&mut session, &busy[i % LOADED], &format!("load {i}"))?;
                        refused_busy.fetch_add(refused, Ordering::Relaxed);
                        sent.fetch_add(1, Ordering::Relaxed);
                        i += LOADED_SENDERS;
                    }
                    Ok(())
                })
            })
            .collect();
        let started = Instant::now();
        let measured = measure(
            rounds.min(LOADED_ROUNDS),
            &a.daemon.operator(),
            &nia,
            (&member_log, &lead_log),
            |line| a.type_line(&lead, line),
            &sight,
        );
        let rate = sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a sender panicked"))?
                .context("the load's senders stopped")?;
        }
        let measured = measured?;
        Ok(Loaded {
            visible: measured.visible,
            after_stored: measured.after_stored,
            rate,
            busy: refused_busy.load(Ordering::Relaxed),
        })
    })
}

/// The nudge under load: the rounds, the part from the reply's commit on b, the rate the load
/// kept, and how many of its sends were answered `gateway_busy` (and sent again).
struct Loaded {
    visible: Summary,
    after_stored: Summary,
    rate: f64,
    busy: usize,
}

/// `n` tasks from a's operator to a member on b that is busy all along: how long until b holds
/// every one.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a run on the wall clock"
)]
fn throughput(n: usize, senders: usize) -> anyhow::Result<Rate> {
    let (fleet, a, b) = two_gateways(
        &[("bench", &[("SIM_AGENT_WORK_MS", "3600000")])],
        &format!("limits:\n  maxQueuedTasks: {}\n", n + 10),
    )?;
    let nia = format!("nia@{}", fleet.gateways[1]);
    // The first task makes nia busy for the rest of the run.
    send(&a.daemon.operator(), &nia, "warm up")?;
    crate::wait_until(
        "nia busy with the first task",
        Duration::from_secs(60),
        || open_tickets(&b, "nia") == 1,
    );
    // Who spends the CPU: the two daemons and the broker's node.
    let spent = || -> [u64; 3] {
        let ticks = |pid: u32| super::cpu_ticks(pid).unwrap_or(0);
        [
            ticks(a.daemon.pid()),
            ticks(b.daemon.pid()),
            broker_pid().map_or(0, ticks),
        ]
    };
    let sessions = sessions(&a, senders)?;
    let before = spent();
    let started = Instant::now();
    let busy = std::thread::scope(|scope| -> anyhow::Result<usize> {
        let workers: Vec<_> = sessions
            .into_iter()
            .enumerate()
            .map(|(w, mut session)| {
                let nia = &nia;
                scope.spawn(move || -> anyhow::Result<usize> {
                    let mut busy = 0;
                    for i in (w..n).step_by(senders) {
                        busy += send_on(&mut session, nia, &format!("task {i}"))?;
                    }
                    Ok(busy)
                })
            })
            .collect();
        let mut busy = 0;
        for w in workers {
            busy += w
                .join()
                .map_err(|_| anyhow::anyhow!("a sender panicked"))??;
        }
        Ok(busy)
    })?;
    crate::wait_until("b holds every task", Duration::from_secs(600), || {
        open_tickets(&b, "nia") > n
    });
    let took = started.elapsed();
    let after = spent();
    // A tick is 10 ms: µs per message.
    let cpu = std::array::from_fn(|i| (after[i] - before[i]) * 10_000 / n as u64);
    drop((a, b));
    drop(fleet);
    Ok(Rate { n, took, cpu, busy })
}

/// A throughput run: `n` tasks in `took`, the CPU each cost gateway a, gateway b and the
/// broker, in µs, and the sends answered `gateway_busy` (and sent again).
struct Rate {
    n: usize,
    took: Duration,
    cpu: [u64; 3],
    busy: usize,
}

/// The pid of the local RabbitMQ node (`beam.smp`), if one runs.
pub(super) fn broker_pid() -> Option<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-o", "beam.smp"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// How many tickets `member` on `rig` holds open.
fn open_tickets(rig: &crate::rig::Rig, member: &str) -> usize {
    http::get(rig.daemon.operator(), "/sessions")
        .ok()
        .and_then(|r| {
            r.json()["members"]
                .as_array()?
                .iter()
                .find(|m| m["target"] == member)
                .and_then(|m| m["openTickets"].as_array().map(Vec::len))
        })
        .unwrap_or(0)
}

/// `senders` MCP sessions with `rig`'s operator socket, each kept for every send, as an agent's
/// client keeps one.
fn sessions(rig: &crate::rig::Rig, senders: usize) -> anyhow::Result<Vec<McpConn>> {
    (0..senders)
        .map(|_| {
            let mut session = McpConn::connect_to(rig.daemon.operator(), "/mcp")?;
            session.initialize()?;
            Ok(session)
        })
        .collect()
}

/// `fleet_send` of `task` to `target` with `wait: false` on `session`, sent again for as long
/// as the answer is `gateway_busy` (b is behind, and the send waited its turn for room without
/// getting it), as an agent told to try again would; returns how many times it was.
fn send_on(session: &mut McpConn, target: &str, task: &str) -> anyhow::Result<usize> {
    let args = serde_json::json!({ "target": target, "task": task, "wait": false });
    let mut busy = 0;
    loop {
        let sent = session.call_tool("fleet_send", &args)?;
        if sent["structuredContent"]["code"] == "gateway_busy" {
            busy += 1;
            continue;
        }
        return structured("fleet_send", &sent).map(|_| busy);
    }
}

/// `fleet_send` with `wait: false` from the operator.
fn send(operator: &http::Endpoint, target: &str, task: &str) -> anyhow::Result<()> {
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "fleet_send", "arguments": { "target": target, "task": task, "wait": false } },
    });
    let answer =
        http::request(operator, "POST", "/mcp", Some(&body.to_string())).context("fleet_send")?;
    anyhow::ensure!(
        answer.body.contains("\"ticket\""),
        "fleet_send failed: {}",
        answer.body
    );
    Ok(())
}

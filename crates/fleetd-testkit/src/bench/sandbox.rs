//! `fleetd-bench sandbox`: what a sandbox adds to a spawn (issue 38). On a private tmux server,
//! the lead spawns sim-agent members of two profiles in turn — one plain, one boxed by
//! bubblewrap (`sandbox: {}`), both in the same directory — and, where this machine has the
//! user `fleetd-agent` and the bench runs as root, a third that runs as that user (`runAs`),
//! and times each `fleet_spawn` from the call to its answer (the member's agent up, its MCP
//! session seen, the member ready), then stops it. Side by side: p50/p99 of each and what the
//! box (and the second user) adds.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Met, Row, Summary, arg_number, ms, progress};

const DEFAULT_SPAWNS: usize = 30;

/// Runs the benchmark: `--spawns N` of each profile.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let spawns = arg_number(args, "--spawns", DEFAULT_SPAWNS)?;
    anyhow::ensure!(
        std::process::Command::new("bwrap")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "bubblewrap is not installed (apt-get install bubblewrap)"
    );
    let work = tempfile::tempdir()?;
    let dir = work.path().display().to_string();
    let second_user = rustix::process::geteuid().is_root()
        && std::process::Command::new("getent")
            .args(["passwd", "fleetd-agent"])
            .output()
            .is_ok_and(|o| o.status.success());
    let apart = if second_user {
        format!(
            "{}    cwd: {dir}\n    runAs: fleetd-agent\n",
            crate::rig::sim_profile("apart", &[("SIM_AGENT_WORK_MS", "0")])
        )
    } else {
        progress(
            "no runAs row: it needs root and the user fleetd-agent (useradd --system --create-home fleetd-agent)",
        );
        String::new()
    };
    let profiles = format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{plain}    cwd: {dir}\n{boxed}    cwd: {dir}\n    sandbox: {{}}\n{apart}",
        plain = crate::rig::sim_profile("plain", &[("SIM_AGENT_WORK_MS", "0")]),
        boxed = crate::rig::sim_profile("boxed", &[("SIM_AGENT_WORK_MS", "0")]),
    );
    let rig = crate::rig::Rig::start(&profiles);
    progress(&format!("{spawns} spawns of each profile, alternating…"));
    let (mut plain, mut boxed, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..spawns {
        plain.push(spawn_once(&rig, "plain", &format!("p{n}"))?);
        boxed.push(spawn_once(&rig, "boxed", &format!("b{n}"))?);
        if second_user {
            other.push(spawn_once(&rig, "apart", &format!("a{n}"))?);
        }
    }
    let (plain, boxed) = (Summary::of(plain), Summary::of(boxed));
    let other = (!other.is_empty()).then(|| Summary::of(other));
    progress(&format!("the box alone, {spawns} times…"));
    let (setup, start) = box_alone(work.path(), spawns)?;
    let added = |a: Duration, b: Duration| {
        if a >= b {
            format!("+{}", ms(a - b))
        } else {
            format!("-{}", ms(b - a))
        }
    };
    println!("\n| spawn → ready | p50 | p99 |\n| --- | --- | --- |");
    println!("| plain | {} | {} |", ms(plain.p50), ms(plain.p99));
    println!("| sandboxed | {} | {} |", ms(boxed.p50), ms(boxed.p99));
    println!(
        "| the box adds | {} | {} |",
        added(boxed.p50, plain.p50),
        added(boxed.p99, plain.p99)
    );
    if let Some(other) = &other {
        println!(
            "| as a second user (runAs) | {} | {} |",
            ms(other.p50),
            ms(other.p99)
        );
        println!(
            "| the second user adds | {} | {} |",
            added(other.p50, plain.p50),
            added(other.p99, plain.p99)
        );
    }
    println!(
        "\nthe box alone: made {} ; bubblewrap around `true` {}",
        setup.cell(),
        start.cell()
    );
    let mut rows = vec![
        Row::new(
            "sandbox",
            format!("fleet_spawn → ready, sandboxed (sim-agent on tmux, {spawns} spawns)"),
            boxed.cell(),
        )
        .alternatives(format!(
            "plain: {}; the box adds {} / {}",
            plain.cell(),
            added(boxed.p50, plain.p50),
            added(boxed.p99, plain.p99)
        ))
        .target("side by side (issue 38)", Met::NotApplicable),
        Row::new(
            "sandbox",
            "the box alone: made (bubblewrap probed, home made, plan) / started and ended around `true`",
            format!("{} / {}", setup.cell(), start.cell()),
        ),
    ];
    if let Some(other) = other {
        rows.push(
            Row::new(
                "sandbox",
                format!("fleet_spawn → ready, as a second user (runAs, {spawns} spawns)"),
                other.cell(),
            )
            .alternatives(format!(
                "the second user adds {} / {} (getent, its leftovers ended, setpriv)",
                added(other.p50, plain.p50),
                added(other.p99, plain.p99)
            ))
            .target("side by side (issue 38)", Met::NotApplicable),
        );
    }
    Ok(rows)
}

/// What the box itself costs, `times` times: `fleetd::sandbox::boxed` (bubblewrap found and
/// probed, the member's home made, the plan), then bubblewrap run with that plan around `true`.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times the box's steps on the wall clock"
)]
fn box_alone(workdir: &std::path::Path, times: usize) -> anyhow::Result<(Summary, Summary)> {
    let state = tempfile::tempdir()?;
    // What a running daemon has made: the door's directory.
    std::fs::create_dir(fleetd::sandbox::door_dir(state.path()))?;
    let spec = fleetd::config::Sandbox {
        read_only: Vec::new(),
        writable: Vec::new(),
        network: true,
        home_from: None,
    };
    let target = fleetd_core::Target::new("bench").map_err(|e| anyhow::anyhow!("{e}"))?;
    let env = std::collections::BTreeMap::new();
    let runtime = tokio::runtime::Runtime::new()?;
    let (mut made, mut ran) = (Vec::new(), Vec::new());
    for _ in 0..times {
        let request = fleetd::sandbox::Request {
            profile: "bench",
            spec: &spec,
            state_dir: state.path(),
            target: &target,
            workdir: Some(workdir),
            worktree: false,
            env: &env,
            fleet_addr: None,
        };
        let start = Instant::now();
        let argv = runtime
            .block_on(fleetd::sandbox::boxed(&request, &["true".to_owned()]))
            .map_err(|e| anyhow::anyhow!(e))?;
        made.push(start.elapsed());
        let start = Instant::now();
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .status()?;
        ran.push(start.elapsed());
        anyhow::ensure!(status.success(), "the box around `true` failed: {status}");
    }
    Ok((Summary::of(made), Summary::of(ran)))
}

/// Spawns member `name` of `profile`, timing the call, then stops it.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a spawn on the wall clock"
)]
fn spawn_once(rig: &crate::rig::Rig, profile: &str, name: &str) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let spawned = rig.lead("fleet_spawn", &json!({ "profile": profile, "name": name }));
    let took = start.elapsed();
    anyhow::ensure!(spawned["isError"] == false, "spawning {name}: {spawned}");
    let stopped = rig.lead("fleet_stop", &json!({ "target": name }));
    anyhow::ensure!(stopped["isError"] == false, "stopping {name}: {stopped}");
    Ok(took)
}

//! The model gateway's cost on the path of a streamed answer (SPEC §18): the time to the first
//! streamed byte and to the whole answer, through fleetd and straight to the model, with every
//! member streaming at once. The target is that fleetd adds at most 2 ms at p99.
//!
//! The fleet: a `fake-model` (the Anthropic Messages API, streamed), fleetd on fake-herdr with a
//! backend pointing at it (`throughFleetd`, its credential in a secret file) and [`MEMBERS`]
//! members of a `custom` profile on that backend, each in its own pane. Each member's agent is
//! the load generator ([`super::model_load`]): it opens its MCP session as an agent does (so the
//! spawn sees it ready), then, from a moment the benchmark gives on the wall clock, runs its
//! ticks — even ticks straight to the fake model, odd ones through fleetd with the key fleetd
//! gave it — each path over its own kept-alive connection, as an agent's HTTP client keeps one.
//! fleetd locates each connection's caller from the connection, as it does for a real agent.
//! The answer is a text of [`TEXT_BYTES`], streamed as a model streams it: `message_start` at
//! once, then after some "thinking" the other events, [`STREAM_GAP_MS`] apart, each its own
//! frame. The first byte is fleetd's admission and the backend's first frame; the end includes
//! the relay of every frame and the usage's durable commit before the last one. The
//! first [`WARMUP`] ticks (connections opened, callers located, the upstream pool filled) are
//! not counted. Two loads ([`LOADS`]), one after the other on the same fleet:
//!
//! - *all at once*: every member's request leaves at the same instant (ticks 25 ms apart, the
//!   same path for all), and the eight answers stream together for about 15 ms — the worst case
//!   for the first byte, eight admissions at once on the machine's cores;
//! - *spread*: member `i`'s ticks start `i × 5 ms` after member 0's (ticks 40 ms apart), and each
//!   answer streams for about 32 ms, so six to eight streams are under way at any moment, as
//!   agents' turns overlap, and their requests arrive one by one.
//!
//! `fleetd-bench model [--rounds N] [--members N]` (`--rounds`: requests each way per member in
//! each load). Prints; never asserts.

use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::pane_client::{Control, HerdrFleet, PaneClient};
use super::{Met, Row, Summary, arg_number, cpu_ticks, progress};
use crate::bin_path;

const AREA: &str = "model gateway";
const DEFAULT_ROUNDS: usize = 200;
/// Members streaming at once.
const MEMBERS: usize = 8;
/// The answer's text (its stream is a little longer: the events around it).
const TEXT_BYTES: usize = 3000;
/// Between one event of an answer and the next, after the first (the fake model's knob).
const STREAM_GAP_MS: u64 = 2;
/// Ticks not counted (both paths).
const WARMUP: u64 = 20;
/// The target: what fleetd may add at p99, to the first byte and to the whole answer.
const TARGET: Duration = Duration::from_millis(2);
const TARGET_TEXT: &str = "added p99 ≤ 2 ms (model gateway, SPEC §18)";

/// How the members' requests are placed in time.
#[derive(Debug, Clone, Copy)]
struct Load {
    name: &'static str,
    /// From one of a member's ticks to its next.
    period_ms: u64,
    /// How long the model "thinks" between its first event and the rest (a `ping` at its end).
    think_ms: u64,
    /// Whether member `i` starts `i × period / members` after member 0 (else all together).
    stagger: bool,
}

/// The loads, in the order they run.
const LOADS: [Load; 2] = [
    Load {
        name: "all at once",
        period_ms: 25,
        think_ms: 0,
        stagger: false,
    },
    Load {
        name: "spread",
        period_ms: 40,
        think_ms: 15,
        stagger: true,
    },
];

/// What one load measured.
struct Measured {
    load: Load,
    first: [Summary; 2],
    whole: [Summary; 2],
    /// The streamed answer's size through fleetd (bytes).
    bytes: u64,
    /// fleetd's CPU time over the load, per request through it.
    cpu_per_request: Duration,
    /// The fake model's, per request it answered (both paths).
    model_cpu_per_request: Duration,
    late: u64,
    reopened: u64,
    samples: usize,
}

impl Measured {
    fn met(s: &[Summary; 2]) -> bool {
        s[1].p99.saturating_sub(s[0].p99) <= TARGET
    }
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = arg_number(args, "--rounds", DEFAULT_ROUNDS)?.max(1);
    let members = arg_number(args, "--members", MEMBERS)?.max(1);
    let before = loadavg();
    progress(&format!(
        "{members} members, {rounds} requests each way each, in each of {} loads…",
        LOADS.len()
    ));
    let measured = measure(rounds, members)?;
    let after = loadavg();
    // The disk's floor under the usage commit each answer waits for before its last frame.
    let floor = super::nudge::fsync_floor();
    let added = |i: fn(&Summary) -> Duration, s: &[Summary; 2]| signed_ms(i(&s[1]), i(&s[0]));
    println!(
        "\n## Model gateway: {members} members streaming, {rounds} requests each way each, straight \
         to the model and through fleetd on alternate ticks ({} B answers)\n",
        measured.first().map_or(0, |m| m.bytes)
    );
    println!("| load | path | first byte p50 | p99 | max | whole answer p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for m in &measured {
        for (name, i) in [("straight to the model", 0), ("through fleetd", 1)] {
            println!(
                "| {} | {name} | {} | {} | {} | {} | {} | {} |",
                m.load.name,
                super::ms(m.first[i].p50),
                super::ms(m.first[i].p99),
                super::ms(m.first[i].max),
                super::ms(m.whole[i].p50),
                super::ms(m.whole[i].p99),
                super::ms(m.whole[i].max),
            );
        }
        println!(
            "| {} | **added by fleetd** | {} | {} | — | {} | {} | — |",
            m.load.name,
            added(|s| s.p50, &m.first),
            added(|s| s.p99, &m.first),
            added(|s| s.p50, &m.whole),
            added(|s| s.p99, &m.whole),
        );
    }
    println!();
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    for m in &measured {
        println!(
            "{}: target {TARGET_TEXT}: first byte {}, whole answer {} ({} samples a path; CPU a \
             request: fleetd {} (through it), the fake model {}; {} ticks started late, {} \
             connections reopened; {} ms of thinking, events {STREAM_GAP_MS} ms apart, ticks {} \
             ms apart)",
            m.load.name,
            verdict(Measured::met(&m.first)),
            verdict(Measured::met(&m.whole)),
            m.samples,
            super::ms(m.cpu_per_request),
            super::ms(m.model_cpu_per_request),
            m.late,
            m.reopened,
            m.load.think_ms,
            m.load.period_ms,
        );
    }
    let floor = match floor {
        Ok(f) => {
            println!(
                "the disk's floor under the usage commit, right after: raw fdatasync of a 200 B \
                 append p50 {} / p99 {} / max {}",
                super::ms(f.p50),
                super::ms(f.p99),
                super::ms(f.max)
            );
            f.cell()
        }
        Err(e) => format!("not measured: {e:#}"),
    };
    println!("load average {before} before, {after} after");
    let mut rows = Vec::new();
    for m in &measured {
        for (what, s) in [
            ("time to the first streamed byte", &m.first),
            ("time to the whole answer", &m.whole),
        ] {
            rows.push(
                Row::new(
                    AREA,
                    format!(
                        "{what}, {members} members streaming, {}, through fleetd",
                        m.load.name
                    ),
                    format!(
                        "{} (added p50 {} / p99 {})",
                        s[1].cell(),
                        added(|s| s.p50, s),
                        added(|s| s.p99, s)
                    ),
                )
                .alternatives(format!("straight to the model {}", s[0].cell()))
                .target(TARGET_TEXT, Met::from_bool(Measured::met(s))),
            );
        }
    }
    let cpu = |f: fn(&Measured) -> Duration| {
        measured
            .iter()
            .map(|m| format!("{} {}", m.load.name, super::ms(f(m))))
            .collect::<Vec<_>>()
            .join("; ")
    };
    rows.push(
        Row::new(
            AREA,
            "fleetd's CPU per request through it",
            cpu(|m| m.cpu_per_request),
        )
        .alternatives(format!(
            "the fake model's per request it answers: {}",
            cpu(|m| m.model_cpu_per_request)
        )),
    );
    rows.push(Row::new(AREA, "raw fdatasync, right after", floor));
    Ok(rows)
}

/// `a − b` in milliseconds, signed.
fn signed_ms(a: Duration, b: Duration) -> String {
    let diff = a.as_secs_f64() - b.as_secs_f64();
    format!("{:+.3} ms", diff * 1000.0)
}

/// The machine's load average (1, 5, 15 min), as `uptime` prints it.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(", "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// A `fake-model` of the benchmark's own, logging nothing (its log would be one more write per
/// request on both paths), killed when dropped.
struct Fake {
    child: std::process::Child,
    url: String,
}

impl Fake {
    fn start() -> anyhow::Result<Self> {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(bin_path("fake-model"))
            .args(["--stream-gap-ms", &STREAM_GAP_MS.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("fake-model starts")?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            std::io::BufReader::new(stdout).read_line(&mut line)?;
        }
        let addr = line.trim().strip_prefix("listening on ").map(str::to_owned);
        let mut fake = Self {
            child,
            url: String::new(),
        };
        fake.url = format!(
            "http://{}",
            addr.with_context(|| format!("fake-model printed {line:?}"))?
        );
        Ok(fake)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The request every tick sends: a streamed Messages request whose prompt makes the fake model
/// think `think_ms`, then answer with [`TEXT_BYTES`] of text (a tool offered, as an agent's
/// turns offer tools: a request without is a side request, answered at once with a title).
fn request_body(think_ms: u64) -> String {
    let sentence = "The member streams its answer through fleetd, frame by frame, as it comes. ";
    let text = sentence.repeat(TEXT_BYTES / sentence.len() + 1);
    let think = if think_ms == 0 {
        String::new()
    } else {
        format!("@sleep {:.3} ", think_ms as f64 / 1000.0)
    };
    json!({
        "model": "fake",
        "max_tokens": 4096,
        "stream": true,
        "tools": [{
            "name": "Bash",
            "description": "Runs a shell command.",
            "input_schema": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        }],
        "messages": [{"role": "user", "content": format!("{think}@text {}", &text[..TEXT_BYTES])}],
    })
    .to_string()
}

#[expect(
    clippy::disallowed_methods,
    reason = "the members' ticks are set on the wall clock, the one clock their processes share"
)]
fn now_us() -> i64 {
    jiff::Timestamp::now().as_microsecond()
}

/// The fleet, then every load in turn.
fn measure(rounds: usize, members: usize) -> anyhow::Result<Vec<Measured>> {
    use std::os::unix::fs::PermissionsExt as _;
    let fake = Fake::start()?;
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("backend-key");
    std::fs::write(&secret, "sk-fake-backend-credential-0123456789\n")?;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600))?;
    let control = Control::bind()?;
    let extra = format!(
        "backends:\n  fake:\n    baseUrl: {}\n    authTokenSecret: backend_key\n    throughFleetd: true\nsecrets:\n  backend_key:\n    file: {}\n",
        fake.url,
        secret.display()
    );
    let profile = format!(
        "  model:\n    agent: custom\n    command: {}\n    args: [model-load, \"{}\", \"{}\"]\n    backend: fake\n    env:\n      HERDR_AGENT: claude\n",
        bin_path("fleetd-bench").display(),
        control.addr(),
        fake.url
    );
    let mut fleet = HerdrFleet::start_with_profiles(&extra, &profile)?;
    fleet.spawn("model", "m", members, 4)?;
    let mut clients = (0..members)
        .map(|_| control.accept())
        .collect::<anyhow::Result<Vec<_>>>()?;
    LOADS
        .into_iter()
        .map(|load| {
            progress(&format!("{}…", load.name));
            run_load(
                load,
                rounds,
                &mut clients,
                (fleet.daemon_pid(), fake.child.id()),
            )
        })
        .collect()
}

/// One load on every member at once; `pids`: fleetd's and the fake model's.
fn run_load(
    load: Load,
    rounds: usize,
    clients: &mut [PaneClient],
    pids: (u32, u32),
) -> anyhow::Result<Measured> {
    let members = clients.len();
    let ticks = WARMUP + 2 * rounds as u64;
    let period_us = load.period_ms * 1000;
    let start = now_us() + 500_000;
    let body = request_body(load.think_ms);
    let cpu_before = (cpu_ticks(pids.0)?, cpu_ticks(pids.1)?);
    let answers: Vec<anyhow::Result<Value>> = std::thread::scope(|scope| {
        let running: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, client)| {
                let offset = if load.stagger {
                    period_us * i as u64 / members as u64
                } else {
                    0
                };
                let args = json!({
                    "start_us": start + i64::try_from(offset).unwrap_or(0),
                    "ticks": ticks,
                    "warmup": WARMUP,
                    "period_us": period_us,
                    "body": body,
                });
                scope.spawn(move || client.call("load", args).map(|t| t.result))
            })
            .collect();
        running
            .into_iter()
            .map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a member's thread panicked")))
            })
            .collect()
    });
    let cpu = cpu_ticks(pids.0)? - cpu_before.0;
    let model_cpu = cpu_ticks(pids.1)? - cpu_before.1;
    let (mut first, mut whole) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let (mut bytes, mut late, mut reopened) = (0, 0, 0);
    for answer in answers {
        let answer = answer.context("a member's load")?;
        for (i, path) in ["direct", "fleetd"].into_iter().enumerate() {
            for sample in answer[path].as_array().into_iter().flatten() {
                let us = |j: usize| Duration::from_micros(sample[j].as_u64().unwrap_or(0));
                first[i].push(us(0));
                whole[i].push(us(1));
            }
            reopened += answer["reopened"][i].as_u64().unwrap_or(0);
        }
        bytes = answer["bytes"][1].as_u64().unwrap_or(0);
        late += answer["late"].as_u64().unwrap_or(0);
    }
    let samples = first[1].len();
    anyhow::ensure!(samples > 0, "no request was measured");
    // Every request through fleetd in the window, the warm-up's too; USER_HZ: 100 a second.
    let through = samples + members * usize::try_from(WARMUP / 2)?;
    let per = |ticks: u64, requests: usize| -> anyhow::Result<Duration> {
        Ok(Duration::from_millis(ticks * 10) / u32::try_from(requests)?)
    };
    let [d, f] = first;
    let [dw, fw] = whole;
    Ok(Measured {
        load,
        first: [Summary::of(d), Summary::of(f)],
        whole: [Summary::of(dw), Summary::of(fw)],
        bytes,
        cpu_per_request: per(cpu, through)?,
        model_cpu_per_request: per(model_cpu, 2 * through)?,
        late,
        reopened,
        samples,
    })
}

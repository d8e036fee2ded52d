//! The model gateway's cost on the path of a streamed answer (SPEC §18): the time to the first
//! streamed byte and to the whole answer, through fleetd and straight to the model, with every
//! member streaming at once. The target is that fleetd adds at most 2 ms at p99.
//!
//! The fleet: a `fake-model` (the Anthropic Messages API, streamed), fleetd on fake-herdr with a
//! backend pointing at it (`throughFleetd`, its credential in a secret file) and [`MEMBERS`]
//! members of a `custom` profile on that backend, each in its own pane. Each member's agent is
//! the load generator ([`super::model_load`]): it opens its MCP session as an agent does (so the
//! spawn sees it ready), then, at a moment the benchmark gives on the wall clock, runs its ticks
//! [`PERIOD_MS`] apart — even ticks straight to the fake model, odd ones through fleetd with the
//! key fleetd gave it, so at every tick all members stream at once on the same path — each path
//! over its own kept-alive connection, as an agent's HTTP client keeps one. fleetd locates each
//! connection's caller from the connection, as it does for a real agent. The answer is a text of
//! [`TEXT_BYTES`] after [`THINK_MS`] of "thinking" (`message_start` at once, the rest after it):
//! the first byte is fleetd's admission and the backend's first frame, the end includes the
//! relay of every frame and the usage's durable commit before the last one. The first
//! [`WARMUP`] ticks (connections opened, callers located, the upstream pool filled) are not
//! counted.
//!
//! `fleetd-bench model [--rounds N] [--members N] [--period-ms N] [--think-ms N]` (`--rounds`:
//! requests each way per member). Prints; never asserts.

use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::pane_client::{Control, HerdrFleet};
use super::{Met, Row, Summary, arg_number, cpu_ticks, progress};
use crate::bin_path;

const AREA: &str = "model gateway";
const DEFAULT_ROUNDS: usize = 200;
/// Members streaming at once.
const MEMBERS: usize = 8;
/// From one tick to the next: longer than a whole answer, so a member's ticks do not overlap.
const PERIOD_MS: usize = 25;
/// How long the model "thinks" between its first event and the rest.
const THINK_MS: usize = 10;
/// The answer's text (its stream is a little longer: the events around it).
const TEXT_BYTES: usize = 3000;
/// Ticks not counted (both paths).
const WARMUP: u64 = 20;
/// The target: what fleetd may add at p99, to the first byte and to the whole answer.
const TARGET: Duration = Duration::from_millis(2);
const TARGET_TEXT: &str = "added p99 ≤ 2 ms (model gateway, SPEC §18)";

/// What one run measured.
struct Measured {
    first: [Summary; 2],
    whole: [Summary; 2],
    /// The streamed answer's size, straight and through fleetd (bytes).
    bytes: [u64; 2],
    /// fleetd's CPU time over the ticks, per request through it.
    cpu_per_request: Duration,
    late: u64,
    reopened: u64,
    samples: usize,
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = arg_number(args, "--rounds", DEFAULT_ROUNDS)?.max(1);
    let members = arg_number(args, "--members", MEMBERS)?.max(1);
    let period = arg_number(args, "--period-ms", PERIOD_MS)?.max(1);
    let think = arg_number(args, "--think-ms", THINK_MS)?;
    let before = loadavg();
    progress(&format!(
        "{members} members, {rounds} requests each way each, ticks {period} ms apart…"
    ));
    let m = measure(rounds, members, period, think)?;
    let after = loadavg();
    // The disk's floor under the usage commit each answer waits for before its last frame.
    let floor = super::nudge::fsync_floor();
    let added = |i: fn(&Summary) -> Duration, s: &[Summary; 2]| signed_ms(i(&s[1]), i(&s[0]));
    println!(
        "\n## Model gateway: {members} members streaming at once, {rounds} requests each way each \
         ({} B answers, {think} ms of thinking, ticks {period} ms apart, straight and through \
         fleetd alternating)\n",
        m.bytes[1]
    );
    println!("| path | first byte p50 | p99 | max | whole answer p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|");
    for (name, i) in [("straight to the model", 0), ("through fleetd", 1)] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            super::ms(m.first[i].p50),
            super::ms(m.first[i].p99),
            super::ms(m.first[i].max),
            super::ms(m.whole[i].p50),
            super::ms(m.whole[i].p99),
            super::ms(m.whole[i].max),
        );
    }
    println!(
        "| added by fleetd | {} | {} | — | {} | {} | — |",
        added(|s| s.p50, &m.first),
        added(|s| s.p99, &m.first),
        added(|s| s.p50, &m.whole),
        added(|s| s.p99, &m.whole),
    );
    let met = |s: &[Summary; 2]| s[1].p99.saturating_sub(s[0].p99) <= TARGET;
    println!(
        "\ntarget {TARGET_TEXT}: first byte {}, whole answer {}",
        if met(&m.first) { "PASS" } else { "MISS" },
        if met(&m.whole) { "PASS" } else { "MISS" },
    );
    println!(
        "({} samples a path; fleetd's CPU {} a request through it; {} ticks started late, {} \
         connections reopened; load average {before} before, {after} after)",
        m.samples,
        super::ms(m.cpu_per_request),
        m.late,
        m.reopened,
    );
    let floor = match floor {
        Ok(f) => {
            println!(
                "(the disk's floor under the usage commit, right after: raw fdatasync of a 200 B \
                 append p50 {} / p99 {} / max {})",
                super::ms(f.p50),
                super::ms(f.p99),
                super::ms(f.max)
            );
            f.cell()
        }
        Err(e) => format!("not measured: {e:#}"),
    };
    let row = |what: &str, s: &[Summary; 2]| {
        Row::new(
            AREA,
            format!("{what}, {members} members streaming at once, through fleetd"),
            format!(
                "{} (added p50 {} / p99 {})",
                s[1].cell(),
                added(|s| s.p50, s),
                added(|s| s.p99, s)
            ),
        )
        .alternatives(format!("straight to the model {}", s[0].cell()))
        .target(TARGET_TEXT, Met::from_bool(met(s)))
    };
    Ok(vec![
        row("time to the first streamed byte", &m.first),
        row("time to the whole answer", &m.whole),
        Row::new(
            AREA,
            "fleetd's CPU per request through it",
            super::ms(m.cpu_per_request),
        ),
        Row::new(AREA, "raw fdatasync, right after", floor),
    ])
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
fn request_body(think_ms: usize) -> String {
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

fn measure(rounds: usize, members: usize, period: usize, think: usize) -> anyhow::Result<Measured> {
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
    let ticks = WARMUP + 2 * rounds as u64;
    let args = json!({
        "start_us": now_us() + 500_000,
        "ticks": ticks,
        "warmup": WARMUP,
        "period_us": period as u64 * 1000,
        "body": request_body(think),
    });
    let cpu_before = cpu_ticks(fleet.daemon_pid())?;
    let answers: Vec<anyhow::Result<Value>> = std::thread::scope(|scope| {
        let running: Vec<_> = clients
            .iter_mut()
            .map(|client| {
                let args = args.clone();
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
    let cpu = cpu_ticks(fleet.daemon_pid())? - cpu_before;
    let (mut first, mut whole) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let (mut bytes, mut late, mut reopened) = ([0, 0], 0, 0);
    for answer in answers {
        let answer = answer.context("a member's load")?;
        for (i, path) in ["direct", "fleetd"].into_iter().enumerate() {
            for sample in answer[path].as_array().into_iter().flatten() {
                let us = |j: usize| Duration::from_micros(sample[j].as_u64().unwrap_or(0));
                first[i].push(us(0));
                whole[i].push(us(1));
            }
            bytes[i] = answer["bytes"][i].as_u64().unwrap_or(0);
            reopened += answer["reopened"][i].as_u64().unwrap_or(0);
        }
        late += answer["late"].as_u64().unwrap_or(0);
    }
    let samples = first[1].len();
    anyhow::ensure!(samples > 0, "no request was measured");
    // Every request through fleetd in the window, the warm-up's too; USER_HZ: 100 a second.
    let through = samples + members * usize::try_from(WARMUP / 2)?;
    let cpu_per_request = Duration::from_millis(cpu * 10) / u32::try_from(through)?;
    let [d, f] = first;
    let [dw, fw] = whole;
    Ok(Measured {
        first: [Summary::of(d), Summary::of(f)],
        whole: [Summary::of(dw), Summary::of(fw)],
        bytes,
        cpu_per_request,
        late,
        reopened,
        samples,
    })
}

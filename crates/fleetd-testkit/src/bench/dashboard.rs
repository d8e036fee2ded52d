//! The dashboard under load (issue 18): a real headless Chromium signed in to the built daemon
//! on fake-herdr with 200 members, then a burst of at least 10,000 fleet events (`fleet_send`
//! of queued tasks to every member, each a `ticket.state` event and more). Measured in the page:
//! sign-in to 200 members shown; the frame interval and the long tasks while the burst streams
//! in; how long a script round trip into the page takes during the burst (what a click would
//! wait for); from the burst's last event to the page having it; the JS heap after. Prints;
//! never asserts.
//!
//! `fleetd-bench dashboard [--members N] [--tasks-per-member N]`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::pane_client::HerdrFleet;
use super::{Row, Summary, arg_number, ms, progress};
use crate::browser::{Browser, require_chromium};
use crate::http::events::SseReader;

const DEFAULT_MEMBERS: usize = 200;
/// 200 × 50 = 10,000 tasks, each at least one event (under `limits.maxQueuedTasks`, 64).
const DEFAULT_TASKS: usize = 50;
/// `fleet_send`s in flight at once during the burst.
const PARALLEL: usize = 16;
/// How long the stream must be quiet for the burst to count as over.
const QUIET: Duration = Duration::from_secs(2);
const PATIENCE: Duration = Duration::from_secs(120);

/// Probes installed in the page: every frame's interval, and the long tasks (> 50 ms on the
/// main thread) the browser reports.
const PROBES: &str = r"
window.__bench = { gaps: [], long: [], stop: false };
const b = window.__bench;
let last = null;
const tick = (t) => {
  if (last !== null) b.gaps.push(t - last);
  last = t;
  if (!b.stop) requestAnimationFrame(tick);
};
requestAnimationFrame(tick);
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) b.long.push(e.duration);
}).observe({ entryTypes: ['longtask'] });
return true;
";

/// What the stream reader saw: events counted and the last id with when it came.
#[derive(Debug, Default)]
struct Seen {
    count: usize,
    last_id: String,
    last_at: Option<std::time::Instant>,
}

/// Runs the benchmark, prints its table and returns its rows.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let members = arg_number(args, "--members", DEFAULT_MEMBERS)?;
    let per_member = arg_number(args, "--tasks-per-member", DEFAULT_TASKS)?;
    anyhow::ensure!(
        require_chromium() == crate::Service::Present,
        "no headless Chromium: apt-get install -y chromium chromium-driver"
    );
    progress(&format!("dashboard: {members} members on fake-herdr…"));
    // One lead spawns them all: the per-lead cap is lifted to the fleet's size.
    let mut fleet = HerdrFleet::start(&format!("maxMembersPerLead: {}\n", members + 1))?;
    fleet.wait_healthy();
    fleet.spawn("idle", "m", members, 8)?;
    let operator = fleet.daemon.operator();

    let browser = Browser::start(1440, 1000)?;
    let key = crate::http::request(&operator, "POST", "/dashboard/keys", None)?;
    anyhow::ensure!(key.status == 200, "POST /dashboard/keys: {}", key.body);
    let url = key.json()["url"]
        .as_str()
        .context("no url in the key's answer")?
        .to_owned();
    let load = timed(|| {
        browser.goto(&url)?;
        browser.wait_for(
            "every member on the page",
            PATIENCE,
            &format!("return document.querySelectorAll('#members tbody tr').length === {members};"),
        );
        Ok(())
    })?;
    // What a script round trip costs with the page at rest (WebDriver's own share).
    let mut at_rest = Vec::new();
    for _ in 0..20 {
        let started = now();
        browser.eval("return document.body.dataset.rendered;", &[])?;
        at_rest.push(started.elapsed());
    }
    let at_rest = Summary::of(at_rest);
    browser.eval(PROBES, &[])?;

    // A reader of the same stream, to know the burst's last event.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut reader = SseReader::unix(
        &crate::daemon::state_dir(fleet.dir()).join("api.sock"),
        None,
    )?;
    anyhow::ensure!(reader.status == 200, "/events: {}", reader.refusal);
    {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            while let Some(event) = reader.next_event() {
                let mut s = seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                s.count += 1;
                s.last_id = event.id;
                s.last_at = Some(now());
            }
        });
    }

    let tasks = members * per_member;
    progress(&format!(
        "dashboard: a burst of {tasks} fleet_send ({PARALLEL} in flight)…"
    ));
    let calls: Vec<(String, Value)> = (0..tasks)
        .map(|n| {
            (
                "fleet_send".to_owned(),
                json!({ "target": format!("m{}", n % members), "task": format!("task {n}"), "wait": false }),
            )
        })
        .collect();
    // The burst runs here; a second thread measures the page meanwhile.
    let done = std::sync::atomic::AtomicBool::new(false);
    let (burst, round_trips) = std::thread::scope(|scope| {
        let probe = scope.spawn(|| {
            let mut trips = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let started = now();
                if browser
                    .eval("return document.body.dataset.rendered;", &[])
                    .is_ok()
                {
                    trips.push(started.elapsed());
                }
                pause(Duration::from_millis(50));
            }
            trips
        });
        let started = now();
        let answers = fleet.lead.call_many(calls, PARALLEL);
        let took = started.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let trips = probe.join().unwrap_or_default();
        ((took, answers), trips)
    });
    let (burst_took, answers) = burst;
    let refused = answers?
        .iter()
        .filter(|r| r.as_ref().map_or(true, |t| t.result["isError"] == true))
        .count();
    // Quiet for QUIET: the burst's events are all out.
    let (events, last_id, last_at) = loop {
        pause(Duration::from_millis(100));
        let s = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = s.last_at
            && at.elapsed() >= QUIET
        {
            break (s.count, s.last_id.clone(), at);
        }
    };
    let script = format!(
        "return window.fleetdDashboard.lastId === {};",
        json!(last_id)
    );
    browser.wait_for("the page to have the last event", PATIENCE, &script);
    // The page had it no later than now; it may have had it up to a poll earlier.
    let caught_up = last_at.elapsed().saturating_sub(QUIET);
    let probes = browser.eval(
        "const b = window.__bench; b.stop = true; return { gaps: b.gaps, long: b.long, heap: performance.memory ? performance.memory.usedJSHeapSize : null, received: window.fleetdDashboard.received, rows: document.querySelectorAll('#members tbody tr').length };",
        &[],
    )?;
    let millis = |v: &Value| -> Vec<Duration> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .map(|m| Duration::from_secs_f64(m / 1000.0))
            .collect()
    };
    let gaps = millis(&probes["gaps"]);
    let long = millis(&probes["long"]);
    let frames = Summary::of(if gaps.is_empty() {
        vec![Duration::ZERO]
    } else {
        gaps.clone()
    });
    let trips = Summary::of(if round_trips.is_empty() {
        vec![Duration::ZERO]
    } else {
        round_trips
    });
    let heap = probes["heap"].as_f64().map_or_else(
        || "not reported".to_owned(),
        |b| format!("{:.1} MiB", b / 1_048_576.0),
    );
    let blocked: Duration = long.iter().sum();
    let worst = long.iter().max().copied().unwrap_or_default();
    let rows = vec![
        Row::new(
            "dashboard",
            format!("sign-in link → {members} members shown (headless Chromium)"),
            ms(load),
        ),
        Row::new(
            "dashboard",
            format!(
                "burst: {tasks} fleet_send in {:.1} s → {events} events streamed ({refused} refused)",
                burst_took.as_secs_f64()
            ),
            format!(
                "{} events received by the page, {} member rows",
                probes["received"], probes["rows"]
            ),
        ),
        Row::new(
            "dashboard",
            "frame interval during the burst (60 Hz is 16.7 ms)",
            format!(
                "{} / max {} ({} frames)",
                frames.cell(),
                ms(frames.max),
                gaps.len()
            ),
        ),
        Row::new(
            "dashboard",
            "long tasks (> 50 ms) during the burst",
            format!(
                "{} tasks, {} in all, worst {}",
                long.len(),
                ms(blocked),
                ms(worst)
            ),
        ),
        Row::new(
            "dashboard",
            "a script round trip into the page during the burst (what a click waits for)",
            format!("{} / max {}", trips.cell(), ms(trips.max)),
        ),
        Row::new(
            "dashboard",
            "the same round trip with the page at rest (WebDriver's own share)",
            format!("{} / max {}", at_rest.cell(), ms(at_rest.max)),
        ),
        Row::new(
            "dashboard",
            "the burst's last event → in the page",
            format!("≤ {}", ms(caught_up)),
        ),
        Row::new("dashboard", "JS heap after the burst", heap),
    ];
    println!("\nfleetd dashboard under load\n");
    println!("| measurement | fleetd |");
    println!("|---|---|");
    for row in &rows {
        println!("| {} | {} |", row.measurement, row.fleetd);
    }
    drop(browser);
    drop(fleet);
    Ok(rows)
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark measures on the wall clock"
)]
fn now() -> std::time::Instant {
    std::time::Instant::now()
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark paces its probes on the wall clock"
)]
fn pause(d: Duration) {
    std::thread::sleep(d);
}

fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let started = now();
    f()?;
    Ok(started.elapsed())
}

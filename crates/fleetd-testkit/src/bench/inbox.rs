//! Inbox benchmark: raw fdatasync baseline vs fleetd's embedded and AMQP stores vs RabbitMQ
//! alone (lapin with publisher confirms on the same durable quorum queues, no fleetd code), printed
//! as one table. Measures and reports; never asserts. Run it with
//! `cargo run --release -p fleetd-testkit --bin fleetd-bench -- inbox [--quick] [--no-amqp] [--dir DIR]`.
//!
//! Every embedded and AMQP publish counted here is durable before it is acknowledged (SQLite WAL +
//! `synchronous=FULL` fsync, or RabbitMQ's publisher confirm on a quorum queue). Wall time is read
//! from tokio's monotonic clock: a benchmark measures wall time by definition.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use fleetd::store::{InboxStore, SqliteStore, StoreOptions};
use fleetd_core::{Message, MessageKind, MsgId, Target};
use tokio::time::Instant;

use super::{Met, Row, progress};

/// How many inbox targets the messages are spread over (like the measurements in DEPENDENCIES.md).
const TARGETS: usize = 8;
/// The size of each message's text: a typical short reply.
const TEXT_BYTES: usize = 200;

/// Sizes of one run. `--quick` divides the counts so a smoke run takes seconds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    single: usize,
    per_publisher: [(usize, usize); 3],
    pub(super) amqp_single: usize,
    pub(super) amqp_per_publisher: [(usize, usize); 3],
}

impl Sizes {
    fn new(quick: bool) -> Self {
        let div = if quick { 5 } else { 1 };
        Self {
            single: 500 / div,
            // (publishers, messages each)
            per_publisher: [(1, 500 / div), (8, 400 / div), (64, 500 / div)],
            amqp_single: 300 / div,
            amqp_per_publisher: [(1, 300 / div), (8, 150 / div), (64, 60 / div)],
        }
    }
}

/// Latency percentiles of one sequential series.
#[derive(Debug, Clone, Copy)]
pub(super) struct Latency {
    p50: Duration,
    p99: Duration,
}

impl Latency {
    pub(super) fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |pct: usize| samples[(samples.len() * pct / 100).min(samples.len() - 1)];
        Self {
            p50: at(50),
            p99: at(99),
        }
    }
}

/// What one backend measured.
#[derive(Debug, Default)]
pub(super) struct Column {
    pub(super) single: Option<Latency>,
    /// msg/s per publisher count, in the order of `Sizes::per_publisher`, with the average number
    /// of operations per commit where the backend reports it.
    pub(super) throughput: Vec<(f64, Option<f64>)>,
    pub(super) acks: Option<f64>,
    pub(super) note: Option<String>,
    /// Where the time went, a line per run, from fleetd's step timings (see `profile`).
    pub(super) profile: Vec<String>,
}

/// Runs the benchmark, prints its table and returns its rows for the combined table.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let mut quick = false;
    let mut amqp = true;
    let mut dir: Option<PathBuf> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--no-amqp" => amqp = false,
            "--dir" => dir = Some(PathBuf::from(rest.next().context("--dir needs a path")?)),
            other => anyhow::bail!("unknown inbox benchmark argument {other:?}"),
        }
    }
    let sizes = Sizes::new(quick);
    let base = dir.unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("fleetd-bench-inbox-")
        .tempdir_in(&base)
        .with_context(|| format!("create a scratch directory in {}", base.display()))?;
    progress(&format!("inbox benchmark in {}", scratch.path().display()));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start a tokio runtime")?;
    let mut raw = RawLog::create(&scratch.path().join("raw.log"))?;
    let (raw, embedded) =
        runtime.block_on(embedded(&mut raw, &scratch.path().join("inbox.db"), sizes))?;
    let skipped = || Column {
        note: Some("skipped (--no-amqp)".to_owned()),
        ..Column::default()
    };
    let (broker, rabbit) = if amqp {
        (
            runtime.block_on(super::inbox_amqp::column(sizes)),
            runtime.block_on(super::rabbit::column(sizes)),
        )
    } else {
        (skipped(), skipped())
    };
    print!("{}", table(&raw, [&embedded, &broker, &rabbit], sizes));
    Ok(rows(&raw, [&embedded, &broker, &rabbit], sizes))
}

/// The combined table's inbox rows.
fn rows(raw: &Latency, [embedded, amqp, rabbit]: [&Column; 3], sizes: Sizes) -> Vec<Row> {
    let na = |column: &Column| column.note.clone().unwrap_or_else(|| "–".to_owned());
    let single = |column: &Column| {
        column.single.map_or_else(
            || na(column),
            |l| format!("p50 {} / p99 {}", micros(l.p50), micros(l.p99)),
        )
    };
    let ratio = embedded
        .single
        .map(|l| l.p50.as_secs_f64() / raw.p50.as_secs_f64());
    let last = sizes.per_publisher.len() - 1;
    let busiest = |column: &Column| {
        column
            .throughput
            .get(last)
            .map_or_else(|| na(column), |(r, _)| rate(*r))
    };
    let acks = |column: &Column| column.acks.map_or_else(|| na(column), rate);
    let embedded_rate = embedded.throughput.get(last).map(|(r, _)| *r);
    vec![
        Row::new(
            "inbox",
            "durable publish, one at a time",
            format!(
                "embedded {}{}",
                single(embedded),
                ratio.map_or_else(String::new, |r| format!(" ({r:.2}× raw)"))
            ),
        )
        .alternatives(format!(
            "fleetd AMQP {}; RabbitMQ alone {}; raw fdatasync p50 {} / p99 {}",
            single(amqp),
            single(rabbit),
            micros(raw.p50),
            micros(raw.p99)
        ))
        .target(
            "embedded p50 ≤ 1.3× raw fdatasync (#17)",
            ratio.map_or(Met::NotApplicable, |r| Met::from_bool(r <= 1.3)),
        ),
        Row::new(
            "inbox",
            "durable publish throughput, 64 publishers",
            format!("embedded {}", busiest(embedded)),
        )
        .alternatives(format!(
            "fleetd AMQP {}; RabbitMQ alone {}",
            busiest(amqp),
            busiest(rabbit)
        ))
        .target(
            "embedded ≥ 50,000 msg/s, each durable before its ack (#17)",
            embedded_rate.map_or(Met::NotApplicable, |r| Met::from_bool(r >= 50_000.0)),
        ),
        Row::new(
            "inbox",
            "ack throughput, 64 ackers",
            format!("embedded {}", acks(embedded)),
        )
        .alternatives(format!(
            "fleetd AMQP {}; RabbitMQ alone {}",
            acks(amqp),
            acks(rabbit)
        )),
    ]
}

/// The device's floor: appends one ~200 B record to a file and `fdatasync`s it.
pub(super) struct RawLog {
    file: std::fs::File,
    record: Vec<u8>,
}

impl RawLog {
    pub(super) fn create(path: &Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .context("open the baseline file")?;
        Ok(Self {
            file,
            record: vec![b'r'; TEXT_BYTES],
        })
    }

    pub(super) fn append(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        self.file.write_all(&self.record).context("append")?;
        self.file.sync_data().context("fdatasync")?;
        Ok(start.elapsed())
    }
}

pub(super) fn targets(prefix: &str) -> Vec<Target> {
    (0..TARGETS)
        .map(|n| Target::new(format!("{prefix}{n}")).expect("bench target names are valid"))
        .collect()
}

/// A ~200 B reply to `target`, numbered `n`.
#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark mints real ids on the wall clock"
)]
pub(super) fn message(target: &Target, n: usize) -> Message {
    let mut text = format!("benchmark reply {n} ");
    text.extend(std::iter::repeat_n(
        'x',
        TEXT_BYTES.saturating_sub(text.len()),
    ));
    Message {
        msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
        target: target.clone(),
        ticket: None,
        kind: MessageKind::Reply,
        text,
        from: "bench".to_owned(),
        created_at: jiff::Timestamp::now(),
    }
}

/// Publishes `count` messages one at a time, timing each.
pub(super) async fn single(
    store: &dyn InboxStore,
    targets: &[Target],
    count: usize,
) -> anyhow::Result<(Latency, Vec<(Target, MsgId)>)> {
    let mut samples = Vec::with_capacity(count);
    let mut published = Vec::with_capacity(count);
    for n in 0..count {
        let target = &targets[n % targets.len()];
        let m = message(target, n);
        let id = m.msg_id;
        let start = Instant::now();
        store.publish(m).await?;
        samples.push(start.elapsed());
        published.push((target.clone(), id));
    }
    Ok((Latency::of(samples), published))
}

/// `publishers` tasks each publish `each` messages back to back; returns msg/s and the ids.
pub(super) async fn concurrent(
    store: &Arc<dyn InboxStore>,
    targets: &[Target],
    publishers: usize,
    each: usize,
) -> anyhow::Result<(f64, Vec<(Target, MsgId)>)> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..publishers {
        let store = Arc::clone(store);
        let target = targets[p % targets.len()].clone();
        tasks.spawn(async move {
            let mut ids = Vec::with_capacity(each);
            for n in 0..each {
                let m = message(&target, n);
                ids.push((target.clone(), m.msg_id));
                store.publish(m).await?;
            }
            anyhow::Ok(ids)
        });
    }
    let mut all = Vec::with_capacity(publishers * each);
    while let Some(done) = tasks.join_next().await {
        all.extend(done.context("publisher task")??);
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    Ok((rate, all))
}

/// Acks every id from 64 concurrent tasks, 8 per target, each target's ids oldest first (the
/// order a lead acks what it peeked); returns acks/s.
pub(super) async fn ack_all(
    store: &Arc<dyn InboxStore>,
    ids: Vec<(Target, MsgId)>,
) -> anyhow::Result<f64> {
    const ACKERS: usize = 64;
    let total = ids.len();
    let mut by_target: std::collections::BTreeMap<Target, Vec<MsgId>> = Default::default();
    for (target, id) in ids {
        by_target.entry(target).or_default().push(id);
    }
    let mut shares: Vec<Vec<(Target, MsgId)>> = vec![Vec::new(); ACKERS];
    let per_target = (ACKERS / by_target.len().max(1)).max(1);
    for (t, (target, mut ids)) in by_target.into_iter().enumerate() {
        ids.sort_unstable();
        for (n, id) in ids.into_iter().enumerate() {
            shares[(t * per_target + n % per_target) % ACKERS].push((target.clone(), id));
        }
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for share in shares {
        let store = Arc::clone(store);
        tasks.spawn(async move {
            for (target, id) in share {
                anyhow::ensure!(
                    store.ack(&target, id).await?,
                    "message {id} was not pending"
                );
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("acker task")??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

async fn embedded(
    raw: &mut RawLog,
    path: &Path,
    sizes: Sizes,
) -> anyhow::Result<(Latency, Column)> {
    progress("raw fdatasync baseline and embedded store…");
    let sqlite = Arc::new(SqliteStore::open(path.to_owned(), StoreOptions::default()).await?);
    let store: Arc<dyn InboxStore> = Arc::clone(&sqlite) as Arc<dyn InboxStore>;
    let targets = targets("bench");
    // Alternate one raw fdatasync and one embedded publish, so both series see the same noise
    // from everything else on the machine.
    let mut raw_samples = Vec::with_capacity(sizes.single);
    let mut samples = Vec::with_capacity(sizes.single);
    let mut published = Vec::with_capacity(sizes.single);
    for n in 0..sizes.single {
        raw_samples.push(raw.append()?);
        let target = &targets[n % targets.len()];
        let m = message(target, n);
        published.push((target.clone(), m.msg_id));
        let start = Instant::now();
        store.publish(m).await?;
        samples.push(start.elapsed());
    }
    let latency = Latency::of(samples);
    let mut column = Column {
        single: Some(latency),
        ..Column::default()
    };
    for (publishers, each) in sizes.per_publisher {
        let (commits, ops) = sqlite.commit_stats();
        let (rate, ids) = concurrent(&store, &targets, publishers, each).await?;
        let (commits_after, ops_after) = sqlite.commit_stats();
        let per_commit = (ops_after - ops) as f64 / (commits_after - commits).max(1) as f64;
        column.throughput.push((rate, Some(per_commit)));
        published.extend(ids);
    }
    column.acks = Some(ack_all(&store, published).await?);
    store.close().await?;
    Ok((Latency::of(raw_samples), column))
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn rate(r: f64) -> String {
    format!("{} msg/s", crate::thousands(r.round() as u64))
}

fn table(raw: &Latency, [embedded, amqp, rabbit]: [&Column; 3], sizes: Sizes) -> String {
    let raw_rate = 1.0 / raw.p50.as_secs_f64();
    let na = |column: &Column| column.note.clone().unwrap_or_else(|| "–".to_owned());
    let mut rows: Vec<[String; 6]> = Vec::new();
    let lat = |column: &Column, pick: fn(&Latency) -> Duration, ratio: bool| match column.single {
        Some(l) if ratio => format!(
            "{} ({:.2}× raw)",
            micros(pick(&l)),
            pick(&l).as_secs_f64() / pick(raw).as_secs_f64()
        ),
        Some(l) => micros(pick(&l)),
        None => na(column),
    };
    // The single-publish rows, one a percentile: its name, how it is read off a latency, and
    // its target.
    type Percentile = fn(&Latency) -> Duration;
    let percentiles: [(&str, Percentile, &str); 2] = [
        (
            "single publish p50 (one at a time)",
            |l| l.p50,
            "embedded ≤ 1.3× raw; AMQP ≤ 1.5× RabbitMQ",
        ),
        ("single publish p99", |l| l.p99, "AMQP ≤ 2× RabbitMQ"),
    ];
    for (what, pick, target) in percentiles {
        rows.push([
            what.to_owned(),
            micros(pick(raw)),
            lat(embedded, pick, true),
            versus(amqp, rabbit, pick),
            lat(rabbit, pick, false),
            target.to_owned(),
        ]);
    }
    for (n, (publishers, each)) in sizes.per_publisher.iter().enumerate() {
        let cell = |column: &Column| match column.throughput.get(n) {
            Some((r, Some(per_commit))) => format!("{} ({per_commit:.1}/commit)", rate(*r)),
            Some((r, None)) => rate(*r),
            None => na(column),
        };
        let amqp_each = sizes.amqp_per_publisher[n].1;
        rows.push([
            format!("throughput, {publishers} publisher(s) ({each} | {amqp_each} each)"),
            if *publishers == 1 {
                format!("{} (1/p50)", rate(raw_rate))
            } else {
                "–".to_owned()
            },
            cell(embedded),
            match (amqp.throughput.get(n), rabbit.throughput.get(n)) {
                (Some((ours, _)), Some((theirs, _))) => {
                    format!("{} ({:.2}× RabbitMQ)", rate(*ours), ours / theirs)
                }
                _ => cell(amqp),
            },
            cell(rabbit),
            if *publishers == 64 {
                "embedded ≥ 50,000 msg/s; AMQP ≥ 0.8× RabbitMQ".to_owned()
            } else {
                String::new()
            },
        ]);
    }
    let acks = |column: &Column| column.acks.map_or_else(|| na(column), rate);
    rows.push([
        "ack throughput, 64 ackers".to_owned(),
        "–".to_owned(),
        acks(embedded),
        acks(amqp),
        acks(rabbit),
        String::new(),
    ]);
    let mut out = super::markdown_table(
        &[
            "workload",
            "raw fdatasync",
            "fleetd embedded (SQLite)",
            "fleetd AMQP (RabbitMQ)",
            "RabbitMQ alone (lapin)",
            "target (reported, not asserted)",
        ],
        &rows,
    );
    for line in &amqp.profile {
        let _ = writeln!(out, "fleetd AMQP, {line}");
    }
    out
}

/// The AMQP column's latency with its ratio to RabbitMQ alone's.
fn versus(amqp: &Column, rabbit: &Column, pick: fn(&Latency) -> Duration) -> String {
    match (amqp.single, rabbit.single) {
        (Some(ours), Some(theirs)) => format!(
            "{} ({:.2}× RabbitMQ)",
            micros(pick(&ours)),
            pick(&ours).as_secs_f64() / pick(&theirs).as_secs_f64()
        ),
        _ => amqp.single.map_or_else(
            || amqp.note.clone().unwrap_or_else(|| "–".to_owned()),
            |l| micros(pick(&l)),
        ),
    }
}

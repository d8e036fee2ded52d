//! Integration tests: kill -9 proof of the inbox (SPEC §13.1). `inbox-crash-writer` publishes
//! from many tasks and prints each msgId only after `publish` returned; these tests SIGKILL it at
//! seeded random moments, reopen the store and require every printed msgId exactly once.
//! Delays are random but only correctness is asserted, never timing.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use fleetd::store::{self, InboxStore, StoreOptions, StoreSpec};
use fleetd_core::{MsgId, Target};
use fleetd_testkit::{RABBITMQ_URL, Service, require_rabbitmq};
use tokio::io::AsyncReadExt;

use crate::store::QueueCleanup;

const WRITER: &str = env!("CARGO_BIN_EXE_inbox-crash-writer");
/// Publishing tasks inside the writer: enough to keep group commits busy.
const WRITER_TASKS: &str = "16";

/// What one killed writer claimed before it died (complete lines only).
#[derive(Debug, Default)]
struct Claims {
    published: Vec<MsgId>,
    acking: HashSet<MsgId>,
    acked: HashSet<MsgId>,
}

fn parse_claims(stdout: &str) -> Claims {
    let mut claims = Claims::default();
    // A line cut by the kill has no newline: it claims nothing.
    let complete = stdout.rfind('\n').map_or("", |end| &stdout[..end]);
    for line in complete.lines() {
        let (verb, id) = line.split_once(' ').unwrap_or((line, ""));
        let parse =
            || MsgId::parse(id).unwrap_or_else(|err| panic!("bad writer line {line:?}: {err}"));
        match verb {
            "ready" => {}
            "published" => claims.published.push(parse()),
            "acking" => {
                claims.acking.insert(parse());
            }
            "acked" => {
                claims.acked.insert(parse());
            }
            _ => panic!("unexpected writer line {line:?}"),
        }
    }
    claims
}

/// Runs the writer on the store at `path` (with `url`, the AMQP store on that broker), SIGKILLs
/// it after `delay`, and returns what it printed.
async fn run_and_kill(
    path: &str,
    url: Option<&str>,
    targets: &[Target],
    delay: Duration,
) -> Claims {
    let names = targets
        .iter()
        .map(Target::as_str)
        .collect::<Vec<_>>()
        .join(",");
    let kind = if url.is_some() { "amqp" } else { "embedded" };
    let mut args = vec![kind, path, WRITER_TASKS, &names];
    args.extend(url);
    let mut child = tokio::process::Command::new(WRITER)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn inbox-crash-writer");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Read while it runs, so a full pipe never stalls the writer.
    let out = tokio::spawn(async move {
        let mut text = String::new();
        stdout.read_to_string(&mut text).await.map(|_| text)
    });
    let err = tokio::spawn(async move {
        let mut text = String::new();
        stderr.read_to_string(&mut text).await.map(|_| text)
    });
    tokio::time::sleep(delay).await;
    child.start_kill().expect("send SIGKILL");
    let status = child.wait().await.expect("reap the writer");
    let stdout = out.await.expect("stdout task").expect("read stdout");
    let stderr = err.await.expect("stderr task").expect("read stderr");
    assert_eq!(
        status.signal(),
        Some(9),
        "the writer must die by our SIGKILL, not on its own ({status}); stderr:\n{stderr}"
    );
    parse_claims(&stdout)
}

/// Checks one cycle against what the store holds now and drains it, so the next cycle starts
/// empty. `history` holds every id drained in earlier cycles: none may ever come back.
async fn check_and_drain(
    store: &dyn InboxStore,
    targets: &[Target],
    claims: &Claims,
    history: &mut HashSet<MsgId>,
    context: &str,
    settle: Duration,
) -> usize {
    let must_have: Vec<MsgId> = claims
        .published
        .iter()
        .filter(|id| !claims.acking.contains(id))
        .copied()
        .collect();
    let mut drained: Vec<MsgId> = Vec::new();
    let started = tokio::time::Instant::now();
    loop {
        for target in targets {
            let messages = store.drain(target).await.expect("drain");
            for m in &messages {
                assert_eq!(
                    &m.target, target,
                    "{context}: message {} in the wrong inbox",
                    m.msg_id
                );
            }
            drained.extend(messages.iter().map(|m| m.msg_id));
        }
        let present: HashSet<MsgId> = drained.iter().copied().collect();
        let complete = must_have.iter().all(|id| present.contains(id));
        // A broker returns a killed client's unacknowledged deliveries asynchronously: give it
        // `settle` to do so (zero for the embedded store, which has nothing in flight).
        if complete || started.elapsed() >= settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let present: HashSet<MsgId> = drained.iter().copied().collect();
    assert_eq!(
        present.len(),
        drained.len(),
        "{context}: a message was stored twice"
    );
    let lost: Vec<&MsgId> = must_have
        .iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{context}: {} acknowledged publishes lost: {lost:?}",
        lost.len()
    );
    let resurrected: Vec<&MsgId> = claims
        .acked
        .iter()
        .filter(|id| present.contains(id))
        .collect();
    assert!(
        resurrected.is_empty(),
        "{context}: acked messages came back: {resurrected:?}"
    );
    let repeated: Vec<&MsgId> = present.iter().filter(|id| history.contains(id)).collect();
    assert!(
        repeated.is_empty(),
        "{context}: messages drained before came back: {repeated:?}"
    );
    history.extend(present);
    must_have.len()
}

/// The seed comes from `FLEETD_CRASH_SEED` when set (to replay a failure), else at random.
fn seed() -> u64 {
    let seed = std::env::var("FLEETD_CRASH_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("crash test seed: {seed} (replay with FLEETD_CRASH_SEED={seed})");
    seed
}

/// One crash run: the store the writer publishes into, killed and reopened cycle after cycle.
struct KillRun<'a> {
    /// The store the writer publishes into and each check reopens, the way a restarted daemon
    /// would.
    spec: StoreSpec,
    targets: &'a [Target],
    cycles: usize,
    /// The range of delays (ms) after which each writer is killed.
    kill_after_ms: std::ops::RangeInclusive<u64>,
    /// How long a reopened store may take to give back a killed client's deliveries.
    settle: Duration,
}

/// What [`kill_cycles`] proved.
struct Checked {
    /// Acknowledged publishes found again, exactly once, across all cycles.
    publishes: usize,
    /// Cycles whose writer died before its first publish.
    kills_before_ready: usize,
}

/// Runs `run.cycles` writers on `run.spec`, each SIGKILLed at a moment drawn from `rng` (made
/// from `seed`), and after each reopens the store the way a restarted daemon would and checks
/// and drains it ([`check_and_drain`]).
async fn kill_cycles(run: &KillRun<'_>, seed: u64, rng: &mut fastrand::Rng) -> Checked {
    let (path, url) = match &run.spec {
        StoreSpec::Embedded { path } => (path, None),
        StoreSpec::Amqp { url, path } => (path, Some(url.as_str())),
    };
    let location = path.to_str().expect("utf-8 path");
    let mut history = HashSet::new();
    let mut checked = Checked {
        publishes: 0,
        kills_before_ready: 0,
    };
    for cycle in 0..run.cycles {
        let delay = Duration::from_millis(rng.u64(run.kill_after_ms.clone()));
        let claims = run_and_kill(location, url, run.targets, delay).await;
        if claims.published.is_empty() {
            checked.kills_before_ready += 1;
        }
        let context = format!("seed {seed}, cycle {cycle}, kill after {delay:?}");
        let store: Arc<dyn InboxStore> = store::open(&run.spec, &StoreOptions::default())
            .await
            .unwrap_or_else(|err| panic!("{context}: reopen after kill -9 failed: {err}"));
        checked.publishes += check_and_drain(
            &*store,
            run.targets,
            &claims,
            &mut history,
            &context,
            run.settle,
        )
        .await;
        store.close().await.expect("close");
    }
    assert!(
        checked.publishes > 0,
        "the writer never got to publish: the test proved nothing"
    );
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_survives_kill_9_without_loss_or_duplicates() {
    const CYCLES: usize = 50;
    let dir = tempfile::tempdir().expect("tempdir");
    let targets: Vec<Target> = ["amy", "ben", "cat"]
        .into_iter()
        .map(|name| Target::new(name).expect("valid"))
        .collect();
    let run = KillRun {
        spec: StoreSpec::Embedded {
            path: dir.path().join("inbox.db"),
        },
        targets: &targets,
        cycles: CYCLES,
        // 0–250 ms: some kills land during start-up (lock, migration, WAL recovery), most while
        // 16 tasks publish and ack.
        kill_after_ms: 0..=250,
        settle: Duration::ZERO,
    };
    let seed = seed();
    let checked = kill_cycles(&run, seed, &mut fastrand::Rng::with_seed(seed)).await;
    eprintln!(
        "{CYCLES} kill -9 cycles: {} acknowledged publishes checked, 0 lost, 0 duplicated ({} kills before the first publish)",
        checked.publishes, checked.kills_before_ready
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_store_survives_kill_9_without_loss_or_duplicates() {
    const CYCLES: usize = 10;
    if require_rabbitmq() == Service::Skip {
        return;
    }
    let seed = seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let run_name = format!("k{:08x}", rng.u32(..));
    let targets: Vec<Target> = ["amy", "ben", "cat"]
        .into_iter()
        .map(|name| Target::new(format!("{run_name}-{name}")).expect("valid"))
        .collect();
    let _cleanup = QueueCleanup(targets.clone());
    // The writer's local file: it ingests what it publishes there, and each check reopens it
    // (with the broker) the way a restarted daemon would.
    let dir = tempfile::tempdir().expect("tempdir");
    let run = KillRun {
        spec: StoreSpec::Amqp {
            url: RABBITMQ_URL.to_owned(),
            path: dir.path().join("inbox.db"),
        },
        targets: &targets,
        cycles: CYCLES,
        kill_after_ms: 50..=600,
        settle: Duration::from_secs(20),
    };
    let checked = kill_cycles(&run, seed, &mut rng).await;
    eprintln!(
        "{CYCLES} kill -9 cycles against RabbitMQ: {} confirmed publishes checked, 0 lost, 0 duplicated",
        checked.publishes
    );
}

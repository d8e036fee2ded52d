//! The inbox benchmark's "fleetd AMQP" column: fleetd's AMQP store on the local RabbitMQ with
//! its local file on this disk, the same workload as the other columns, and where each run's
//! time went (the store's step timings, see `profile`). Benchmarks only.

use std::sync::Arc;
use std::time::Duration;

use fleetd::store::{AmqpStore, InboxStore, SqliteStore, StoreOptions};
use fleetd_core::Target;

use super::inbox::{Column, Sizes, ack_all, concurrent, single, targets};
use super::progress;

pub(super) async fn column(sizes: Sizes) -> Column {
    progress("AMQP store on the local RabbitMQ…");
    let addr = crate::RABBITMQ_ADDR;
    let reachable = addr.parse().ok().is_some_and(|addr| {
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok()
    });
    if !reachable {
        return Column {
            note: Some(format!("n/a: no broker at {addr}")),
            ..Column::default()
        };
    }
    let targets = targets(&format!("bench{:06x}-", fastrand::u32(..0x00ff_ffff)));
    let mut column = Column::default();
    if let Err(err) = amqp_runs(&targets, sizes, &mut column).await {
        column.note = Some(format!("failed: {err:#}"));
    }
    if let Err(err) = delete_queues(&targets).await {
        progress(&format!("could not delete the benchmark queues: {err:#}"));
    }
    column
}

async fn amqp_runs(targets: &[Target], sizes: Sizes, column: &mut Column) -> anyhow::Result<()> {
    // The AMQP store ingests into a local file, as the daemon's does.
    let dir = tempfile::tempdir()?;
    let local =
        Arc::new(SqliteStore::open(dir.path().join("inbox.db"), StoreOptions::default()).await?);
    let store: Arc<dyn InboxStore> =
        Arc::new(AmqpStore::open(crate::RABBITMQ_URL, local, StoreOptions::default()).await?);
    // Each target's queues declared and its consumer running, as in a fleet that has been up
    // for a while (the RabbitMQ-alone column declares its queues before it measures, too).
    let (_, mut published) = single(&*store, targets, targets.len()).await?;
    super::profile::install();
    super::profile::take();
    let (latency, singles) = single(&*store, targets, sizes.amqp_single).await?;
    published.extend(singles);
    column.single = Some(latency);
    column.profile.push(steps("1 publisher, one at a time"));
    for (publishers, each) in sizes.amqp_per_publisher {
        let (rate, ids) = concurrent(&store, targets, publishers, each).await?;
        column.throughput.push((rate, None));
        column
            .profile
            .push(steps(&format!("{publishers} publisher(s)")));
        published.extend(ids);
    }
    column.acks = Some(ack_all(&store, published).await?);
    store.close().await?;
    Ok(())
}

/// One line of the AMQP column's profile: the medians of the step timings fleetd reported since
/// the last line.
fn steps(run: &str) -> String {
    let seen = super::profile::take();
    let p50 = |field: &str| {
        super::profile::median(seen.get(field))
            .map_or_else(|| "–".to_owned(), |v| format!("{v} µs"))
    };
    let sum = |field: &str| seen.get(field).map_or(0, |v| v.iter().sum::<u64>());
    let steps = seen.get("batch").map_or(0, Vec::len);
    format!(
        "{run}: publish → broker confirm p50 {}, its local commit (at the same time) p50 {}; {} broker messages of {:.1}; {steps} consumer steps of {:.1} messages ({:.1} committed here already), their commit p50 {}",
        p50("confirm_us"),
        p50("commit_us"),
        seen.get("group").map_or(0, Vec::len),
        sum("group") as f64 / seen.get("group").map_or(1, Vec::len).max(1) as f64,
        (sum("batch") + sum("own")) as f64 / steps.max(1) as f64,
        sum("own") as f64 / steps.max(1) as f64,
        p50("step_commit_us"),
    )
}

async fn delete_queues(targets: &[Target]) -> anyhow::Result<()> {
    let conn =
        lapin::Connection::connect(crate::RABBITMQ_URL, lapin::ConnectionProperties::default())
            .await?;
    delete_queues_on(&conn, targets).await?;
    conn.close(200, "benchmark done".into()).await?;
    Ok(())
}

/// Deletes the benchmark's inbox queues over an open connection (fleetd's AMQP store and the
/// RabbitMQ-alone column use the same queue names).
pub(super) async fn delete_queues_on(
    conn: &lapin::Connection,
    targets: &[Target],
) -> anyhow::Result<()> {
    let channel = conn.create_channel().await?;
    for target in targets {
        for queue in [
            AmqpStore::queue_name(target),
            AmqpStore::dead_letter_queue_name(target),
        ] {
            channel
                .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
                .await?;
        }
    }
    Ok(())
}

//! The inbox benchmark's "RabbitMQ alone" column: the same workload as fleetd's AMQP store —
//! durable quorum queues, persistent ~200 B messages, each publish awaited until its publisher
//! confirm, `basic.get` + manual `basic.ack` to consume — done with lapin directly, without any
//! fleetd code, so the difference to fleetd's AMQP column is fleetd's own overhead. Benchmarks only.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fleetd::store::AmqpStore;
use fleetd_core::Target;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::time::Instant;

use super::inbox::{Column, Latency, Sizes, message, targets};
use super::progress;

/// Acking tasks, as in the other columns.
const ACKERS: usize = 64;

/// Measures the column; a missing broker or a failure becomes the column's note.
pub(super) async fn column(sizes: Sizes) -> Column {
    progress("RabbitMQ alone (lapin, publisher confirms)…");
    let targets = targets(&format!("rmq{:06x}-", fastrand::u32(..0x00ff_ffff)));
    let mut column = Column::default();
    let conn = match Connection::connect(crate::RABBITMQ_URL, ConnectionProperties::default()).await
    {
        Ok(conn) => conn,
        Err(e) => {
            column.note = Some(format!("n/a: no broker at {} ({e})", crate::RABBITMQ_ADDR));
            return column;
        }
    };
    if let Err(err) = runs(&conn, &targets, sizes, &mut column).await {
        column.note = Some(format!("failed: {err:#}"));
    }
    if let Err(err) = super::inbox_amqp::delete_queues_on(&conn, &targets).await {
        progress(&format!("could not delete the benchmark queues: {err:#}"));
    }
    let _ = conn.close(200, "benchmark done".into()).await;
    column
}

async fn runs(
    conn: &Connection,
    targets: &[Target],
    sizes: Sizes,
    column: &mut Column,
) -> anyhow::Result<()> {
    let channel = conn.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for target in targets {
        declare(&channel, target).await?;
    }
    let mut samples = Vec::with_capacity(sizes.amqp_single);
    let mut published = 0;
    for n in 0..sizes.amqp_single {
        let start = Instant::now();
        publish(&channel, &targets[n % targets.len()], n).await?;
        samples.push(start.elapsed());
        published += 1;
    }
    column.single = Some(Latency::of(samples));
    let targets: Arc<[Target]> = targets.into();
    for (publishers, each) in sizes.amqp_per_publisher {
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for p in 0..publishers {
            let (channel, targets) = (channel.clone(), Arc::clone(&targets));
            tasks.spawn(async move {
                for n in 0..each {
                    publish(&channel, &targets[p % targets.len()], n).await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.context("publisher task")??;
        }
        column.throughput.push((
            (publishers * each) as f64 / start.elapsed().as_secs_f64(),
            None,
        ));
        published += publishers * each;
    }
    column.acks = Some(ack_all(conn, &targets, published).await?);
    Ok(())
}

async fn declare(channel: &Channel, target: &Target) -> anyhow::Result<()> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(AmqpStore::queue_name(target).into(), options, args)
        .await?;
    Ok(())
}

async fn publish(channel: &Channel, target: &Target, n: usize) -> anyhow::Result<()> {
    let m = message(target, n);
    let body = serde_json::to_vec(&m)?;
    let properties = BasicProperties::default()
        .with_message_id(m.msg_id.to_string().into())
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    let confirm = channel
        .basic_publish(
            "".into(),
            AmqpStore::queue_name(target).into(),
            BasicPublishOptions::default(),
            &body,
            properties,
        )
        .await?
        .await?;
    anyhow::ensure!(
        matches!(confirm, Confirmation::Ack(_)),
        "the broker did not confirm: {confirm:?}"
    );
    Ok(())
}

/// `ACKERS` tasks, spread over the targets (one channel per target), get and ack until every
/// published message is gone; returns acks/s.
async fn ack_all(conn: &Connection, targets: &[Target], total: usize) -> anyhow::Result<f64> {
    let per_target = (ACKERS / targets.len()).max(1);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for target in targets {
        let channel = conn.create_channel().await?;
        let queue = AmqpStore::queue_name(target);
        for _ in 0..per_target {
            let (channel, queue) = (channel.clone(), queue.clone());
            tasks.spawn(async move {
                let mut acked = 0usize;
                while let Some(got) = channel
                    .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
                    .await?
                {
                    channel
                        .basic_ack(got.delivery.delivery_tag, BasicAckOptions::default())
                        .await?;
                    acked += 1;
                }
                anyhow::Ok(acked)
            });
        }
    }
    let mut acked = 0;
    while let Some(done) = tasks.join_next().await {
        acked += done.context("acker task")??;
    }
    let elapsed = start.elapsed();
    anyhow::ensure!(acked == total, "acked {acked} of {total} messages");
    Ok(acked as f64
        / elapsed
            .as_secs_f64()
            .max(Duration::from_micros(1).as_secs_f64()))
}

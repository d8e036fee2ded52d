//! A queue of the bench's own bound to `fleet.presence`, as each gateway's presence queue
//! is: counts the broadcasts and their bytes.

use super::{Arc, AtomicBool, AtomicU64, Ordering};
use crate::broker::FleetVhost;
use futures_util::StreamExt as _;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

/// The running tap; stops when dropped.
pub(super) struct Presence {
    messages: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Presence {
    /// Gives the broker's `guest` the vhost and starts counting.
    pub(super) fn start(vhost: &FleetVhost) -> anyhow::Result<Self> {
        vhost.ctl.run(&[
            "set_permissions",
            "-p",
            &vhost.vhost,
            "guest",
            ".*",
            ".*",
            ".*",
        ])?;
        let url = format!(
            "amqp://guest:guest@{}/{}",
            crate::RABBITMQ_ADDR,
            vhost.vhost
        );
        let (messages, bytes, stop) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (m, b, s) = (Arc::clone(&messages), Arc::clone(&bytes), Arc::clone(&stop));
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let consumer = async {
                    let conn =
                        lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
                            .await?;
                    let channel = conn.create_channel().await?;
                    let queue = channel
                        .queue_declare(
                            "".into(),
                            QueueDeclareOptions {
                                exclusive: true,
                                auto_delete: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await?;
                    channel
                        .queue_bind(
                            queue.name().as_str().into(),
                            "fleet.presence".into(),
                            "".into(),
                            QueueBindOptions::default(),
                            FieldTable::default(),
                        )
                        .await?;
                    let consumer = channel
                        .basic_consume(
                            queue.name().as_str().into(),
                            "bench-tap".into(),
                            BasicConsumeOptions {
                                no_ack: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await?;
                    anyhow::Ok((conn, consumer))
                };
                let (_conn, mut consumer) = match consumer.await {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while !s.load(Ordering::Relaxed) {
                    let next = tokio::time::timeout(
                        std::time::Duration::from_millis(200),
                        consumer.next(),
                    );
                    match next.await {
                        Ok(Some(Ok(delivery))) => {
                            m.fetch_add(1, Ordering::Relaxed);
                            b.fetch_add(delivery.data.len() as u64, Ordering::Relaxed);
                        }
                        Ok(_) => return,
                        Err(_) => {}
                    }
                }
            });
        });
        ready
            .recv_timeout(std::time::Duration::from_secs(30))
            .map_err(|_| anyhow::anyhow!("the presence tap did not start"))??;
        Ok(Self {
            messages,
            bytes,
            stop,
        })
    }

    /// Broadcasts and bytes seen so far.
    pub(super) fn seen(&self) -> (u64, u64) {
        (
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

//! The link's connections to one broker: one that publishes and one that consumes, opened
//! together, checked against the topology (passive declares) and counted as one generation.
//!
//! Two, because RabbitMQ's credit flow throttles the *reading* of a connection that publishes
//! faster than its queues take. On one shared connection that also held back this gateway's
//! consumer acks, so once its prefetch window was unacked the broker stopped delivering to it:
//! replies addressed to a gateway waited behind the gateway's own sends, for seconds under a
//! 64-sender load (docs/BENCHMARKS.md, "The cross-host nudge under load"). RabbitMQ's own advice
//! is the same (its `flow-control.md`: "use separate connections for publishing and
//! consuming").

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fleetd_core::gateway::EXCHANGE;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

use super::publish::{Publisher, confirm_channel};
use super::{CONNECT_TIMEOUT, Link, PREFETCH, lock};

/// Longest wait for a connection's `close-ok`: one whose socket died may never answer.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection's error events.
pub(super) type Events = Pin<Box<dyn futures_util::Stream<Item = lapin::Event> + Send>>;

/// A live link: its two connections, their consumers and event streams, and its generation.
pub(super) struct Session {
    pub(super) publishing: Arc<Connection>,
    pub(super) consuming: Connection,
    pub(super) consumer: lapin::Consumer,
    pub(super) presence_consumer: Option<lapin::Consumer>,
    pub(super) publishing_events: Events,
    pub(super) consuming_events: Events,
    pub(super) generation: u64,
}

impl Session {
    /// Closes both connections.
    pub(super) async fn close(self, why: &str) {
        close_both(&self.publishing, &self.consuming, why).await;
    }
}

impl Link {
    /// Connects to `url` twice (publishing, consuming), checks the topology is there, and starts
    /// consuming.
    pub(super) async fn connect(&self, url: &str) -> Result<Session, String> {
        let publishing = Arc::new(self.open(url, "publishing").await?);
        // Listening from the start: lapin only reports events to a listener that exists.
        let publishing_events: Events = Box::pin(publishing.events_listener());
        let consuming = match self.open(url, "consuming").await {
            Ok(connection) => connection,
            Err(why) => {
                close_within(&publishing, "its twin did not connect").await;
                return Err(why);
            }
        };
        let consuming_events: Events = Box::pin(consuming.events_listener());
        let (publisher, consumer, presence_consumer) =
            match self.channels(&publishing, &consuming).await {
                Ok(opened) => opened,
                Err(why) => {
                    close_both(&publishing, &consuming, "not linked").await;
                    return Err(why);
                }
            };
        let generation = self
            .inner
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        *lock(&self.inner.publisher) = Some(Publisher {
            generation,
            channel: publisher,
            connection: Arc::clone(&publishing),
        });
        *lock(&self.inner.down) = None;
        self.inner.up.notify_waiters();
        Ok(Session {
            publishing,
            consuming,
            consumer,
            presence_consumer,
            publishing_events,
            consuming_events,
            generation,
        })
    }

    /// One connection to `url`, named for its `role` (the broker's connection list shows it).
    async fn open(&self, url: &str, role: &str) -> Result<Connection, String> {
        let config = &self.inner.config;
        let full = with_credentials(url, &config.user, &config.password, config.heartbeat_secs)?;
        let props = ConnectionProperties::default()
            .with_connection_name(format!("fleetd gateway {} ({role})", config.me).into());
        let connecting = crate::store::amqp::tls::connect(&full, props, &config.tls);
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| format!("no answer from {url} within {}s", CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| format!("{url}: {e}"))
    }

    /// The publishing channel (after checking the exchange is there), and the consumers of the
    /// inbound queue and of the presence queue.
    async fn channels(
        &self,
        publishing: &Connection,
        consuming: &Connection,
    ) -> Result<(lapin::Channel, lapin::Consumer, Option<lapin::Consumer>), String> {
        let config = &self.inner.config;
        let publisher = confirm_channel(publishing).await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        publisher
            .exchange_declare(
                EXCHANGE.into(),
                lapin::ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|e| missing(&format!("exchange {EXCHANGE}"), &e))?;
        let consumer_channel = consuming
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        let inbound = config.me.inbound_queue();
        consumer_channel
            .queue_declare(
                inbound.as_str().into(),
                super::super::passive(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| missing(&format!("queue {inbound}"), &e))?;
        consumer_channel
            .basic_qos(PREFETCH, BasicQosOptions { global: false })
            .await
            .map_err(|e| e.to_string())?;
        let consumer = consumer_channel
            .basic_consume(
                inbound.as_str().into(),
                format!("fleetd-{}", config.me).as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| format!("cannot consume {inbound}: {e}"))?;
        // Presence is soft state: taken as it comes, never acknowledged one by one.
        let presence_queue = config.me.presence_queue();
        let presence_channel = consuming
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        // Not reading it costs only the other gateways' presence (their members show stale),
        // never the link: tasks and replies do not wait for it.
        let presence_consumer = match presence_channel
            .basic_consume(
                presence_queue.as_str().into(),
                format!("fleetd-{}-presence", config.me).as_str().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
        {
            Ok(consumer) => Some(consumer),
            Err(e) => {
                let why = missing(&format!("queue {presence_queue}"), &e);
                tracing::warn!(gateway = %config.me, reason = %why, "the gateway cannot read its presence queue; other gateways' members will show stale until the next reconnect");
                None
            }
        };
        Ok((publisher, consumer, presence_consumer))
    }
}

/// Closes both connections, each given [`CLOSE_TIMEOUT`] to say so.
async fn close_both(publishing: &Connection, consuming: &Connection, why: &str) {
    futures_util::future::join(close_within(publishing, why), close_within(consuming, why)).await;
}

/// Closes `connection`, waiting at most [`CLOSE_TIMEOUT`] for the broker to say so.
async fn close_within(connection: &Connection, why: &str) {
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, connection.close(200, why.into())).await;
}

/// A refusal of a passive declare, in words that say what to do.
fn missing(what: &str, e: &lapin::Error) -> String {
    if crate::store::amqp::session::is_not_found(e) {
        format!(
            "the broker has no {what}: provision the fleet first (`fleetd gateway provision`, README)"
        )
    } else {
        format!("cannot check {what}: {e}")
    }
}

/// `amqp://host/vhost` with `user:password@` and the heartbeat.
fn with_credentials(
    url: &str,
    user: &str,
    password: &str,
    heartbeat: u64,
) -> Result<String, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{url:?} is not an AMQP URL"))?;
    let auth = if password.is_empty() {
        format!("{}@", encode(user))
    } else {
        format!("{}:{}@", encode(user), encode(password))
    };
    let sep = if rest.contains('?') { '&' } else { '?' };
    Ok(format!("{scheme}://{auth}{rest}{sep}heartbeat={heartbeat}"))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::amqp::link::{LinkConfig, LinkTls};
    use fleetd_core::gateway::GatewayName;

    #[test]
    fn credentials_and_the_heartbeat_go_into_the_url() {
        assert_eq!(
            with_credentials("amqp://rmq:5672/fleet", "a", "p@ss/w", 15).expect("url"),
            "amqp://a:p%40ss%2Fw@rmq:5672/fleet?heartbeat=15"
        );
        assert_eq!(
            with_credentials("amqps://rmq/fleet?x=1", "b", "", 5).expect("url"),
            "amqps://b@rmq/fleet?x=1&heartbeat=5"
        );
        assert!(with_credentials("rmq:5672", "a", "", 5).is_err());
        let config = LinkConfig {
            me: GatewayName::new("a").expect("a"),
            urls: vec![],
            user: "a".to_owned(),
            password: "hunter2".to_owned(),
            heartbeat_secs: 15,
            outbox_alarm: 1000,
            tls: LinkTls::system(),
        };
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}

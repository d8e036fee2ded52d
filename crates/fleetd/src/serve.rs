//! `fleetd serve`: wires the configured parts together and runs the HTTP listener until shutdown.
//! Owns start-up order and graceful shutdown; takes its I/O (listener, shutdown signal) as
//! arguments so tests run it in-process on `127.0.0.1:0`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{Config, Store};
use crate::health::{HealthReport, PartHealth};

/// The running daemon's shared handle, cheap to clone into handlers.
#[derive(Debug, Clone)]
pub struct Daemon {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
}

impl Daemon {
    /// Opens everything the daemon owns for `config`.
    pub async fn open(config: Config) -> anyhow::Result<Self> {
        Ok(Self {
            inner: Arc::new(Inner { config }),
        })
    }

    /// The configuration the daemon runs on.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Asks every part whether it answers.
    pub async fn health(&self) -> HealthReport {
        let store = match &self.inner.config.store {
            Store::Embedded { path } => {
                let dir = path
                    .parent()
                    .map(std::path::Path::to_path_buf)
                    .unwrap_or_default();
                let probe = tokio::fs::create_dir_all(&dir).await;
                PartHealth {
                    kind: "embedded",
                    ok: probe.is_ok(),
                    error: probe
                        .err()
                        .map(|e| format!("state directory {} is not usable: {e}", dir.display())),
                }
            }
            Store::Amqp { .. } => PartHealth {
                kind: "amqp",
                ok: false,
                error: Some("the AMQP store is not connected yet".to_owned()),
            },
        };
        HealthReport::from_parts(store, None, None)
    }

    /// Serves HTTP on `listener` until `shutdown` completes, then finishes in-flight requests.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let app = crate::http::router(self);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await?;
        tracing::info!("fleetd stopped");
        Ok(())
    }
}

/// Opens the daemon for `config` and serves on `listener` until `shutdown`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    Daemon::open(config).await?.run(listener, shutdown).await
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => tracing::info!("SIGINT received: shutting down"),
                    _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
                }
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e}); only SIGINT stops fleetd");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

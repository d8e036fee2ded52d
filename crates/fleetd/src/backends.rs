//! The backend health prober (SPEC §7): every backend with a `healthUrl` is fetched every
//! `healthIntervalSecs`; a 2xx answer is up, anything else (status, refused connection, timeout)
//! is down with the reason. Each reading goes to the engine, which turns transitions into
//! incidents for the members on that backend (and so nudges for their leads). Reads the running
//! configuration each round, so backends added or removed by a reload are probed or dropped.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Live;
use crate::engine::WeakEngineHandle;

/// How often the prober looks for a due backend.
const ROUND: Duration = Duration::from_millis(250);
/// The longest one probe may take: a health endpoint that cannot answer in this is down.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the prober; it ends when the engine does.
pub fn spawn(config: Live, engine: WeakEngineHandle) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut next: BTreeMap<String, Instant> = BTreeMap::new();
        loop {
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let now = Instant::now();
            let snapshot = config.current();
            next.retain(|name, _| snapshot.backends.contains_key(name));
            for (name, backend) in &snapshot.backends {
                let Some(url) = backend.health_url.clone() else {
                    continue;
                };
                if next.get(name).is_some_and(|at| *at > now) {
                    continue;
                }
                let interval = Duration::from_secs(backend.health_interval_secs.max(1));
                next.insert(name.clone(), now + interval);
                let engine = engine.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let down = probe(&url, PROBE_TIMEOUT.min(interval)).await.err();
                    tracing::debug!(backend = %name, down = ?down, "backend probed");
                    let _ = engine.backend_health(name, down).await;
                });
            }
            tokio::time::sleep(ROUND).await;
        }
    })
}

/// `Ok` when `url` answers 2xx in time; else why not.
async fn probe(url: &str, timeout: Duration) -> Result<(), String> {
    match crate::client::wire::probe::get_status(url, timeout).await {
        Ok(status) if (200..300).contains(&status) => Ok(()),
        Ok(status) => Err(format!("its health endpoint {url} answered HTTP {status}")),
        Err(e) => Err(e.to_string()),
    }
}

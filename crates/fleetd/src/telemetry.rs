//! Metrics (SPEC §9 `/metrics`): the process-wide Prometheus recorder and the names fleetd
//! records under. Code everywhere records with the `metrics` macros; only this module knows the
//! exporter. Names and labels (labels are bounded sets — tool names, outcome codes, states,
//! member names; never message text):
//!
//! - `fleetd_tool_calls_total{tool, outcome}` — outcome `ok` or the refusal code;
//! - `fleetd_nudges_total{outcome}` — `nudged`, `deferred_busy`, `exhausted`, `no_lead`,
//!   `binding_forgotten`, `inject_failed`, `inject_uncertain`;
//! - `fleetd_inbox_depth{target}` — pending messages per member inbox (as last read);
//! - `fleetd_tickets{state}` — tickets the engine holds, by state;
//! - `fleetd_delivery_seconds` — ticket opened → task typed into the member's pane;
//! - `fleetd_nudge_seconds` — a nudge decided → typed into the lead's pane;
//! - `fleetd_store_publish_seconds`, `fleetd_store_ack_seconds` — durable store commits.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The recorder's handle, installing the recorder on first use. When another recorder is
/// installed already (several daemons in one test process), the first one keeps recording and
/// every daemon renders it.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[
                0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ])
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::debug!("a metrics recorder was installed already; /metrics renders ours");
        }
        handle
    })
}

/// The Prometheus text of every metric now.
pub fn render() -> String {
    let handle = handle();
    handle.run_upkeep();
    handle.render()
}

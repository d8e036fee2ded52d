//! Metrics (SPEC §9 `/metrics`): the process-wide Prometheus recorder and the names fleetd
//! records under. Code everywhere records with the `metrics` macros; only this module knows the
//! exporter. Names and labels (labels are bounded sets — tool names, outcome codes, states,
//! member names; never message text):
//!
//! - `fleetd_tool_calls_total{tool, outcome}` — outcome `ok` or the refusal code;
//! - `fleetd_nudges_total{outcome}` — `nudged`, `deferred_busy`, `exhausted`, `no_lead`,
//!   `binding_forgotten`, `inject_failed`, `inject_uncertain`;
//! - `fleetd_tasks_total{outcome}` — MCP tasks (the keystroke-free wake): `armed`, then
//!   `completed` or `failed` when a client is told the ticket's news, or `cancelled`;
//! - `fleetd_inbox_depth{target}` — pending messages per member inbox (as last read), one series
//!   per inbox that exists: a member's, or a released member's still holding mail;
//! - `fleetd_tickets{state}` — tickets the engine holds, by state;
//! - `fleetd_delivery_seconds` — ticket opened → task typed into the member's pane;
//! - `fleetd_nudge_seconds` — a nudge decided → typed into the lead's pane;
//! - `fleetd_store_publish_seconds`, `fleetd_store_ack_seconds` — durable store commits;
//! - `fleetd_connections_open` — connections the gate holds, over every door;
//! - `fleetd_connections_closed_total{reason}` — connections refused (the refusal's code) or
//!   closed by fleetd (`idle_timeout`, `header_timeout`, `evicted`).
//! - `fleetd_amqp_dead_lettered_total{reason}` — messages the AMQP inbox moved to a dead-letter
//!   queue because it could not take them: `undecodable`, `wrong_target`, `refused`.
//! - `fleetd_gateway_refused_total{reason}` — another gateway's messages this gateway refused:
//!   `malformed`, `no_user_id`, `impersonation`, `version` (before the engine looks at them),
//!   `never_sent` (a reply, ticket event, question or spawn result for something never sent
//!   there), `not_allowed` (`gateway.peers` does not allow it), `undeliverable`, `presence`;
//! - `fleetd_gateway_outbox` — messages waiting in this gateway's outbox for the broker;
//! - `fleetd_gateway_peer_queued{gateway}` — messages waiting in another gateway's queue on the
//!   broker, as last read while sending there (`gateway.peerBacklogMax` bounds it);
//! - `fleetd_gateway_forwarded_total{kind, outcome}` — outbox messages the broker took
//!   (`confirmed`), could not route (`unroutable`), or that wait for a missing queue (`parked`);
//! - `fleetd_gateway_confirm_seconds` — an outbox message handed to the broker → the broker's
//!   word on it (the broker's part of a hop between gateways);
//! - `fleetd_gateway_taken_seconds{kind}` — a delivery from another gateway handed to the engine
//!   → taken here, durably (a reply: stored in the inbox and its ticket told), in turn behind
//!   the deliveries before it.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

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

/// Every family fleetd records: name, Prometheus type, help. A scrape shows each one from
/// start-up, before any traffic (a family with no series yet is its `HELP` and `TYPE` lines).
const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "fleetd_tool_calls_total",
        "counter",
        "MCP tool calls (REST routes included), by tool and outcome (ok or the refusal code)",
    ),
    (
        "fleetd_nudges_total",
        "counter",
        "Nudge decisions for leads, by outcome",
    ),
    (
        "fleetd_tasks_total",
        "counter",
        "MCP tasks (the keystroke-free wake), by outcome: armed, completed, failed, cancelled",
    ),
    ("fleetd_inbox_depth", "gauge", DEPTH_HELP),
    (
        "fleetd_tickets",
        "gauge",
        "Tickets the engine holds, by state",
    ),
    (
        "fleetd_delivery_seconds",
        "histogram",
        "Ticket opened to its task typed into the member's pane",
    ),
    (
        "fleetd_nudge_seconds",
        "histogram",
        "A nudge decided to its text typed into the lead's pane",
    ),
    (
        "fleetd_store_publish_seconds",
        "histogram",
        "Durable store commit of a published message",
    ),
    (
        "fleetd_store_ack_seconds",
        "histogram",
        "Durable store commit of an acknowledgement",
    ),
    (
        "fleetd_connections_open",
        "gauge",
        "Connections admitted and open, over every door",
    ),
    (
        "fleetd_connections_closed_total",
        "counter",
        "Connections refused (by the refusal's code) or closed by fleetd (idle_timeout, header_timeout, evicted)",
    ),
    (
        "fleetd_amqp_dead_lettered_total",
        "counter",
        "Messages the AMQP inbox rejected into a dead-letter queue (agent.<target>.dead), by reason",
    ),
    (
        "fleetd_gateway_refused_total",
        "counter",
        "Messages from other gateways this gateway refused (dead-lettered, or a spawn answered with the reason), by reason",
    ),
    (
        "fleetd_gateway_outbox",
        "gauge",
        "Messages waiting in this gateway's outbox for the broker",
    ),
    (
        "fleetd_gateway_peer_queued",
        "gauge",
        "Messages waiting in another gateway's queue on the broker, as last read while sending there, by gateway",
    ),
    (
        "fleetd_gateway_forwarded_total",
        "counter",
        "Outbox messages handed to the broker, by kind and outcome (confirmed, unroutable, parked)",
    ),
    (
        "fleetd_gateway_confirm_seconds",
        "histogram",
        "An outbox message handed to the broker until the broker's word on it",
    ),
    (
        "fleetd_gateway_taken_seconds",
        "histogram",
        "A delivery from another gateway handed to the engine until it is taken here durably, by kind",
    ),
    (
        "fleetd_model_tokens",
        "gauge",
        "Model tokens counted through the model gateway, every account kept (a restart keeps them), by member name and kind (input, output, cache_read, cache_write)",
    ),
    (
        "fleetd_model_cost_usd",
        "gauge",
        "What those tokens cost at the backends' configured prices, by member name",
    ),
    (
        "fleetd_model_tree_tokens",
        "gauge",
        "Model tokens by delegation tree (its top member) and kind",
    ),
    (
        "fleetd_model_tree_cost_usd",
        "gauge",
        "Model cost by delegation tree (its top member)",
    ),
    (
        "fleetd_model_profile_tokens",
        "gauge",
        "Model tokens by profile and kind",
    ),
    (
        "fleetd_model_profile_cost_usd",
        "gauge",
        "Model cost by profile",
    ),
    (
        "fleetd_model_lead_tokens",
        "gauge",
        "Model tokens by lead (its pane; operator for trees no lead spawned) and kind",
    ),
    ("fleetd_model_lead_cost_usd", "gauge", "Model cost by lead"),
];

/// What a group of model accounts spent, for the `fleetd_model_*` gauges.
#[derive(Debug, Clone, Copy)]
pub enum SpentBy {
    /// By member name.
    Member,
    /// By delegation tree.
    Tree,
    /// By profile.
    Profile,
    /// By lead.
    Lead,
}

/// Sets the model gauges of `key` (a member, tree, profile or lead, as `by` says) to `spent`.
pub fn model_spent(by: SpentBy, key: &str, spent: &fleetd_core::usage::Spent) {
    let t = &spent.tokens;
    let kinds = [
        ("input", t.input),
        ("output", t.output),
        ("cache_read", t.cache_read),
        ("cache_write", t.cache_write),
    ];
    let key = key.to_owned();
    let cost = spent.cost_micros as f64 / 1e6;
    macro_rules! set {
        ($tokens:literal, $cost:literal, $label:literal) => {{
            for (kind, n) in kinds {
                metrics::gauge!($tokens, $label => key.clone(), "kind" => kind).set(n as f64);
            }
            metrics::gauge!($cost, $label => key).set(cost);
        }};
    }
    match by {
        SpentBy::Member => set!("fleetd_model_tokens", "fleetd_model_cost_usd", "member"),
        SpentBy::Tree => set!(
            "fleetd_model_tree_tokens",
            "fleetd_model_tree_cost_usd",
            "tree"
        ),
        SpentBy::Profile => set!(
            "fleetd_model_profile_tokens",
            "fleetd_model_profile_cost_usd",
            "profile"
        ),
        SpentBy::Lead => set!(
            "fleetd_model_lead_tokens",
            "fleetd_model_lead_cost_usd",
            "lead"
        ),
    }
}

/// Sets the open-connection gauge.
pub fn connections_open(open: usize) {
    metrics::gauge!("fleetd_connections_open").set(open as f64);
}

/// Counts a connection refused or closed by fleetd, by `reason` (a fixed code).
pub fn connection_closed(reason: &'static str) {
    metrics::counter!("fleetd_connections_closed_total", "reason" => reason).increment(1);
}

/// Installs the recorder and describes every family (so a series, once it exists, carries its
/// help text). Called once at start-up; calling it again is harmless.
pub fn describe() {
    handle();
    for (name, kind, help) in FAMILIES {
        match *kind {
            "counter" => metrics::describe_counter!(*name, *help),
            "gauge" => metrics::describe_gauge!(*name, *help),
            _ => metrics::describe_histogram!(*name, *help),
        }
    }
}

/// The `fleetd_inbox_depth` series: one per member inbox that exists (a member's, or a released
/// member's that still holds mail), kept here rather than in the recorder, which never forgets
/// a series — one per name ever used.
static DEPTHS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

fn depths() -> std::sync::MutexGuard<'static, BTreeMap<String, u64>> {
    crate::sync::lock(&DEPTHS)
}

/// Sets `target`'s inbox depth.
pub fn set_inbox_depth(target: &str, pending: u64) {
    depths().insert(target.to_owned(), pending);
}

/// Drops `target`'s inbox depth series (the member is gone and its inbox empty).
pub fn forget_inbox_depth(target: &str) {
    depths().remove(target);
}

/// The Prometheus text of every metric now: the recorder's series, the inbox depths, then the
/// `HELP` and `TYPE` lines of each family that has no series yet.
pub fn render() -> String {
    let handle = handle();
    handle.run_upkeep();
    let mut text = handle.render();
    let depths = depths();
    if !depths.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "# HELP fleetd_inbox_depth {DEPTH_HELP}\n# TYPE fleetd_inbox_depth gauge\n"
        ));
        for (target, pending) in depths.iter() {
            let label = target.replace('\\', "\\\\").replace('"', "\\\"");
            text.push_str(&format!(
                "fleetd_inbox_depth{{target=\"{label}\"}} {pending}\n"
            ));
        }
    }
    with_every_family(text)
}

const DEPTH_HELP: &str = "Pending messages per member inbox, as last read";

fn with_every_family(mut text: String) -> String {
    for (name, kind, help) in FAMILIES {
        if !text.contains(&format!("# TYPE {name} ")) {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_without_series_is_still_described() {
        let rendered = "# HELP fleetd_tickets x\n# TYPE fleetd_tickets gauge\nfleetd_tickets{state=\"queued\"} 1\n";
        let text = with_every_family(rendered.to_owned());
        for (name, kind, _) in FAMILIES {
            assert_eq!(
                text.matches(&format!("# TYPE {name} {kind}\n")).count(),
                1,
                "{name} in {text}"
            );
        }
        assert!(
            text.starts_with(rendered),
            "the recorder's series come first"
        );
    }
}

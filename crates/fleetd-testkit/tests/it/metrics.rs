//! `/metrics` (issue 8): the daemon's Prometheus text parses with a Prometheus text-format parser,
//! and its counters, gauges and histograms move when tools are called and tasks flow.

use std::time::Duration;

use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use fleetd_testkit::{http, wait_until};
use prometheus_parse::{Scrape, Value as Metric};
use serde_json::json;

fn scrape(rig: &Rig) -> Scrape {
    let response = http::get(rig.daemon.addr, "/metrics").expect("GET /metrics");
    assert_eq!(response.status, 200);
    let lines = response.body.lines().map(|l| Ok(l.to_owned()));
    Scrape::parse(lines).expect("the Prometheus text parses")
}

/// The value of `metric` with exactly these labels (0 when absent); a histogram gives its count.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Metric::Counter(v) | Metric::Gauge(v) | Metric::Untyped(v) => *v,
            Metric::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            Metric::Summary(_) => 0.0,
        })
        .sum()
}

#[test]
fn e2e_metrics_parse_and_move_when_tools_are_called() {
    let Some(rig) = Rig::start_if_tmux(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}",
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")])
    )) else {
        return;
    };
    let before = scrape(&rig);
    let list_ok = [("tool", "fleet_list"), ("outcome", "ok")];
    for _ in 0..2 {
        structured_ok(&rig.lead("fleet_list", &json!({})));
    }
    rig.lead("fleet_nonsense", &json!({}));
    rig.spawn("sim", "alice");
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "alice", "task": "count me", "timeoutSecs": 60 }),
    ));
    assert_eq!(sent["status"], "replied", "{sent}");
    // A reply nobody waits for sits in the inbox: depth and a push decision are recorded.
    rig.send_task("alice", "later");
    // The second task is typed (a delivery recorded) on its own time: wait for both.
    wait_until(
        "alice's inbox depth to read 1 and both tasks to be delivered",
        Duration::from_secs(60),
        || {
            let now = scrape(&rig);
            value(&now, "fleetd_inbox_depth", &[("target", "alice")]) >= 1.0
                && value(&now, "fleetd_delivery_seconds", &[]) >= 2.0
        },
    );
    let after = scrape(&rig);
    assert_eq!(
        value(&after, "fleetd_tool_calls_total", &list_ok)
            - value(&before, "fleetd_tool_calls_total", &list_ok),
        2.0
    );
    assert_eq!(
        value(
            &after,
            "fleetd_tool_calls_total",
            &[("tool", "unknown"), ("outcome", "unknown_tool")]
        ),
        1.0
    );
    assert!(
        value(
            &after,
            "fleetd_tool_calls_total",
            &[("tool", "fleet_spawn"), ("outcome", "ok")]
        ) >= 1.0
    );
    assert!(value(&after, "fleetd_tickets", &[("state", "replied")]) >= 1.0);
    assert!(value(&after, "fleetd_delivery_seconds", &[]) >= 2.0);
    assert!(value(&after, "fleetd_store_publish_seconds", &[]) >= 2.0);
    assert!(value(&after, "fleetd_store_ack_seconds", &[]) >= 1.0);
    assert!(
        value(&after, "fleetd_nudges_total", &[]) >= 1.0,
        "a push decision was counted"
    );
    // Review L8: a series per member name ever used. Once alice is gone and her inbox read,
    // her depth series goes too.
    structured_ok(&rig.lead("fleet_stop", &json!({ "target": "alice" })));
    let has_alice = || {
        scrape(&rig)
            .samples
            .iter()
            .any(|s| s.metric == "fleetd_inbox_depth" && s.labels.get("target") == Some("alice"))
    };
    assert!(has_alice(), "her inbox still holds mail");
    let drained = structured_ok(&rig.lead("fleet_poll", &json!({ "target": "alice" })));
    for reply in drained["replies"].as_array().into_iter().flatten() {
        structured_ok(&rig.lead(
            "fleet_ack",
            &json!({ "target": "alice", "msgId": reply["msgId"] }),
        ));
    }
    wait_until(
        "alice's depth series to go",
        Duration::from_secs(30),
        || !has_alice(),
    );
}

#[test]
fn a_fresh_daemon_describes_every_family_before_any_traffic() {
    // Issue 15: a scrape before the first call was an empty body; a dashboard or alert rule saw
    // no family at all.
    let home = tempfile::tempdir().expect("tempdir");
    let daemon = fleetd_testkit::daemon::Daemon::start(home.path(), &[]);
    let response = http::get(daemon.addr, "/metrics").expect("GET /metrics");
    assert_eq!(response.status, 200);
    let scrape = Scrape::parse(response.body.lines().map(|l| Ok(l.to_owned())))
        .expect("the Prometheus text parses");
    for (family, kind) in [
        ("fleetd_tool_calls_total", "counter"),
        ("fleetd_nudges_total", "counter"),
        ("fleetd_inbox_depth", "gauge"),
        ("fleetd_tickets", "gauge"),
        ("fleetd_delivery_seconds", "histogram"),
        ("fleetd_nudge_seconds", "histogram"),
        ("fleetd_store_publish_seconds", "histogram"),
        ("fleetd_store_ack_seconds", "histogram"),
        ("fleetd_amqp_dead_lettered_total", "counter"),
    ] {
        assert!(
            response.body.contains(&format!("# TYPE {family} {kind}\n")),
            "{family} is not described: {}",
            response.body
        );
        assert!(
            scrape.docs.contains_key(family),
            "{family} has no HELP: {:?}",
            scrape.docs
        );
    }
}

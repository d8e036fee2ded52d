//! A member's own model requests: its pane holds only its model key and fleetd's URL; each
//! request, in each API and either key header, reaches the backend with the real credential in
//! that same header (and never the member's key), streams back whole, and is counted exactly
//! what the backend served — tokens by kind and cost, in `fleet_list` and `/metrics`.

use fleetd_testkit::fake_model::served::Usage;

use super::{SECRET, assert_served, gauge, scrape, start};

/// What `u` costs at the rig's prices ($3, $15, $0.30, $3.75 per million), in micro-dollars,
/// rounded as fleetd rounds each answer.
fn cost_micros(u: Usage) -> u64 {
    let sum = u128::from(u.input) * 3_000_000
        + u128::from(u.output) * 15_000_000
        + u128::from(u.cache_read) * 300_000
        + u128::from(u.cache_write) * 3_750_000;
    u64::try_from((sum + 500_000) / 1_000_000).expect("small")
}

#[test]
fn e2e_model_gateway_a_members_own_requests_reach_the_backend_with_the_real_credential_and_are_counted_exactly()
 {
    let Some(gw) = start(&[], "") else {
        return;
    };
    let key = gw.member("ann");
    // The member's whole process tree holds its own key and fleetd's URL, never the credential.
    let envs = fleetd_testkit::tree_environments(gw.rig.pane_pid("fleet:ann"));
    assert!(!envs.is_empty(), "ann's pane has processes");
    for env in &envs {
        assert!(
            !env.contains(SECRET),
            "the credential is in ann's pane: {env}"
        );
    }
    let has = |line: String| envs.iter().any(|e| e.lines().any(|l| l == line));
    assert!(has(format!("FLEETD_BACKEND_TOKEN={key}")), "{envs:?}");
    assert!(has(format!("FLEETD_BACKEND_URL={}", gw.url())), "{envs:?}");

    // Anthropic's API with x-api-key, the Responses API and Chat Completions with a bearer token.
    let asked = [
        ("", "x-api-key"),
        ("--api responses --header bearer", "authorization"),
        ("--api chat --header bearer", "authorization"),
    ];
    for (args, _) in asked {
        assert_served(&gw.call_as("ann", args), args);
    }
    let requests = gw.fake.requests();
    assert_eq!(requests.len(), asked.len(), "{requests:?}");
    for (request, (args, header)) in requests.iter().zip(asked) {
        assert_eq!(request["key"], SECRET, "{args}: {request}");
        let headers = request["headers"].as_object().expect("headers");
        let other = if header == "x-api-key" {
            "authorization"
        } else {
            "x-api-key"
        };
        assert!(
            headers.contains_key(header) && !headers.contains_key(other),
            "{args}: the credential goes in the header the member used: {headers:?}"
        );
        assert!(
            !request.to_string().contains("fleetd-mk-"),
            "{args}: a model key reached the backend: {request}"
        );
    }
    let served = gw.fake.served();
    assert!(
        served.len() == asked.len() && served.iter().all(|l| l["served"] == true),
        "every answer was served whole: {served:?}"
    );

    gw.assert_counted("ann", gw.served());
    let cost: u64 = served
        .iter()
        .map(|l| cost_micros(serde_json::from_value(l["usage"].clone()).expect("usage")))
        .sum();
    let usage = gw.listed_usage("ann");
    let listed = usage["costUsd"].as_f64().expect("costUsd");
    assert!(
        (listed - cost as f64 / 1e6).abs() < 1e-9,
        "cost {listed} is {cost} micro-dollars: {usage}"
    );
    let metric = gauge(
        &scrape(&gw.rig),
        "fleetd_model_cost_usd",
        &[("member", "ann")],
    );
    assert!(
        metric.is_some_and(|m| (m - cost as f64 / 1e6).abs() < 1e-9),
        "fleetd_model_cost_usd{{member=ann}} = {metric:?}, {cost} micro-dollars"
    );
}

//! A member's model budget: its profile's `budget: {tokens}` lets two requests through and
//! refuses the next (403 `budget_reached`, saying so in words), before the backend sees it; its
//! lead hears once per episode (one warning, one incident in the member's inbox, however many
//! requests are refused); neither the member nor the lead may raise it, the operator does
//! (`fleetd budget`), and the next request goes through. `fleet_spawn`'s `budget` tightens the
//! profile's, never loosens it, and a bad one is refused naming its field.

use std::time::Duration;

use fleetd_testkit::fake_model::served::Usage;
use fleetd_testkit::rig::{LEAD, error_code, structured_ok};
use fleetd_testkit::{bin_path, http, thousands, wait_until};
use serde_json::{Value, json};

use super::{Gateway, PROMPT, assert_refused, assert_served, start, total};

/// How many of member `name`'s inbox texts contain `words`.
fn notices(gw: &Gateway, name: &str, words: &str) -> usize {
    http::reply_texts(gw.rig.daemon.operator(), name)
        .iter()
        .filter(|t| t.contains(words))
        .count()
}

/// `mcp-call --http POST /sessions/ann/budget` typed into tmux target `pane`: its answer.
fn raise_from(gw: &Gateway, pane: &str) -> Value {
    let out = gw.next_out();
    let r = out.display();
    gw.rig.type_line(
        pane,
        &format!(
            r#"{} --http POST /sessions/ann/budget '{{"tokens": 999999999}}' > {r}.tmp; mv {r}.tmp {r}"#,
            bin_path("mcp-call").display()
        ),
    );
    let text = crate::security::read_when_there(&out, "a budget raised from a pane");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `fleetd budget ARGS` as the operator (this process, on the daemon's own socket).
fn fleetd_budget(gw: &Gateway, args: &[&str]) -> std::process::Output {
    fleetd_testkit::daemon::command(gw.rig.dir())
        .arg("budget")
        .args(args)
        .output()
        .expect("fleetd runs")
}

#[test]
fn e2e_model_gateway_a_budget_stops_the_member_with_one_incident_and_only_the_operator_raises_it() {
    // The fake's usage is planned per request: the first answer stays under the limit, the
    // second reaches it.
    let first = Usage::planned(1, PROMPT);
    let limit = total(first) + 1;
    let Some(gw) = start(&[], &format!("    budget:\n      tokens: {limit}\n")) else {
        return;
    };
    gw.member("ann");
    assert_served(&gw.call_as("ann", ""), "the first request");
    assert_eq!(gw.served(), first, "the fake's usage for its first answer");
    assert_served(
        &gw.call_as("ann", ""),
        "the second request, still under the limit",
    );
    let spent = gw.served();
    assert!(total(spent) >= limit, "two answers reach the limit");

    let refused = gw.call_as("ann", "");
    assert_refused(&refused, 403, "budget_reached", "past the budget");
    assert!(
        refused.error_message().contains("budget"),
        "the agent is told why in words: {refused:?}"
    );
    let reached = "reached its model budget";
    wait_until(
        "the incident in ann's inbox",
        Duration::from_secs(30),
        || notices(&gw, "ann", reached) == 1,
    );
    let refused = gw.call_as("ann", "--api responses --header bearer");
    assert_refused(&refused, 403, "budget_reached", "refused again");
    assert_eq!(gw.requests(), 2, "no refused request reached the backend");
    gw.assert_counted("ann", spent);

    // The budget is the operator's: the member cannot raise its own, nor can its lead.
    for pane in ["fleet:ann", LEAD] {
        let answer = raise_from(&gw, pane);
        assert_eq!(answer["status"], 403, "{pane}: {answer}");
        assert_eq!(
            answer["body"]["error"], "not_the_operator",
            "{pane}: {answer}"
        );
    }
    let refused = gw.call_as("ann", "");
    assert_refused(&refused, 403, "budget_reached", "still spent");
    // A value fleetd cannot take is refused, naming it; the budget stays as it was.
    let bad = fleetd_budget(&gw, &["ann", "--tokens", "5", "--warn-at", "2"]);
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && said.contains("`warnAt`"), "{said}");
    // The operator raises it: it says what is set and what was spent, and ann goes on.
    let raised = fleetd_budget(&gw, &["ann", "--tokens", "100000000"]);
    let said = String::from_utf8_lossy(&raised.stdout);
    assert!(
        raised.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&raised.stderr)
    );
    assert!(
        said.contains(&format!(
            "set ann's model budget: {} of 100,000,000 tokens",
            thousands(total(spent))
        )) && said.contains(&format!("spent so far: {} tokens", total(spent))),
        "{said}"
    );
    assert_served(
        &gw.call_as("ann", ""),
        "after the operator raised the budget",
    );
    assert_eq!(gw.requests(), 3);
    gw.assert_counted("ann", gw.served());
    // One episode: one warning and one incident, however many requests were refused.
    let texts = http::reply_texts(gw.rig.daemon.operator(), "ann");
    assert_eq!(notices(&gw, "ann", reached), 1, "{texts:?}");
    assert_eq!(notices(&gw, "ann", "has used"), 1, "{texts:?}");

    // At spawn a budget tightens the profile's, never loosens it; a bad one names its field.
    let looser =
        json!({ "profile": "agent", "name": "bob", "budget": { "tokens": 1_000_000_000_000_u64 } });
    structured_ok(&gw.rig.lead("fleet_spawn", &looser));
    let budget = gw.listed_usage("bob")["budget"].clone();
    assert_eq!(
        budget,
        json!(format!("0 of {} tokens", thousands(limit))),
        "bob's"
    );
    let bad = gw.rig.lead(
        "fleet_spawn",
        &json!({ "profile": "agent", "name": "cy", "budget": { "tokens": 9, "warnAt": 3 } }),
    );
    assert_eq!(error_code(&bad), "invalid_arguments", "{bad}");
    assert!(bad.to_string().contains("budget.warnAt"), "{bad}");
}

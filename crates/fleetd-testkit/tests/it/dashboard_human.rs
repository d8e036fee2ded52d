//! The human in the loop on the dashboard (issue 39, SPEC §20), in a real headless Chromium
//! against the built daemon on real tmux: a member blocked on a permission prompt comes first on
//! the page with its dialog and a button per choice; the webhook's notice links to it; one click
//! answers it, the card goes and the member finishes its task. A member's question reaches the
//! webhook too, and is answered from the page: the member's waiting `fleet_ask` returns it.
//! Screenshots go to `target/test-artifacts/` (`dashboard-blocked.png` is the README's).

use std::time::Duration;

use fleetd_testkit::browser::{Browser, artifact, require_chromium};
use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::webhook::{Answer, Webhook};
use fleetd_testkit::{Service, require_tmux, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(60);

/// The webhook's notices of `kind` about `target`.
fn notices(hook: &Webhook, kind: &str, target: &str) -> Vec<Value> {
    hook.received()
        .into_iter()
        .map(|r| r.body)
        .filter(|b| b["kind"] == kind && b["target"] == target)
        .collect()
}

#[test]
fn e2e_dashboard_answers_a_blocked_member_and_a_question_the_webhook_told_of() {
    if require_tmux() == Service::Skip || require_chromium() == Service::Skip {
        return;
    }
    let hook = Webhook::start(Answer::Ok);
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nnotify:\n  sinks:\n    - kind: webhook\n      url: {}\nprofiles:\n{}{}",
        hook.url(),
        sim_profile(
            "blocker",
            &[
                ("SIM_AGENT_SCRIPT", "permission"),
                ("SIM_AGENT_WORK_MS", "300")
            ]
        ),
        sim_profile(
            "curious",
            &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "200")]
        ),
    ));
    let operator = Endpoint::Unix(state_dir(rig.dir()).join("api.sock"));
    let browser = Browser::start(1360, 900).expect("headless Chromium");
    let link = http::request(&operator, "POST", "/dashboard/keys", None).expect("a key");
    browser
        .goto(link.json()["url"].as_str().expect("url"))
        .expect("open the link");
    browser.wait_for(
        "the live stream",
        PATIENCE,
        "return document.getElementById('conn').dataset.state === 'live';",
    );

    // bea blocks on her permission prompt: first on the page, with the dialog and its choices.
    rig.spawn("blocker", "bea");
    let ticket = rig.send_task("bea", "deploy the site");
    browser.wait_for(
        "bea's dialog on the page",
        PATIENCE,
        "const li = document.getElementById('blocked-bea'); return !!li && li.querySelectorAll('button.choice').length === 2;",
    );
    let card = browser
        .eval(
            "const li = document.getElementById('blocked-bea'); return { dialog: li.querySelector('pre.dialog').textContent, choices: [...li.querySelectorAll('button.choice')].map(b => b.textContent), first: document.querySelector('main > section:not([hidden])').id, status: document.querySelector('tr[data-target=\"bea\"] .status').textContent };",
            &[],
        )
        .expect("the card");
    assert!(
        card["dialog"]
            .as_str()
            .is_some_and(|d| d.contains("Do you want to proceed?")),
        "{card}"
    );
    assert_eq!(card["choices"], json!(["1. Yes", "2. No"]), "{card}");
    assert_eq!(
        card["first"], "blocked-panel",
        "blocked members come first: {card}"
    );
    assert_eq!(card["status"], "blocked", "{card}");

    // The webhook was told once, with a link that opens the page at bea.
    wait_until("the blocked notice", PATIENCE, || {
        !notices(&hook, "blocked", "bea").is_empty()
    });
    let notice = notices(&hook, "blocked", "bea").remove(0);
    let to_bea = notice["link"].as_str().expect("a link").to_owned();
    assert!(to_bea.ends_with("/#member=bea"), "{notice}");
    browser.goto(&to_bea).expect("open the notice's link");
    browser.wait_for(
        "bea's card in focus",
        PATIENCE,
        "const li = document.getElementById('blocked-bea'); return !!li && li.classList.contains('focus');",
    );
    browser
        .screenshot(&artifact("dashboard-blocked.png"))
        .expect("screenshot");

    // One click answers it: the card goes and bea finishes.
    browser
        .eval(
            "document.querySelector('#blocked-bea button[data-choice=\"1\"]').click(); return true;",
            &[],
        )
        .expect("click");
    browser.wait_for(
        "bea's card gone",
        PATIENCE,
        "return !document.getElementById('blocked-bea') && document.getElementById('blocked-panel').hidden;",
    );
    assert!(
        rig.reply_of(&ticket)
            .contains("sim-agent did: deploy the site")
    );
    browser.wait_for(
        "the approval in the event log",
        PATIENCE,
        "return [...document.querySelectorAll('#events li')].some(li => li.textContent.includes('typed 1 (Yes) into bea'));",
    );
    assert_eq!(
        notices(&hook, "blocked", "bea").len(),
        1,
        "one notice for the episode"
    );

    // eve's question reaches the webhook and is answered from the page; her fleet_ask returns it.
    rig.spawn("curious", "eve");
    let asked = rig.send_task("eve", "which region?");
    wait_until("the question notice", PATIENCE, || {
        !notices(&hook, "question", "eve").is_empty()
    });
    browser.wait_for(
        "eve's question card",
        PATIENCE,
        "return !!document.querySelector('#questions li textarea');",
    );
    browser
        .eval(
            "const li = document.querySelector('#questions li'); li.querySelector('textarea').value = 'eu-west'; li.querySelector('button[type=submit]').click(); return true;",
            &[],
        )
        .expect("answer");
    assert!(
        rig.reply_of(&asked).contains("eu-west"),
        "eve's fleet_ask returned the page's answer"
    );
}

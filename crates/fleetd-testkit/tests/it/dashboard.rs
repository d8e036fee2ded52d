//! The dashboard (SPEC §14) in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, over WebDriver), against the built daemon on real tmux with sim-agents: a
//! browser signed in with `fleetd dashboard`'s link sees a member appear, work and reply, answers
//! a member's question from the page (the member gets the answer), and a page from another
//! origin that tries the same is refused with nothing changed. Screenshots of the run go to
//! `target/test-artifacts/`.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::time::Duration;

use fleetd_testkit::browser::{Browser, artifact, require_chromium};
use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{Rig, sim_profile};
use fleetd_testkit::{Service, require_tmux, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(60);
const REPLY: &str = "the pebbles are counted";

/// A script returning the text of `selector`'s first match, or "".
fn text_of(selector: &str) -> String {
    format!(
        "const e = document.querySelector({}); return e ? e.textContent.trim() : '';",
        json!(selector)
    )
}

/// Serves `page` to every request on a port of its own: a web page of another origin than
/// fleetd's (another port of the same host is another origin, and the same site, so it is the
/// closest a page can get to fleetd's own).
fn serve_page(page: String) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    addr
}

fn open_questions(operator: &Endpoint) -> Vec<Value> {
    http::get(operator, "/questions")
        .expect("GET /questions")
        .json()["questions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn e2e_dashboard_in_a_real_browser_follows_the_fleet_and_answers_a_question() {
    if require_tmux() == Service::Skip || require_chromium() == Service::Skip {
        return;
    }
    let mut rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nprofiles:\n{}{}",
        sim_profile(
            "sim",
            &[("SIM_AGENT_WORK_MS", "2500"), ("SIM_AGENT_REPLY", REPLY)]
        ),
        sim_profile(
            "curious",
            &[("SIM_AGENT_SCRIPT", "ask"), ("SIM_AGENT_WORK_MS", "200")]
        ),
    ));
    let operator = Endpoint::Unix(state_dir(rig.dir()).join("api.sock"));
    let browser = Browser::start(1360, 1000).expect("headless Chromium");

    // Signed out, the page asks for a credential and shows no fleet data.
    let base = format!("http://{}", rig.daemon.addr);
    browser.goto(&format!("{base}/")).expect("open the page");
    browser.wait_for(
        "the sign-in form",
        PATIENCE,
        "return !document.getElementById('login').hidden",
    );
    browser
        .screenshot(&artifact("dashboard-signed-out.png"))
        .expect("screenshot");

    // `fleetd dashboard`'s link signs it in (POST /dashboard/keys on the operator's socket is
    // what the command asks).
    let link = http::request(&operator, "POST", "/dashboard/keys", None).expect("a key");
    assert_eq!(link.status, 200, "{}", link.body);
    let url = link.json()["url"].as_str().expect("url").to_owned();
    assert!(url.starts_with(&format!("{base}/#key=")), "{url}");
    browser.goto(&url).expect("open the link");
    browser.wait_for(
        "the live stream",
        PATIENCE,
        "return document.getElementById('conn').dataset.state === 'live' && !document.getElementById('app').hidden",
    );
    let address = browser
        .eval("return location.href;", &[])
        .expect("location");
    assert_eq!(
        address,
        json!(format!("{base}/")),
        "the key is out of the address bar"
    );

    // A member appears when spawned.
    rig.spawn("sim", "nia");
    browser.wait_for(
        "nia's row",
        PATIENCE,
        "return !!document.querySelector('tr[data-target=\"nia\"]');",
    );
    assert_eq!(
        browser
            .eval(&text_of("tr[data-target=\"nia\"] td:nth-child(3)"), &[])
            .expect("profile"),
        json!("sim")
    );

    // Its status changes when it works, and its reply is counted.
    rig.send_task("nia", "count the pebbles");
    browser.wait_for(
        "nia working",
        PATIENCE,
        "const e = document.querySelector('tr[data-target=\"nia\"] .status'); return e && e.textContent.trim() === 'working';",
    );
    browser
        .screenshot(&artifact("dashboard-working.png"))
        .expect("screenshot");
    browser.wait_for(
        "nia's reply counted",
        PATIENCE,
        "const e = document.querySelector('tr[data-target=\"nia\"] .inbox'); return e && e.textContent.trim() === '1';",
    );
    browser.wait_for(
        "the reply in the event log",
        PATIENCE,
        "return [...document.querySelectorAll('#events li')].some(li => li.textContent.includes('nia replied'));",
    );
    // The task's wait until it was typed is in the delivery chart of the last hour.
    browser.wait_for(
        "the delivery latency charted",
        PATIENCE,
        "return document.getElementById('stat-delivery').textContent.startsWith('1 samples');",
    );
    assert!(
        !browser
            .eval("return document.body.innerText;", &[])
            .expect("text")
            .as_str()
            .unwrap_or_default()
            .contains(REPLY),
        "no reply text on the page until someone opens the member"
    );

    // A question, answered from the page.
    rig.spawn("curious", "eve");
    let ticket = rig.send_task("eve", "deploy");
    let mut question = Value::Null;
    wait_until("eve's question", PATIENCE, || {
        question = open_questions(&operator)
            .into_iter()
            .next()
            .unwrap_or_default();
        !question.is_null()
    });
    let qid = question["questionId"].as_str().expect("id").to_owned();
    assert_eq!(question["target"], "eve");
    let card = format!("li[data-question=\"{qid}\"]");
    browser.wait_for(
        "the question's card with its text",
        PATIENCE,
        &format!(
            "const li = document.querySelector({}); return li && li.querySelector('.ask').textContent.includes('sim-agent asks about: deploy');",
            json!(card)
        ),
    );

    // First, a page of another origin tries to answer it (and to read the fleet) with the
    // browser's session cookie: refused, nothing changes.
    let evil = serve_page(format!(
        r#"<!doctype html><title>another site</title><script>
window.results = {{}};
const base = {base};
fetch(base + '/questions/{qid}/answer', {{ method: 'POST', mode: 'no-cors', credentials: 'include',
  headers: {{ 'Content-Type': 'text/plain' }}, body: JSON.stringify({{ answer: 'from another site' }}) }})
  .then(() => {{ window.results.post = 'sent'; }}, (e) => {{ window.results.post = 'failed: ' + e; }});
fetch(base + '/questions', {{ credentials: 'include' }})
  .then((r) => r.text()).then((t) => {{ window.results.read = t; }}, (e) => {{ window.results.read = 'failed: ' + e; }});
</script>"#,
        base = json!(base),
    ));
    browser
        .goto(&format!("http://{evil}/"))
        .expect("open the other site");
    let results = browser.wait_for(
        "the other site's requests to finish",
        PATIENCE,
        "const r = window.results; return r && r.post && r.read ? r : null;",
    );
    assert_eq!(results["post"], "sent", "the request left the browser");
    assert!(
        results["read"]
            .as_str()
            .is_some_and(|r| r.starts_with("failed")),
        "the other site read nothing: {results}"
    );
    rig.daemon
        .wait_for_log("fleetd's refusal of the other site", PATIENCE, |line| {
            line.contains("a request from another site was refused")
                && line.contains(&format!("/questions/{qid}/answer"))
        });
    assert_eq!(
        open_questions(&operator)
            .iter()
            .map(|q| q["questionId"].clone())
            .collect::<Vec<_>>(),
        vec![json!(qid)],
        "the question is still open"
    );

    // Back on fleetd's page (still signed in: the cookie), the answer box works.
    browser.goto(&format!("{base}/")).expect("back");
    browser.wait_for(
        "the card again",
        PATIENCE,
        &format!("return !!document.querySelector({});", json!(card)),
    );
    browser
        .screenshot(&artifact("dashboard-question.png"))
        .expect("screenshot");
    browser
        .eval(
            "const li = document.querySelector(arguments[0]); li.querySelector('textarea').value = 'use staging'; li.querySelector('button[type=submit]').click(); return true;",
            &[json!(card)],
        )
        .expect("answer from the page");
    browser.wait_for(
        "the card to close",
        PATIENCE,
        &format!("return !document.querySelector({});", json!(card)),
    );
    let reply = rig.reply_of(&ticket);
    assert!(
        reply.contains("use staging"),
        "eve got the page's answer: {reply}"
    );
    assert!(open_questions(&operator).is_empty());
    browser.wait_for(
        "the answer in the event log",
        PATIENCE,
        "return [...document.querySelectorAll('#events li')].some(li => li.textContent.includes('answered'));",
    );
    browser
        .screenshot(&artifact("dashboard-answered.png"))
        .expect("screenshot");

    // Ack and stop from the page: nia's details show its reply with an Ack button; acking
    // empties its inbox; Stop (asked twice) releases it.
    browser
        .eval(
            "document.querySelector('tr[data-target=\"nia\"]').click(); return true;",
            &[],
        )
        .expect("open nia's details");
    browser.wait_for(
        "nia's reply in its details",
        PATIENCE,
        "return !!document.querySelector('#detail [data-action=ack]');",
    );
    browser
        .eval(
            "document.querySelector('#detail [data-action=ack]').click(); return true;",
            &[],
        )
        .expect("ack");
    browser.wait_for(
        "nia's inbox empty",
        PATIENCE,
        "const e = document.querySelector('tr[data-target=\"nia\"] .inbox'); return e && e.textContent.trim() === '0';",
    );
    assert!(
        http::reply_texts(&operator, "nia").is_empty(),
        "the page's ack reached the inbox"
    );
    // Stop takes two clicks (the first arms the button). The ack above re-renders the details
    // when its answer comes, which can replace an armed button with a fresh one on a loaded
    // machine: click whatever button is there, enabled, until the row is gone.
    browser.wait_for(
        "nia's row gone",
        PATIENCE,
        "const b = document.querySelector('#detail [data-action=stop]'); \
         if (b && !b.disabled) b.click(); \
         return !document.querySelector('tr[data-target=\"nia\"]');",
    );
    let members = http::get(&operator, "/sessions").expect("sessions").json();
    assert!(
        members["members"]
            .as_array()
            .is_some_and(|m| m.iter().all(|m| m["target"] != "nia")),
        "{members}"
    );

    // On a phone's width, the page reflows instead of scrolling sideways (the members table
    // scrolls in its own box).
    browser.resize(390, 844).expect("resize");
    browser.wait_for(
        "no sideways scrolling at 390 px",
        PATIENCE,
        "return window.innerWidth <= 420 && document.documentElement.scrollWidth <= window.innerWidth;",
    );
    browser
        .screenshot(&artifact("dashboard-phone.png"))
        .expect("screenshot");
}

/// This machine's first non-loopback IPv4 address, if it has one.
fn outside_address() -> Option<std::net::IpAddr> {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|a| a.is_ipv4() && !a.is_loopback())
}

/// Listening beyond loopback (reached at this machine's own outside address), the page works
/// with the daemon's API token: signed out it shows nothing and the API asks for the token; the token
/// typed into the page's form signs the browser in, the stream goes live and a member spawned
/// meanwhile appears.
#[test]
fn e2e_dashboard_beyond_loopback_signs_in_with_the_api_token() {
    const TOKEN: &str = "dashboard-token-51c3a9";
    if require_tmux() == Service::Skip || require_chromium() == Service::Skip {
        return;
    }
    let Some(ip) = outside_address() else {
        assert!(
            fleetd_testkit::require(
                "a non-loopback address",
                false,
                "give the machine a network interface with an IPv4 address (hostname -I lists none)",
            ) == Service::Skip
        );
        return;
    };
    let secrets = tempfile::tempdir().expect("tempdir");
    let token_file = fleetd_testkit::secret_file(secrets.path(), "api-token", TOKEN);
    let rig = Rig::start_on(
        &format!(
            "apiToken: api\nsecrets:\n  api:\n    file: {}\nprofiles:\n{}",
            token_file.display(),
            sim_profile("sim", &[])
        ),
        // Every address: the browser comes from outside loopback, members from loopback.
        "0.0.0.0:0",
    );
    let operator = Endpoint::Unix(state_dir(rig.dir()).join("api.sock"));
    let addr = std::net::SocketAddr::new(ip, rig.daemon.addr.port());
    // No credential: the API refuses and names the token.
    let refused = http::get(addr, "/sessions").expect("answers");
    refused.assert_refused(401, "token_required", "no credential");

    let browser = Browser::start(1360, 1000).expect("headless Chromium");
    browser
        .goto(&format!("http://{addr}/"))
        .expect("open the page");
    browser.wait_for(
        "the sign-in form",
        PATIENCE,
        "return !document.getElementById('login').hidden && !!document.getElementById('token-form');",
    );
    // A wrong token is refused on the page, and the page stays signed out.
    let submit = |token: &str| {
        browser
            .eval(
                "document.getElementById('token').value = arguments[0]; document.getElementById('token-form').requestSubmit(); return true;",
                &[json!(token)],
            )
            .expect("submit the token form");
    };
    submit("not the token");
    browser.wait_for(
        "the refusal on the page",
        PATIENCE,
        "return document.getElementById('app').hidden && document.getElementById('login-error').textContent.includes('token');",
    );
    submit(TOKEN);
    browser.wait_for(
        "the live stream",
        PATIENCE,
        "return document.getElementById('conn').dataset.state === 'live' && !document.getElementById('app').hidden",
    );
    let spawned = http::request(
        &operator,
        "POST",
        "/mcp",
        Some(
            &json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": { "name": "fleet_spawn", "arguments": { "profile": "sim", "name": "nia" } } })
            .to_string(),
        ),
    )
    .expect("spawn");
    assert!(
        spawned.body.contains("\"isError\":false"),
        "{}",
        spawned.body
    );
    browser.wait_for(
        "nia's row",
        PATIENCE,
        "return !!document.querySelector('tr[data-target=\"nia\"]');",
    );
    browser
        .screenshot(&artifact("dashboard-beyond-loopback.png"))
        .expect("screenshot");
    // The token never shows in the page.
    let text = browser
        .eval("return document.documentElement.outerHTML;", &[])
        .expect("page");
    assert!(
        !text.to_string().contains(TOKEN),
        "the token is in the page"
    );
}

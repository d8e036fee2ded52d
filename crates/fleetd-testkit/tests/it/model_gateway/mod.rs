//! The model gateway end to end (SPEC §18): the built fleetd on a private tmux server, a real
//! `fake-model` as the backend, and members whose agent is a `sim-agent` that runs each line
//! typed into its pane as a shell command (`print`), so `model-call` typed there is the member's
//! agent asking its backend through fleetd. Each test shows what fleetd refused and that a
//! refusal changed nothing (the backend got no request, no usage was counted), and that what it
//! counted is exactly what the backend served: `fleet_list`, `/metrics` and the fake's own
//! `served` log agree.
//!
//! - `served`: the member's own requests, in each API and key header, reach the backend with
//!   the real credential and are counted exactly; its pane holds only its model key;
//! - `access`: the key from any other place (another member, the lead, no pane, another uid, a
//!   web page, after the member's release) is refused;
//! - `crash`: fleetd killed mid-stream: the member's request fails cleanly, nothing is counted
//!   for it, and after the restart the next request is counted once;
//! - `budget`: a budget stops the member with one incident to its lead; only the operator
//!   raises it.

mod access;
mod budget;
mod crash;
mod served;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fleetd_testkit::fake_model::FakeModel;
use fleetd_testkit::fake_model::served::Usage;
use fleetd_testkit::model_call::{self, Outcome};
use fleetd_testkit::rig::{Rig, structured_ok};
use fleetd_testkit::{bin_path, http, wait_until};
use prometheus_parse::{Scrape, Value as Metric};
use serde_json::{Value, json};

/// The backend's real credential: only fleetd may hold it.
const SECRET: &str = "sk-lab-real-credential-5e0c2b";

/// The prompt every `model-call` sends (its length shapes the fake's planned usage).
const PROMPT: &str = "@text model-call says hello";

/// How long one `model-call` may take, typed into a pane and answered.
const CALL_PATIENCE: Duration = Duration::from_secs(60);

/// A rig whose backend `lab` is a fake model served through fleetd.
struct Gateway {
    rig: Rig,
    fake: FakeModel,
    /// Keeps the fake's log and the secret file.
    _files: tempfile::TempDir,
    calls: AtomicUsize,
}

/// A rig with backend `lab` (the fake, started with `fake_args`, its credential [`SECRET`])
/// and profile `agent`: a `custom` member on `lab` that runs what is typed into its pane, with
/// `profile_extra` (YAML lines of the profile, indented four spaces) added. `None` without tmux
/// outside CI.
fn start(fake_args: &[&str], profile_extra: &str) -> Option<Gateway> {
    if fleetd_testkit::require_tmux() == fleetd_testkit::Service::Skip {
        return None;
    }
    let files = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start_with(files.path(), "lab", "unused", fake_args);
    let token = fleetd_testkit::secret_file(files.path(), "lab-token", SECRET);
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\n\
         backends:\n  lab:\n    baseUrl: {url}\n    authTokenSecret: lab-token\n    prices:\n      input: 3.0\n      output: 15.0\n      cacheRead: 0.3\n      cacheWrite: 3.75\n\
         secrets:\n  lab-token:\n    file: {token}\n\
         profiles:\n  agent:\n    agent: custom\n    command: {sim}\n    backend: lab\n    env:\n      SIM_AGENT_SCRIPT: print\n      SIM_AGENT_WORK_MS: \"0\"\n{profile_extra}",
        url = fake.url(),
        token = token.display(),
        sim = bin_path("sim-agent").display(),
    ));
    Some(Gateway {
        rig,
        fake,
        _files: files,
        calls: AtomicUsize::new(0),
    })
}

impl Gateway {
    /// Spawns member `name` of profile `agent`; its model key.
    fn member(&self, name: &str) -> String {
        self.rig.spawn("agent", name);
        self.key_of(name)
    }

    /// The model key fleetd gave member `name` (from its agent's environment).
    fn key_of(&self, name: &str) -> String {
        let env = fleetd_testkit::environ(self.rig.pane_pid(&format!("fleet:{name}")));
        let key = env
            .get("FLEETD_BACKEND_TOKEN")
            .cloned()
            .unwrap_or_else(|| panic!("{name} has no FLEETD_BACKEND_TOKEN: {env:?}"));
        assert!(key.starts_with("fleetd-mk-"), "{name}'s key: {key}");
        key
    }

    /// fleetd's URL for backend `lab`, as members are given it.
    fn url(&self) -> String {
        format!("http://{}/model/lab", self.rig.daemon.addr)
    }

    /// Where the next `model-call` writes its outcome (and its progress, `.progress`).
    fn next_out(&self) -> PathBuf {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        self.rig.dir().join(format!("model-call-{n}.json"))
    }

    /// Types `model-call ARGS --out FILE` into tmux target `pane` and waits for its outcome.
    fn call_in(&self, pane: &str, args: &str) -> Outcome {
        let out = self.next_out();
        self.start_in(pane, &format!("{args} --out {}", out.display()));
        self.outcome(&out, pane)
    }

    /// Types `model-call ARGS` into `pane` without waiting.
    fn start_in(&self, pane: &str, args: &str) {
        let line = format!(
            "{} --prompt '{PROMPT}' {args}",
            bin_path("model-call").display()
        );
        self.rig.type_line(pane, &line);
    }

    /// The outcome a `model-call` in `pane` writes to `out`, once it is there.
    fn outcome(&self, out: &std::path::Path, pane: &str) -> Outcome {
        let mut outcome = None;
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(&format!("model-call in {pane}"), CALL_PATIENCE, || {
                outcome = model_call::read(out);
                outcome.is_some()
            });
        }));
        if let Err(panic) = waited {
            eprintln!("---- {pane} ----\n{}", self.rig.history(pane));
            std::panic::resume_unwind(panic);
        }
        outcome.expect("read")
    }

    /// `model-call` from member `name`'s own pane, with its own URL and key (`args` more).
    fn call_as(&self, name: &str, args: &str) -> Outcome {
        self.call_in(&format!("fleet:{name}"), args)
    }

    /// What the fake served whole to requests presenting the real credential: every answer it
    /// served whole (none presented anything else), and each reported some usage, so a total
    /// of zero never passes for one counted right.
    fn served(&self) -> Usage {
        let whole: Vec<_> = self
            .fake
            .served()
            .into_iter()
            .filter(|l| l["served"] == true)
            .collect();
        for line in &whole {
            assert_eq!(
                line["key"], SECRET,
                "an answer served to another key: {line}"
            );
            assert!(
                line["usage"]["output"].as_u64() > Some(0),
                "no usage: {line}"
            );
        }
        self.fake.served_usage(SECRET)
    }

    /// How many requests reached the fake.
    fn requests(&self) -> usize {
        self.fake.requests().len()
    }

    /// Member `name`'s `usage` in `fleet_list` (null when it has none).
    fn listed_usage(&self, name: &str) -> Value {
        let listed = structured_ok(&self.rig.lead("fleet_list", &json!({})));
        listed["members"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["target"] == name)
            .map_or(Value::Null, |m| m["usage"].clone())
    }

    /// Asserts that `fleet_list` and `/metrics` count exactly `served` for member `name`.
    fn assert_counted(&self, name: &str, served: Usage) {
        self.assert_listed(name, served);
        self.assert_metered(name, served);
    }

    /// Asserts that `fleet_list` shows live member `name` spent exactly `served`.
    fn assert_listed(&self, name: &str, served: Usage) {
        let usage = self.listed_usage(name);
        assert_eq!(
            usage["tokens"],
            json!({
                "input": served.input, "output": served.output,
                "cacheRead": served.cache_read, "cacheWrite": served.cache_write,
            }),
            "fleet_list's usage of {name} is what the backend served: {usage}"
        );
        assert_eq!(usage["totalTokens"], total(served), "{usage}");
    }

    /// Asserts that `/metrics` counts exactly `served` for the name `name` (every member that
    /// had it, released ones included).
    fn assert_metered(&self, name: &str, served: Usage) {
        let metrics = scrape(&self.rig);
        for (kind, n) in [
            ("input", served.input),
            ("output", served.output),
            ("cache_read", served.cache_read),
            ("cache_write", served.cache_write),
        ] {
            let gauge = gauge(
                &metrics,
                "fleetd_model_tokens",
                &[("member", name), ("kind", kind)],
            );
            assert_eq!(
                gauge,
                Some(n as f64),
                "fleetd_model_tokens{{member={name},kind={kind}}}"
            );
        }
    }
}

/// `a` less `b`, kind by kind.
fn minus(a: Usage, b: Usage) -> Usage {
    Usage {
        input: a.input - b.input,
        output: a.output - b.output,
        cache_read: a.cache_read - b.cache_read,
        cache_write: a.cache_write - b.cache_write,
    }
}

/// Tokens of every kind together.
fn total(u: Usage) -> u64 {
    u.input + u.output + u.cache_read + u.cache_write
}

/// `/metrics`, parsed.
fn scrape(rig: &Rig) -> Scrape {
    let response = http::get(rig.daemon.operator(), "/metrics").expect("GET /metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    Scrape::parse(response.body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text")
}

/// The value of gauge `metric` with these labels, when it is there.
fn gauge(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .find(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .and_then(|s| match s.value {
            Metric::Gauge(v) | Metric::Untyped(v) => Some(v),
            _ => None,
        })
}

/// Asserts that `outcome` is a whole, successful streamed answer.
fn assert_served(outcome: &Outcome, what: &str) {
    assert_eq!(outcome.status, 200, "{what}: {outcome:?}");
    assert!(
        outcome.finished && outcome.events > 2 && outcome.trouble.is_none(),
        "{what}: {outcome:?}"
    );
}

/// Asserts that `outcome` is fleetd's refusal `code` with HTTP `status`.
fn assert_refused(outcome: &Outcome, status: u16, code: &str, what: &str) {
    assert_eq!(
        (outcome.status, outcome.error_code().as_str()),
        (status, code),
        "{what}: {outcome:?}"
    );
    assert_eq!(outcome.events, 0, "{what}: a refusal streams nothing");
}

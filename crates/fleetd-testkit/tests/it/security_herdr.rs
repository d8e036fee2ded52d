//! The security suite on herdr (fake-herdr, which spawns real processes on real PTYs and applies
//! per-pane env as herdr does: to the pane's process only, never stored or exported): backend
//! secrets reach only their member's process — never an argv, the lead, another member or
//! anything herdr's API answers; a pane a member opens in the members' workspace through herdr's
//! own API is nobody, and one it opens beside the lead's pane a stray (nobody too); a member's
//! `setsid -f` child is anonymous. Each attack leaves every inbox
//! as it was.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleetd_testkit::rig_herdr::HerdrRig;
use fleetd_testkit::{bin_path, environ, http, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);
const SECRET: &str = "sk-herdr-lab-0c4e77a1d95b";

/// A herdr rig with a lead agent, a backend whose token is [`SECRET`] handed to its members
/// themselves (`throughFleetd: false`, the path whose leaks this suite looks for), a `shell` member on it
/// (mallory), a plain replying member without a backend (alice) holding one unread reply.
fn rig() -> (HerdrRig, String, tempfile::TempDir) {
    let home = tempfile::tempdir().expect("tempdir");
    let secret_file = fleetd_testkit::secret_file(home.path(), "lab-token", SECRET);
    let shell = format!(
        "{}      SIM_AGENT_SCRIPT: shell\n    backend: lab\n",
        fleetd_testkit::rig_herdr::sim_profile("shell", 100)
    );
    let rig = HerdrRig::start(&format!(
        "primary:\n  tab: w1:t1\n  pushReminders: 0\nbackends:\n  lab:\n    baseUrl: http://127.0.0.1:9/v1\n    authTokenSecret: labtoken\n    throughFleetd: false\nsecrets:\n  labtoken:\n    file: {}\nprofiles:\n{shell}{}",
        secret_file.display(),
        fleetd_testkit::rig_herdr::sim_profile("plain", 100),
    ));
    let (_, lead) = rig.agent_lead("boss");
    (rig, lead, home)
}

/// Spawns `name` from `profile` through the lead and waits until the operator sees it.
fn spawn(rig: &HerdrRig, lead: &str, profile: &str, name: &str) -> Value {
    rig.call_from(
        lead,
        &format!(r#"fleet_spawn {{"profile":"{profile}","name":"{name}"}}"#),
    );
    let mut member = Value::Null;
    wait_until(&format!("{name} spawned"), PATIENCE, || {
        member = http::get(rig.daemon.operator(), &format!("/sessions/{name}"))
            .map(|r| r.json())
            .unwrap_or_default();
        member["connected"] == true
    });
    member
}

/// Has `member` run `line` with its shell tool (a task without waiting).
fn run_in(rig: &HerdrRig, lead: &str, member: &str, line: &str) {
    let args = json!({ "target": member, "task": line, "wait": false });
    rig.call_from(lead, &format!("fleet_send {args}"));
}

/// The replies pending in `target`'s inbox, as the operator reads them.
fn replies(rig: &HerdrRig, target: &str) -> Value {
    http::get(
        rig.daemon.operator(),
        &format!("/sessions/{target}/replies"),
    )
    .expect("replies")
    .json()["replies"]
        .clone()
}

/// The herdr pane of a member (`lead:w1:p3` → `w1:p3`).
fn pane_of(member: &Value) -> String {
    member["paneId"]
        .as_str()
        .and_then(|p| p.strip_prefix("lead:"))
        .expect("a pane id")
        .to_owned()
}

fn pid_of(rig: &HerdrRig, pane: &str) -> u32 {
    let info = rig.call("pane.process_info", &json!({ "pane_id": pane }));
    u32::try_from(info["process_info"]["shell_pid"].as_u64().expect("pid")).expect("fits")
}

/// The refusal code in an `mcp-call --print` / `--http` answer.
fn code(answer: &Value) -> String {
    answer["result"]["structuredContent"]["code"]
        .as_str()
        .or_else(|| answer["body"]["error"].as_str())
        .unwrap_or("none")
        .to_owned()
}

fn read_when_there(path: &Path, what: &str) -> String {
    wait_until(what, PATIENCE, || path.exists());
    std::fs::read_to_string(path).expect("read")
}

/// The answers an attack script wrote to `out` (once it is there): the text, and each line's
/// [`code`].
fn codes_in(out: &Path, what: &str) -> (String, Vec<String>) {
    let text = read_when_there(out, what);
    let codes = text
        .lines()
        .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
        .collect();
    (text, codes)
}

/// mallory splits pane `target` (`$HERDR_PANE_ID`: its own) through herdr's API, towards
/// `direction`; the pane that opened.
fn mallory_splits(rig: &HerdrRig, lead: &str, target: &str, direction: &str, what: &str) -> String {
    let m = bin_path("mcp-call").display().to_string();
    let panes_before: BTreeSet<String> = pane_ids(rig);
    run_in(
        rig,
        lead,
        "mallory",
        &format!(
            r#"{m} --herdr "{{\"id\":\"1\",\"method\":\"pane.split\",\"params\":{{\"target_pane_id\":\"{target}\",\"direction\":\"{direction}\",\"focus\":false,\"env\":{{}}}}}}""#
        ),
    );
    let mut opened = String::new();
    wait_until(what, PATIENCE, || {
        opened = pane_ids(rig)
            .difference(&panes_before)
            .next()
            .cloned()
            .unwrap_or_default();
        !opened.is_empty()
    });
    opened
}

#[test]
fn e2e_herdr_security_backend_secrets_reach_only_their_member() {
    let (rig, lead, _home) = rig();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let watcher = std::thread::spawn(move || {
        let mut seen = Vec::new();
        while !flag.load(Ordering::Relaxed) {
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                if let Ok(bytes) = std::fs::read(entry.path().join("cmdline"))
                    && bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes())
                {
                    seen.push(String::from_utf8_lossy(&bytes).replace('\0', " "));
                }
            }
        }
        seen
    });
    // The watcher's own check: an argv that carries the secret is seen.
    std::process::Command::new("sh")
        .args(["-c", "sleep 0.5", "control", SECRET])
        .status()
        .expect("sh runs");
    let mallory = spawn(&rig, &lead, "shell", "mallory");
    let alice = spawn(&rig, &lead, "plain", "alice");
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().expect("watcher");
    let (control, leaks): (Vec<_>, Vec<_>) = seen
        .into_iter()
        .partition(|s| s.contains("sleep 0.5 control"));
    assert!(!control.is_empty(), "the watcher sees argv at all");
    assert!(leaks.is_empty(), "the secret was on an argv: {leaks:#?}");

    let env = environ(pid_of(&rig, &pane_of(&mallory)));
    assert_eq!(
        env.get("FLEETD_BACKEND_TOKEN").map(String::as_str),
        Some(SECRET)
    );
    for (who, pane) in [("alice", pane_of(&alice)), ("the lead", lead.clone())] {
        let env = environ(pid_of(&rig, &pane));
        assert!(
            !env.values().any(|v| v.contains(SECRET)),
            "{who} has it: {:?}",
            env.keys().collect::<BTreeSet<_>>()
        );
    }
    // Nothing herdr answers a lead carries it.
    for (method, params) in [
        ("session.snapshot", json!({})),
        ("pane.list", json!({})),
        ("pane.get", json!({ "pane_id": pane_of(&mallory) })),
        ("pane.process_info", json!({ "pane_id": pane_of(&mallory) })),
        ("layout.export", json!({ "pane_id": pane_of(&mallory) })),
    ] {
        let answer = rig.herdr.call(method, &params).expect("herdr answers");
        assert!(!answer.to_string().contains(SECRET), "{method}: {answer}");
    }
    // A reply that quotes the token reaches the lead redacted.
    run_in(&rig, &lead, "mallory", "echo \"$FLEETD_BACKEND_TOKEN\"");
    wait_until("mallory's reply", PATIENCE, || {
        replies(&rig, "mallory")
            .as_array()
            .is_some_and(|r| !r.is_empty())
    });
    let stored = replies(&rig, "mallory").to_string();
    assert!(stored.contains("[redacted: labtoken]"), "{stored}");
    assert!(!stored.contains(SECRET), "{stored}");
}

#[test]
fn e2e_herdr_security_a_pane_a_member_opens_is_nobody_and_its_escaped_child_anonymous() {
    let (rig, lead, _home) = rig();
    let mallory = spawn(&rig, &lead, "shell", "mallory");
    spawn(&rig, &lead, "plain", "alice");
    run_in(&rig, &lead, "alice", "the report");
    wait_until("alice's reply", PATIENCE, || {
        replies(&rig, "alice")
            .as_array()
            .is_some_and(|r| r.len() == 1)
    });
    let before = (replies(&rig, "alice"), replies(&rig, "mallory"));
    let id = before.0[0]["msgId"].as_str().expect("msgId").to_owned();
    let m = bin_path("mcp-call").display().to_string();
    let attack = |name: &str| {
        let out = rig.dir().join(format!("{name}.out"));
        let script = rig.dir().join(format!("{name}.sh"));
        std::fs::write(
            &script,
            format!(
                "sleep 0.3\nexport FLEETD_URL=http://{addr}\n\
                 {{ {m} --print fleet_list '{{}}'\n\
                 {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
                 {m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{id}\"}}'\n\
                 {m} --print fleet_reply '{{\"text\":\"forged\"}}'\n\
                 {m} --http POST /sessions/alice/replies/drain\n\
                 }} > {out}.tmp; mv {out}.tmp {out}\n",
                addr = rig.daemon.addr,
                out = out.display(),
            ),
        )
        .expect("write script");
        (script, out)
    };

    // mallory opens a pane in its own workspace through herdr's API (its environment names
    // the socket and its pane), and something runs in it.
    let opened = mallory_splits(
        &rig,
        &lead,
        "$HERDR_PANE_ID",
        "right",
        "the pane mallory opened",
    );
    let split = rig.call("pane.get", &json!({ "pane_id": opened }));
    assert_eq!(
        split["pane"]["workspace_id"],
        rig.call("pane.get", &json!({ "pane_id": pane_of(&mallory) }))["pane"]["workspace_id"],
        "in the members' workspace"
    );
    let (script, out) = attack("split");
    rig.type_line(&opened, &format!("sh {}", script.display()));
    let (text, codes) = codes_in(&out, "the opened pane's calls");
    assert_eq!(codes, vec!["unregistered_pane"; 5], "{text}");

    // mallory splits the lead's own pane through herdr's API (review H1): outside the members'
    // workspace, in the primary tab beside the live lead, opened while members ran — a stray.
    let beside_lead = mallory_splits(
        &rig,
        &lead,
        &lead,
        "down",
        "the pane mallory opened beside the lead",
    );
    let (script, out) = attack("beside-lead");
    rig.type_line(&beside_lead, &format!("sh {}", script.display()));
    let (text, codes) = codes_in(&out, "the calls from beside the lead");
    assert_eq!(codes, vec!["stray_pane"; 5], "{text}");

    // A `setsid -f` child of mallory: out of its pane's tree, so anonymous.
    let (script, out) = attack("escaped");
    run_in(
        &rig,
        &lead,
        "mallory",
        &format!("setsid -f sh {}", script.display()),
    );
    let (text, codes) = codes_in(&out, "the escaped child's calls");
    assert_eq!(
        codes,
        [
            "none", // fleet_list: names only, open to anyone
            "anonymous_caller",
            "anonymous_caller",
            "anonymous_caller",
            "anonymous_caller"
        ],
        "{text}"
    );
    assert_eq!(replies(&rig, "alice"), before.0, "alice's inbox untouched");
    wait_until("mallory's own replies to settle", PATIENCE, || {
        replies(&rig, "mallory")
            .as_array()
            .is_some_and(|r| r.len() == 3)
    });
    assert!(
        !replies(&rig, "mallory").to_string().contains("forged"),
        "nothing stored in mallory's name"
    );
}

/// Every pane id herdr lists.
fn pane_ids(rig: &HerdrRig) -> BTreeSet<String> {
    rig.call("pane.list", &json!({}))["panes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["pane_id"].as_str().map(str::to_owned))
        .collect()
}

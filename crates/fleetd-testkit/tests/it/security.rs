//! The security suite (tmux): every door tried the way an attacker on the same machine would —
//! an anonymous process, a member's agent and its children (a pane it splits, a window it
//! opens, a `setsid` child, an orphan left after `fleet_stop`), a process of another uid, a web
//! page (a rebinding `Host`, a cross-site `Origin`) — each refused, with nothing changed in any
//! inbox; backend secrets checked in every place a lead could look (`/proc/*/cmdline` during a
//! spawn, `tmux show-environment`, the lead's own environment, texts that reach it); state file
//! modes. The built binary, real tmux on a private socket, real HTTP.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleetd_testkit::daemon::{Daemon, state_dir};
use fleetd_testkit::rig::{LEAD, Rig, error_code, sim_profile, structured_ok};
use fleetd_testkit::{Service, bin_path, environ, http, require, require_tmux, wait_until};
use serde_json::{Value, json};

const PATIENCE: Duration = Duration::from_secs(90);
const TOKEN: &str = "fleet-api-token-7d1c0e";

/// A rig with a shell lead, an API token, a replying member `alice` holding one unread reply,
/// and a `shell` member `mallory` that runs whatever task it is given as a shell command line
/// (an agent with a shell tool).
pub(crate) fn rig_with_mail(extra_profiles: &str) -> Option<(Rig, String)> {
    if require_tmux() == Service::Skip {
        return None;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let token_file = home.path().join("api-token");
    std::fs::write(&token_file, TOKEN).expect("write token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\napiToken: api\nsecrets:\n  api:\n    file: {}\nprofiles:\n{}{}{}",
        token_file.display(),
        sim_profile("sim", &[("SIM_AGENT_WORK_MS", "200")]),
        sim_profile(
            "shell",
            &[("SIM_AGENT_SCRIPT", "shell"), ("SIM_AGENT_WORK_MS", "100")]
        ),
        extra_profiles,
    ));
    // The token file lives beside the rig's own files for the rig's life.
    std::mem::forget(home);
    rig.spawn("sim", "alice");
    rig.spawn("shell", "mallory");
    structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "alice", "task": "the report", "wait": false }),
    ));
    let mut id = String::new();
    wait_until("alice's reply in her inbox", PATIENCE, || {
        let inbox = http::get(rig.daemon.operator(), "/sessions/alice/replies")
            .map(|r| r.json())
            .unwrap_or_default();
        id = inbox["replies"][0]["msgId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        !id.is_empty()
    });
    Some((rig, id))
}

/// What the operator sees of alice, the member every attack aims at: her pending replies, her
/// tickets and queue. (The attacking member's own inbox changes legitimately: the lead's tasks
/// to it are answered there.) Compared before and after an attack: nothing may change.
pub(crate) fn fleet_state(rig: &Rig) -> Value {
    let replies = http::get(rig.daemon.operator(), "/sessions/alice/replies")
        .expect("replies")
        .json()["replies"]
        .clone();
    let alice = http::get(rig.daemon.operator(), "/sessions/alice")
        .expect("session")
        .json();
    json!({
        "alice": replies,
        "alice's tickets": [alice["tickets"], alice["queued"]],
    })
}

/// Runs `line` in `member`'s shell (a `shell` sim-agent) through the lead's `fleet_send` and
/// returns each line it printed after the `exit N` line, parsed as JSON where it is JSON.
pub(crate) fn run_in(rig: &Rig, member: &str, line: &str) -> Vec<Value> {
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": member, "task": line, "timeoutSecs": 90 }),
    ));
    let reply = sent["reply"].as_str().unwrap_or_default().to_owned();
    assert!(reply.starts_with("exit "), "{member} ran it: {sent}");
    reply
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| json!(l)))
        .collect()
}

/// The refusal code in an `mcp-call --print` answer or an `--http` answer.
pub(crate) fn code(answer: &Value) -> String {
    let tool = &answer["result"]["structuredContent"]["code"];
    let rest = &answer["body"]["error"];
    tool.as_str()
        .or_else(|| rest.as_str())
        .unwrap_or("none")
        .to_owned()
}

pub(crate) fn mcp_call() -> String {
    bin_path("mcp-call").display().to_string()
}

/// Waits for `path` and returns its text.
pub(crate) fn read_when_there(path: &Path, what: &str) -> String {
    wait_until(what, PATIENCE, || path.exists());
    std::fs::read_to_string(path).expect("read")
}

#[test]
fn e2e_security_rest_and_mcp_follow_one_policy_for_anonymous_callers_and_web_pages() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    let addr = rig.daemon.addr;
    let bearer = format!("Bearer {TOKEN}");
    let host = addr.to_string();
    // This test process is in no pane: anonymous over TCP. It may list, and nothing more.
    let listed = http::get(addr, "/sessions").expect("sessions");
    assert_eq!(listed.status, 200);
    assert!(
        !listed.body.contains("the report"),
        "names only: {}",
        listed.body
    );
    assert_eq!(http::get(addr, "/metrics").expect("metrics").status, 200);
    let task = r#"{"task":"forged","wait":false}"#;
    let ack = format!("/sessions/alice/replies/{id}/ack");
    let attempts: [(&str, &str, Option<&str>); 8] = [
        ("GET", "/sessions/alice", None),
        // The event stream shows the whole fleet: leads and the operator only.
        ("GET", "/events", None),
        ("GET", "/events/latency", None),
        ("GET", "/sessions/alice/replies", None),
        ("POST", "/sessions/alice/replies/drain", None),
        ("POST", &ack, None),
        ("POST", "/sessions/alice/tasks", Some(task)),
        ("POST", "/sessions/mallory/tasks", Some(task)),
    ];
    for (method, path, body) in attempts {
        let answer = http::request(addr, method, path, body).expect("answers");
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "anonymous_caller"),
            "anonymous {method} {path}: {}",
            answer.body
        );
    }
    // The old destructive GET drains nothing.
    let answer = http::get(addr, "/sessions/alice/replies?drain=true").expect("answers");
    assert_eq!(answer.status, 400, "{}", answer.body);
    // The MCP door answers the same.
    for (tool, args) in [
        ("fleet_poll", json!({ "target": "alice" })),
        ("fleet_status", json!({ "target": "alice" })),
        ("fleet_ack", json!({ "target": "alice", "msgId": id })),
        ("fleet_send", json!({ "target": "alice", "task": "forged" })),
        ("fleet_stop", json!({ "target": "alice" })),
        ("fleet_reply", json!({ "text": "forged" })),
    ] {
        let answer = mcp_tcp(addr, &[], tool, &args);
        assert_eq!(
            answer.status, 200,
            "{tool}: a tool error, not a transport one"
        );
        assert_eq!(
            error_code(&answer.json()["result"]),
            "anonymous_caller",
            "anonymous {tool}"
        );
    }
    // A wrong token is refused outright; the right one makes the operator (reads work).
    let wrong = http::request_with(
        addr,
        "GET",
        "/sessions/alice/replies",
        &[("Authorization", "Bearer wrong")],
        None,
    )
    .expect("answers");
    assert_eq!(
        (wrong.status, wrong.error_code().as_str()),
        (401, "bad_token")
    );
    let with_token = http::request_with(
        addr,
        "GET",
        "/sessions/alice/replies",
        &[("Authorization", &bearer)],
        None,
    )
    .expect("answers");
    assert_eq!(with_token.status, 200, "{}", with_token.body);
    // A web page. DNS rebinding: the browser sends the attacker's name as Host — refused on
    // every route, even with the token (a page never has it, but the rule must not depend on
    // that).
    let evil = format!("evil.example:{}", addr.port());
    for (method, path) in [
        ("GET", "/sessions/alice/replies"),
        ("GET", "/healthz"),
        ("POST", "/mcp"),
        ("POST", ack.as_str()),
    ] {
        let answer = http::request_with(
            addr,
            method,
            path,
            &[("Host", &evil), ("Authorization", &bearer)],
            Some("{}"),
        )
        .expect("answers");
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "foreign_host"),
            "rebinding {method} {path}: {}",
            answer.body
        );
    }
    // A cross-site request: the right Host, another site's Origin.
    let origin = [
        ("Origin", "http://evil.example"),
        ("Authorization", bearer.as_str()),
        ("Host", host.as_str()),
    ];
    for (path, body) in [
        ("/sessions/alice/tasks", task),
        (ack.as_str(), ""),
        ("/sessions/alice/replies/drain", ""),
    ] {
        let answer = http::request_with(addr, "POST", path, &origin, Some(body)).expect("answers");
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "foreign_origin"),
            "cross-site POST {path}: {}",
            answer.body
        );
    }
    let answer = mcp_tcp(
        addr,
        &origin,
        "fleet_ack",
        &json!({ "target": "alice", "msgId": id }),
    );
    assert_eq!(
        (answer.status, answer.error_code().as_str()),
        (403, "foreign_origin")
    );
    // Another site's `EventSource`: refused before any event, even with the token.
    for path in ["/events", "/events/latency"] {
        let answer = http::request_with(addr, "GET", path, &origin, None).expect("answers");
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "foreign_origin"),
            "cross-site GET {path}: {}",
            answer.body
        );
    }
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
}

/// A JSON-RPC `tools/call` over TCP from this process, with extra `headers`.
fn mcp_tcp(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
    tool: &str,
    args: &Value,
) -> http::Response {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": tool, "arguments": args } });
    http::request_with(addr, "POST", "/mcp", headers, Some(&body.to_string())).expect("answers")
}

#[test]
fn e2e_security_a_member_can_use_no_lead_door() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    // mallory's agent runs these with its shell tool: its FLEETD_URL, its own process.
    let m = mcp_call();
    let line = [
        format!("{m} --print fleet_poll '{{\"target\":\"alice\"}}'"),
        format!("{m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{id}\"}}'"),
        format!("{m} --print fleet_send '{{\"target\":\"alice\",\"task\":\"forged\"}}'"),
        format!("{m} --print fleet_stop '{{\"target\":\"alice\"}}'"),
        format!("{m} --http GET /sessions/alice/replies"),
        format!("{m} --http POST /sessions/alice/replies/drain"),
        format!("{m} --http POST /sessions/alice/replies/{id}/ack"),
        format!("{m} --http POST /sessions/alice/tasks '{{\"task\":\"forged\"}}'"),
        format!("{m} --http GET /events"),
        format!("{m} --http GET /events/latency"),
        format!("{} inbox alice", bin_path("fleetd").display()),
    ]
    .join(" ; ");
    let answers = run_in(&rig, "mallory", &line);
    let codes: Vec<String> = answers.iter().take(10).map(code).collect();
    assert_eq!(codes, vec!["not_a_lead"; 10], "{answers:#?}");
    let cli = answers
        .iter()
        .skip(10)
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(cli.contains("not_a_lead"), "the CLI from a member: {cli}");
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
}

#[test]
fn e2e_security_panes_a_member_opens_are_nobody() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    // The attack a pane opened by the member runs: everything a lead may do.
    let attack = |name: &str| {
        let out = rig.dir().join(format!("{name}.out"));
        let script = rig.dir().join(format!("{name}.sh"));
        let m = mcp_call();
        std::fs::write(
            &script,
            format!(
                "export FLEETD_URL=http://{addr}\n\
                 {{ {m} --print fleet_list '{{}}'\n\
                 {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
                 {m} --print fleet_ack '{{\"target\":\"alice\",\"msgId\":\"{id}\"}}'\n\
                 {m} --print fleet_send '{{\"target\":\"alice\",\"task\":\"forged\"}}'\n\
                 {m} --print fleet_reply '{{\"text\":\"forged\"}}'\n\
                 {m} --http GET /sessions/alice/replies\n\
                 {m} --http POST /sessions/alice/replies/{id}/ack\n\
                 }} > {out}.tmp; mv {out}.tmp {out}\n",
                addr = rig.daemon.addr,
                out = out.display(),
            ),
        )
        .expect("write script");
        (script, out)
    };
    // A split of the member's own window (its environment has TMUX), and a new window in its
    // session: both in the members' workspace, both no member.
    let (split, split_out) = attack("split");
    let (window, window_out) = attack("window");
    run_in(
        &rig,
        "mallory",
        &format!(
            "tmux split-window -d 'sh {}' ; tmux new-window -d 'sh {}'",
            split.display(),
            window.display()
        ),
    );
    for (out, how) in [(split_out, "split-window"), (window_out, "new-window")] {
        let text = read_when_there(&out, how);
        let codes: Vec<String> = text
            .lines()
            .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
            .collect();
        assert_eq!(codes, vec!["unregistered_pane"; 7], "{how}: {text}");
    }
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
}

#[test]
fn e2e_security_member_children_outside_its_pane_are_anonymous() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    let m = mcp_call();
    let operator = state_dir(rig.dir()).join("api.sock");
    // A child that stays in the member's process tree is the member, even in its own session.
    let kept = rig.dir().join("kept.out");
    run_in(
        &rig,
        "mallory",
        &format!(
            "setsid sh -c \"{m} --print fleet_poll '{{\\\"target\\\":\\\"alice\\\"}}' > {k}.tmp; mv {k}.tmp {k}\"",
            k = kept.display()
        ),
    );
    let kept = read_when_there(&kept, "the setsid child in the tree");
    assert_eq!(
        code(&serde_json::from_str(&kept).expect("JSON")),
        "not_a_lead",
        "still the member: {kept}"
    );
    // `setsid -f`: re-parented out of the pane's tree. Over TCP, and on the operator's socket
    // (it is the daemon's own user), it is anonymous: never more than the member it came from.
    let out = rig.dir().join("escaped.out");
    let script = rig.dir().join("escaped.sh");
    // It waits a moment first, so `setsid -f`'s own process (its parent for an instant) is
    // surely gone.
    std::fs::write(
        &script,
        format!(
            "sleep 0.3\n{{ {m} --print fleet_poll '{{\"target\":\"alice\"}}'\n\
             {m} --print fleet_reply '{{\"text\":\"forged\"}}'\n\
             {m} --http POST /sessions/alice/replies/{id}/ack\n\
             {fleetd} ack alice {id} --daemon unix:{sock} 2>&1\n\
             }} > {out}.tmp; mv {out}.tmp {out}\n",
            fleetd = bin_path("fleetd").display(),
            sock = operator.display(),
            out = out.display(),
        ),
    )
    .expect("script");
    run_in(
        &rig,
        "mallory",
        &format!("setsid -f sh {}", script.display()),
    );
    let text = read_when_there(&out, "the escaped child's calls");
    let lines: Vec<&str> = text.lines().collect();
    let codes: Vec<String> = lines
        .iter()
        .take(3)
        .map(|l| code(&serde_json::from_str(l).expect("JSON line")))
        .collect();
    assert_eq!(codes, vec!["anonymous_caller"; 3], "{text}");
    assert!(
        lines[3..].join("\n").contains("anonymous_caller"),
        "the operator's socket: {text}"
    );

    // A child that survives `fleet_stop` (it ignores the hangup), holding the keep-alive
    // connection it opened as the member: once the pane is gone, the same connection is no
    // longer the member's. It runs in the foreground of mallory's shell tool, so it is in the
    // pane's process tree for its first call.
    let gate = rig.dir().join("gate");
    let out = rig.dir().join("orphan.out");
    structured_ok(&rig.lead(
        "fleet_send",
        &json!({
            "target": "mallory",
            "wait": false,
            "task": format!(
                "nohup {m} --keepalive {gate} {out} fleet_poll '{{\"target\":\"alice\"}}' fleet_reply '{{\"text\":\"forged after stop\"}}' >/dev/null 2>&1",
                gate = gate.display(),
                out = out.display()
            ),
        }),
    ));
    let first = read_when_there(&out.with_extension("out.first"), "the orphan's first call");
    let first: Value = serde_json::from_str(&first).expect("JSON");
    assert_eq!(
        code(&first["first"]),
        "not_a_lead",
        "a member then: {first}"
    );
    structured_ok(&rig.lead(
        "fleet_stop",
        &json!({ "target": "mallory", "cause": "test" }),
    ));
    wait_until("mallory released", PATIENCE, || {
        http::get(rig.daemon.operator(), "/sessions/mallory").is_ok_and(|r| r.status == 404)
    });
    std::fs::write(&gate, "").expect("gate");
    let done: Value =
        serde_json::from_str(&read_when_there(&out, "the orphan's second call")).expect("JSON");
    assert_eq!(done["ports"][0], done["ports"][1], "one connection: {done}");
    // Anonymous (it left the pane's tree) or nobody (its cached pane is no member's any more):
    // either way refused.
    let second = code(&done["second"]);
    assert!(
        ["anonymous_caller", "unregistered_pane"].contains(&second.as_str()),
        "{done}"
    );
    let after = fleet_state(&rig);
    assert_eq!(after["alice"], before["alice"], "alice's inbox untouched");
    assert_eq!(after["alice's tickets"], before["alice's tickets"]);
    let leftover = http::reply_texts(rig.daemon.operator(), "mallory");
    assert!(
        !leftover.iter().any(|t| t.contains("forged")),
        "nothing stored in mallory's name: {leftover:?}"
    );
}

/// Runs a command as uid/gid 65534 (nobody) with `setpriv`; `None` when this process is not
/// root (then the test is skipped, or fails under CI).
pub(crate) fn as_nobody(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<std::process::Output> {
    let root = rustix::process::geteuid().is_root();
    if require(
        "root (to run a process as another uid with setpriv)",
        root,
        "Run the suite as root, as CI does (.ci/run).",
    ) == Service::Skip
    {
        return None;
    }
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
        program,
    ])
    .args(args)
    .env_clear()
    .env("PATH", "/usr/bin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Some(cmd.output().expect("setpriv runs"))
}

#[test]
fn e2e_security_another_uid_is_anonymous_unless_it_has_the_token() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    let url = format!("http://{}", rig.daemon.addr);
    // The other user runs copies in a directory it can reach (the checkout may be in a home
    // directory it cannot enter).
    let reachable = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(reachable.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let copy = |name: &str| {
        let to = reachable.path().join(name);
        std::fs::copy(bin_path(name), &to).expect("copy");
        to.display().to_string()
    };
    let m = copy("mcp-call");
    let fleetd = copy("fleetd");
    let run = |args: &[&str]| -> Option<Value> {
        let out = as_nobody(&m, args, &[("FLEETD_URL", &url)])?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        Some(
            serde_json::from_str(text.trim())
                .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr))),
        )
    };
    let ack = format!("/sessions/alice/replies/{id}/ack");
    let Some(listed) = run(&["--http", "GET", "/sessions"]) else {
        return;
    };
    assert_eq!(listed["status"], 200, "{listed}");
    for args in [
        vec!["--http", "GET", "/events"],
        vec!["--http", "GET", "/events/latency"],
        vec!["--http", "GET", "/sessions/alice/replies"],
        vec!["--http", "POST", "/sessions/alice/replies/drain"],
        vec!["--http", "POST", ack.as_str()],
        vec!["--print", "fleet_poll", r#"{"target":"alice"}"#],
        vec![
            "--print",
            "fleet_send",
            r#"{"target":"alice","task":"forged"}"#,
        ],
    ] {
        let answer = run(&args).expect("ran");
        assert_eq!(code(&answer), "anonymous_caller", "{args:?}: {answer}");
    }
    // The token makes any client the operator.
    let bearer = format!("Authorization:Bearer {TOKEN}");
    let answer = run(&[
        "--http",
        "--header",
        &bearer,
        "GET",
        "/sessions/alice/replies",
    ])
    .expect("ran");
    assert_eq!(answer["status"], 200, "{answer}");
    // The operator's socket is the daemon user's alone: another uid cannot even connect.
    let sock = state_dir(rig.dir()).join("api.sock");
    let out = as_nobody(
        &fleetd,
        &[
            "ack",
            "alice",
            &id,
            "--daemon",
            &format!("unix:{}", sock.display()),
        ],
        &[],
    )
    .expect("ran");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ermission denied"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Another uid inside the lead's own pane is still another uid: anonymous, never the lead.
    let result = rig.dir().join("lead-pane-nobody.out");
    rig.type_line(
        LEAD,
        &format!(
            "setpriv --reuid=65534 --regid=65534 --clear-groups {m} --print fleet_poll '{{\"target\":\"alice\"}}' > {r}.tmp; mv {r}.tmp {r}",
            r = result.display()
        ),
    );
    let text = read_when_there(&result, "the other uid's call from the lead pane");
    assert_eq!(
        code(&serde_json::from_str(text.trim()).expect("JSON")),
        "anonymous_caller",
        "{text}"
    );
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
}

/// Scans every process's command line until stopped, collecting any that contains `needle`.
fn cmdline_watch(
    needle: &str,
) -> (
    Arc<AtomicBool>,
    std::thread::JoinHandle<(usize, Vec<String>)>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let needle = needle.as_bytes().to_vec();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut rounds = 0;
        while !flag.load(Ordering::Relaxed) {
            rounds += 1;
            for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let path = entry.path().join("cmdline");
                if let Ok(bytes) = std::fs::read(&path)
                    && bytes.windows(needle.len()).any(|w| w == needle.as_slice())
                {
                    seen.push(format!(
                        "{}: {}",
                        path.display(),
                        String::from_utf8_lossy(&bytes).replace('\0', " ")
                    ));
                }
            }
        }
        (rounds, seen)
    });
    (stop, handle)
}

/// The pid of the process in a tmux pane.
fn pane_pid(rig: &Rig, target: &str) -> u32 {
    let out = rig
        .tmux
        .run(&["display-message", "-p", "-t", target, "#{pane_pid}"])
        .expect("tmux");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a pid")
}

#[test]
fn e2e_security_backend_secrets_reach_only_their_members() {
    if require_tmux() == Service::Skip {
        return;
    }
    let secret = "sk-lab-5e3f9a1c2b7d4e60";
    let home = tempfile::tempdir().expect("tempdir");
    let secret_file = home.path().join("lab-token");
    std::fs::write(&secret_file, secret).expect("write");
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let with_backend = |name: &str, script: &str, work_ms: &str| {
        format!(
            "{}    backend: lab\n",
            sim_profile(
                name,
                &[("SIM_AGENT_SCRIPT", script), ("SIM_AGENT_WORK_MS", work_ms)]
            )
        )
    };
    let rig = Rig::start(&format!(
        "primary:\n  tab: base:lead\n  pushReminders: 0\nbackends:\n  lab:\n    baseUrl: http://127.0.0.1:9/v1\n    authTokenSecret: labtoken\nsecrets:\n  labtoken:\n    file: {}\nprofiles:\n{}{}{}",
        secret_file.display(),
        with_backend("shell", "shell", "100"),
        // Turns long enough for tmux's status poll to see the member working, then idle.
        with_backend("leaky", "print", "1500"),
        sim_profile("plain", &[("SIM_AGENT_WORK_MS", "100")]),
    ));
    // Every process's argv is watched from before the first spawn (the one that creates the
    // members' tmux session) to after the last.
    let (stop, watcher) = cmdline_watch(secret);
    // The watcher's own check: a process that does carry the secret on its argv is seen.
    let control = std::process::Command::new("sh")
        .args(["-c", "sleep 0.5", "control", secret])
        .status()
        .expect("sh runs");
    assert!(control.success());
    let mallory = rig.spawn("shell", "mallory");
    rig.spawn("leaky", "lee");
    let pat = rig.spawn("plain", "pat");
    stop.store(true, Ordering::Relaxed);
    let (rounds, seen) = watcher.join().expect("watcher");
    assert!(rounds > 5, "the watcher looked {rounds} times");
    let (control, leaks): (Vec<_>, Vec<_>) = seen
        .into_iter()
        .partition(|s| s.contains("sleep 0.5 control"));
    assert!(!control.is_empty(), "the watcher sees argv at all");
    assert!(leaks.is_empty(), "the secret was on an argv: {leaks:#?}");

    // The member has it; the member without a backend and the lead do not.
    let pid_of = |spawned: &Value| {
        let pane = spawned["paneId"]
            .as_str()
            .and_then(|p| p.strip_prefix("lead:"))
            .expect("pane id")
            .to_owned();
        pane_pid(&rig, &pane)
    };
    assert_eq!(
        environ(pid_of(&mallory))
            .get("FLEETD_BACKEND_TOKEN")
            .map(String::as_str),
        Some(secret)
    );
    let pat_env = environ(pid_of(&pat));
    assert!(
        !pat_env.values().any(|v| v.contains(secret)),
        "a member without a backend inherits nothing: {:?}",
        pat_env.keys().collect::<BTreeSet<_>>()
    );
    let lead_env = environ(pane_pid(&rig, LEAD));
    assert!(!lead_env.values().any(|v| v.contains(secret)));
    // What the lead can ask tmux: the members' session environment and the global one.
    let shown = rig.dir().join("shown-env");
    rig.type_line(
        LEAD,
        &format!(
            "{{ tmux show-environment -t fleet; tmux show-environment -g; }} > {s}.tmp 2>&1; mv {s}.tmp {s}",
            s = shown.display()
        ),
    );
    let text = read_when_there(&shown, "tmux show-environment from the lead");
    assert!(text.contains("PATH="), "it read something: {text}");
    assert!(!text.contains(secret), "{text}");
    // The launch file that carried the values is gone.
    let launch = state_dir(rig.dir()).join("launch");
    let left: Vec<_> = std::fs::read_dir(&launch)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "launch files left: {left:?}");

    // Texts that reach the lead: a reply that quotes the token, and the turn-done fallback's
    // raw pane text after a member printed it.
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "mallory", "task": "echo \"$FLEETD_BACKEND_TOKEN\"" }),
    ));
    let reply = sent["reply"].as_str().unwrap_or_default();
    assert!(reply.contains("[redacted: labtoken]"), "{sent}");
    assert!(!sent.to_string().contains(secret), "{sent}");
    let sent = structured_ok(&rig.lead(
        "fleet_send",
        &json!({ "target": "lee", "task": "echo \"token is $FLEETD_BACKEND_TOKEN\"" }),
    ));
    assert_eq!(sent["status"], "ended_without_reply", "{sent}");
    let fallback = sent["reply"].as_str().unwrap_or_default();
    assert!(fallback.contains("token is [redacted: labtoken]"), "{sent}");
    assert!(!sent.to_string().contains(secret), "{sent}");
    // And the member printed the real thing in its own pane: it does have it.
    let lee = structured_ok(&rig.lead("fleet_status", &json!({ "target": "lee" })));
    let lee_pane = lee["paneId"]
        .as_str()
        .and_then(|p| p.strip_prefix("lead:"))
        .expect("pane");
    assert!(rig.history(lee_pane).contains(secret));
}

#[test]
fn e2e_security_state_is_owner_only_and_a_loose_one_is_tightened() {
    let home = tempfile::tempdir().expect("tempdir");
    let state = state_dir(home.path());
    // A state directory an older fleetd left readable by everyone.
    std::fs::create_dir_all(&state).expect("mkdir");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for (name, text) in [("inbox.db", ""), ("members.json", "[]")] {
        std::fs::write(state.join(name), text).expect("write");
        std::fs::set_permissions(state.join(name), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let daemon = Daemon::start(home.path(), &[]);
    // Said at start, before the daemon listens.
    for name in ["inbox.db", "members.json", "\"was\":\"755\""] {
        assert!(
            daemon
                .seen_logs()
                .iter()
                .any(|l| l.contains("made it owner-only") && l.contains(name)),
            "a warning names {name}: {:#?}",
            daemon.seen_logs()
        );
    }
    // Something written: the inbox files exist with their journal.
    let answer = http::request(
        daemon.operator(),
        "POST",
        "/sessions/alice/replies/drain",
        None,
    )
    .expect("answers");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&state).expect("list").flatten() {
        let path = entry.path();
        let expected = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode(&path), expected, "{}", path.display());
        files.push(entry.file_name().to_string_lossy().into_owned());
    }
    files.sort();
    for name in ["api.sock", "fleetd.sock", "inbox.db", "inbox.db.lock"] {
        assert!(files.iter().any(|f| f == name), "{name} in {files:?}");
    }
    // An older fleetd's member registry is imported into the store, then removed.
    assert!(!files.iter().any(|f| f == "members.json"), "{files:?}");
    // Another user cannot even look inside.
    if rustix::process::geteuid().is_root() {
        let out = as_nobody("ls", &[&state.display().to_string()], &[]).expect("root");
        assert!(!out.status.success(), "nobody listed the state directory");
    }
}

/// The dashboard's doors and the operator routes it uses (`/dashboard/keys`, the sign-in, the
/// session cookie, `/questions`, an answer, a stop, `/tickets`), tried by an anonymous process,
/// a member's agent, another uid and a web page: each refused, nothing changed. The operator's
/// key works once; the cookie it buys is `HttpOnly` and `SameSite=Strict`, counts only from
/// fleetd's own page, and stops counting at sign-out; a forged one is nothing.
#[test]
fn e2e_security_guessing_the_dashboard_token_is_slowed_down_per_address() {
    let Some((rig, _)) = rig_with_mail("") else {
        return;
    };
    let addr = rig.daemon.addr;
    let login = |token: &str| {
        http::request(
            addr,
            "POST",
            "/dashboard/login",
            Some(&format!(r#"{{"token":"{token}"}}"#)),
        )
        .expect("login answers")
    };
    // Review L5: five typos are free; the sixth wrong guess makes this address wait.
    for n in 1..=6 {
        let wrong = login(&format!("guess-{n}"));
        assert_eq!(
            (wrong.status, wrong.error_code().as_str()),
            (401, "bad_credential"),
            "guess {n}: {}",
            wrong.body
        );
    }
    // While it waits, even the right token is not heard, and no session is opened.
    let refused = login(TOKEN);
    assert_eq!(
        (refused.status, refused.error_code().as_str()),
        (429, "too_many_sign_ins"),
        "{}",
        refused.body
    );
    assert!(refused.headers("set-cookie").is_empty(), "{}", refused.head);
    let wait: u64 = refused
        .headers("retry-after")
        .first()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("a Retry-After header: {}", refused.head));
    assert!((1..=60).contains(&wait), "{wait}");
    // The operator's own socket is another address: it is not held up.
    let operator = rig.daemon.operator();
    let key = http::request(&operator, "POST", "/dashboard/keys", None)
        .expect("a key")
        .json()["key"]
        .as_str()
        .expect("key")
        .to_owned();
    assert!(!key.is_empty());
    // After the wait the right token signs in, and the count starts again.
    fleetd_testkit::agents::rig::pause(Duration::from_millis(wait * 1000 + 200));
    let signed = login(TOKEN);
    assert_eq!(signed.status, 200, "{}", signed.body);
    let typo = login("typo");
    assert_eq!(typo.error_code(), "bad_credential", "{}", typo.body);
}

#[test]
fn e2e_security_dashboard_sign_in_and_operator_routes_are_the_operators_alone() {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    let addr = rig.daemon.addr;
    let operator = rig.daemon.operator();
    let ack = format!("/sessions/alice/replies/{id}/ack");
    let doors: [(&str, &str, Option<&str>); 6] = [
        ("POST", "/dashboard/keys", None),
        ("GET", "/questions", None),
        (
            "POST",
            "/questions/q-1/answer",
            Some(r#"{"answer":"forged"}"#),
        ),
        ("POST", "/sessions/alice/stop", None),
        ("GET", "/tickets", None),
        ("POST", ack.as_str(), None),
    ];

    // An anonymous process (this test, in no pane, no token).
    for (method, path, body) in doors {
        let answer = http::request(addr, method, path, body).expect("answers");
        let expected = if path == "/dashboard/keys" {
            "not_the_operator"
        } else {
            "anonymous_caller"
        };
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, expected),
            "anonymous {method} {path}: {}",
            answer.body
        );
    }
    // A web page: refused for its origin before anything else, even holding the token.
    let bearer = format!("Bearer {TOKEN}");
    for (method, path, body) in doors.iter().filter(|(m, ..)| *m == "POST") {
        let answer = http::request_with(
            addr,
            method,
            path,
            &[
                ("Origin", "http://evil.example"),
                ("Authorization", &bearer),
            ],
            *body,
        )
        .expect("answers");
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "foreign_origin"),
            "cross-site {method} {path}: {}",
            answer.body
        );
    }
    // A member's agent, with its shell tool.
    let m = mcp_call();
    let line = doors
        .iter()
        .map(|(method, path, body)| format!("{m} --http {method} {path} '{}'", body.unwrap_or("")))
        .collect::<Vec<_>>()
        .join(" ; ");
    let answers = run_in(&rig, "mallory", &line);
    let codes: Vec<String> = answers.iter().map(code).collect();
    assert_eq!(
        codes,
        [
            "not_the_operator",
            "not_a_lead",
            "not_a_lead",
            "not_a_lead",
            "not_a_lead",
            "not_a_lead"
        ],
        "{answers:#?}"
    );
    // Another uid.
    let reachable = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(reachable.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let copy = reachable.path().join("mcp-call");
    std::fs::copy(bin_path("mcp-call"), &copy).expect("copy");
    let url = format!("http://{addr}");
    for (method, path, body) in doors {
        let Some(out) = as_nobody(
            &copy.display().to_string(),
            &["--http", method, path, body.unwrap_or("")],
            &[("FLEETD_URL", &url)],
        ) else {
            return;
        };
        let answer: Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        let expected = if path == "/dashboard/keys" {
            "not_the_operator"
        } else {
            "anonymous_caller"
        };
        assert_eq!(
            code(&answer),
            expected,
            "another uid {method} {path}: {answer}"
        );
    }

    // The operator's key, traded once for a session.
    let key = http::request(&operator, "POST", "/dashboard/keys", None)
        .expect("a key")
        .json()["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let login = format!(r#"{{"key":"{key}"}}"#);
    let signed = http::request(addr, "POST", "/dashboard/login", Some(&login)).expect("login");
    assert_eq!(signed.status, 200, "{}", signed.body);
    let set = signed.headers("set-cookie").join("\n");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }
    let session = set
        .split(';')
        .next()
        .and_then(|pair| pair.strip_prefix("fleetd_session="))
        .expect("the session cookie")
        .to_owned();
    let again = http::request(addr, "POST", "/dashboard/login", Some(&login)).expect("login");
    assert_eq!(
        (again.status, again.error_code().as_str()),
        (401, "bad_credential"),
        "a key works once"
    );
    let wrong_token = http::request(
        addr,
        "POST",
        "/dashboard/login",
        Some(r#"{"token":"guess"}"#),
    )
    .expect("login");
    assert_eq!(wrong_token.error_code(), "bad_credential");
    // The API token itself signs a browser in (how one on another host does).
    let by_token = http::request(
        addr,
        "POST",
        "/dashboard/login",
        Some(&format!(r#"{{"token":"{TOKEN}"}}"#)),
    )
    .expect("login");
    assert_eq!(by_token.status, 200, "{}", by_token.body);
    assert!(
        by_token
            .headers("set-cookie")
            .iter()
            .any(|c| c.starts_with("fleetd_session=") && c.contains("HttpOnly")),
        "{}",
        by_token.head
    );

    let cookie = format!("fleetd_session={session}");
    let with = |extra: &[(&str, &str)]| {
        let mut headers = vec![("Cookie", cookie.as_str())];
        headers.extend_from_slice(extra);
        http::request_with(addr, "GET", "/sessions/alice/replies", &headers, None).expect("answers")
    };
    assert_eq!(with(&[]).status, 200, "the session is the operator's");
    assert_eq!(
        with(&[("Sec-Fetch-Site", "same-origin")]).status,
        200,
        "from fleetd's own page"
    );
    for site in ["same-site", "cross-site"] {
        let answer = with(&[("Sec-Fetch-Site", site)]);
        assert_eq!(
            (answer.status, answer.error_code().as_str()),
            (403, "anonymous_caller"),
            "a {site} request gets nothing from the cookie"
        );
    }
    let forged = http::request_with(
        addr,
        "GET",
        "/sessions/alice/replies",
        &[("Cookie", "fleetd_session=00ff")],
        None,
    )
    .expect("answers");
    assert_eq!(forged.error_code(), "anonymous_caller", "a forged cookie");
    let cross = http::request_with(
        addr,
        "POST",
        &ack,
        &[("Cookie", &cookie), ("Origin", "http://127.0.0.1:1")],
        None,
    )
    .expect("answers");
    assert_eq!(
        (cross.status, cross.error_code().as_str()),
        (403, "foreign_origin"),
        "another port is another site"
    );
    // A member holding a session is still the member.
    let answers = run_in(
        &rig,
        "mallory",
        &format!("{m} --http --header 'Cookie:{cookie}' GET /sessions/alice/replies"),
    );
    assert_eq!(code(&answers[0]), "not_a_lead", "{answers:#?}");

    let out = http::request_with(
        addr,
        "POST",
        "/dashboard/logout",
        &[("Cookie", &cookie)],
        None,
    )
    .expect("logout");
    assert_eq!(out.status, 200);
    assert_eq!(
        with(&[]).error_code(),
        "anonymous_caller",
        "signed out, the cookie is nothing"
    );
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
}

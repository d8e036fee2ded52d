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
use fleetd_testkit::{Service, bin_path, environ, http, require_root, require_tmux, wait_until};
use serde_json::{Value, json};

mod approvals;
mod members;
mod operator;

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
    let token_file = fleetd_testkit::secret_file(home.path(), "api-token", TOKEN);
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
    rig.send_task("alice", "the report");
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

/// A story of the suite: `attack` (given the rig of [`rig_with_mail`] and the id of alice's
/// unread reply) tries its doors and checks each refusal, and then nothing may have changed in
/// alice's inbox. Where tmux is missing the test returns, having said why.
pub(crate) fn attack_changes_nothing(attack: impl FnOnce(&Rig, &str)) {
    let Some((rig, id)) = rig_with_mail("") else {
        return;
    };
    let before = fleet_state(&rig);
    attack(&rig, &id);
    assert_eq!(fleet_state(&rig), before, "nothing changed in any inbox");
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

/// Runs shell `command` in the lead's pane with its output to a file `name` in the rig's
/// directory (written whole, then renamed, so it is never read half-written); that output.
pub(crate) fn in_lead_shell(rig: &Rig, name: &str, command: &str, what: &str) -> String {
    let out = rig.dir().join(name);
    rig.type_line(
        LEAD,
        &format!(
            "{{ {command}; }} > {o}.tmp; mv {o}.tmp {o}",
            o = out.display()
        ),
    );
    read_when_there(&out, what)
}

/// Waits for `path` and returns its text.
pub(crate) fn read_when_there(path: &Path, what: &str) -> String {
    wait_until(what, PATIENCE, || path.exists());
    std::fs::read_to_string(path).expect("read")
}

#[test]
fn e2e_security_rest_and_mcp_follow_one_policy_for_anonymous_callers_and_web_pages() {
    attack_changes_nothing(|rig, id| {
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
            answer.assert_refused(
                403,
                "anonymous_caller",
                &format!("anonymous {method} {path}"),
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
        let replies_with = |authorization: &str| {
            http::get_with(
                addr,
                "/sessions/alice/replies",
                &[("Authorization", authorization)],
            )
            .expect("answers")
        };
        replies_with("Bearer wrong").assert_refused(401, "bad_token", "a wrong token");
        let with_token = replies_with(&bearer);
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
            answer.assert_refused(403, "foreign_host", &format!("rebinding {method} {path}"));
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
            let answer =
                http::request_with(addr, "POST", path, &origin, Some(body)).expect("answers");
            answer.assert_refused(403, "foreign_origin", &format!("cross-site POST {path}"));
        }
        let answer = mcp_tcp(
            addr,
            &origin,
            "fleet_ack",
            &json!({ "target": "alice", "msgId": id }),
        );
        answer.assert_refused(403, "foreign_origin", "a cross-site MCP call");
        // Another site's `EventSource`: refused before any event, even with the token.
        for path in ["/events", "/events/latency"] {
            let answer = http::get_with(addr, path, &origin).expect("answers");
            answer.assert_refused(403, "foreign_origin", &format!("cross-site GET {path}"));
        }
    });
}

/// A JSON-RPC `tools/call` over TCP from this process, with extra `headers`.
pub(crate) fn mcp_tcp(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
    tool: &str,
    args: &Value,
) -> http::Response {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "name": tool, "arguments": args } });
    http::request_with(addr, "POST", "/mcp", headers, Some(&body.to_string())).expect("answers")
}

/// Runs a command as uid/gid 65534 (nobody) with `setpriv`; `None` when this process is not
/// root (then the test is skipped, or fails under CI).
pub(crate) fn as_nobody(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Option<std::process::Output> {
    if require_root() == Service::Skip {
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
    attack_changes_nothing(|rig, id| {
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
        let run =
            |args: &[&str]| -> Option<Value> {
                let out = as_nobody(&m, args, &[("FLEETD_URL", &url)])?;
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                Some(serde_json::from_str(text.trim()).unwrap_or_else(|e| {
                    panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr))
                }))
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
                id,
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
        let text = in_lead_shell(
            rig,
            "lead-pane-nobody.out",
            &format!(
                "setpriv --reuid=65534 --regid=65534 --clear-groups {m} --print fleet_poll '{{\"target\":\"alice\"}}'"
            ),
            "the other uid's call from the lead pane",
        );
        assert_eq!(
            code(&serde_json::from_str(text.trim()).expect("JSON")),
            "anonymous_caller",
            "{text}"
        );
    });
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

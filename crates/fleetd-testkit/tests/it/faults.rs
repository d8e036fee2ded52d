//! Fault tests with the built binary: the state directory's disk fills up under a
//! running fleet. `/healthz` must say so (503, the store's error), nothing may be acknowledged
//! that was not written, no task whose ticket could not be kept may be typed, and everything
//! must come back when space returns. The state directory sits on a small tmpfs mounted for the
//! test (root, or CAP_SYS_ADMIN, is needed to mount it). And the tmux server dying under the
//! daemon (killed, or crashed) and coming back on the same socket.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fleetd_testkit::daemon::state_dir;
use fleetd_testkit::http::{self, Endpoint};
use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use fleetd_testkit::{Service, require, require_tmux, wait_until};
use serde_json::{Value, json};

/// A tmpfs mounted for the test, unmounted (lazily: the daemon may still hold files) on drop.
struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mount a tmpfs at {}", at.display());
        Self { at: at.to_owned() }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

fn can_mount() -> Service {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    require(
        "mounting a tmpfs",
        root,
        "run the test suite as root (or with CAP_SYS_ADMIN): it mounts a small tmpfs under the state directory",
    )
}

/// An MCP tool call on the operator's socket: the whole JSON-RPC result.
fn operator_call(endpoint: &Endpoint, tool: &str, args: &Value) -> Value {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": tool, "arguments": args } });
    let response = http::request(endpoint.clone(), "POST", "/mcp", Some(&body.to_string()))
        .expect("the operator socket answers");
    let value: Value = serde_json::from_str(&response.body).expect("JSON-RPC");
    value["result"].clone()
}

/// The replies waiting in `target`'s inbox, read and acknowledged on the operator's socket;
/// their texts.
fn take_replies(endpoint: &Endpoint, target: &str) -> Vec<String> {
    let polled = structured_ok(&operator_call(
        endpoint,
        "fleet_poll",
        &json!({ "target": target }),
    ));
    let mut texts = Vec::new();
    for reply in polled["replies"].as_array().into_iter().flatten() {
        let id = reply["msgId"].as_str().unwrap_or_default();
        let _ = operator_call(
            endpoint,
            "fleet_ack",
            &json!({ "target": target, "msgId": id }),
        );
        texts.push(reply["text"].as_str().unwrap_or_default().to_owned());
    }
    texts
}

/// Fills `dir`'s file system: writes until the disk refuses.
fn fill(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = std::fs::File::create(&filler).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.sync_all();
    filler
}

fn healthz(rig: &Rig) -> (u16, Value) {
    let response = http::get(rig.daemon.addr, "/healthz").expect("/healthz answers");
    let body = serde_json::from_str(&response.body).unwrap_or(Value::Null);
    (response.status, body)
}

#[test]
fn e2e_a_full_state_disk_is_reported_keeps_nothing_unwritten_and_recovers() {
    if require_tmux() == Service::Skip || can_mount() == Service::Skip {
        return;
    }
    let mut rig = Rig::start(&format!("profiles:\n{}", sim_profile("sim", &[])));
    rig.spawn("sim", "ann");
    // The state directory moves onto an 8 MiB tmpfs, contents and all.
    rig.kill_daemon();
    let state = state_dir(rig.dir());
    let saved = rig.dir().join("state-before");
    std::fs::rename(&state, &saved).expect("move the state aside");
    std::fs::create_dir(&state).expect("recreate the state dir");
    let _tmpfs = Tmpfs::mount(&state, "8m");
    for entry in std::fs::read_dir(&saved).expect("saved state").flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            std::fs::copy(entry.path(), state.join(entry.file_name())).expect("copy back");
        }
    }
    rig.restart_daemon();
    let operator = rig.daemon.operator();
    assert_eq!(healthz(&rig).0, 200, "healthy before the disk fills");

    let filler = fill(&state);
    // Writes that still fit the files' own free pages may go through; keep writing until the
    // store refuses one. Every task accepted is a ticket kept on disk.
    let mut accepted = Vec::new();
    let mut held = None;
    for n in 0..400 {
        let task = format!("task {n} while the disk fills");
        let result = operator_call(
            &operator,
            "fleet_send",
            &json!({ "target": "ann", "task": task, "wait": false }),
        );
        if result["isError"] == true {
            let text = result["content"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(text.contains("store_unavailable"), "{result}");
            assert!(text.contains("do not send it again"), "{text}");
            held = Some(task);
            break;
        }
        accepted.push(task);
    }
    let held = held.expect("the full disk refused a write within 400 tasks");
    let (status, body) = healthz(&rig);
    assert_eq!(status, 503, "degraded while the disk is full: {body}");
    assert_eq!(body["store"]["ok"], false, "{body}");
    let reason = body["store"]["error"].as_str().unwrap_or_default();
    assert!(
        reason.contains("full"),
        "the store's error is shown: {body}"
    );
    // Reads still answer.
    let status = structured_ok(&operator_call(
        &operator,
        "fleet_status",
        &json!({ "target": "ann" }),
    ));
    assert_eq!(status["target"], "ann", "{status}");

    // Space returns: health recovers, the held task is typed once and answered.
    std::fs::remove_file(&filler).expect("free the disk");
    wait_until("/healthz to recover", Duration::from_secs(30), || {
        healthz(&rig).0 == 200
    });
    let want = format!("sim-agent did: {held}");
    let mut seen = Vec::new();
    wait_until("the held task's reply", Duration::from_secs(120), || {
        seen.extend(take_replies(&operator, "ann"));
        seen.contains(&want)
    });
    assert_eq!(
        seen.iter().filter(|t| **t == want).count(),
        1,
        "the held task ran once: {seen:?}"
    );
    for task in &accepted {
        let reply = format!("sim-agent did: {task}");
        wait_until(
            "every accepted task's reply",
            Duration::from_secs(120),
            || {
                if seen.contains(&reply) {
                    return true;
                }
                seen.extend(take_replies(&operator, "ann"));
                seen.contains(&reply)
            },
        );
    }
}

/// How a test takes the tmux server away.
#[derive(Debug, Clone, Copy)]
enum TmuxDeath {
    /// `tmux kill-server`, as a user would.
    KillServer,
    /// SIGKILL of the server process (a crash): its socket file stays behind.
    Sigkill,
}

/// The tmux server dies under the running daemon (issue 17): fleetd lets the old server go (its
/// control clients must not keep a dying server alive), says so on /healthz, and once a server
/// is back on the same socket it serves the fleet again: a member spawned there works and
/// replies, over a new control client.
#[test]
fn e2e_tmux_dying_under_fleetd_is_let_go_and_a_new_server_is_used() {
    if require_tmux() == Service::Skip {
        return;
    }
    for death in [TmuxDeath::KillServer, TmuxDeath::Sigkill] {
        tmux_dies_under_fleetd(death);
    }
}

fn tmux_dies_under_fleetd(death: TmuxDeath) {
    let mut rig = Rig::start(&format!("profiles:\n{}", sim_profile("sim", &[])));
    let operator = rig.daemon.operator();
    let ask = |tool: &str, args: &Value| structured_ok(&operator_call(&operator, tool, args));
    // A member at work, so the daemon holds an event client on each session, and a reply.
    ask("fleet_spawn", &json!({ "profile": "sim", "name": "ann" }));
    let sent = ask("fleet_send", &json!({ "target": "ann", "task": "before" }));
    assert_eq!(sent["status"], "replied", "{death:?}: {sent}");
    let pid_of_server = || {
        let out = rig
            .tmux
            .run(&["display-message", "-p", "#{pid}"])
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let old = pid_of_server();
    assert!(!old.is_empty(), "{death:?}: the server's pid");
    match death {
        TmuxDeath::KillServer => {
            rig.tmux.run_ok(&["kill-server"]);
        }
        TmuxDeath::Sigkill => {
            let status = Command::new("kill")
                .args(["-KILL", &old])
                .status()
                .expect("kill runs");
            assert!(status.success());
        }
    }
    // Gone for good: not held up by the daemon reconnecting to it while it exits.
    wait_until(
        &format!("the old tmux server ({death:?}) to exit"),
        Duration::from_secs(15),
        || !Path::new(&format!("/proc/{old}")).exists(),
    );
    wait_until(
        &format!("/healthz to say the multiplexer is down ({death:?})"),
        Duration::from_secs(30),
        || healthz(&rig).0 == 503,
    );
    // tmux is back on the same socket.
    rig.tmux.restart();
    assert_ne!(pid_of_server(), old);
    // ann's pane went with the old server: the new one's listing lacks it, and she is released.
    wait_until("ann released", Duration::from_secs(30), || {
        ask("fleet_list", &json!({}))["members"]
            .as_array()
            .is_some_and(Vec::is_empty)
    });
    wait_until(
        &format!("/healthz healthy again ({death:?})"),
        Duration::from_secs(30),
        || healthz(&rig).0 == 200,
    );
    ask("fleet_spawn", &json!({ "profile": "sim", "name": "bob" }));
    let sent = ask("fleet_send", &json!({ "target": "bob", "task": "after" }));
    assert_eq!(sent["status"], "replied", "{death:?}: {sent}");
    assert_eq!(sent["reply"], "sim-agent did: after", "{death:?}: {sent}");
    rig.daemon.wait_for_log(
        "a control client on the new server",
        Duration::from_secs(30),
        |l| l.contains("tmux control client attached") && !l.contains("\"generation\":1"),
    );
}

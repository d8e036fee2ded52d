//! End to end: `fleetd demo --no-pause`, the built binary exec'ing the built `fleetd-demo`,
//! plays its whole scripted session against real tmux — delegation, a reply while the lead is
//! busy, the nudge, a question, a stop, a SIGKILL and restart — reports `0 replies lost`, exits
//! 0, and leaves no tmux server or temp dir behind.

use std::path::PathBuf;

use fleetd_testkit::daemon::command;
use fleetd_testkit::{Service, require_tmux};

#[test]
fn e2e_demo_plays_every_step_and_loses_no_reply() {
    if require_tmux() == Service::Skip {
        return;
    }
    let home = tempfile::tempdir().expect("tempdir");
    let out = command(home.path())
        .args(["demo", "--no-pause"])
        .output()
        .expect("fleetd demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fleetd demo failed ({}):\n{stdout}\n---- stderr ----\n{stderr}",
        out.status
    );
    assert!(
        stdout.lines().any(|l| l == "0 replies lost"),
        "no `0 replies lost` line:\n{stdout}"
    );
    let steps = stdout
        .lines()
        .filter(|l| l.starts_with("ok  ") || l.starts_with("FAIL"))
        .collect::<Vec<_>>();
    assert_eq!(steps.len(), 11, "every step is reported:\n{stdout}");
    assert!(
        steps.iter().all(|l| l.starts_with("ok  ")),
        "a step failed:\n{stdout}"
    );
    // It said where its tmux server was: the socket's directory is gone.
    let socket: PathBuf = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("tmux -S "))
        .and_then(|l| l.split_whitespace().next())
        .map(PathBuf::from)
        .expect("the attach command is printed");
    let dir = socket.parent().expect("the socket lives in a dir");
    assert!(
        !dir.exists(),
        "the demo left its tmux dir {} behind",
        dir.display()
    );
}

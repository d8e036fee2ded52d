//! Integration tests: the tmux backend's persistent control-mode client against real tmux on
//! private `-S` sockets — the hot paths spawn no `tmux` process while it is up, a command that
//! got no answer may have typed, and the backend recovers when its session or its whole server
//! is killed (by `kill-server` and by SIGKILL) and tmux comes back, and nothing changes in tmux
//! while a control client attaches (tmux before 3.7 crashes on it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetd::mux::tmux::Tmux;
use fleetd::mux::{Multiplexer, PaneEvent, PaneInfo};
use fleetd_core::{AgentStatus, PaneId, TerminalId};
use fleetd_testkit::tmux::TmuxServer;
use tokio::sync::broadcast;

use crate::mux_kit::{
    eventually, gone, member, next_pick, real_tmux, statuses, tmux_server, wait_tail,
    watched_sim_agent, write_script,
};

/// Opens a pane running `cat` in a new tab of `workspace`.
async fn open_cat(tmux: &Tmux, workspace: &str) -> PaneInfo {
    tmux.open_pane(member(workspace, &[], vec!["cat".to_owned()]))
        .await
        .expect("open")
}

/// A tmux that appends each invocation's arguments (one line) to `log`, then runs the real one.
fn logging_tmux(dir: &Path, log: &Path) -> PathBuf {
    let wrapper = dir.join("tmux-logging");
    write_script(
        &wrapper,
        &format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec {} \"$@\"\n",
            log.display(),
            real_tmux()
        ),
    );
    wrapper
}

fn invocations(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits for `pane`'s next status reading (any status) and returns its incarnation.
async fn next_reading(rx: &mut broadcast::Receiver<PaneEvent>, pane: &PaneId) -> TerminalId {
    next_pick(rx, &format!("a reading of {pane}"), |e| match e {
        PaneEvent::StatusChanged {
            pane: p, terminal, ..
        } if p == pane => Some(terminal.clone()),
        _ => None,
    })
    .await
}

/// A backend on `server` that runs the tmux wrapper `wrapper` writes (into the server's
/// directory, the wrapper logging to `log_name` there), with a `cat` pane open in `fleet`: the
/// backend, the wrapper's log and the pane.
async fn wrapped_tmux(
    server: &TmuxServer,
    wrapper: fn(&Path, &Path) -> PathBuf,
    log_name: &str,
) -> (Tmux, PathBuf, PaneId) {
    let log = server.dir().join(log_name);
    let mut config = server.backend_config();
    config.program = wrapper(server.dir(), &log);
    let tmux = Tmux::new(config);
    let pane = open_cat(&tmux, "fleet").await.pane;
    (tmux, log, pane)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_paths_run_no_tmux_process_while_the_control_client_is_up() {
    let Some(server) = tmux_server() else {
        return;
    };
    let (tmux, log, pane) = wrapped_tmux(&server, logging_tmux, "invocations.log").await;
    let mut events = tmux.events();
    tmux.watch(&pane).await.expect("watch");
    next_reading(&mut events, &pane).await;
    let before = invocations(&log);
    for i in 0..3 {
        tmux.submit(&pane, &format!("line {i}"))
            .await
            .expect("submit");
    }
    tmux.press_enter(&pane).await.expect("enter");
    wait_tail(&tmux, &pane, "line 2").await;
    tmux.list_panes().await.expect("list");
    tmux.pane(&pane).await.expect("pane");
    tmux.process_info(&pane).await.expect("process info");
    tmux.ping().await.expect("ping");
    tmux.watch(&pane).await.expect("watch again");
    next_reading(&mut events, &pane).await;
    let after = invocations(&log);
    assert_eq!(
        after[before.len()..],
        [] as [String; 0],
        "tmux processes on the hot paths"
    );
    // One command client (no output), one event client for the watched pane's session.
    let attaches = |kind: &str| {
        after
            .iter()
            .filter(|l| l.contains("-C attach-session") && l.contains(kind))
            .count()
    };
    assert_eq!(attaches("no-output"), 1, "{after:#?}");
    assert_eq!(attaches("-t =fleet"), 1, "{after:#?}");
}

/// A tmux whose control clients (`-C`) start 1.5 s late, writing `start <ms> <args>` to `log`
/// when asked and `exec <ms> <args>` when they start (milliseconds since the epoch).
fn slow_attaching_tmux(dir: &Path, log: &Path) -> PathBuf {
    let wrapper = dir.join("tmux-slow-attach");
    write_script(
        &wrapper,
        &format!(
            "#!/bin/sh
case \" $* \" in\n*\" -C \"*) echo \"start $(date +%s%3N) $*\" >> '{log}'; sleep 1.5; echo \"exec $(date +%s%3N) $*\" >> '{log}';;\nesac\nexec {tmux} \"$@\"\n",
            log = log.display(),
            tmux = real_tmux()
        ),
    );
    wrapper
}

/// The milliseconds since the epoch of `log`'s line of `kind` for an attach to `session`.
fn attach_time(log: &Path, kind: &str, session: &str) -> Option<u128> {
    invocations(log).iter().find_map(|line| {
        let rest = line.strip_prefix(kind)?.trim_start();
        let (ms, args) = rest.split_once(' ')?;
        args.contains(&format!("-t ={session}"))
            .then(|| ms.parse().ok())
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_changes_in_tmux_while_a_control_client_attaches() {
    // tmux before 3.7 segfaults when it notifies a control client still identifying itself —
    // here a session created while the watch's event client attaches (fleetd's AttachGate).
    let Some(server) = tmux_server() else {
        return;
    };
    let (tmux, log, pane) = wrapped_tmux(&server, slow_attaching_tmux, "attaches.log").await;
    tmux.watch(&pane).await.expect("watch");
    eventually("the event client's tmux to be asked for", async || {
        attach_time(&log, "start", "fleet")
    })
    .await;
    open_cat(&tmux, "other").await;
    // Read with `date`, as the wrapper reads its times.
    let out = std::process::Command::new("date")
        .arg("+%s%3N")
        .output()
        .expect("date");
    let created: u128 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("date prints milliseconds");
    let attaching = eventually("the event client's tmux to start", async || {
        attach_time(&log, "exec", "fleet")
    })
    .await;
    assert!(
        created >= attaching,
        "the session was created {} ms before the event client's tmux even started: {:#?}",
        attaching - created,
        invocations(&log)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_command_that_gets_no_answer_may_have_typed() {
    let Some(server) = tmux_server() else {
        return;
    };
    let bin = tempfile::tempdir().expect("tempdir");
    // A control client that attaches, answers the two commands a submit sends before it types
    // (the screen read and `set-buffer`) and then passes on nothing more: tmux carries out each
    // command, and its answer never arrives.
    let program = bin.path().join("tmux-control-mute");
    write_script(
        &program,
        &format!(
            "#!/bin/sh\ncase \" $* \" in\n*\" -C \"*) {tmux} \"$@\" | {{ n=0; armed=; while IFS= read -r line; do printf '%s\\n' \"$line\"; case \"$line\" in '%session-changed'*) armed=1;; '%end'*|'%error'*) if [ -n \"$armed\" ]; then n=$((n+1)); [ $n -ge 2 ] && exec sleep 30; fi;; esac; done; }};;\n*) exec {tmux} \"$@\";;\nesac\n",
            tmux = real_tmux()
        ),
    );
    let plain = Tmux::new(server.backend_config());
    let pane = open_cat(&plain, "fleet").await.pane;
    let mut config = server.backend_config();
    config.call_timeout = Duration::from_millis(500);
    config.program = program;
    let impatient = Tmux::new(config);
    for err in [
        impatient
            .submit(&pane, "maybe typed")
            .await
            .map(|_| ())
            .expect_err("no answer"),
        impatient.press_enter(&pane).await.expect_err("no answer"),
    ] {
        assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    }
    // It was typed: uncertain was the truth.
    wait_tail(&plain, &pane, "maybe typed").await;
    // Other calls that get no answer did nothing worth knowing: still transient.
    let err = impatient.list_panes().await.expect_err("no answer");
    assert!(err.is_transient(), "{err}");
}

/// The session the backend's control client is attached to.
fn control_session(server: &TmuxServer) -> Option<String> {
    let out = server
        .run(&[
            "list-clients",
            "-F",
            "#{client_control_mode} #{client_session}",
        ])
        .expect("list-clients");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("1 ").map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_client_moves_on_when_its_session_is_destroyed() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = Tmux::new(server.backend_config());
    let pane = open_cat(&tmux, "fleet").await.pane;
    let spare = open_cat(&tmux, "spare").await.pane;
    tmux.list_panes().await.expect("list");
    let attached = control_session(&server).expect("a control client is attached");
    // Destroy the session it is attached to (keeping a pane to type into elsewhere).
    let (keep, target) = if attached == "fleet" {
        (spare, "fleet")
    } else {
        (pane, attached.as_str())
    };
    server.run_ok(&["kill-session", "-t", &format!("={target}")]);
    // A read whose answer the leaving client took with it is read again: no failure shows.
    let listed = tmux.list_panes().await.expect("list");
    assert!(listed.iter().any(|p| p.pane == keep));
    let again = eventually("a control client to attach again", async || {
        tmux.list_panes().await.ok()?;
        control_session(&server)
    })
    .await;
    assert_ne!(again, target);
    tmux.submit(&keep, "still here").await.expect("submit");
    wait_tail(&tmux, &keep, "still here").await;
}

enum Kill {
    Command,
    Sigkill,
}

async fn recovers_after(kill: Kill) {
    let Some(server) = tmux_server() else {
        return;
    };
    let log = server.dir().join("invocations.log");
    let mut config = server.backend_config();
    config.program = logging_tmux(server.dir(), &log);
    config.poll_interval = Duration::from_millis(200);
    let tmux = Tmux::new(config);
    let old = open_cat(&tmux, "fleet").await;
    let mut events = tmux.events();
    tmux.watch(&old.pane).await.expect("watch");
    next_reading(&mut events, &old.pane).await;

    match kill {
        Kill::Command => {
            server.run_ok(&["kill-server"]);
        }
        Kill::Sigkill => {
            let out = server
                .run(&["display-message", "-p", "#{pid}"])
                .expect("pid");
            let pid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let status = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status()
                .expect("kill");
            assert!(status.success());
        }
    }
    // No server: a failure that says nothing about the pane.
    let err = eventually("the server to be gone", async || {
        tmux.list_panes().await.err()
    })
    .await;
    assert!(err.is_transient(), "{err}");

    server.restart();
    // The watch's listing from the new server lacks the old pane's incarnation.
    assert_eq!(
        gone(&mut events, &old.pane).await,
        Some(old.terminal.clone())
    );
    let new = open_cat(&tmux, "fleet").await;
    tmux.watch(&new.pane).await.expect("watch");
    next_reading(&mut events, &new.pane).await;
    // Once the control client is back (at most a reconnect backoff later), nothing runs a
    // process again.
    eventually(
        "the control client to attach to the new server",
        async || {
            tmux.list_panes().await.ok()?;
            let log = invocations(&log);
            let last = log.last()?;
            last.contains("-C attach-session").then_some(())
        },
    )
    .await;
    let before = invocations(&log).len();
    tmux.submit(&new.pane, "typed after the restart")
        .await
        .expect("submit");
    wait_tail(&tmux, &new.pane, "typed after the restart").await;
    assert!(!tmux.list_panes().await.expect("list").is_empty());
    assert_eq!(invocations(&log)[before..], [] as [String; 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_recovers_when_the_tmux_server_is_killed() {
    recovers_after(Kill::Command).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_recovers_when_the_tmux_server_is_sigkilled() {
    recovers_after(Kill::Sigkill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_status_follows_a_pane_on_the_control_client() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = Tmux::new(server.backend_config());
    let pane = open_cat(&tmux, "fleet").await.pane;
    let mut events = tmux.events();
    tmux.watch(&pane).await.expect("watch");
    let first = next_reading(&mut events, &pane).await;
    // A spinner in the title: working.
    tmux.submit(&pane, "x").await.expect("submit");
    server.run_ok(&["select-pane", "-t", pane.as_str(), "-T", "\u{2802} busy"]);
    statuses(&mut events, &pane, &[AgentStatus::Working]).await;
    server.run_ok(&["kill-pane", "-t", pane.as_str()]);
    assert_eq!(gone(&mut events, &pane).await, Some(first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_changes_are_read_on_tmux_notifications_not_on_a_poll() {
    // Both polls a minute apart: every reading after the first must come from tmux's `%output`
    // and window notifications (the test gives up long before a poll).
    let Some(server) = tmux_server() else {
        return;
    };
    let mut config = server.backend_config();
    config.poll_interval = Duration::from_secs(60);
    config.safety_poll_interval = Duration::from_secs(60);
    let tmux = Tmux::new(config);
    let (mut events, pane) =
        watched_sim_agent(&tmux, &["--script", "silent", "--work-ms", "1500"]).await;
    for turn in 0..2 {
        tmux.submit(&pane.pane, &format!("turn {turn}"))
            .await
            .expect("submit");
        statuses(
            &mut events,
            &pane.pane,
            &[AgentStatus::Working, AgentStatus::Idle],
        )
        .await;
    }
    // Closing the window: `%window-close` makes the listing that finds it gone.
    server.run_ok(&["kill-pane", "-t", pane.pane.as_str()]);
    assert_eq!(gone(&mut events, &pane.pane).await, Some(pane.terminal));
}

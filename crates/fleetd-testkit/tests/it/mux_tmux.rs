//! Integration tests: the tmux backend against real tmux on private `-S` sockets in tempdirs
//! (never the user's server): member env read back from `/proc`, literal text delivery, derived
//! status, not-found versus transient errors, and a typing that may have typed (uncertain).

use std::time::Duration;

use fleetd::mux::tmux::Tmux;
use fleetd::mux::{Multiplexer, PaneEvent, SplitDirection, SubmitPath};
use fleetd_core::{AgentStatus, PaneId};
use fleetd_testkit::tmux::TmuxServer;
use fleetd_testkit::{Service, require_tmux, wait_until};

use crate::mux_kit::{
    PATIENCE, eventually, failed_inputs, gone, member, not_found, real_tmux, sim_agent, split_pane,
    statuses, tmux_server, wait_tail, watched_sim_agent, write_script,
};

fn backend(server: &TmuxServer) -> Tmux {
    Tmux::new(server.backend_config())
}

/// A pane that records every byte typed into it (raw mode, no echo) to a file of `server`'s
/// directory: `(pane, the file)`, once it is ready to record.
async fn recorder(tmux: &Tmux, server: &TmuxServer) -> (PaneId, std::path::PathBuf) {
    let record = server.dir().join("received.bin");
    let script = format!("stty raw -echo; exec cat > '{}'", record.display());
    let pane = tmux
        .open_pane(member("fleet", &[], vec!["sh".into(), "-c".into(), script]))
        .await
        .expect("open recorder");
    // The file exists once `cat` runs, after `stty` put the terminal in raw mode.
    eventually("the recorder to start", async || {
        record.exists().then_some(())
    })
    .await;
    (pane.pane, record)
}

/// What `record` holds once it has at least `expected`'s length, as text.
async fn received(record: &std::path::Path, expected: &str) -> String {
    let got = eventually("the text to arrive", async || {
        let bytes = std::fs::read(record).ok()?;
        (bytes.len() >= expected.len()).then_some(bytes)
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_env_reaches_the_process_and_fleetd_env_does_not() {
    if require_tmux() == Service::Skip {
        return;
    }
    // No server yet: fleetd's backend starts it, with its cleaned environment.
    let server = TmuxServer::unstarted().expect("tempdir");
    let tmux = backend(&server);
    let pane = tmux
        .open_pane(member(
            "fleet",
            &[("FLEET_TEST_TOKEN", "s3cr3t"), ("ANOTHER", "a b'c")],
            sim_agent(&["--script", "silent"]),
        ))
        .await
        .expect("open member");
    let info = tmux.process_info(&pane.pane).await.expect("process info");
    let pid = info.shell_pid.expect("pid");
    // The pane's process is the launcher (a `sh` reading its launch file) until it `exec`s the
    // member's command, whose environment is then the one /proc shows.
    wait_until(
        "the launcher to exec the member",
        Duration::from_secs(30),
        || fleetd_testkit::environ(pid).contains_key("FLEET_TEST_TOKEN"),
    );
    let env = fleetd_testkit::environ(pid);
    assert_eq!(
        env.get("FLEET_TEST_TOKEN").map(String::as_str),
        Some("s3cr3t")
    );
    assert_eq!(env.get("ANOTHER").map(String::as_str), Some("a b'c"));
    assert!(
        !env.contains_key("CARGO_PKG_NAME"),
        "the test's own environment leaked into the pane"
    );
    assert_eq!(pane.workspace.as_str(), "fleet");

    let second = tmux
        .open_pane(member("fleet", &[], sim_agent(&["--script", "silent"])))
        .await
        .expect("second");
    assert_eq!(second.workspace, pane.workspace);
    assert_ne!(second.tab, pane.tab);
    let split = tmux
        .open_pane(split_pane(
            &second.pane,
            SplitDirection::Down,
            &[("SPLIT", "1")],
            sim_agent(&["--script", "silent"]),
        ))
        .await
        .expect("split");
    assert_eq!(split.tab, second.tab);
    let panes = tmux.list_panes().await.expect("list");
    for p in [&pane.pane, &second.pane, &split.pane] {
        assert!(
            panes.iter().any(|i| i.pane == *p),
            "{p} missing from {panes:?}"
        );
    }
    let tabs = tmux.list_tabs().await.expect("tabs");
    assert_eq!(
        tabs.iter()
            .find(|t| t.tab == second.tab)
            .map(|t| t.pane_count),
        Some(2)
    );
    assert!(
        tmux.ping()
            .await
            .expect("ping")
            .version
            .starts_with("tmux ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_keys_deliver_quotes_unicode_and_newlines_literally() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = backend(&server);
    let (pane, record) = recorder(&tmux, &server).await;
    let text = "it's \"quoted\" $HOME `id` \\ -n ünïcödé ✓ 日本\n";
    let submitted = tmux.submit(&pane, text).await.expect("submit");
    assert_eq!(submitted.path, SubmitPath::TmuxPaste);
    let expected = format!("{text}\r");
    assert_eq!(received(&record, &expected).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_ending_in_a_semicolon_arrive_whole() {
    // On a process's argv tmux reads an argument ending in `;` as a command separator and drops
    // it (`a;` typed `a`, a task of just `;` typed an empty line) and one ending in `\;` as an
    // escaped `;`; on the control client's command line its parser reads quotes, `$`, `~`, `#`
    // and escapes. Both paths must type every text as it is.
    if require_tmux() == Service::Skip {
        return;
    }
    let texts = [
        "run the tests;",
        ";",
        "a\\;",
        "x;;",
        "a \\\\;",
        "end\\",
        "it's 'quoted' \"twice\" $HOME ${X} ~ ~/x #{pane_id} #x {a} } %if 1",
        "'",
        "\\'\\",
        "tab\there\u{1f}unit\u{7f}del \u{1b}[0m",
        "two\nlines\r\n",
        "-n",
        "--",
        "Enter",
        "ünïcödé ✓ 日本 \u{2800}",
    ];
    for control_mode in [true, false] {
        let server = TmuxServer::start().expect("tmux");
        let mut config = server.backend_config();
        config.control_mode = control_mode;
        let tmux = Tmux::new(config);
        let (pane, record) = recorder(&tmux, &server).await;
        let mut expected = String::new();
        for text in texts {
            tmux.submit(&pane, text).await.expect("submit");
            expected.push_str(text);
            expected.push('\r');
        }
        assert_eq!(
            received(&record, &expected).await,
            expected,
            "control mode {control_mode}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listing_per_poll_serves_every_watched_pane() {
    // Review L11: each watched pane had its own poll, a `list-panes` and a `capture-pane` every
    // 400 ms; now one `list-panes -a` per poll serves them all (the screen is still read for an
    // agent whose status depends on it).
    let Some(server) = tmux_server() else {
        return;
    };
    // A tmux that writes down each of its subcommands, then runs the real one.
    let calls = server.dir().join("calls.log");
    let wrapper = server.dir().join("tmux-wrapper");
    write_script(
        &wrapper,
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in -*|/*) ;; *) echo \"$a\" >> '{}'; break;; esac; done\nexec {} \"$@\"\n",
            calls.display(),
            real_tmux()
        ),
    );
    let mut config = server.backend_config();
    config.program = wrapper;
    config.poll_interval = Duration::from_millis(50);
    // Processes, so the wrapper sees each command (over the control client it sees one attach).
    config.control_mode = false;
    let tmux = Tmux::new(config);
    let mut panes = Vec::new();
    for _ in 0..4 {
        let pane = tmux
            .open_pane(member("fleet", &[], vec!["sleep".into(), "600".into()]))
            .await
            .expect("open");
        panes.push(pane.pane);
    }
    let mut events = tmux.events();
    for pane in &panes {
        tmux.watch(pane).await.expect("watch");
    }
    // Their first readings, in whatever order one poll publishes them.
    let mut unseen: std::collections::BTreeSet<PaneId> = panes.iter().cloned().collect();
    tokio::time::timeout(PATIENCE, async {
        while !unseen.is_empty() {
            if let Ok(PaneEvent::StatusChanged { pane, status, .. }) = events.recv().await {
                // Read before `sleep` took over from the shell tmux starts it with (a loaded
                // machine; seen in CI), a pane's first reading is `unknown`: its next is idle.
                if status == AgentStatus::Unknown {
                    continue;
                }
                assert_eq!(status, AgentStatus::Idle, "{pane}");
                unseen.remove(&pane);
            }
        }
    })
    .await
    .expect("every watched pane's first reading");
    let count = |what: &str| {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .filter(|l| *l == what)
            .count()
    };
    let (lists, captures) = (count("list-panes"), count("capture-pane"));
    eventually("a dozen polls", async || {
        (count("capture-pane") >= captures + 48).then_some(())
    })
    .await;
    let lists = count("list-panes") - lists;
    let captures = count("capture-pane") - captures;
    // Four agent panes: four screens per poll, one listing for all of them.
    assert!(
        lists * 2 <= captures,
        "{lists} listings for {captures} screen reads: a listing per pane"
    );
    for pane in &panes {
        tmux.unwatch(pane);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follows_the_title_spinner_and_closing_reports_gone() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = backend(&server);
    let (mut events, pane) =
        watched_sim_agent(&tmux, &["--script", "silent", "--work-ms", "4000"]).await;
    tmux.submit(&pane.pane, "work please")
        .await
        .expect("submit");
    statuses(&mut events, &pane.pane, &[AgentStatus::Working]).await;
    statuses(&mut events, &pane.pane, &[AgentStatus::Idle]).await;
    // sim-agent drops its spinner before it prints "turn done", and the idle title is read as
    // soon as tmux reports the output that set it: the line may follow the reading.
    let tail = wait_tail(&tmux, &pane.pane, "turn done").await;
    assert!(tail.contains("work please"), "{tail}");

    tmux.close_pane(&pane.pane).await.expect("close");
    assert_eq!(
        gone(&mut events, &pane.pane).await,
        Some(pane.terminal.clone())
    );
    not_found(tmux.pane(&pane.pane).await, "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_panes_are_not_found_and_a_missing_server_is_transient() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = backend(&server);
    let missing = PaneId::new("%999").expect("id");
    not_found(tmux.pane(&missing).await, "missing");
    not_found(tmux.submit(&missing, "x").await, "missing");
    not_found(tmux.close_pane(&missing).await, "missing");

    let nowhere = TmuxServer::unstarted().expect("tempdir");
    let dead = backend(&nowhere);
    for err in [
        dead.list_panes().await.map(|_| ()).expect_err("no server"),
        dead.ping().await.map(|_| ()).expect_err("no server"),
        // Typing into no server typed nothing: transient, never uncertain.
        dead.submit(&missing, "x")
            .await
            .map(|_| ())
            .expect_err("no server"),
        dead.press_enter(&missing).await.expect_err("no server"),
    ] {
        assert!(err.is_transient() && !err.is_not_found(), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_keys_that_times_out_may_have_typed() {
    let Some(server) = tmux_server() else {
        return;
    };
    let tmux = backend(&server);
    let pane = tmux
        .open_pane(member("fleet", &[], vec!["cat".into()]))
        .await
        .expect("open");
    // A tmux client killed at its timeout may already have handed the keys to the server: here
    // every client that types (`paste-buffer`, `send-keys`) does its work and then hangs, so
    // each such call times out after it acted (a zero timeout raced the client, which sometimes
    // finished first on a busy machine); `list-panes` hangs too, having done nothing worth
    // knowing. The screen reads and `set-buffer` that go before the paste answer.
    let bin = tempfile::tempdir().expect("tempdir");
    let program = bin.path().join("tmux-then-hang");
    write_script(
        &program,
        "#!/bin/sh\ncase \" $* \" in *\" paste-buffer \"*|*\" send-keys \"*|*\" list-panes \"*) tmux \"$@\"; exec sleep 30;; esac\nexec tmux \"$@\"\n",
    );
    let mut config = server.backend_config();
    config.call_timeout = Duration::from_millis(500);
    config.program = program;
    // Processes; the control client's timeout is tested in `mux_tmux_control`.
    config.control_mode = false;
    let impatient = Tmux::new(config);
    for err in failed_inputs(&impatient, &pane.pane, "maybe typed").await {
        assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    }
    // Other calls that time out did nothing worth knowing: still transient.
    let err = impatient.list_panes().await.expect_err("timed out");
    assert!(err.is_transient(), "{err}");
}

//! Integration tests: the caller locator against real panes — `sim-agent`s in a private tmux
//! server and in a `fake-herdr`, each connecting to a TCP listener (one through a grandchild) —
//! plus an anonymous caller, a spoofed environment and the unix-socket path.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use fleetd::locate::{Locator, LocatorConfig};
use fleetd::mux::herdr::{Herdr, HerdrConfig};
use fleetd::mux::tmux::Tmux;
use fleetd::mux::{Launch, MuxRouter, OpenPane, Placement};
use fleetd_core::{MuxDaemon, QualifiedPaneId};
use fleetd_testkit::fake_herdr::process::FakeHerdrProcess;
use fleetd_testkit::tmux::TmuxServer;
use fleetd_testkit::{Service, bin_path, require_tmux};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const PATIENCE: Duration = Duration::from_secs(30);

fn connecting_agent(addr: &str, tag: &str, depth: u32, env: &[(&str, &str)]) -> OpenPane {
    OpenPane {
        placement: Placement::NewTab {
            workspace: "fleet".to_owned(),
        },
        label: Some(tag.to_owned()),
        cwd: None,
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        launch: Launch::Argv(vec![
            bin_path("sim-agent").display().to_string(),
            "--script".into(),
            "silent".into(),
            "--connect".into(),
            addr.to_owned(),
            "--connect-tag".into(),
            tag.to_owned(),
            "--connect-depth".into(),
            depth.to_string(),
        ]),
    }
}

/// Accepts one connection and reads its `hello <pid> <tag>` line.
async fn accept_hello(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr, u32, String) {
    let (stream, peer) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("a pane connects in time")
        .expect("accept");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    tokio::time::timeout(PATIENCE, reader.read_line(&mut line))
        .await
        .expect("hello in time")
        .expect("read hello");
    let mut words = line.split_whitespace().skip(1);
    let pid = words
        .next()
        .and_then(|p| p.parse().ok())
        .expect("pid in hello");
    let tag = words.next().expect("tag in hello").to_owned();
    (reader.into_inner(), peer, pid, tag)
}

fn session_of(pid: u32) -> u32 {
    fleetd::locate::platform::read_stat(pid)
        .expect("stat")
        .session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locator_names_the_right_pane_for_every_connection() {
    if require_tmux() == Service::Skip {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let local = listener.local_addr().expect("addr");
    let addr = local.to_string();

    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeHerdrProcess::start(&bin_path("fake-herdr"), &dir.path().join("herdr.sock"))
        .expect("fake-herdr");
    let herdr = Herdr::new(HerdrConfig::new(fake.socket()));
    let tmux_server = TmuxServer::start().expect("tmux");
    let tmux = Tmux::new(tmux_server.backend_config());
    let router = MuxRouter::new(Arc::new(herdr), Some(Arc::new(tmux)));
    let locator = Locator::new(router.clone(), LocatorConfig::default());

    // tag → (daemon, request)
    let plan = [
        ("herdr-direct", MuxDaemon::Lead, 0, vec![]),
        ("herdr-grandchild", MuxDaemon::Lead, 2, vec![]),
        ("tmux-direct", MuxDaemon::Member, 0, vec![]),
        // Claims to be a herdr pane; the session says otherwise.
        (
            "tmux-spoofed-grandchild",
            MuxDaemon::Member,
            2,
            vec![("HERDR_PANE_ID", "w1:p1")],
        ),
    ];
    let mut expected: HashMap<String, QualifiedPaneId> = HashMap::new();
    let mut held = Vec::new();
    for (tag, daemon, depth, env) in plan {
        let pane = router
            .daemon(daemon)
            .expect("configured")
            .open_pane(connecting_agent(&addr, tag, depth, &env))
            .await
            .expect("open pane");
        expected.insert(
            tag.to_owned(),
            QualifiedPaneId::new(daemon, pane.pane.clone()),
        );
        let (stream, peer, pid, got_tag) = accept_hello(&listener).await;
        assert_eq!(got_tag, tag);
        let located = locator.locate_tcp(peer, local).await.expect("locate");
        assert_eq!(located.pid, Some(pid), "{tag}: the connecting process");
        let found = located
            .pane
            .clone()
            .unwrap_or_else(|| panic!("{tag}: no pane found"));
        assert_eq!(found.pane, expected[tag], "{tag}");
        assert_eq!(found.shell_pid, session_of(pid), "{tag}");
        if depth > 0 {
            assert_ne!(found.shell_pid, pid, "{tag}: a descendant, not the shell");
        }
        assert_eq!(
            located.env_mismatch,
            tag.contains("spoofed"),
            "{tag}: {located:?}"
        );
        held.push(stream);
    }

    // A fresh locator, knowing every pane from its first reading, finds each pane's caller in
    // the panes' process trees (none by the full scan), and in the same pane as before.
    let fresh = Locator::new(router.clone(), LocatorConfig::default());
    for stream in &held {
        let peer = stream.peer_addr().expect("peer");
        let located = fresh.locate_tcp(peer, local).await.expect("locate again");
        let pane = located.pane.expect("still in its pane");
        assert!(expected.values().any(|p| *p == pane.pane), "{pane:?}");
    }
    let counts = fresh.search_counts();
    assert_eq!(
        (counts.pane_tree, counts.full_scan, counts.not_found),
        (held.len() as u64, 0, 0),
        "{counts:?}"
    );

    // A caller in no pane (this test process) is not in any pane's tree: the full scan finds it,
    // and it is anonymous.
    let own = TcpStream::connect(local).await.expect("connect");
    let (_own_server_side, own_peer) = listener.accept().await.expect("accept");
    assert_eq!(own_peer, own.local_addr().expect("addr"));
    let anonymous = fresh
        .locate_tcp(own_peer, local)
        .await
        .expect("locate self");
    assert_eq!(anonymous.pid, Some(std::process::id()));
    assert_eq!(anonymous.pane, None);
    assert_eq!(
        fresh.search_counts().full_scan,
        1,
        "{:?}",
        fresh.search_counts()
    );

    // The unix-socket path: SO_PEERCRED names the peer process.
    let sock = dir.path().join("fleetd.sock");
    let unix = tokio::net::UnixListener::bind(&sock).expect("bind unix");
    let _client = tokio::net::UnixStream::connect(&sock)
        .await
        .expect("connect unix");
    let (server_side, _) = unix.accept().await.expect("accept unix");
    let via_unix = locator
        .locate_unix(&server_side)
        .await
        .expect("locate unix");
    assert_eq!(via_unix.pid, Some(std::process::id()));
    assert_eq!(via_unix.pane, None);

    // Re-locating the held connections hits the warm path and still agrees.
    for stream in &held {
        let peer = stream.peer_addr().expect("peer");
        let located = locator.locate_tcp(peer, local).await.expect("relocate");
        assert!(located.pane.is_some());
    }
}

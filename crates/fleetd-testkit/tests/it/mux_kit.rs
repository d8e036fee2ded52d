//! What the multiplexer backends' tests (`mux_tmux`, `mux_tmux_control`, `mux_herdr`) share:
//! the pane a member opens in, a sim-agent's command line, and waiting — on a probe, on a
//! pane's screen, and on the backend's pane events — so each test reads as the transcript of
//! what it did and what the backend then reported.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use fleetd::mux::{
    Launch, Multiplexer, MuxError, OpenPane, PaneEvent, PaneInfo, Placement, SplitDirection,
};
use fleetd_core::{AgentStatus, PaneId, TerminalId};
use fleetd_testkit::tmux::TmuxServer;
use fleetd_testkit::{Service, bin_path, require_tmux};
use tokio::sync::broadcast;

/// Generous bound for anything a loaded 2-core machine has to do.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A private tmux server where tmux is there; `None` (the test returns, having said why) where
/// it is not, outside CI (under CI a missing tmux fails the test).
pub(crate) fn tmux_server() -> Option<TmuxServer> {
    (require_tmux() == Service::Present).then(|| TmuxServer::start().expect("tmux"))
}

/// A member's pane: a new tab in `workspace` labelled `member`, running `command` with `env`.
pub(crate) fn member(workspace: &str, env: &[(&str, &str)], command: Vec<String>) -> OpenPane {
    OpenPane {
        placement: Placement::NewTab {
            workspace: workspace.to_owned(),
        },
        label: Some("member".to_owned()),
        cwd: None,
        env: env_map(env),
        launch: Launch::Argv(command),
    }
}

/// An unlabelled pane split off `of` in `direction`, running `command` with `env`.
pub(crate) fn split_pane(
    of: &PaneId,
    direction: SplitDirection,
    env: &[(&str, &str)],
    command: Vec<String>,
) -> OpenPane {
    OpenPane {
        placement: Placement::Split {
            of: of.clone(),
            direction,
        },
        label: None,
        cwd: None,
        env: env_map(env),
        launch: Launch::Argv(command),
    }
}

fn env_map(env: &[(&str, &str)]) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The built `sim-agent` with `args`.
pub(crate) fn sim_agent(args: &[&str]) -> Vec<String> {
    let mut argv = vec![bin_path("sim-agent").display().to_string()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv
}

/// The real `tmux` on PATH (for wrappers that log or delay it, then run it).
pub(crate) fn real_tmux() -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v tmux"])
        .output()
        .expect("sh");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// Writes an executable script `body` at `path`.
pub(crate) fn write_script(path: &Path, body: &str) {
    std::fs::write(path, body).expect("write the wrapper");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
}

/// Opens a pane in workspace `fleet` running sim-agent with `args`, and once it is ready
/// watches it until it reports idle: the events to follow its turns on, and the pane.
pub(crate) async fn watched_sim_agent(
    mux: &impl Multiplexer,
    args: &[&str],
) -> (broadcast::Receiver<PaneEvent>, PaneInfo) {
    let mut events = mux.events();
    let pane = mux
        .open_pane(member("fleet", &[], sim_agent(args)))
        .await
        .expect("open");
    wait_tail(mux, &pane.pane, "sim-agent ready").await;
    mux.watch(&pane.pane).await.expect("watch");
    statuses(&mut events, &pane.pane, &[AgentStatus::Idle]).await;
    (events, pane)
}

/// What a submit of `text` into `pane` and then an Enter failed with (each must fail).
pub(crate) async fn failed_inputs(
    mux: &impl Multiplexer,
    pane: &PaneId,
    text: &str,
) -> [MuxError; 2] {
    [
        mux.submit(pane, text)
            .await
            .map(|_| ())
            .expect_err("the submit fails"),
        mux.press_enter(pane).await.expect_err("the Enter fails"),
    ]
}

/// What `probe` finds, polled every 100 ms for 30 s; panics naming `what` when it finds nothing.
pub(crate) async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(value) = probe().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The tail of `pane` once it shows `needle`; panics with the last read when it never does.
pub(crate) async fn wait_tail(mux: &impl Multiplexer, pane: &PaneId, needle: &str) -> String {
    let mut last = String::new();
    for _ in 0..300 {
        last = mux.read_tail(pane, 200).await.unwrap_or_default();
        if last.contains(needle) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pane {pane} never showed {needle:?}; last read:\n{last}");
}

/// What `pick` takes from the first event it takes anything from (others pass by); panics
/// naming `what` after [`PATIENCE`].
pub(crate) async fn next_pick<T>(
    rx: &mut broadcast::Receiver<PaneEvent>,
    what: &str,
    mut pick: impl FnMut(&PaneEvent) -> Option<T>,
) -> T {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    if let Some(picked) = pick(&event) {
                        return picked;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// The next event `pred` accepts (others pass by); panics naming `what` after [`PATIENCE`].
pub(crate) async fn next_event(
    rx: &mut broadcast::Receiver<PaneEvent>,
    what: &str,
    mut pred: impl FnMut(&PaneEvent) -> bool,
) -> PaneEvent {
    next_pick(rx, what, |event| pred(event).then(|| event.clone())).await
}

/// Waits for `pane` to report each of `steps` in turn (other events pass by): a turn's
/// transcript, e.g. `[Working, Done]`.
pub(crate) async fn statuses(
    rx: &mut broadcast::Receiver<PaneEvent>,
    pane: &PaneId,
    steps: &[AgentStatus],
) {
    for (i, want) in steps.iter().enumerate() {
        let what = format!("{pane} {want:?} (step {} of {steps:?})", i + 1);
        next_event(rx, &what, status_of(pane, *want)).await;
    }
}

/// Whether an event is `pane` reporting `want`.
pub(crate) fn status_of<'a>(
    pane: &'a PaneId,
    want: AgentStatus,
) -> impl FnMut(&PaneEvent) -> bool + 'a {
    move |e| matches!(e, PaneEvent::StatusChanged { pane: p, status, .. } if p == pane && *status == want)
}

/// Waits for `pane` to be reported gone; the incarnation the report names.
pub(crate) async fn gone(
    rx: &mut broadcast::Receiver<PaneEvent>,
    pane: &PaneId,
) -> Option<TerminalId> {
    next_pick(rx, &format!("{pane} to be gone"), |e| match e {
        PaneEvent::Gone { pane: p, terminal } if p == pane => Some(terminal.clone()),
        _ => None,
    })
    .await
}

/// Asserts that a call failed with not-found (the pane, or its agent, is affirmatively gone);
/// `why` names the failure expected.
pub(crate) fn not_found<T: std::fmt::Debug>(result: Result<T, MuxError>, why: &str) {
    let err = result.expect_err(why);
    assert!(err.is_not_found(), "{why}: {err}");
}

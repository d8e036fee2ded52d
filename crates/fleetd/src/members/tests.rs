//! Driver tests of the spawn saga on paused tokio time against the in-process fake multiplexer:
//! a request dropped while its pane opens or while its agent starts never leaves a reserved
//! name, an orphan pane or a member that never gets ready; every failure after the pane opened
//! closes it and frees the name.

use std::pin::{Pin, pin};
use std::time::Duration;

use fleetd_core::access::Role;
use fleetd_core::{AgentStatus, Target};
use serde_json::{Value, json};
use tokio::time::sleep;

use super::SpawnRequest;
use crate::engine::EngineHandle;
use crate::mcp::{Caller, Fleet};
use crate::mux::Launch;
use crate::mux::fake::FakeMux;
use crate::test_support::{caller, config, engine_parts, fleet, memory_store};

/// A profile whose agent runs its own command (`Launch::Argv`), and one of a known agent kind
/// with none (`Launch::Agent`).
const CONFIG: &str = "profiles:\n  sim:\n    agent: custom\n    command: /bin/sim\n    args: [--fast]\n  cl:\n    agent: claude\n    args: [--model, x]\n";

struct Setup {
    fleet: Fleet,
    fake: FakeMux,
}

fn setup() -> Setup {
    let fake = FakeMux::new();
    let config = config(CONFIG);
    let parts = engine_parts(&fake, &memory_store(), crate::config::Live::fixed(config));
    Setup {
        fleet: fleet(parts),
        fake,
    }
}

fn lead() -> Caller {
    caller(Role::Lead)
}

fn ann() -> Target {
    Target::new("ann").expect("target")
}

async fn spawn(fleet: &Fleet, args: Value) -> Result<Value, (String, String)> {
    crate::mcp::tools::call(fleet, &lead(), "fleet_spawn", args)
        .await
        .map(|out| out.value)
        .map_err(|e| (e.code.as_str().to_owned(), e.message))
}

/// Waits (on paused time) until `cond` holds; fails naming `what` after a virtual `within`.
async fn until<F: Future<Output = bool>>(
    what: &str,
    within: Duration,
    mut cond: impl FnMut() -> F,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        sleep(Duration::from_millis(10)).await;
    }
}

async fn listed(engine: &EngineHandle, name: &str) -> bool {
    engine
        .list()
        .await
        .expect("engine")
        .iter()
        .any(|m| m.target.as_str() == name)
}

/// Asserts that a spawn failed with error `code`, its message saying `says`.
fn assert_failed(outcome: Result<Value, (String, String)>, code: &str, says: &str) {
    let (got, message) = outcome.expect_err(code);
    assert_eq!(got, code, "{message}");
    assert!(message.contains(says), "{message}");
}

/// Whether `name` can be reserved now (then it is given back at once).
async fn name_free(engine: &EngineHandle, name: &str) -> bool {
    match engine
        .reserve(Some(name.to_owned()), crate::engine::Delegator::Operator)
        .await
        .expect("engine")
    {
        Ok((target, _)) => {
            engine.unreserve(target).await.expect("engine");
            true
        }
        Err(_) => false,
    }
}

/// Drives `call` until `stage` holds, leaving it pending; fails if it ends first.
async fn drive_until<T: std::fmt::Debug, F: Future<Output = bool>>(
    call: Pin<&mut impl Future<Output = T>>,
    what: &str,
    stage: impl FnMut() -> F,
) {
    tokio::select! {
        done = call => panic!("the spawn ended before {what}: {done:?}"),
        () = until(what, Duration::from_secs(30), stage) => {}
    }
}

/// Drives the spawn of `ann` until `stage` holds, then drops the request mid-way.
async fn spawn_and_drop<F: Future<Output = bool>>(fleet: &Fleet, stage: impl FnMut() -> F) {
    let mut call = pin!(spawn(fleet, json!({ "profile": "sim", "name": "ann" })));
    drive_until(call.as_mut(), "the spawn to reach its stage", stage).await;
}

#[tokio::test(start_paused = true)]
async fn a_spawn_dropped_while_its_pane_opens_still_completes() {
    let Setup { fleet, fake } = setup();
    fake.hold_opens(true);
    spawn_and_drop(&fleet, || async { fake.opens().len() == 1 }).await;
    // The multiplexer answers after the request is gone: the saga goes on without it.
    fake.hold_opens(false);
    until("ann to be registered", Duration::from_secs(5), || {
        listed(&fleet.engine, "ann")
    })
    .await;
    fleet.engine.presence(ann()).await.expect("engine");
    fake.set_status("w9:p1", AgentStatus::Idle);
    // Long past the ready timeout: it was never taken for a failed spawn.
    sleep(Duration::from_secs(120)).await;
    let members = fleet.engine.list().await.expect("engine");
    let member = members.iter().find(|m| m.target == ann()).expect("ann");
    assert!(
        member.connected && member.status == fleetd_core::AgentStatus::Idle,
        "{member:?}"
    );
    assert!(fake.has_pane("w9:p1"));
    assert!(!name_free(&fleet.engine, "ann").await, "ann holds its name");
}

#[tokio::test(start_paused = true)]
async fn a_spawn_dropped_while_its_agent_starts_is_undone_when_it_never_gets_ready() {
    let Setup { fleet, fake } = setup();
    spawn_and_drop(&fleet, || listed(&fleet.engine, "ann")).await;
    until(
        "the spawn to give up and undo",
        Duration::from_secs(95),
        || async { !fake.has_pane("w9:p1") },
    )
    .await;
    sleep(Duration::from_millis(10)).await;
    assert!(!listed(&fleet.engine, "ann").await, "no member left behind");
    assert!(
        name_free(&fleet.engine, "ann").await,
        "no name left reserved"
    );
}

#[tokio::test(start_paused = true)]
async fn an_agent_not_ready_in_time_fails_the_spawn_and_closes_its_pane() {
    let Setup { fleet, fake } = setup();
    let started = tokio::time::Instant::now();
    let failed = spawn(&fleet, json!({ "profile": "sim", "name": "ann" })).await;
    assert_failed(
        failed,
        "agent_not_ready",
        "status unknown, MCP not connected",
    );
    assert_eq!(started.elapsed().as_secs(), 90, "the ready timeout");
    // Undone before the answer: a retry with the same name works at once.
    assert!(!fake.has_pane("w9:p1"), "the pane is closed");
    assert!(!listed(&fleet.engine, "ann").await);
    assert!(name_free(&fleet.engine, "ann").await);
}

#[tokio::test(start_paused = true)]
async fn a_pane_that_closes_before_its_agent_is_ready_fails_the_spawn_and_frees_the_name() {
    let Setup { fleet, fake } = setup();
    let mut call = pin!(spawn(&fleet, json!({ "profile": "sim", "name": "ann" })));
    drive_until(call.as_mut(), "ann to be registered", || {
        listed(&fleet.engine, "ann")
    })
    .await;
    fake.close("w9:p1");
    assert_failed(
        call.await,
        "spawn_failed",
        "pane closed before its agent was ready",
    );
    assert!(name_free(&fleet.engine, "ann").await);
}

#[tokio::test(start_paused = true)]
async fn a_pane_that_cannot_open_fails_the_spawn_and_frees_the_name() {
    let Setup { fleet, fake } = setup();
    fake.opens_fail(true);
    let failed = spawn(&fleet, json!({ "profile": "sim", "name": "ann" })).await;
    assert_failed(failed, "spawn_failed", "could not open a pane for ann");
    assert!(name_free(&fleet.engine, "ann").await);
}

#[tokio::test(start_paused = true)]
async fn a_ready_member_gets_its_first_task_and_a_taken_name_is_refused() {
    let Setup { fleet, fake } = setup();
    let mut call = pin!(spawn(
        &fleet,
        json!({ "profile": "sim", "name": "ann", "task": "hello" })
    ));
    drive_until(call.as_mut(), "ann to be registered", || {
        listed(&fleet.engine, "ann")
    })
    .await;
    fake.set_status("w9:p1", AgentStatus::Idle);
    fleet.engine.presence(ann()).await.expect("engine");
    let spawned = call.await.expect("spawned");
    assert_eq!(spawned["target"], "ann");
    assert_eq!(spawned["paneId"], "lead:w9:p1");
    assert_eq!(spawned["terminalId"], "t-open1");
    assert!(spawned["ticket"].is_string(), "{spawned}");
    let (code, _) = spawn(&fleet, json!({ "profile": "sim", "name": "ann" }))
        .await
        .expect_err("taken");
    assert_eq!(code, "name_taken");
    let (code, _) = spawn(&fleet, json!({ "profile": "nope" }))
        .await
        .expect_err("unknown");
    assert_eq!(code, "unknown_profile");
}

#[tokio::test(start_paused = true)]
async fn a_saga_cancelled_midway_is_undone_by_its_guard() {
    let Setup { fleet, fake } = setup();
    let request = |name: &str| SpawnRequest {
        profile: "sim".to_owned(),
        name: Some(name.to_owned()),
        ..SpawnRequest::default()
    };
    // Cancelled with its member registered, waiting for the agent: released, pane closed.
    let saga = fleet.spawner.start(request("ann"));
    until("ann to be registered", Duration::from_secs(5), || {
        listed(&fleet.engine, "ann")
    })
    .await;
    saga.abort();
    until("ann's pane to close", Duration::from_secs(5), || async {
        !fake.has_pane("w9:p1")
    })
    .await;
    assert!(!listed(&fleet.engine, "ann").await);
    assert!(name_free(&fleet.engine, "ann").await);
    // Cancelled while its pane opens: the reserved name is given back.
    fake.hold_opens(true);
    let saga = fleet.spawner.start(request("bo"));
    until(
        "bo's pane to be asked for",
        Duration::from_secs(5),
        || async { fake.opens().len() == 2 },
    )
    .await;
    saga.abort();
    until("bo's name to be free", Duration::from_secs(5), || {
        name_free(&fleet.engine, "bo")
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_pane_runs_the_profiles_command_or_its_agent_kind_with_the_members_env() {
    let Setup { fleet, fake } = setup();
    fake.opens_fail(true); // only the requests matter here
    for (profile, name) in [("sim", "ann"), ("cl", "bo")] {
        let _ = spawn(&fleet, json!({ "profile": profile, "name": name })).await;
    }
    let opens = fake.opens();
    assert_eq!(
        opens[0].launch,
        Launch::Argv(vec!["/bin/sim".to_owned(), "--fast".to_owned()])
    );
    assert_eq!(
        opens[1].launch,
        Launch::Agent {
            name: "bo".to_owned(),
            kind: "claude".to_owned(),
            args: vec!["--model".to_owned(), "x".to_owned()],
        }
    );
    assert_eq!(opens[1].label.as_deref(), Some("bo"));
    assert_eq!(opens[1].env["FLEETD_TARGET"], "bo");
    assert_eq!(opens[1].env["FLEETD_URL"], "http://127.0.0.1:1");
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_connects_before_its_member_is_registered_counts_as_present() {
    let Setup { fleet, fake } = setup();
    fake.hold_opens(true);
    let mut call = pin!(spawn(&fleet, json!({ "profile": "sim", "name": "ann" })));
    drive_until(call.as_mut(), "the pane to be asked for", || async {
        fake.opens().len() == 1
    })
    .await;
    // Its agent's MCP session arrives while fleetd still waits for the multiplexer's answer:
    // a caller in the members' space whose pane holds no member yet is nobody.
    let early = Caller {
        spawning_user: None,
        role: Role::Nobody,
        pane: None,
        unregistered: Some(crate::locate::CallerPane {
            pane: fleetd_core::QualifiedPaneId::new(
                fleetd_core::MuxDaemon::Lead,
                fleetd_core::PaneId::new("w9:p1").expect("pane"),
            ),
            terminal: fleetd_core::TerminalId::new("t-open1").expect("terminal"),
            shell_pid: 1,
            workspace_label: None,
            started: 0,
        }),
        via_daemon: None,
        stray: None,
        cancel: tokio_util::sync::CancellationToken::new(),
    };
    crate::identity::note_presence(&fleet, &early).await;
    fake.hold_opens(false);
    drive_until(call.as_mut(), "ann to be registered", || {
        listed(&fleet.engine, "ann")
    })
    .await;
    fake.set_status("w9:p1", AgentStatus::Idle);
    let spawned = call.await.expect("ready without another MCP session");
    assert_eq!(spawned["target"], "ann");
}

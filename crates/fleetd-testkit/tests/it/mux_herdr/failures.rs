//! The herdr backend when things go wrong: a stalled prompt reported with nothing pressed,
//! transient failures never read as not-found, answers that came too late read as uncertain, a
//! watch that survives a herdr restart, and an exiting agent's incarnation reported gone.

use super::*;
use crate::mux_kit::{failed_inputs, next_pick};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_prompt_is_reported_and_the_adapter_presses_nothing() {
    let fx = start_fake(&[]);
    let (mut events, pane, log) = fx
        .watched_logging_claude(
            "sticky.jsonl",
            &["--script", "silent", "--swallow", "1", "--work-ms", "500"],
        )
        .await;
    let submitted = fx
        .herdr
        .submit(&pane.pane, "swallowed once")
        .await
        .expect("submit");
    // herdr typed it and saw nothing happen within its 5 s: reported, not retried (review M6).
    assert_eq!(submitted.path, SubmitPath::AgentPrompt);
    assert_eq!(submitted.started, Some(false), "{submitted:?}");
    eventually("the swallowed Enter", async || {
        (logged(&log, "swallowed") > 0).then_some(())
    })
    .await;
    assert_eq!(logged(&log, "swallowed"), 1, "only herdr's own Enter");
    assert_eq!(
        logged(&log, "turn"),
        0,
        "the prompt still waits in the composer"
    );
    // The caller's one Enter retry gets the turn started.
    fx.herdr.press_enter(&pane.pane).await.expect("enter");
    statuses(&mut events, &pane.pane, &[AgentStatus::Working]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_never_reported_as_not_found() {
    let fx = start_fake(&[]);
    let pane = fx.open_claude(&["--script", "silent"]).await;

    fx.fake
        .fault(&json!({ "fault": "drop", "count": 3 }))
        .expect("fault");
    for err in [
        fx.herdr.pane(&pane.pane).await.expect_err("dropped"),
        fx.herdr
            .list_panes()
            .await
            .map(|_| ())
            .expect_err("dropped"),
        fx.herdr
            .process_info(&pane.pane)
            .await
            .map(|_| ())
            .expect_err("dropped"),
    ] {
        assert!(err.is_transient() && !err.is_not_found(), "{err}");
    }
    fx.herdr
        .pane(&pane.pane)
        .await
        .expect("works again after the drops");

    let impatient = fx.impatient(300);
    fx.fake
        .fault(&json!({ "fault": "delay", "ms": 1500 }))
        .expect("fault");
    let err = impatient.pane(&pane.pane).await.expect_err("too slow");
    assert!(err.is_transient() && !err.is_not_found(), "{err}");
    fx.fake.fault(&json!({ "fault": "clear" })).expect("fault");

    let gone_socket = fx.nowhere();
    let err = gone_socket.pane(&pane.pane).await.expect_err("no server");
    assert!(err.is_transient() && !err.is_not_found(), "{err}");

    // Affirmative answers are not-found.
    let missing = PaneId::new("w9:p9").expect("id");
    not_found(fx.herdr.pane(&missing).await, "missing");
    wait_tail(&fx.herdr, &pane.pane, "sim-agent ready").await;
    for _ in 0..100 {
        if fx
            .herdr
            .pane(&pane.pane)
            .await
            .expect("pane")
            .agent
            .is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fx.fake
        .fault(&json!({ "fault": "agent_not_found", "count": 1 }))
        .expect("fault");
    not_found(fx.herdr.submit(&pane.pane, "x").await, "agent gone");
    fx.herdr.close_pane(&pane.pane).await.expect("close");
    not_found(fx.herdr.pane(&pane.pane).await, "closed");
    not_found(fx.herdr.close_pane(&pane.pane).await, "closed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_herdr_typed_then_answered_timeout_is_uncertain() {
    let fx = start_fake(&[]);
    let (_events, pane) = fx
        .watched_claude(&["--script", "silent", "--work-ms", "300"])
        .await;
    fx.fake
        .fault(&json!({ "fault": "input_timeout", "count": 1, "ms": 200 }))
        .expect("fault");
    let err = fx
        .herdr
        .submit(&pane.pane, "typed before the timeout")
        .await
        .expect_err("herdr answered timeout");
    assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    let tail = wait_tail(&fx.herdr, &pane.pane, "turn done").await;
    assert_eq!(
        tail.matches("typed before the timeout").count(),
        1,
        "{tail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pane_input_answered_after_the_client_gave_up_is_uncertain() {
    let fx = start_fake(&[]);
    let pane = fx
        .open_custom(&["--script", "silent", "--work-ms", "200"])
        .await;
    let impatient = fx.impatient(500);
    // The request line is out and applied; the answer comes after the client stopped waiting.
    fx.fake
        .fault(&json!({ "fault": "input_timeout", "count": 2, "ms": 1500 }))
        .expect("fault");
    let err = impatient
        .submit(&pane.pane, "custom task, late ok")
        .await
        .expect_err("no answer in time");
    assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    wait_tail(&fx.herdr, &pane.pane, "turn done").await;
    let err = impatient
        .press_enter(&pane.pane)
        .await
        .expect_err("no answer in time");
    assert!(err.is_uncertain() && !err.is_not_found(), "{err}");
    fx.fake.fault(&json!({ "fault": "clear" })).expect("fault");

    // Failures before anything was written are transient: the pane could not be read first
    // (the connection dropped), or herdr is not there at all.
    fx.fake
        .fault(&json!({ "fault": "drop", "count": 1 }))
        .expect("fault");
    let err = fx
        .herdr
        .submit(&pane.pane, "never typed")
        .await
        .expect_err("dropped");
    assert!(err.is_transient(), "{err}");
    let gone_socket = fx.nowhere();
    for err in failed_inputs(&gone_socket, &pane.pane, "x").await {
        assert!(err.is_transient() && !err.is_not_found(), "{err}");
    }
    let tail = fx.herdr.read_tail(&pane.pane, 200).await.expect("tail");
    assert!(!tail.contains("never typed"), "{tail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_survives_a_herdr_restart() {
    let fx = start_fake(&[]);
    let (mut events, pane) = fx.watched_claude(&["--script", "silent"]).await;

    fx.fake
        .fault(&json!({ "fault": "restart", "down_ms": 800 }))
        .expect("restart");
    let old = pane.terminal.clone();
    next_event(&mut events, "the old incarnation to end", |e| {
        matches!(e, PaneEvent::Gone { pane: p, terminal: Some(t) } if *p == pane.pane && *t == old)
    })
    .await;
    let new_terminal = next_pick(&mut events, "the new incarnation", |e| match e {
        PaneEvent::StatusChanged {
            pane: p, terminal, ..
        } if *p == pane.pane && *terminal != old => Some(terminal.clone()),
        _ => None,
    })
    .await;
    let now = fx
        .herdr
        .pane(&pane.pane)
        .await
        .expect("same pane id after restart");
    assert_eq!(now.terminal, new_terminal);

    // The restored pane runs a fresh shell; start an agent in it and follow a whole turn on the
    // re-established subscription.
    let line = format!(
        "HERDR_AGENT=claude exec {} --script silent --work-ms 1000",
        bin_path("sim-agent").display()
    );
    let submitted = fx
        .herdr
        .submit(&pane.pane, &line)
        .await
        .expect("type into the fresh shell");
    assert_eq!(submitted.path, SubmitPath::PaneInput);
    statuses(&mut events, &pane.pane, &[AgentStatus::Idle]).await;
    fx.herdr
        .submit(&pane.pane, "after restart")
        .await
        .expect("prompt");
    statuses(
        &mut events,
        &pane.pane,
        &[AgentStatus::Working, AgentStatus::Done],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exiting_agent_reports_its_incarnation_gone() {
    let fx = start_fake(&[]);
    let (mut events, pane) = fx.watched_claude(&["--script", "exit"]).await;
    let _ = fx.herdr.submit(&pane.pane, "please exit").await;
    let terminal: TerminalId = pane.terminal.clone();
    next_event(&mut events, "gone", |e| {
        matches!(e, PaneEvent::Gone { pane: p, terminal: Some(t) } if *p == pane.pane && *t == terminal)
    })
    .await;
    not_found(fx.herdr.pane(&pane.pane).await, "closed");
    not_found(fx.herdr.watch(&pane.pane).await, "gone");
}

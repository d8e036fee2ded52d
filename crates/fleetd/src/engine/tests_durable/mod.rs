//! Driver tests of the durable fleet state (SPEC §15, §13.8) on paused time: an engine is
//! dropped as after a kill -9 and a second one starts on the same stores (the in-memory store
//! keeps both the inbox and the fleet state), then members, tickets, queued tasks, open
//! questions and bindings are checked against what the first one knew.

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::{AgentStatus, Target, TicketState};
use jiff::Timestamp;
use tokio::time::sleep;

use super::tests_steps::{
    LEAD, MEMBER, SECOND_MEMBER, assert_refused, fake_with, send_task, task, task_refused,
};
use super::{Durable, EngineHandle, EngineParts, LeadRef, NewMember, TicketAnswer, spawn};
use crate::clock::TokioClock;
use crate::mux::fake::FakeMux;
use crate::store::{InboxStore, MemoryStore, StateStore};
use crate::test_support::{
    config, engine_parts, member_names, memory_store, new_member, qualified, reply_from,
};

mod faults;
mod spend;

/// No pinned primary; reminders every second, so a nudge shows quickly.
const CONFIG: &str = "primary:\n  tab: w9:t9\n  pushReminders: 3\n  pushBackoffMs: 1000\n";

/// The stores that outlive an engine.
#[derive(Clone)]
struct Disk {
    store: Arc<MemoryStore>,
}

impl Disk {
    fn new() -> Self {
        Self {
            store: memory_store(),
        }
    }

    fn start(&self, fake: &FakeMux) -> EngineHandle {
        self.start_on(fake, Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)))
    }

    /// [`Disk::start`] on `clock` (shared across restarts, so time goes on).
    fn start_on(&self, fake: &FakeMux, clock: crate::clock::SharedClock) -> EngineHandle {
        self.start_with(fake, clock, None)
    }

    /// [`Disk::start_on`], importing the legacy `members.json` at `legacy`.
    fn start_with(
        &self,
        fake: &FakeMux,
        clock: crate::clock::SharedClock,
        legacy: Option<std::path::PathBuf>,
    ) -> EngineHandle {
        let config = config(CONFIG);
        spawn(EngineParts {
            durable: Some(Durable {
                store: Arc::clone(&self.store) as Arc<dyn StateStore>,
                legacy_members_file: legacy,
            }),
            clock,
            ..engine_parts(fake, &self.store, crate::config::Live::fixed(config))
        })
    }

    /// Drops `engine` as a kill -9 would (nothing released, nothing flushed beyond the commits)
    /// and lets what it had spawned end.
    async fn kill(&self, engine: EngineHandle) {
        drop(engine);
        settle().await;
    }

    /// [`Disk::kill`], then a new engine on the same stores.
    async fn restart(&self, engine: EngineHandle, fake: &FakeMux) -> EngineHandle {
        self.kill(engine).await;
        self.start(fake)
    }

    /// [`Disk::restart`], ann's pane (`w2:p1`) working normally again by the time the new
    /// engine starts: the fault was the killed daemon's moment.
    async fn restart_healed(&self, engine: EngineHandle, fake: &FakeMux) -> EngineHandle {
        self.kill(engine).await;
        fake.fault("w2:p1", None);
        self.start(fake)
    }
}

fn t(name: &str) -> Target {
    Target::new(name).expect("target")
}

/// The lead of the tests that have one: pane `w1:p1`, terminal `t-lead`.
fn lead_ref() -> LeadRef {
    LeadRef {
        pane: qualified("w1:p1"),
        terminal: fleetd_core::TerminalId::new("t-lead").expect("terminal"),
    }
}

/// A fake multiplexer with ann's pane (`w2:p1`, terminal `t-a`) showing `status`, and the
/// stores that will outlive the engines started on them.
fn ann_pane(status: AgentStatus) -> (FakeMux, Disk) {
    (fake_with(&[(MEMBER, status)]), Disk::new())
}

/// Asserts exactly one text was typed so far, and that it was `text`.
fn typed_once(fake: &FakeMux, text: &str) {
    let typed = fake.typed();
    assert_eq!(typed.len(), 1, "{typed:?}");
    assert_eq!(typed[0].text, text);
}

/// Asserts `text` is the one text typed so far, and that `engine` has `ticket` delivered.
async fn delivered_once(
    fake: &FakeMux,
    engine: &EngineHandle,
    ticket: fleetd_core::Ticket,
    text: &str,
) {
    typed_once(fake, text);
    assert_eq!(state_of(engine, ticket).await, Some(TicketState::Delivered));
}

/// An engine on `disk` with member ann (pane `w2:p1`, terminal `t-a`) registered; its agent has
/// not connected.
async fn with_ann_registered(disk: &Disk, fake: &FakeMux) -> EngineHandle {
    let engine = disk.start(fake);
    engine
        .add_member(new_member("ann", "w2:p1", "t-a"))
        .await
        .expect("engine");
    engine
}

/// [`with_ann_registered`], and connected: where most restart stories begin.
async fn with_ann(disk: &Disk, fake: &FakeMux) -> EngineHandle {
    let engine = with_ann_registered(disk, fake).await;
    engine.presence(t("ann")).await.expect("engine");
    engine
}

/// An engine on `disk` that has seen the lead ([`lead_ref`]), with member ann registered as its
/// member and connected.
async fn with_ann_led(disk: &Disk, fake: &FakeMux) -> EngineHandle {
    let engine = disk.start(fake);
    let lead = lead_ref();
    engine.lead_seen(lead.clone()).await.expect("engine");
    engine
        .add_member(NewMember {
            lead: Some(lead),
            ..new_member("ann", "w2:p1", "t-a")
        })
        .await
        .expect("engine");
    engine.presence(t("ann")).await.expect("engine");
    engine
}

/// Lets spawned effects and the persister run.
async fn settle() {
    sleep(Duration::from_millis(50)).await;
}

async fn state_of(engine: &EngineHandle, ticket: fleetd_core::Ticket) -> Option<TicketState> {
    match engine.ticket(ticket).await.expect("engine") {
        TicketAnswer::Live(view) => Some(view.state),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn members_are_taken_back_and_a_gone_one_is_released_with_its_tickets_failed() {
    let fake = fake_with(&[
        (MEMBER, AgentStatus::Idle),
        (SECOND_MEMBER, AgentStatus::Working),
    ]);
    let disk = Disk::new();
    let first = with_ann_registered(&disk, &fake).await;
    first
        .add_member(new_member("bo", "w2:p2", "t-b"))
        .await
        .expect("engine");
    let ticket = task(&first, "bo", "a long job").await;
    disk.kill(first).await;
    // While fleetd was down, bo's pane got a new occupant.
    fake.vanish("w2:p2");
    fake.add_pane("w2:p2", "t-other", "w2:t2", AgentStatus::Idle);
    let second = disk.start(&fake);
    settle().await;
    let names = member_names(&second).await;
    assert_eq!(names, ["ann"], "ann taken back, bo gone");
    assert!(second.list().await.expect("engine")[0].connected);
    assert_eq!(state_of(&second, ticket).await, Some(TicketState::Failed));
    let TicketAnswer::Live(view) = second.ticket(ticket).await.expect("engine") else {
        panic!("the ticket is known");
    };
    assert_eq!(view.cause.as_deref(), Some("gone"));
    let notice = disk.store.peek(&t("bo"), 10).await.expect("peek");
    assert!(
        notice.iter().any(|m| m.text.contains("released (gone)")),
        "the lead learns it: {notice:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_task_is_typed_exactly_once_across_a_restart() {
    let (fake, disk) = ann_pane(AgentStatus::Working);
    let first = with_ann(&disk, &fake).await;
    let ticket = task(&first, "ann", "queued while busy").await;
    settle().await;
    assert!(fake.typed().is_empty(), "busy: nothing typed yet");
    let second = disk.restart(first, &fake).await;
    settle().await;
    assert_eq!(state_of(&second, ticket).await, Some(TicketState::Queued));
    fake.set_status("w2:p1", AgentStatus::Idle);
    settle().await;
    delivered_once(&fake, &second, ticket, "queued while busy").await;
}

#[tokio::test(start_paused = true)]
async fn a_typing_that_wrote_nothing_is_typed_after_a_restart() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = with_ann(&disk, &fake).await;
    fake.fault("w2:p1", Some(crate::mux::fake::Fault::TypingRefused));
    let ticket = task(&first, "ann", "never reached the pane").await;
    settle().await;
    assert!(fake.typed().is_empty(), "the socket failed: nothing typed");
    let second = disk.restart_healed(first, &fake).await;
    settle().await;
    delivered_once(&fake, &second, ticket, "never reached the pane").await;
}

#[tokio::test(start_paused = true)]
async fn a_task_in_doubt_that_never_reached_its_pane_is_typed_after_the_restart() {
    // Killed after the task was marked typed and before the multiplexer typed it: the pane
    // does not show it and the member is idle, so the restarted daemon types it, once.
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = with_ann(&disk, &fake).await;
    fake.fault("w2:p1", Some(crate::mux::fake::Fault::TypingHangs));
    let ticket = task(&first, "ann", "lost in the kill").await;
    let second_task = task(&first, "ann", "queued behind it").await;
    settle().await;
    assert!(fake.typed().is_empty(), "the typing call never came back");
    let second = disk.restart_healed(first, &fake).await;
    sleep(Duration::from_secs(5)).await;
    let typed: Vec<String> = fake.typed().into_iter().map(|t| t.text).collect();
    assert_eq!(typed, ["lost in the kill"], "typed once, and first");
    assert_ne!(
        state_of(&second, ticket).await,
        Some(TicketState::EndedWithoutReply)
    );
    assert_eq!(
        state_of(&second, second_task).await,
        Some(TicketState::Queued)
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_in_doubt_that_shows_in_its_pane_is_never_typed_again() {
    // Killed after the text reached the pane and before its answer: the pane shows it, so the
    // restarted daemon never types it again. The member stays idle: one Enter (a text left
    // unsubmitted in its input line would go in now), then the ticket is stalled.
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = with_ann(&disk, &fake).await;
    fake.fault("w2:p1", Some(crate::mux::fake::Fault::LostAnswer));
    let ticket = task(&first, "ann", "typed, answer lost").await;
    settle().await;
    assert_eq!(fake.typed().len(), 1);
    assert_eq!(state_of(&first, ticket).await, Some(TicketState::Queued));
    let second = disk.restart_healed(first, &fake).await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(fake.typed().len(), 1, "never typed twice");
    assert_eq!(fake.enters("w2:p1"), 1, "its one Enter retry");
    assert_eq!(state_of(&second, ticket).await, Some(TicketState::Stalled));
}

#[tokio::test(start_paused = true)]
async fn a_task_typed_before_a_restart_is_never_typed_again_and_its_ticket_ends() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = with_ann(&disk, &fake).await;
    let ticket = task(&first, "ann", "typed once").await;
    settle().await;
    assert_eq!(fake.typed().len(), 1);
    // Killed before the member was seen working; it worked and went idle while fleetd was down.
    let second = disk.restart(first, &fake).await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(fake.typed().len(), 1, "never typed twice");
    assert_eq!(
        state_of(&second, ticket).await,
        Some(TicketState::EndedWithoutReply),
        "the turn-done fallback ends it"
    );
}

/// ann works on the task `job` when fleetd is killed. While it is down `filler` messages of
/// 900 KiB reach her inbox, then her reply to the task: the store has it, the engine never heard
/// of it. After the restart the task's ticket is replied.
async fn check_reply_stored_while_down(filler: usize) {
    let (fake, disk) = ann_pane(AgentStatus::Working);
    let first = with_ann_registered(&disk, &fake).await;
    let ticket = task(&first, "ann", "job").await;
    settle().await;
    disk.kill(first).await;
    let publish = |ticket, text: String| disk.store.publish(reply_from("ann", ticket, text));
    for _ in 0..filler {
        publish(None, "x".repeat(900 * 1024))
            .await
            .expect("publish");
    }
    publish(Some(ticket), "done".to_owned())
        .await
        .expect("publish");
    let second = disk.start(&fake);
    settle().await;
    assert_eq!(state_of(&second, ticket).await, Some(TicketState::Replied));
}

#[tokio::test(start_paused = true)]
async fn a_reply_stored_just_before_the_kill_settles_its_ticket_after_the_restart() {
    check_reply_stored_while_down(0).await;
}

#[tokio::test(start_paused = true)]
async fn a_reply_behind_pages_of_other_mail_still_settles_its_ticket_after_the_restart() {
    // Three 900 KiB messages first: the restart reads the inbox a ~1 MiB page at a time.
    check_reply_stored_while_down(3).await;
}

#[tokio::test(start_paused = true)]
async fn questions_and_bindings_survive_and_the_answer_reaches_the_member() {
    let fake = fake_with(&[(LEAD, AgentStatus::Working), (MEMBER, AgentStatus::Working)]);
    let disk = Disk::new();
    let first = with_ann_led(&disk, &fake).await;
    let (id, _answer) = first
        .ask_question(t("ann"), "which branch?".to_owned())
        .await
        .expect("engine")
        .expect("under the cap");
    settle().await;
    let second = disk.restart(first, &fake).await;
    settle().await;
    let open = second.questions(Some(t("ann"))).await.expect("engine");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].question, "which branch?");
    let members = second.list().await.expect("engine");
    assert_eq!(
        members[0].lead.as_deref(),
        Some("lead:w1:p1"),
        "the binding to its lead came back"
    );
    // The nudge about the question goes to that lead once it is idle.
    fake.set_status("w1:p1", AgentStatus::Idle);
    settle().await;
    let nudges = fake.typed_into("w1:p1");
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(nudges[0].text.contains("question"), "{nudges:?}");
    // Answered after the restart: the member (no longer waiting) gets it as a task.
    let route = second
        .answer(None, id, "main".to_owned())
        .await
        .expect("engine")
        .expect("answered");
    assert_eq!(route, super::AnswerRoute::Task);
    fake.set_status("w2:p1", AgentStatus::Idle);
    settle().await;
    assert!(
        fake.typed()
            .iter()
            .any(|t| t.pane.as_str() == "w2:p1" && t.text.contains("main")),
        "{:?}",
        fake.typed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_clean_shutdown_keeps_members_and_their_open_tickets() {
    let (fake, disk) = ann_pane(AgentStatus::Working);
    let first = with_ann_registered(&disk, &fake).await;
    let ticket = task(&first, "ann", "job").await;
    first.shutdown().await.expect("engine");
    assert!(first.list().await.is_err(), "the engine stopped");
    assert!(
        disk.store
            .peek(&t("ann"), 10)
            .await
            .expect("peek")
            .is_empty(),
        "nothing released, no notice"
    );
    let second = disk.start(&fake);
    settle().await;
    assert_eq!(second.list().await.expect("engine").len(), 1);
    assert_eq!(state_of(&second, ticket).await, Some(TicketState::Queued));
}

/// Waits (in real time: git runs as a process) until `done` holds, for at most 20 s.
async fn real_wait(what: &str, mut done: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if done().await {
            return;
        }
        sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// What the pane `pane` (incarnation `t-<pane>`) is to `engine`, born `born_ago` before now.
async fn standing(engine: &EngineHandle, pane: &str, born_ago: u64) -> super::Standing {
    engine
        .standing(
            qualified(pane),
            fleetd_core::TerminalId::new(format!("t-{pane}").replace(':', "-")).expect("terminal"),
            Some(Duration::from_secs(born_ago)),
        )
        .await
        .expect("engine")
}

#[tokio::test(start_paused = true)]
async fn the_lead_rule_s_spans_survive_a_restart() {
    use super::Standing::{Lead, Stray};
    let fake = fake_with(&[
        (MEMBER, AgentStatus::Idle),
        (("w1:p2", "t-w1-p2", "w1:t2"), AgentStatus::Idle),
    ]);
    let disk = Disk::new();
    let clock: crate::clock::SharedClock = Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH));
    let first = disk.start_on(&fake, Arc::clone(&clock));
    assert_eq!(
        standing(&first, "w1:p1", 0).await,
        Lead,
        "no member ever: a lead"
    );
    sleep(Duration::from_secs(10)).await;
    first
        .add_member(new_member("ann", "w2:p1", "t-a"))
        .await
        .expect("engine");
    sleep(Duration::from_secs(10)).await; // now 20 s; ann here since 10 s
    assert_eq!(standing(&first, "w1:p2", 5).await, Stray, "born at 15 s");
    assert_eq!(standing(&first, "w1:p3", 15).await, Lead, "born at 5 s");
    disk.kill(first).await;
    let second = disk.start_on(&fake, Arc::clone(&clock));
    settle().await;
    assert_eq!(
        standing(&second, "w1:p2", 5).await,
        Stray,
        "still, after the restart"
    );
    assert_eq!(standing(&second, "w1:p3", 15).await, Lead);
    second
        .release(t("ann"), "stopped".to_owned())
        .await
        .expect("engine");
    settle().await;
    sleep(Duration::from_secs(20)).await;
    assert_eq!(
        standing(&second, "w1:p4", 18).await,
        Stray,
        "born within the settle time after the last member went"
    );
    assert_eq!(
        standing(&second, "w1:p5", 1).await,
        Lead,
        "born after the members"
    );
    // The operator admits a stray: a lead from then on, and after a restart.
    second
        .lead_seen(LeadRef {
            pane: qualified("w1:p2"),
            terminal: fleetd_core::TerminalId::new("t-w1-p2").expect("terminal"),
        })
        .await
        .expect("engine");
    assert_eq!(standing(&second, "w1:p2", 25).await, Lead, "admitted");
    disk.kill(second).await;
    let third = disk.start_on(&fake, clock);
    settle().await;
    assert_eq!(
        standing(&third, "w1:p6", 23).await,
        Stray,
        "born during ann's span"
    );
}

#[tokio::test(start_paused = true)]
async fn a_task_whose_turn_is_seen_starting_before_its_typing_answer_is_timed_as_delivered() {
    // CI, 2026-12-08: on a loaded machine the member's title said `working` before fleetd
    // heard the typing call's answer; the `delivered` that followed no longer applied, so the
    // task's wait was never charted (the dashboard's delivery chart stayed empty).
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let engine = with_ann(&disk, &fake).await;
    fake.fault("w2:p1", Some(crate::mux::fake::Fault::TypingHangs));
    let ticket = task(&engine, "ann", "count the pebbles").await;
    sleep(Duration::from_millis(700)).await;
    fake.set_status("w2:p1", AgentStatus::Working);
    settle().await;
    assert_eq!(state_of(&engine, ticket).await, Some(TicketState::Working));
    let delivery = engine.latency().delivery;
    assert_eq!(delivery.len(), 1, "{delivery:?}");
    assert!((690..=710).contains(&delivery[0].1), "{delivery:?}");
}

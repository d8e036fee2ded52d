//! Steps the engine's driver tests (`tests`, `tests_durable`, `tests_gateway`) share, written
//! once: a fake multiplexer holding the panes a story needs, a task sent as the operator, and a
//! refusal checked by its code and its words.

use fleetd_core::refusal::Refusal;
use fleetd_core::{AgentStatus, Target, Ticket};

use super::EngineHandle;
use crate::mux::fake::FakeMux;

/// A pane as these tests place it: its id, its terminal (incarnation) and its tab.
pub(super) type PanePlace = (&'static str, &'static str, &'static str);

/// The lead's pane: `w1:p1`, terminal `t-lead`, in tab `w1:t1` (the pinned primary tab where a
/// test's config pins one).
pub(super) const LEAD: PanePlace = ("w1:p1", "t-lead", "w1:t1");

/// The first member's pane: `w2:p1`, terminal `t-a`, in tab `w2:t1`.
pub(super) const MEMBER: PanePlace = ("w2:p1", "t-a", "w2:t1");

/// The second member's pane: `w2:p2`, terminal `t-b`, in tab `w2:t2`.
pub(super) const SECOND_MEMBER: PanePlace = ("w2:p2", "t-b", "w2:t2");

/// A fake multiplexer holding `panes`, each showing its status.
pub(super) fn fake_with(panes: &[(PanePlace, AgentStatus)]) -> FakeMux {
    let fake = FakeMux::new();
    for &((pane, terminal, tab), status) in panes {
        fake.add_pane(pane, terminal, tab, status);
    }
    fake
}

/// What the engine answers to `text` sent to member `to` by the operator (no lead, no
/// delegating member).
pub(super) async fn send_task(
    engine: &EngineHandle,
    to: &str,
    text: impl Into<String>,
) -> Result<Ticket, Refusal> {
    engine
        .submit(None, Target::new(to).expect("target"), text.into())
        .await
        .expect("engine")
}

/// [`send_task`], queued: its ticket.
pub(super) async fn task(engine: &EngineHandle, to: &str, text: impl Into<String>) -> Ticket {
    send_task(engine, to, text).await.expect("queued")
}

/// [`send_task`], refused with `code`, saying `says`.
pub(super) async fn task_refused(
    engine: &EngineHandle,
    to: &str,
    text: impl Into<String>,
    (code, says): (&str, &str),
) {
    let refused = send_task(engine, to, text).await.expect_err("refused");
    assert_refused(&refused, code, says);
}

/// Asserts `refusal` carries `code` and says `says`.
pub(super) fn assert_refused(refusal: &Refusal, code: &str, says: &str) {
    assert_eq!(refusal.code, code, "{refusal:?}");
    assert!(
        refusal.message.contains(says),
        "{says:?}: {}",
        refusal.message
    );
}

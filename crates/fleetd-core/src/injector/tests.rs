//! Injector tests: scripted inputs at given times, checked against the effects transcript.

use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("valid")
}

fn target(name: &str) -> Target {
    Target::new(name).expect("valid")
}

fn ticket(n: u64) -> Ticket {
    Ticket::from_parts(n, [0; 10])
}

/// One scripted step: at second `at`, feed `input`.
struct Step(i64, InjectorInput);

/// Runs `steps` through a fresh injector (grace 5 s) with member `a` added, and renders every
/// effect as a line `@<secs> <effect>` so a transcript reads like a log.
fn check(steps: Vec<Step>, expect: &[&str]) {
    let mut inj = Injector::new(SignedDuration::from_secs(5));
    inj.handle_at(
        InjectorInput::MemberAdded {
            target: target("a"),
        },
        t(0),
    );
    let names: BTreeMap<Ticket, String> = (1..=9).map(|n| (ticket(n), format!("T{n}"))).collect();
    let name = |tk: &Ticket| names.get(tk).cloned().unwrap_or_else(|| tk.to_string());
    let mut got = Vec::new();
    for Step(at, input) in steps {
        for effect in inj.handle_at(input, t(at)) {
            let line = match effect {
                InjectorEffect::Type { target, ticket } => {
                    format!("type {target} {}", name(&ticket))
                }
                InjectorEffect::Resubmit { target, ticket } => {
                    format!("enter {target} {}", name(&ticket))
                }
                InjectorEffect::Ticket { ticket, event } => format!("{} {event:?}", name(&ticket)),
                InjectorEffect::RecordFallback { target, ticket } => {
                    format!("fallback {target} {}", name(&ticket))
                }
            };
            got.push(format!("@{at} {line}"));
        }
    }
    assert_eq!(got, expect);
}

fn enqueue(n: u64) -> InjectorInput {
    InjectorInput::Enqueue {
        target: target("a"),
        ticket: ticket(n),
    }
}
fn status(activity: Activity) -> InjectorInput {
    InjectorInput::Activity {
        target: target("a"),
        activity,
    }
}
fn presence() -> InjectorInput {
    InjectorInput::PresenceSeen {
        target: target("a"),
    }
}
fn typed(n: u64, ok: bool) -> InjectorInput {
    InjectorInput::Typed {
        target: target("a"),
        ticket: ticket(n),
        ok,
    }
}
fn replied(n: u64) -> InjectorInput {
    InjectorInput::Replied {
        target: target("a"),
        ticket: ticket(n),
    }
}
fn recorded() -> InjectorInput {
    InjectorInput::FallbackRecorded {
        target: target("a"),
    }
}

#[test]
fn task_waits_for_rest_and_presence_then_is_verified() {
    check(
        vec![
            Step(0, enqueue(1)),
            Step(1, status(Activity::AtRest)),
            Step(2, presence()),
            Step(2, typed(1, true)),
            Step(3, status(Activity::Busy)),
            Step(9, replied(1)),
            Step(10, status(Activity::AtRest)),
        ],
        &["@2 type a T1", "@2 T1 Delivered", "@3 T1 TurnStarted"],
    );
}

#[test]
fn tasks_are_delivered_in_order_one_turn_at_a_time() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(1, enqueue(1)),
            Step(1, enqueue(2)),
            Step(1, typed(1, true)),
            Step(2, status(Activity::Busy)),
            Step(2, enqueue(3)),
            Step(5, replied(1)),
            Step(6, status(Activity::AtRest)),
            Step(6, typed(2, true)),
            Step(7, status(Activity::Busy)),
            Step(8, replied(2)),
            Step(9, status(Activity::AtRest)),
        ],
        &[
            "@1 type a T1",
            "@1 T1 Delivered",
            "@2 T1 TurnStarted",
            "@6 type a T2",
            "@6 T2 Delivered",
            "@7 T2 TurnStarted",
            "@9 type a T3",
        ],
    );
}

#[test]
fn unverified_submit_is_retried_once_then_stalled() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(0, enqueue(1)),
            Step(0, typed(1, true)),
            Step(4, InjectorInput::Tick),
            Step(5, InjectorInput::Tick),
            Step(5, typed(1, true)),
            Step(10, InjectorInput::Tick),
            Step(10, enqueue(2)),
        ],
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@5 enter a T1",
            "@10 T1 Stalled",
            "@10 type a T2",
        ],
    );
}

#[test]
fn retry_that_starts_the_turn_is_not_stalled() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(0, enqueue(1)),
            Step(0, typed(1, true)),
            Step(5, InjectorInput::Tick),
            Step(6, status(Activity::Busy)),
            Step(6, typed(1, true)),
            Step(20, InjectorInput::Tick),
        ],
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@5 enter a T1",
            "@6 T1 TurnStarted",
        ],
    );
}

#[test]
fn silent_turn_end_records_a_fallback_before_the_next_task() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(0, enqueue(1)),
            Step(0, enqueue(2)),
            Step(0, typed(1, true)),
            Step(1, status(Activity::Busy)),
            Step(3, status(Activity::AtRest)),
            Step(4, recorded()),
        ],
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@3 fallback a T1",
            "@4 type a T2",
        ],
    );
}

#[test]
fn typing_errors_retry_then_stall() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(0, enqueue(1)),
            Step(0, typed(1, false)),
            Step(0, InjectorInput::Tick),
            Step(1, InjectorInput::Tick),
            Step(1, typed(1, false)),
            Step(2, InjectorInput::Tick),
            Step(2, typed(1, false)),
        ],
        &[
            "@0 type a T1",
            "@1 type a T1",
            "@2 type a T1",
            "@2 T1 Stalled",
        ],
    );
}

#[test]
fn busy_member_is_never_typed_into() {
    check(
        vec![
            Step(0, presence()),
            Step(0, status(Activity::Busy)),
            Step(0, enqueue(1)),
            Step(30, InjectorInput::Tick),
            Step(31, status(Activity::Unknown)),
            Step(32, InjectorInput::Tick),
        ],
        &[],
    );
}

#[test]
fn next_wake_is_the_verify_deadline() {
    let mut inj = Injector::new(SignedDuration::from_secs(5));
    let a = target("a");
    inj.handle_at(InjectorInput::MemberAdded { target: a.clone() }, t(0));
    inj.handle_at(InjectorInput::PresenceSeen { target: a.clone() }, t(0));
    inj.handle_at(
        InjectorInput::Activity {
            target: a.clone(),
            activity: Activity::AtRest,
        },
        t(0),
    );
    inj.handle_at(
        InjectorInput::Enqueue {
            target: a.clone(),
            ticket: ticket(1),
        },
        t(0),
    );
    assert_eq!(inj.next_wake(), None);
    inj.handle_at(
        InjectorInput::Typed {
            target: a.clone(),
            ticket: ticket(1),
            ok: true,
        },
        t(2),
    );
    assert_eq!(inj.next_wake(), Some(t(7)));
    assert_eq!(inj.current(&a), Some(ticket(1)));
    assert_eq!(inj.queued(&a), 0);
}

#[test]
fn a_reply_verifies_delivery_even_when_working_was_never_seen() {
    check(
        vec![
            Step(0, status(Activity::AtRest)),
            Step(0, presence()),
            Step(0, enqueue(1)),
            Step(0, enqueue(2)),
            Step(0, typed(1, true)),
            // The turn was shorter than the status poll: only the reply shows it happened.
            Step(1, replied(1)),
            Step(1, typed(2, true)),
            Step(20, InjectorInput::Tick),
        ],
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 type a T2",
            "@1 T2 Delivered",
            "@20 enter a T2",
        ],
    );
}

#[test]
fn a_turn_restored_after_a_restart_is_never_typed_again() {
    let mut inj = Injector::new(SignedDuration::from_secs(5));
    let a = target("a");
    inj.handle_at(InjectorInput::MemberAdded { target: a.clone() }, t(0));
    inj.handle_at(presence(), t(0));
    // T1 was typed before the restart; T2 was still queued.
    inj.restore_current(&a, ticket(1));
    assert!(
        inj.handle_at(enqueue(2), t(0)).is_empty(),
        "T1's turn first"
    );
    assert_eq!(inj.current(&a), Some(ticket(1)));
    // The member is found at rest: T1's turn ended while fleetd was down, without a reply.
    assert_eq!(
        inj.handle_at(status(Activity::AtRest), t(1)),
        [InjectorEffect::RecordFallback {
            target: a.clone(),
            ticket: ticket(1)
        }]
    );
    assert_eq!(
        inj.handle_at(recorded(), t(2)),
        [InjectorEffect::Type {
            target: a.clone(),
            ticket: ticket(2)
        }],
        "then the queued task, and never T1 again"
    );
}

#[test]
fn a_restored_turn_that_is_answered_needs_no_fallback() {
    let mut inj = Injector::new(SignedDuration::from_secs(5));
    let a = target("a");
    inj.handle_at(InjectorInput::MemberAdded { target: a.clone() }, t(0));
    inj.restore_current(&a, ticket(1));
    inj.handle_at(status(Activity::Busy), t(0));
    assert!(inj.handle_at(replied(1), t(1)).is_empty());
    assert!(inj.handle_at(status(Activity::AtRest), t(2)).is_empty());
}

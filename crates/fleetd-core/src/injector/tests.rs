//! Injector tests: scripted inputs at given times, checked against the effects transcript, and a
//! property test for SPEC §13.7 (a task is never typed twice unless its typing wrote nothing) and
//! one Enter retry per delivery.

use proptest::prelude::*;

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

/// A fresh injector (grace 5 s) with member `a` added, then fed `inputs` at @0; what those
/// answer is not looked at.
fn injector(inputs: Vec<InjectorInput>) -> Injector {
    let mut inj = Injector::new(SignedDuration::from_secs(5));
    inj.handle_at(
        InjectorInput::MemberAdded {
            target: target("a"),
        },
        t(0),
    );
    for input in inputs {
        inj.handle_at(input, t(0));
    }
    inj
}

/// Runs `steps` through [`injector`]`([])`, and renders every effect as a line
/// `@<secs> <effect>` so a transcript reads like a log.
fn check(steps: Vec<Step>, expect: &[&str]) {
    let mut inj = injector(vec![]);
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
fn typed(n: u64, outcome: TypeOutcome) -> InjectorInput {
    InjectorInput::Typed {
        target: target("a"),
        ticket: ticket(n),
        outcome,
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

/// `a` at rest and present at @0, then `then`: where most cases start.
fn ready(then: Vec<Step>) -> Vec<Step> {
    let mut steps = vec![Step(0, status(Activity::AtRest)), Step(0, presence())];
    steps.extend(then);
    steps
}

/// [`ready`], then at @0 T1 and the `behind` tasks queued and T1's typing answered with
/// `outcome`, then `then`.
fn t1_typed(outcome: TypeOutcome, behind: &[u64], then: Vec<Step>) -> Vec<Step> {
    let mut steps = vec![Step(0, enqueue(1))];
    steps.extend(behind.iter().map(|&n| Step(0, enqueue(n))));
    steps.push(Step(0, typed(1, outcome)));
    steps.extend(then);
    ready(steps)
}

#[test]
fn task_waits_for_rest_and_presence_then_is_verified() {
    check(
        vec![
            Step(0, enqueue(1)),
            Step(1, status(Activity::AtRest)),
            Step(2, presence()),
            Step(2, typed(1, TypeOutcome::Accepted)),
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
        ready(vec![
            Step(1, enqueue(1)),
            Step(1, enqueue(2)),
            Step(1, typed(1, TypeOutcome::Accepted)),
            Step(2, status(Activity::Busy)),
            Step(2, enqueue(3)),
            Step(5, replied(1)),
            Step(6, status(Activity::AtRest)),
            Step(6, typed(2, TypeOutcome::Accepted)),
            Step(7, status(Activity::Busy)),
            Step(8, replied(2)),
            Step(9, status(Activity::AtRest)),
        ]),
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
        t1_typed(
            TypeOutcome::Accepted,
            &[],
            vec![
                Step(4, InjectorInput::Tick),
                Step(5, InjectorInput::Tick),
                Step(5, typed(1, TypeOutcome::Accepted)),
                Step(10, InjectorInput::Tick),
                Step(10, enqueue(2)),
            ],
        ),
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
        t1_typed(
            TypeOutcome::Accepted,
            &[],
            vec![
                Step(5, InjectorInput::Tick),
                Step(6, status(Activity::Busy)),
                Step(6, typed(1, TypeOutcome::Accepted)),
                Step(20, InjectorInput::Tick),
            ],
        ),
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
        t1_typed(
            TypeOutcome::Accepted,
            &[2],
            vec![
                Step(1, status(Activity::Busy)),
                Step(3, status(Activity::AtRest)),
                Step(4, recorded()),
            ],
        ),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@3 fallback a T1",
            "@4 type a T2",
        ],
    );
}

fn delegating(outstanding: bool) -> InjectorInput {
    InjectorInput::Delegating {
        target: target("a"),
        outstanding,
    }
}

/// [`t1_typed`] accepted with `behind` queued; T1's turn starts at @1, hands work to `a`'s own
/// members at @2 and ends at @3 waiting on it; then `then`.
fn t1_waiting_on_delegates(behind: &[u64], then: Vec<Step>) -> Vec<Step> {
    let mut steps = vec![
        Step(1, status(Activity::Busy)),
        Step(2, delegating(true)),
        Step(3, status(Activity::AtRest)),
    ];
    steps.extend(then);
    t1_typed(TypeOutcome::Accepted, behind, steps)
}

/// A member that handed part of its task to its own members and ended its turn is still on that
/// task: no fallback, nothing else typed; the turn its nudge starts answers it.
#[test]
fn a_turn_that_ends_waiting_on_delegated_work_is_answered_in_a_later_turn() {
    check(
        t1_waiting_on_delegates(
            &[2],
            vec![
                // Its member replied; the nudge starts a turn, in which it answers T1.
                Step(9, status(Activity::Busy)),
                Step(10, delegating(false)),
                Step(11, replied(1)),
                Step(12, status(Activity::AtRest)),
            ],
        ),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@12 type a T2",
        ],
    );
}

/// Its members' mail read and nothing answered: the turn is over once the work is in, and its
/// fallback is recorded then (at rest), or at its next rest.
#[test]
fn a_turn_waiting_on_delegated_work_gets_its_fallback_when_the_work_is_in() {
    check(
        t1_waiting_on_delegates(&[], vec![Step(5, delegating(false))]),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@5 fallback a T1",
        ],
    );
    check(
        t1_waiting_on_delegates(
            &[],
            vec![
                Step(9, status(Activity::Busy)),
                Step(10, delegating(false)),
                Step(12, status(Activity::AtRest)),
            ],
        ),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@12 fallback a T1",
        ],
    );
}

/// A nudge typed into a delegating member's pane holds its tasks back until the nudge's turn
/// is seen (or the hold runs out): the two are never typed on top of each other.
#[test]
fn a_hold_keeps_tasks_back_until_the_member_is_seen_busy_or_it_runs_out() {
    let hold = |until: Option<i64>| InjectorInput::Hold {
        target: target("a"),
        until: until.map(t),
    };
    check(
        ready(vec![
            Step(1, hold(Some(6))),
            Step(2, enqueue(1)),
            Step(3, status(Activity::Busy)),
            Step(4, status(Activity::AtRest)),
            Step(4, typed(1, TypeOutcome::Accepted)),
            Step(4, status(Activity::Busy)),
            Step(4, replied(1)),
            Step(5, status(Activity::AtRest)),
            Step(5, hold(Some(20))),
            Step(6, enqueue(2)),
            Step(19, InjectorInput::Tick),
            Step(20, InjectorInput::Tick),
        ]),
        &[
            "@4 type a T1",
            "@4 T1 Delivered",
            "@4 T1 TurnStarted",
            "@20 type a T2",
        ],
    );
    let mut inj = injector(vec![status(Activity::AtRest), presence(), hold(Some(9))]);
    inj.handle_at(enqueue(1), t(1));
    assert!(!inj.would_type(&target("a"), t(1)), "held");
    assert_eq!(inj.next_wake(), Some(t(9)), "a wake when the hold runs out");
    assert!(inj.would_type(&target("a"), t(9)));
    assert_eq!(
        inj.handle_at(hold(None), t(2)),
        vec![InjectorEffect::Type {
            target: target("a"),
            ticket: ticket(1)
        }],
        "lifted: typed at once"
    );
}

#[test]
fn typing_errors_retry_then_stall() {
    check(
        t1_typed(
            TypeOutcome::Failed,
            &[],
            vec![
                Step(0, InjectorInput::Tick),
                Step(1, InjectorInput::Tick),
                Step(1, typed(1, TypeOutcome::Failed)),
                Step(2, InjectorInput::Tick),
                Step(2, typed(1, TypeOutcome::Failed)),
            ],
        ),
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
    let a = target("a");
    let mut inj = injector(vec![presence(), status(Activity::AtRest), enqueue(1)]);
    assert_eq!(inj.next_wake(), None);
    inj.handle_at(typed(1, TypeOutcome::Accepted), t(2));
    assert_eq!(inj.next_wake(), Some(t(7)));
    assert_eq!(inj.current(&a), Some(ticket(1)));
    assert_eq!(inj.queued(&a), 0);
}

#[test]
fn a_reply_verifies_delivery_even_when_working_was_never_seen() {
    check(
        t1_typed(
            TypeOutcome::Accepted,
            &[2],
            vec![
                // The turn was shorter than the status poll: only the reply shows it happened.
                Step(1, replied(1)),
                Step(1, typed(2, TypeOutcome::Accepted)),
                Step(20, InjectorInput::Tick),
            ],
        ),
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
fn a_status_blip_before_the_task_was_submitted_is_not_its_turn() {
    // Codex's start-up spinner read busy after the task was typed, then at rest, while the text
    // still sat in its composer: no fallback, Enter once more, and the task's
    // real turn is the one that counts.
    let not_submitted = InjectorInput::NotSubmitted {
        target: target("a"),
        ticket: ticket(1),
    };
    check(
        t1_typed(
            TypeOutcome::Accepted,
            &[2],
            vec![
                Step(1, status(Activity::Busy)),
                Step(1, status(Activity::AtRest)),
                Step(1, not_submitted),
                Step(1, typed(1, TypeOutcome::Accepted)),
                Step(2, status(Activity::Busy)),
                Step(3, replied(1)),
                Step(4, status(Activity::AtRest)),
            ],
        ),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@1 fallback a T1",
            "@1 enter a T1",
            "@2 T1 TurnStarted",
            "@4 type a T2",
        ],
    );
}

#[test]
fn a_blip_at_rest_before_a_dialog_does_not_end_the_turn() {
    // The member's title read at rest a moment before its permission dialog was drawn: the
    // fallback's look finds it busy again, nothing is recorded, and the turn that counts ends
    // after the dialog — answered (no fallback) or not (its fallback then).
    let goes_on = |answered| InjectorInput::TurnGoesOn {
        target: target("a"),
        ticket: ticket(1),
        answered,
    };
    for (answered, end) in [(false, "@4 fallback a T1"), (true, "@4 type a T2")] {
        let mut steps = vec![
            Step(1, status(Activity::Busy)),
            Step(1, status(Activity::AtRest)),
            Step(1, status(Activity::Busy)),
            Step(2, goes_on(answered)),
            Step(4, status(Activity::AtRest)),
        ];
        if !answered {
            steps.push(Step(5, recorded()));
        }
        let mut expect = vec![
            "@0 type a T1",
            "@0 T1 Delivered",
            "@1 T1 TurnStarted",
            "@1 fallback a T1",
            end,
        ];
        if !answered {
            expect.push("@5 type a T2");
        }
        check(t1_typed(TypeOutcome::Accepted, &[2], steps), &expect);
    }
}

#[test]
fn a_turn_restored_after_a_restart_is_never_typed_again() {
    let a = target("a");
    let mut inj = injector(vec![presence()]);
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
fn an_uncertain_typing_is_verified_and_never_typed_again() {
    // The call timed out after the text went out: the member's status decides, and the text
    // is not typed a second time even though the ticket is still at the head of the lane.
    check(
        t1_typed(
            TypeOutcome::Uncertain,
            &[2],
            vec![
                Step(1, InjectorInput::Tick),
                Step(2, status(Activity::Busy)),
                Step(3, replied(1)),
                Step(4, status(Activity::AtRest)),
            ],
        ),
        &["@0 type a T1", "@2 T1 TurnStarted", "@4 type a T2"],
    );
}

#[test]
fn a_typing_in_doubt_after_a_restart_holds_its_lane_until_the_driver_has_looked() {
    let a = target("a");
    let mut inj = injector(vec![presence(), status(Activity::AtRest)]);
    // T1 was handed to the multiplexer before the restart; T2 was queued behind it.
    inj.restore_typing(&a, ticket(1));
    assert!(
        inj.handle_at(enqueue(2), t(0)).is_empty(),
        "nothing is typed while T1 is in doubt"
    );
    assert!(inj.handle_at(InjectorInput::Tick, t(3)).is_empty());
    // The pane shows it never arrived: T1 is typed again, before T2.
    assert!(
        inj.handle_at(typed(1, TypeOutcome::Failed), t(4))
            .is_empty(),
        "after the retry pause"
    );
    assert_eq!(
        inj.handle_at(InjectorInput::Tick, t(6)),
        [InjectorEffect::Type {
            target: a.clone(),
            ticket: ticket(1)
        }]
    );
    // Had the pane shown it, it would have been verified like an uncertain typing: never typed
    // again, its one Enter retry after the grace.
    let mut arrived = injector(vec![presence(), status(Activity::AtRest)]);
    arrived.restore_typing(&a, ticket(1));
    assert!(
        arrived
            .handle_at(typed(1, TypeOutcome::Uncertain), t(1))
            .is_empty()
    );
    assert_eq!(
        arrived.handle_at(InjectorInput::Tick, t(6)),
        [InjectorEffect::Resubmit {
            target: a.clone(),
            ticket: ticket(1)
        }]
    );
}

#[test]
fn a_restored_turn_that_is_answered_needs_no_fallback() {
    let a = target("a");
    let mut inj = injector(vec![]);
    inj.restore_current(&a, ticket(1));
    inj.handle_at(status(Activity::Busy), t(0));
    assert!(inj.handle_at(replied(1), t(1)).is_empty());
    assert!(inj.handle_at(status(Activity::AtRest), t(2)).is_empty());
}

#[test]
fn an_uncertain_typing_that_never_starts_gets_one_enter_then_stalls() {
    check(
        t1_typed(
            TypeOutcome::Uncertain,
            &[],
            vec![
                Step(5, InjectorInput::Tick),
                Step(5, typed(1, TypeOutcome::Uncertain)),
                Step(10, InjectorInput::Tick),
                Step(11, InjectorInput::Tick),
            ],
        ),
        &["@0 type a T1", "@5 enter a T1", "@10 T1 Stalled"],
    );
}

#[test]
fn a_failed_enter_retry_never_types_the_task_again() {
    // The text was typed; only the Enter press failed. Retyping would run the task twice.
    check(
        t1_typed(
            TypeOutcome::Accepted,
            &[],
            vec![
                Step(5, InjectorInput::Tick),
                Step(5, typed(1, TypeOutcome::Failed)),
                Step(6, InjectorInput::Tick),
                Step(7, InjectorInput::Tick),
                Step(10, InjectorInput::Tick),
            ],
        ),
        &[
            "@0 type a T1",
            "@0 T1 Delivered",
            "@5 enter a T1",
            "@10 T1 Stalled",
        ],
    );
}

#[test]
fn a_typing_the_multiplexer_saw_start_is_the_turn_starting() {
    // herdr saw the member reach working: no grace, no Enter retry; the turn's end is the
    // usual status change.
    check(
        ready(vec![
            Step(0, enqueue(1)),
            Step(0, enqueue(2)),
            Step(1, typed(1, TypeOutcome::Started)),
            Step(20, InjectorInput::Tick),
            Step(21, status(Activity::Busy)),
            Step(22, status(Activity::AtRest)),
            Step(23, recorded()),
        ]),
        &[
            "@0 type a T1",
            "@1 T1 Delivered",
            "@1 T1 TurnStarted",
            "@22 fallback a T1",
            "@23 type a T2",
        ],
    );
}

#[test]
fn a_started_report_after_the_busy_reading_changes_nothing() {
    check(
        ready(vec![
            Step(0, enqueue(1)),
            Step(1, status(Activity::Busy)),
            Step(1, typed(1, TypeOutcome::Started)),
            Step(2, replied(1)),
            Step(3, status(Activity::AtRest)),
        ]),
        &["@0 type a T1", "@1 T1 TurnStarted"],
    );
}

/// What a `Typed` report arriving now answers, as seen from the effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaited {
    Text,
    Enter,
}

fn any_step() -> impl Strategy<Value = (InjectorInput, i64)> {
    let tickets = 1u64..4;
    let input = prop_oneof![
        tickets.clone().prop_map(enqueue),
        prop_oneof![
            Just(Activity::AtRest),
            Just(Activity::Busy),
            Just(Activity::Unknown)
        ]
        .prop_map(status),
        Just(presence()),
        (
            tickets.clone(),
            prop_oneof![
                Just(TypeOutcome::Accepted),
                Just(TypeOutcome::Started),
                Just(TypeOutcome::Uncertain),
                Just(TypeOutcome::Failed)
            ]
        )
            .prop_map(|(n, outcome)| typed(n, outcome)),
        tickets.clone().prop_map(replied),
        Just(recorded()),
        (tickets, any::<bool>()).prop_map(|(n, answered)| InjectorInput::TurnGoesOn {
            target: target("a"),
            ticket: ticket(n),
            answered,
        }),
        any::<bool>().prop_map(delegating),
        (0i64..10).prop_map(|s| InjectorInput::Hold {
            target: target("a"),
            until: Some(t(s)),
        }),
        Just(InjectorInput::Tick),
    ];
    (input, 0i64..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// SPEC §13.7: a task's text is typed again only after a typing of that text that wrote
    /// nothing — never after one that may have typed it, and never after a failed Enter retry;
    /// and each typing gets one Enter retry at most.
    #[test]
    fn a_task_is_typed_again_only_after_a_typing_that_wrote_nothing(
        steps in proptest::collection::vec(any_step(), 1..80)
    ) {
        let mut inj = injector(vec![]);
        let mut now = t(0);
        let mut enqueued = std::collections::BTreeSet::new();
        let mut awaited: BTreeMap<Ticket, Awaited> = BTreeMap::new();
        let mut typings: BTreeMap<Ticket, u32> = BTreeMap::new();
        let mut allowed: BTreeMap<Ticket, u32> = BTreeMap::new();
        let mut enters: BTreeMap<Ticket, u32> = BTreeMap::new();
        for (input, gap) in steps {
            now += SignedDuration::from_secs(gap);
            match &input {
                // A ticket is enqueued once, as the daemon does.
                InjectorInput::Enqueue { ticket, .. } if !enqueued.insert(*ticket) => continue,
                InjectorInput::Typed { ticket, outcome, .. } => {
                    let answers = awaited.remove(ticket);
                    if answers == Some(Awaited::Text) && *outcome == TypeOutcome::Failed {
                        *allowed.entry(*ticket).or_default() += 1;
                    }
                }
                _ => {}
            }
            for effect in inj.handle_at(input, now) {
                match effect {
                    InjectorEffect::Type { ticket, .. } => {
                        *typings.entry(ticket).or_default() += 1;
                        awaited.insert(ticket, Awaited::Text);
                    }
                    InjectorEffect::Resubmit { ticket, .. } => {
                        *enters.entry(ticket).or_default() += 1;
                        awaited.insert(ticket, Awaited::Enter);
                    }
                    _ => {}
                }
            }
        }
        for (ticket, n) in &typings {
            let allowed = allowed.get(ticket).copied().unwrap_or(0);
            prop_assert!(*n <= 1 + allowed, "{ticket} typed {n} times, {allowed} failed typings");
        }
        // Review M6: one Enter retry per delivery, at most.
        for (ticket, n) in &enters {
            let typed = typings.get(ticket).copied().unwrap_or(0);
            prop_assert!(*n <= typed, "{ticket}: {n} Enter retries for {typed} typings");
        }
    }
}

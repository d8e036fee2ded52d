//! Push-loop tests: scripted transcripts for the rules, and property tests for SPEC §13's
//! invariants 2 and 3 (never while working, never over budget, never after the mail is read;
//! one transient failure never forgets a binding, an affirmative not-found always does).

use proptest::prelude::*;

use super::*;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("valid")
}

fn target(name: &str) -> Target {
    Target::new(name).expect("valid")
}

fn lead(name: &str) -> LeadId {
    LeadId(name.to_owned())
}

fn config() -> PushConfig {
    PushConfig {
        reminders: 3,
        backoff: SignedDuration::from_secs(30),
        backoff_max: SignedDuration::from_secs(100),
    }
}

fn render(effect: &PushEffect) -> String {
    match effect {
        PushEffect::Inject { lead, text } => format!("inject {lead}: {text}"),
        PushEffect::ForgetBinding { target, lead } => format!("forget {target}->{lead}"),
        PushEffect::Count(m) => format!("count {m:?}"),
        PushEffect::GaveUp { lead, reminders } => format!("gave up {lead} after {reminders}"),
    }
}

/// Feeds `(second, input)` steps and returns every effect as `@<secs> <effect>`.
fn run(steps: Vec<(i64, PushInput)>) -> Vec<String> {
    let mut push = PushLoop::new(config());
    let mut out = Vec::new();
    for (at, input) in steps {
        for effect in push.handle_at(input, t(at)) {
            out.push(format!("@{at} {}", render(&effect)));
        }
    }
    out
}

fn status(l: &str, activity: LeadActivity) -> PushInput {
    PushInput::LeadStatus {
        lead: lead(l),
        activity,
    }
}
fn inbox(name: &str, pending: u64) -> PushInput {
    PushInput::Inbox {
        target: target(name),
        pending,
    }
}
fn injected(l: &str, outcome: InjectOutcome) -> PushInput {
    PushInput::Injected {
        lead: lead(l),
        outcome,
    }
}
fn delivered(l: &str) -> PushInput {
    injected(l, InjectOutcome::Delivered)
}
fn bound(name: &str, l: &str) -> PushInput {
    PushInput::Bound {
        target: target(name),
        lead: lead(l),
    }
}

/// The primary `p`, receptive at @0, then `then`: where most cases start.
fn primary_receptive(then: Vec<(i64, PushInput)>) -> Vec<(i64, PushInput)> {
    let mut steps = vec![
        (0, PushInput::Primary(Some(lead("p")))),
        (0, status("p", LeadActivity::Receptive)),
    ];
    steps.extend(then);
    steps
}

/// A push loop with a budget of `reminders`, fed [`primary_receptive`]'s steps.
fn primary_loop(reminders: u32) -> PushLoop {
    let mut push = PushLoop::new(PushConfig {
        reminders,
        ..config()
    });
    for (at, input) in primary_receptive(vec![]) {
        push.handle_at(input, t(at));
    }
    push
}

/// Each line up to its first `:`: an inject without its text.
fn heads(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .map(|l| l.split(':').next().unwrap_or_default())
        .collect()
}

#[test]
fn idle_primary_is_nudged_at_once_without_payload() {
    let got = run(primary_receptive(vec![
        (1, inbox("alice", 2)),
        (
            1,
            PushInput::QuestionOpened {
                target: target("bob"),
                question_id: "q1".into(),
            },
        ),
    ]));
    assert_eq!(
        got,
        [
            "@1 count Nudged",
            "@1 inject p: [fleet] 2 messages from alice waiting — call fleet_poll(target=\"alice\") (then fleet_ack the messages you have read)",
        ]
    );
}

#[test]
fn working_lead_is_nudged_only_after_going_idle() {
    let got = run(vec![
        (0, PushInput::Primary(Some(lead("p")))),
        (0, status("p", LeadActivity::Busy)),
        (1, inbox("alice", 1)),
        (5, PushInput::Tick),
        (9, status("p", LeadActivity::Receptive)),
    ]);
    assert_eq!(
        got,
        [
            "@1 count DeferredBusy",
            "@9 count Nudged",
            "@9 inject p: [fleet] 1 message from alice waiting — call fleet_poll(target=\"alice\") (then fleet_ack the messages you have read)",
        ]
    );
}

#[test]
fn a_nudge_refused_as_busy_goes_out_when_the_lead_is_receptive_again() {
    let got = run(primary_receptive(vec![
        (1, inbox("alice", 1)),
        // The multiplexer saw the lead busy (a dialog opened just before the typing).
        (1, injected("p", InjectOutcome::Busy)),
        (1, status("p", LeadActivity::Busy)),
        // Receptive again well before the 2 s retry: nudged at once.
        (2, status("p", LeadActivity::Receptive)),
        (2, delivered("p")),
        // A transient failure still waits out its retry, receptive or not.
        (40, inbox("alice", 2)),
        (40, injected("p", InjectOutcome::Transient)),
        (40, status("p", LeadActivity::Receptive)),
        (41, PushInput::Tick),
        (42, PushInput::Tick),
    ]));
    let got: Vec<String> = got.into_iter().filter(|l| !l.contains("inject")).collect();
    assert_eq!(
        got,
        [
            "@1 count Nudged",
            "@1 count DeferredBusy",
            "@2 count Nudged",
            "@40 count Nudged",
            "@40 count InjectFailed",
            "@42 count Nudged",
        ]
    );
}

#[test]
fn reminders_back_off_exponentially_then_give_up_and_reading_stops_them() {
    let mut steps = primary_receptive(vec![(0, inbox("alice", 1)), (0, delivered("p"))]);
    for at in [29, 30, 59, 90, 150, 250, 400] {
        steps.push((at, PushInput::Tick));
        steps.push((at, delivered("p")));
    }
    let got: Vec<String> = run(steps)
        .into_iter()
        .filter(|l| !l.contains("inject"))
        .collect();
    // 30 s after the 1st, 60 s after the 2nd, then capped at 100 s: the 3rd is the budget, and
    // the batch gives up when a 4th would have been due (190 s), seen at the next tick.
    assert_eq!(
        got,
        [
            "@0 count Nudged",
            "@30 count Nudged",
            "@90 count Nudged",
            "@250 count Exhausted",
            "@250 gave up p after 3",
        ]
    );
    let got = run(primary_receptive(vec![
        (0, inbox("alice", 1)),
        (0, delivered("p")),
        (10, inbox("alice", 0)),
        (100, PushInput::Tick),
    ]));
    assert_eq!(got.iter().filter(|l| l.contains("Nudged")).count(), 1);
}

#[test]
fn delegating_lead_gets_its_members_mail_and_a_gone_lead_falls_back_to_the_primary() {
    let got = run(vec![
        (0, PushInput::Primary(Some(lead("p")))),
        (0, bound("alice", "d")),
        (0, status("p", LeadActivity::Receptive)),
        (0, status("d", LeadActivity::Receptive)),
        (1, inbox("alice", 1)),
        (2, injected("d", InjectOutcome::NotFound)),
    ]);
    assert_eq!(
        heads(&got),
        [
            "@1 count Nudged",
            "@1 inject d",
            "@2 forget alice->d",
            "@2 count BindingForgotten",
            "@2 count Nudged",
            "@2 inject p"
        ]
    );
}

#[test]
fn transient_failure_keeps_the_binding_and_retries() {
    let got = run(vec![
        (0, bound("alice", "d")),
        (0, status("d", LeadActivity::Receptive)),
        (1, inbox("alice", 1)),
        (2, injected("d", InjectOutcome::Transient)),
        (3, PushInput::Tick),
        (4, PushInput::Tick),
    ]);
    // Retried TRANSIENT_RETRY (2 s) after the failure, not a whole backoff later.
    assert_eq!(
        heads(&got),
        [
            "@1 count Nudged",
            "@1 inject d",
            "@2 count InjectFailed",
            "@4 count Nudged",
            "@4 inject d"
        ]
    );
}

#[test]
fn an_uncertain_nudge_counts_as_sent_and_is_not_typed_again() {
    let got = run(primary_receptive(vec![
        (1, inbox("alice", 1)),
        (2, injected("p", InjectOutcome::Uncertain)),
        // A transient failure would be retried here (TRANSIENT_RETRY); this one is not.
        (4, PushInput::Tick),
        (10, PushInput::Tick),
        // The next reminder comes after the ordinary backoff (30 s after the first).
        (31, PushInput::Tick),
    ]));
    assert_eq!(
        heads(&got),
        [
            "@1 count Nudged",
            "@1 inject p",
            "@2 count InjectUncertain",
            "@31 count Nudged",
            "@31 inject p"
        ]
    );
}

#[test]
fn an_uncertain_nudge_spends_the_budget() {
    let mut push = primary_loop(1);
    assert!(
        push.handle_at(inbox("alice", 1), t(0))
            .contains(&PushEffect::Count(PushMetric::Nudged))
    );
    push.handle_at(injected("p", InjectOutcome::Uncertain), t(1));
    let later = push.handle_at(PushInput::Tick, t(40));
    assert!(
        later.contains(&PushEffect::Count(PushMetric::Exhausted)),
        "{later:?}"
    );
    assert!(
        !later.iter().any(|e| matches!(e, PushEffect::Inject { .. })),
        "{later:?}"
    );
}

#[test]
fn no_lead_means_pull_only() {
    let got = run(vec![(0, inbox("alice", 1)), (50, PushInput::Tick)]);
    assert_eq!(got, ["@0 count NoLead"]);
}

#[test]
fn new_mail_after_giving_up_starts_a_new_batch() {
    let mut push = primary_loop(1);
    push.handle_at(inbox("alice", 1), t(0));
    push.handle_at(delivered("p"), t(0));
    let gave_up = push.handle_at(PushInput::Tick, t(40));
    assert!(gave_up.contains(&PushEffect::Count(PushMetric::Exhausted)));
    assert!(push.handle_at(PushInput::Tick, t(500)).is_empty());
    let again = push.handle_at(inbox("alice", 2), t(600));
    assert!(
        again.contains(&PushEffect::Count(PushMetric::Nudged)),
        "{again:?}"
    );
    // Reading one of two is not new mail.
    push.handle_at(delivered("p"), t(600));
    push.handle_at(PushInput::Tick, t(700));
    assert!(
        !push
            .handle_at(inbox("alice", 1), t(800))
            .contains(&PushEffect::Count(PushMetric::Nudged))
    );
}

/// Mail that grows while the last reminder's backoff runs is a new batch when the backoff
/// ends — not a give-up that only a later, unrelated input would undo.
#[test]
fn mail_that_grows_during_the_last_backoff_is_nudged_when_it_ends() {
    let mut push = primary_loop(1);
    push.handle_at(inbox("alice", 1), t(0));
    push.handle_at(delivered("p"), t(0));
    assert!(
        !push
            .handle_at(inbox("bob", 1), t(10))
            .contains(&PushEffect::Count(PushMetric::Nudged)),
        "within the backoff"
    );
    assert_eq!(push.next_wake(), Some(t(30)), "a wake at the backoff's end");
    let out = push.handle_at(PushInput::Tick, t(30));
    assert!(
        out.iter()
            .any(|e| matches!(e, PushEffect::Inject { text, .. } if text.contains("from bob"))),
        "{out:?}"
    );
    assert!(
        !out.contains(&PushEffect::Count(PushMetric::Exhausted)),
        "{out:?}"
    );
}

fn any_input() -> impl Strategy<Value = PushInput> {
    let leads = prop_oneof![Just("p"), Just("d")];
    let targets = prop_oneof![Just("alice"), Just("bob")];
    prop_oneof![
        leads
            .clone()
            .prop_map(|l| PushInput::Primary(Some(lead(l)))),
        (targets.clone(), leads.clone()).prop_map(|(t, l)| PushInput::Bound {
            target: target(t),
            lead: lead(l)
        }),
        targets
            .clone()
            .prop_map(|t| PushInput::Unbound { target: target(t) }),
        (targets.clone(), 0u64..3).prop_map(|(t, n)| inbox(t, n)),
        (targets, 0u8..2).prop_map(|(t, q)| PushInput::QuestionOpened {
            target: target(t),
            question_id: format!("q{q}")
        }),
        (0u8..2).prop_map(|q| PushInput::QuestionClosed {
            question_id: format!("q{q}")
        }),
        (
            leads.clone(),
            prop_oneof![
                Just(LeadActivity::Receptive),
                Just(LeadActivity::Busy),
                Just(LeadActivity::Unknown)
            ]
        )
            .prop_map(|(l, a)| status(l, a)),
        (
            leads.clone(),
            prop_oneof![
                Just(InjectOutcome::Delivered),
                Just(InjectOutcome::NotFound),
                Just(InjectOutcome::Transient),
                Just(InjectOutcome::Uncertain)
            ]
        )
            .prop_map(|(l, outcome)| PushInput::Injected {
                lead: lead(l),
                outcome
            }),
        leads.prop_map(|l| PushInput::LeadGone { lead: lead(l) }),
        Just(PushInput::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold(steps in proptest::collection::vec((any_input(), 0i64..200), 1..60)) {
        let mut push = PushLoop::new(config());
        let mut now = t(0);
        let mut activity: BTreeMap<LeadId, LeadActivity> = BTreeMap::new();
        let mut sent_in_batch: BTreeMap<LeadId, u32> = BTreeMap::new();
        for (input, gap) in steps {
            now += SignedDuration::from_secs(gap);
            let bindings_before = push.bindings.clone();
            let failure = match &input {
                PushInput::Injected { lead, outcome } => Some((lead.clone(), *outcome)),
                PushInput::LeadGone { lead } => Some((lead.clone(), InjectOutcome::NotFound)),
                _ => None,
            };
            if let PushInput::LeadStatus { lead, activity: a } = &input {
                activity.insert(lead.clone(), *a);
            }
            let effects = push.handle_at(input, now);
            let mail = push.mail_by_lead();
            for lead in activity.keys() {
                if !mail.contains_key(lead) {
                    sent_in_batch.remove(lead);
                }
            }
            for effect in &effects {
                if let PushEffect::Inject { lead, text } = effect {
                    // Never while working or unknown.
                    prop_assert_eq!(activity.get(lead), Some(&LeadActivity::Receptive));
                    // Never without mail for that lead.
                    prop_assert!(mail.contains_key(lead));
                    // Never a body: only the fixed phrasing.
                    prop_assert!(text.starts_with("[fleet] "));
                    let n = sent_in_batch.entry(lead.clone()).or_default();
                    *n += 1;
                }
            }
            for (lead, state) in &push.leads {
                prop_assert!(state.sent <= config().reminders, "{lead} over budget");
            }
            match failure {
                Some((lead, InjectOutcome::NotFound)) => {
                    prop_assert!(push.bindings.values().all(|l| *l != lead));
                    prop_assert!(push.primary.as_ref() != Some(&lead));
                }
                Some((_, _)) => prop_assert_eq!(&push.bindings, &bindings_before),
                None => {}
            }
        }
    }
}

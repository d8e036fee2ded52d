//! The event hub's ring, its subscriptions from a `Last-Event-ID`, and the events' JSON.

use super::*;

fn status(n: usize) -> FleetEvent {
    FleetEvent::MemberStatus {
        target: format!("m{n}"),
        status: "working".into(),
    }
}

fn at() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("valid")
}

#[test]
fn events_carry_id_time_and_type() {
    let hub = EventHub::new(8);
    let mut sub = hub.subscribe(None);
    hub.publish(&status(1), at());
    let got = sub.live.try_recv().expect("published");
    let v: serde_json::Value = serde_json::from_str(&got.json).expect("json");
    assert_eq!(v["type"], "member.status");
    assert_eq!(v["target"], "m1");
    assert_eq!(v["id"], got.id.as_str());
    assert!(got.id.ends_with("-1"), "{}", got.id);
    assert_eq!(v["at"], "2027-01-15T08:00:00Z");
    assert_eq!(got.kind, "member.status");
}

#[test]
fn a_new_client_may_ask_for_the_whole_ring() {
    let hub = EventHub::new(3);
    for n in 1..=5 {
        hub.publish(&status(n), at());
    }
    let mut sub = hub.subscribe_all();
    assert!(sub.gap.is_none());
    let seqs: Vec<u64> = sub.missed.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [3, 4, 5], "the ring's bound holds");
    hub.publish(&status(6), at());
    assert_eq!(
        sub.live.try_recv().expect("live").seq,
        6,
        "then live, no hole"
    );
}

#[test]
fn a_client_resumes_after_its_last_event_id() {
    let hub = EventHub::new(8);
    for n in 1..=5 {
        hub.publish(&status(n), at());
    }
    let all = hub.subscribe(Some(&format!("{}-0", hub.boot)));
    let last = all.missed[2].id.clone();
    let sub = hub.subscribe(Some(&last));
    let targets: Vec<String> = sub
        .missed
        .iter()
        .map(|e| {
            serde_json::from_str::<serde_json::Value>(&e.json).expect("json")["target"].to_string()
        })
        .collect();
    assert_eq!(targets, ["\"m4\"", "\"m5\""]);
    assert_eq!(sub.gap, None);
}

#[test]
fn the_latency_record_keeps_the_last_hour_of_what_events_carried() {
    let hub = EventHub::new(2);
    let delivered = |ms| FleetEvent::TicketState {
        ticket: "t".into(),
        target: "m".into(),
        state: "delivered".into(),
        waited_ms: Some(ms),
    };
    let nudged = |ms| FleetEvent::Nudge {
        lead: Some("lead:%1".into()),
        outcome: "nudged".into(),
        after_ms: ms,
    };
    let minutes = |m: i64| at() + jiff::SignedDuration::from_mins(m);
    hub.publish(&delivered(40), minutes(0));
    hub.publish(&nudged(Some(7)), minutes(1));
    // A reminder (no mail newly landed) and other events carry no sample.
    hub.publish(&nudged(None), minutes(2));
    for n in 0..5 {
        hub.publish(&status(n), minutes(3));
    }
    // Far more events than the ring holds went by: the record still has the hour.
    let record = hub.latency(minutes(30));
    let ms = |m: i64| minutes(m).as_millisecond();
    assert_eq!(record.delivery, vec![(ms(0), 40)]);
    assert_eq!(record.nudge, vec![(ms(1), 7)]);
    assert_eq!(record.at, minutes(30).to_string());
    // An hour on, only what is younger than an hour stays.
    hub.publish(&delivered(90), minutes(61));
    let record = hub.latency(minutes(61));
    assert_eq!(record.delivery, vec![(ms(61), 90)]);
    assert_eq!(record.nudge, vec![(ms(1), 7)]);
    assert!(hub.latency(minutes(62)).nudge.is_empty());
    // The serialised event carries its sample; one without leaves the field out.
    let json = serde_json::to_value(delivered(40)).expect("json");
    assert_eq!(json["waited_ms"], 40);
    let json = serde_json::to_value(nudged(None)).expect("json");
    assert!(json.get("after_ms").is_none(), "{json}");
}

#[test]
fn the_ring_is_bounded_and_a_client_too_far_behind_is_told() {
    let hub = EventHub::new(3);
    for n in 1..=10 {
        hub.publish(&status(n), at());
    }
    assert_eq!(hub.ring().events.len(), 3);
    let sub = hub.subscribe(Some(&format!("{}-2", hub.boot)));
    assert_eq!(sub.missed.len(), 3);
    let gap = sub.gap.expect("a gap");
    assert!(gap.starts_with("5 events after"), "{gap}");
    // Caught up exactly at the ring's start: no gap.
    let sub = hub.subscribe(Some(&format!("{}-7", hub.boot)));
    assert_eq!(sub.missed.len(), 3);
    assert_eq!(sub.gap, None);
}

#[test]
fn an_id_from_another_run_or_garbage_is_a_gap_with_everything_held() {
    let hub = EventHub::new(4);
    hub.publish(&status(1), at());
    for bad in ["0-1", "nonsense", &format!("{}-99", hub.boot)] {
        let sub = hub.subscribe(Some(bad));
        assert!(sub.gap.is_some(), "{bad}");
        assert_eq!(sub.missed.len(), 1, "{bad}");
    }
}

#[test]
fn live_events_follow_the_missed_ones_without_a_hole() {
    let hub = EventHub::new(8);
    hub.publish(&status(1), at());
    let mut sub = hub.subscribe(Some(&format!("{}-0", hub.boot)));
    hub.publish(&status(2), at());
    assert_eq!(sub.missed.len(), 1);
    assert!(sub.live.try_recv().expect("live").id.ends_with("-2"));
}

//! The engine's nudges to its leads: reminders that back off and give up, a working lead nudged
//! the moment it goes idle, which lead gets the nudge (blips, closed and vanished leads, no lead
//! at all, mail from before a restart, a reload of the primary tab), the budget spent by nudges
//! that may have been typed, and replies held from the nudge by a wake or a waiter.

use super::*;

#[tokio::test(start_paused = true)]
async fn reminders_back_off_then_give_up_and_the_mail_stays() {
    let fake = lead_idle();
    let rig = rig_with_primary(&fake).await;
    rig.mail("alice").await;
    sleep(Duration::from_secs(120)).await;
    let nudges = rig.fake.typed_into("w1:p1");
    assert_eq!(nudges.len(), 3, "the budget is three: {nudges:?}");
    // 1 s, then 2 s (doubling; the 3 s cap is not reached).
    assert_eq!(spacing(&nudges), [1000, 2000]);
    assert!(nudges.iter().all(|n| !n.text.contains("payload")));
    assert!(nudges[0].text.contains("1 message from alice"));
    let alice = Target::new("alice").expect("target");
    assert_eq!(
        rig.store.depth(&alice).await.expect("depth"),
        1,
        "given up, kept"
    );
    // New mail after giving up starts a new batch.
    rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.fake.typed_into("w1:p1").len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_working_lead_is_nudged_the_moment_it_goes_idle_and_reading_stops_it() {
    let fake = fake_with(&[(LEAD, AgentStatus::Working)]);
    let rig = rig_with_primary(&fake).await;
    let mut events = rig.engine.events().subscribe(None).live;
    let id = rig.mail("alice").await;
    sleep(Duration::from_secs(600)).await;
    rig.no_nudge("w1:p1", "never while working");
    let idle_at = Instant::now();
    fake.set_status("w1:p1", AgentStatus::Idle);
    sleep(Duration::from_millis(50)).await;
    let nudges = rig.fake.typed_into("w1:p1");
    assert_eq!(nudges.len(), 1);
    assert!(
        nudges[0].at - idle_at < Duration::from_millis(5),
        "event-driven, not the next tick: {:?}",
        nudges[0].at - idle_at
    );
    // The nudge's event says how long after the mail landed it went: the ten busy minutes.
    let mut after_ms = None;
    while let Ok(published) = events.try_recv() {
        let event: serde_json::Value = serde_json::from_str(&published.json).expect("json");
        if event["type"] == "nudge" && event["outcome"] == "nudged" {
            after_ms = event["after_ms"].as_u64();
        }
    }
    let after_ms = after_ms.expect("a nudged event with after_ms");
    assert!(
        (599_000..=601_000).contains(&after_ms),
        "mail → nudge: {after_ms} ms"
    );
    assert_eq!(rig.engine.latency().nudge.len(), 1);
    // Busy again, then the mail is read: nothing more, even when idle later.
    fake.set_status("w1:p1", AgentStatus::Working);
    rig.ack("alice", id).await;
    fake.set_status("w1:p1", AgentStatus::Idle);
    sleep(Duration::from_secs(600)).await;
    assert_eq!(rig.fake.typed_into("w1:p1").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_blip_keeps_the_delegating_lead_and_a_closed_one_falls_back_to_the_primary() {
    let fake = fake_with(&[
        (("w1:p1", "t-primary", "w1:t1"), AgentStatus::Idle),
        (("w1:p5", "t-delegator", "w1:t9"), AgentStatus::Idle),
        (("w2:p1", "t-alice", "w2:t1"), AgentStatus::Idle),
    ]);
    let rig = rig_with_primary(&fake).await;
    let delegator = rig.lead("w1:p5", "t-delegator").await;
    rig.add(NewMember {
        lead: Some(delegator),
        ..new_member("alice", "w2:p1", "t-alice")
    })
    .await;
    // The delegating lead's pane cannot be read for a while: the binding holds.
    fake.fault("w1:p5", Some(Fault::Transient));
    let id = rig.mail("alice").await;
    sleep(Duration::from_secs(10)).await;
    rig.no_nudge("w1:p5", "its pane cannot be read: nothing typed yet");
    rig.no_nudge("w1:p1", "a blip never moves mail to the primary");
    fake.fault("w1:p5", None);
    sleep(Duration::from_secs(2)).await;
    let answered = rig.fake.typed_into("w1:p5").len();
    assert!(answered >= 1, "retried once it answers");
    rig.ack("alice", id).await;
    // The delegating lead's pane closes: its binding is forgotten, the primary gets the mail.
    fake.close("w1:p5");
    sleep(Duration::from_millis(10)).await;
    rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.fake.typed_into("w1:p1").len(), 1);
    assert_eq!(rig.fake.typed_into("w1:p5").len(), answered);
}

#[tokio::test(start_paused = true)]
async fn failed_scans_keep_the_primary_and_a_vanished_one_is_replaced() {
    let fake = fake_with(&[(("w1:p1", "t-first", "w1:t1"), AgentStatus::Idle)]);
    let rig = rig_with_primary(&fake).await;
    fake.listing_fails(true);
    sleep(Duration::from_secs(10)).await; // several failed readings
    let id = rig.mail("alice").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(
        rig.fake.typed_into("w1:p1").len(),
        1,
        "the primary was kept"
    );
    rig.ack("alice", id).await;
    // The primary's pane disappears without an event; a new agent opens in the tab.
    fake.listing_fails(false);
    fake.vanish("w1:p1");
    fake.add_pane("w1:p2", "t-second", "w1:t1", AgentStatus::Idle);
    sleep(Duration::from_secs(3)).await; // one TTL
    rig.mail("bob").await;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(rig.fake.typed_into("w1:p2").len(), 1, "the tab's new lead");
    assert_eq!(rig.fake.typed_into("w1:p1").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn with_no_lead_the_mail_waits_for_a_poll() {
    let fake = fake_with(&[(MEMBER, AgentStatus::Idle)]); // not a lead tab
    let rig = rig(&fake);
    rig.mail("alice").await;
    sleep(Duration::from_secs(60)).await;
    assert!(fake.typed().is_empty());
    let alice = Target::new("alice").expect("target");
    assert_eq!(rig.store.depth(&alice).await.expect("depth"), 1);
}

#[tokio::test(start_paused = true)]
async fn mail_from_before_a_restart_is_nudged_once_the_lead_is_known() {
    let fake = lead_idle();
    let store = memory_store();
    // The mail is in the store before the engine starts (a daemon restarted).
    store
        .publish(reply_from("alice", None, "done"))
        .await
        .expect("publish");
    let config = config(CONFIG);
    let _engine = spawn(engine_parts(
        &fake,
        &store,
        crate::config::Live::fixed(config),
    ));
    sleep(Duration::from_millis(100)).await;
    let nudges: Vec<Typed> = fake.typed();
    assert_eq!(nudges.len(), 1, "{nudges:?}");
    assert!(nudges[0].text.contains("1 message from alice"));
}

#[tokio::test(start_paused = true)]
async fn nudges_that_may_have_been_typed_spend_the_budget() {
    // Every nudge goes in and then loses its answer: each one counts, three in all.
    let fake = lead_idle();
    fake.fault("w1:p1", Some(Fault::LostAnswer));
    let rig = rig_with_primary(&fake).await;
    rig.mail("alice").await;
    sleep(Duration::from_secs(120)).await;
    let nudges = rig.fake.typed_into("w1:p1");
    assert_eq!(nudges.len(), 3, "the budget is three: {nudges:?}");
    assert_eq!(spacing(&nudges), [1000, 2000], "each waits its backoff");
}

#[tokio::test(start_paused = true)]
async fn a_reply_returned_by_a_waiter_is_kept_until_its_caller_calls_again_and_a_lost_one_is_nudged()
 {
    // Review M3: the waiter acknowledged the reply before its answer was written, and a waiter
    // cancelled after being handed the reply left it un-nudged forever.
    let rig = primary_and_alice(AgentStatus::Working).await;
    let alice = Target::new("alice").expect("target");
    let mut handed = Vec::new();
    for round in 0..2 {
        let ticket = task(&rig.engine, "alice", format!("job {round}")).await;
        let waiter = rig.engine.wait(ticket).await.expect("engine");
        let reply = reply_from("alice", Some(ticket), format!("done {round}"));
        rig.store.publish(reply.clone()).await.expect("publish");
        let delivered = rig.engine.reply_stored(reply).await.expect("engine");
        assert_eq!(delivered, super::super::Delivered::Waiter);
        assert!(waiter.await.is_ok(), "the waiter got it");
        handed.push(ticket);
    }
    // The first waiter returned its reply to the lead; the second failed before it could.
    rig.engine
        .handed_to(handed[0], "lead:w1:p1".to_owned())
        .await
        .expect("engine");
    sleep(Duration::from_secs(60)).await;
    rig.no_nudge("w1:p1", "replies in a waiter's hands are not nudged about");
    assert_eq!(
        rig.store.depth(&alice).await.expect("depth"),
        2,
        "nor acknowledged"
    );
    rig.engine.unhand_now(handed[1]);
    sleep(Duration::from_millis(100)).await;
    let nudges = rig.fake.typed_into("w1:p1");
    assert_eq!(nudges.len(), 1, "the lost one is mail again: {nudges:?}");
    assert!(
        nudges[0].text.contains("1 message from alice"),
        "{nudges:?}"
    );
    // The lead's next call takes what its waiter returned: exactly the first one.
    let taken = rig
        .engine
        .take_handed("lead:w1:p1".to_owned())
        .await
        .expect("engine");
    assert_eq!(taken.len(), 1);
    assert!(
        rig.engine
            .take_handed("lead:w1:p1".to_owned())
            .await
            .expect("engine")
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_moves_the_primary_tab_and_the_push_budget_at_once() {
    // Issue 14 item 6: primary, leads, tickets and delivery took effect only at the next start.
    let fake = fake_with(&[
        (("w1:p1", "t-one", "w1:t1"), AgentStatus::Idle),
        (("w3:p1", "t-three", "w3:t1"), AgentStatus::Idle),
    ]);
    let (publisher, live) = crate::config::channel(config(CONFIG));
    let store = memory_store();
    let engine = spawn(engine_parts(&fake, &store, live));
    sleep(Duration::from_millis(100)).await; // w1:t1's lead is the primary
    let moved = "primary:\n  tab: w3:t1\n  pushReminders: 1\n  pushBackoffMs: 1000\n";
    publisher.publish(config(moved));
    sleep(Duration::from_millis(100)).await;
    let alice = Target::new("alice").expect("target");
    store
        .publish(reply_from("alice", None, "mail"))
        .await
        .expect("publish");
    engine.inbox_changed(alice).await.expect("engine");
    sleep(Duration::from_secs(30)).await;
    let into = |pane: &str| fake.typed_into(pane).len();
    assert_eq!(into("w1:p1"), 0, "the old primary tab hears nothing");
    assert_eq!(
        into("w3:p1"),
        1,
        "the new one, once: the reloaded budget is one"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wake_holds_its_reply_from_the_nudge_until_read_cancelled_or_lapsed() {
    let rig = primary_and_alice(AgentStatus::Working).await;
    let owner = "lead:w1:p1".to_owned();
    let mut wakes = Vec::new();
    for round in 0..3 {
        let ticket = alice_with_a_task(&rig).await;
        let id = rig
            .engine
            .arm_wake(ticket, owner.clone())
            .await
            .expect("engine")
            .expect("armed");
        assert!(
            rig.engine
                .wake(id.clone(), "lead:w9:p9".to_owned())
                .await
                .expect("engine")
                .is_none(),
            "another caller sees no such wake"
        );
        reply_to(&rig, ticket, &format!("done {round}")).await;
        let view = rig
            .engine
            .wake(id.clone(), owner.clone())
            .await
            .expect("engine")
            .expect("the owner's wake");
        assert_eq!(view.state, Some(TicketState::Replied));
        assert_eq!(view.reply.map(|r| r.text), Some(format!("done {round}")));
        wakes.push(id);
    }
    sleep(Duration::from_secs(30)).await;
    rig.no_nudge("w1:p1", "replies live wakes carry are not nudged about");
    // The first is read (its reply is the owner's: its next call acknowledges it), the second
    // cancelled (the nudge takes over at once), the third never polled (it lapses).
    rig.engine
        .wake_read(wakes[0].clone(), owner.clone())
        .await
        .expect("engine");
    assert!(
        rig.engine
            .cancel_wake(wakes[1].clone(), owner.clone())
            .await
            .expect("engine")
    );
    sleep(Duration::from_millis(100)).await;
    rig.one_nudge("w1:p1", "1 message from alice");
    sleep(Duration::try_from(super::super::state::WAKE_GRACE).expect("positive")).await;
    rig.some_nudge("w1:p1", "2 messages from alice");
    let taken = rig.engine.take_handed(owner).await.expect("engine");
    assert_eq!(taken.len(), 1, "exactly the read wake's reply: {taken:?}");
}

#[tokio::test(start_paused = true)]
async fn a_handed_reply_goes_back_to_the_nudge_when_its_holder_goes_or_never_calls_again() {
    // Review M2: a reply handed to a waiter was uncounted by the push loop until its holder's
    // next call; a holder that closed, or never called again, left it un-nudged for good.
    let fake = fake_with(&[
        (LEAD, AgentStatus::Idle),
        (("w3:p1", "t-other", "w3:t1"), AgentStatus::Idle),
        (MEMBER, AgentStatus::Working),
    ]);
    let rig = rig_with_primary(&fake).await;
    rig.lead("w3:p1", "t-other").await;
    rig.add(new_member("alice", "w2:p1", "t-a")).await;
    let mut handed = Vec::new();
    for round in 0..2 {
        let ticket = alice_with_a_task(&rig).await;
        let waiter = rig.engine.wait(ticket).await.expect("engine");
        reply_to(&rig, ticket, &format!("done {round}")).await;
        assert!(waiter.await.is_ok(), "the waiter got it");
        handed.push(ticket);
    }
    for (ticket, holder) in handed.iter().zip(["lead:w3:p1", "lead:w1:p1"]) {
        rig.engine
            .handed_to(*ticket, holder.to_owned())
            .await
            .expect("engine");
    }
    sleep(Duration::from_secs(60)).await;
    rig.no_nudge("w1:p1", "handed: not nudged");
    // The first holder's pane closes before its next call: that reply is mail again.
    fake.close("w3:p1");
    sleep(Duration::from_millis(100)).await;
    rig.one_nudge("w1:p1", "1 message from alice");
    // The second holder never calls again: after the TTL its reply is counted too.
    sleep(Duration::try_from(super::super::state::HANDED_TTL).expect("positive")).await;
    rig.some_nudge("w1:p1", "2 messages from alice");
}

//! Model accounts (`state::spend`) as the model gateway uses them: a member's key admitted only
//! while it lives, usage kept across a kill -9, and budgets — the member's and its tree's — that
//! refuse the next request, tell the lead once per episode and lift when raised. Every answer
//! the engine gives is checked against the pass it published for the same pane (`state::passes`),
//! which the gateway admits by without the engine's turn: the two never disagree.

use fleetd_core::AgentStatus;
use fleetd_core::usage::Tokens;

use super::*;
use crate::config::BudgetSpec;
use crate::engine::MemberModel;

const KEY: &str = "hash-of-ann-s-key";

fn model(budget: Option<BudgetSpec>, tree_budget: Option<BudgetSpec>) -> Option<MemberModel> {
    Some(MemberModel {
        backend: "lab".to_owned(),
        key_hash: KEY.to_owned(),
        budget,
        tree_budget,
    })
}

fn tokens(n: u64) -> Budget {
    Some(BudgetSpec {
        tokens: Some(n),
        cost_micros: None,
        warn_permille: 500,
    })
}

type Budget = Option<BudgetSpec>;

fn used(input: u64, output: u64) -> Tokens {
    Tokens {
        input,
        output,
        cache_read: 3,
        cache_write: 2,
    }
}

/// An engine with ann (led by [`lead_ref`]) served through the gateway with `budget`.
async fn ann_with(disk: &Disk, fake: &FakeMux, budget: Budget, tree: Budget) -> EngineHandle {
    let engine = disk.start(fake);
    engine.lead_seen(lead_ref()).await.expect("engine");
    engine
        .add_member(NewMember {
            lead: Some(lead_ref()),
            backend: Some("lab".to_owned()),
            model: model(budget, tree),
            ..new_member("ann", "w2:p1", "t-a")
        })
        .await
        .expect("engine");
    engine
}

async fn admit(engine: &EngineHandle, who: &str, key: &str) -> Result<u64, String> {
    admit_to(engine, who, key, "lab").await
}

/// The engine's answer to `who`'s request for `backend` with `key`, once the pass published
/// for `who`'s pane is shown to give the same.
async fn admit_to(
    engine: &EngineHandle,
    who: &str,
    key: &str,
    backend: &str,
) -> Result<u64, String> {
    let answer = engine
        .model_admit(t(who), key.to_owned(), backend.to_owned())
        .await
        .expect("engine")
        .map_err(|r| format!("{}: {}", r.code.as_str(), r.message));
    assert_eq!(
        pass_to(engine, who, key, backend),
        answer.as_ref().ok().map(|id| (t(who), *id)),
        "{who}'s pass for {key} to {backend} disagrees with the engine's {answer:?}"
    );
    answer
}

/// The pass the engine published for a request from `who`'s pane (ann's `w2:p1`, else bo's).
fn pass_to(engine: &EngineHandle, who: &str, key: &str, backend: &str) -> Option<(Target, u64)> {
    let (pane, terminal) = if who == "ann" {
        ("w2:p1", "t-a")
    } else {
        ("w2:p2", "t-b")
    };
    let terminal = fleetd_core::TerminalId::new(terminal).expect("terminal");
    engine
        .model_passes()
        .and_then(|passes| passes.admits(&qualified(pane), &terminal, key, backend))
}

fn pass(engine: &EngineHandle, who: &str, key: &str) -> Option<(Target, u64)> {
    pass_to(engine, who, key, "lab")
}

async fn spend(engine: &EngineHandle, account: u64, n: u64) {
    engine
        .model_usage(account, used(n, n), n)
        .await
        .expect("engine")
        .expect("kept");
}

async fn incidents(disk: &Disk, who: &str, words: &str) -> usize {
    let inbox = disk.store.peek(&t(who), 50).await.expect("peek");
    inbox.iter().filter(|m| m.text.contains(words)).count()
}

#[tokio::test(start_paused = true)]
async fn a_key_is_good_only_for_its_member_its_backend_and_while_it_lives() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    fake.add_pane("w2:p2", "t-b", "w2:t2", AgentStatus::Idle);
    let engine = ann_with(&disk, &fake, None, None).await;
    engine
        .add_member(new_member("bo", "w2:p2", "t-b"))
        .await
        .expect("engine");
    assert!(admit(&engine, "ann", KEY).await.is_ok());
    // Ann's pane in another incarnation (her agent restarted, say) holds no pass of hers.
    let other_terminal = fleetd_core::TerminalId::new("t-later").expect("terminal");
    let passes = engine.model_passes().expect("engine");
    assert_eq!(
        passes.admits(&qualified("w2:p1"), &other_terminal, KEY, "lab"),
        None
    );
    let wrong = admit(&engine, "ann", "another-hash")
        .await
        .expect_err("refused");
    assert!(wrong.starts_with("model_key_refused"), "{wrong}");
    // bo has no account: ann's key from bo's pane is nothing.
    let other = admit(&engine, "bo", KEY).await.expect_err("refused");
    assert!(other.starts_with("model_key_refused"), "{other}");
    let backend = admit_to(&engine, "ann", KEY, "other").await;
    assert!(backend.is_err(), "another backend");
    engine
        .release(t("ann"), "stopped".to_owned())
        .await
        .expect("engine");
    // Gone from the passes by the time the release is answered, before anyone asks the engine.
    assert_eq!(pass(&engine, "ann", KEY), None, "a released member's pass");
    let gone = admit(&engine, "ann", KEY).await.expect_err("refused");
    assert!(gone.starts_with("model_key_refused"), "{gone}");
}

#[tokio::test(start_paused = true)]
async fn usage_is_kept_across_a_kill_and_the_key_still_works_after_it() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = ann_with(&disk, &fake, None, None).await;
    let account = admit(&first, "ann", KEY).await.expect("admitted");
    spend(&first, account, 10).await;
    spend(&first, account, 5).await;
    let second = disk.restart(first, &fake).await;
    settle().await;
    let listed = second.list().await.expect("engine");
    let usage = listed[0].usage.clone().expect("ann's usage");
    assert_eq!(
        usage.tokens,
        Tokens {
            input: 15,
            output: 15,
            cache_read: 6,
            cache_write: 4
        }
    );
    assert_eq!(usage.total_tokens, 40);
    let again = admit(&second, "ann", KEY)
        .await
        .expect("the key survives the restart");
    assert_eq!(again, account, "the same account");
    let totals = second.usage_totals().await.expect("engine");
    assert_eq!(totals.profiles["p"].tokens.total(), 40);
    assert_eq!(totals.trees["ann"].cost_micros, 15);
    let leads: Vec<_> = totals.leads.iter().collect();
    assert_eq!(leads.len(), 1, "{leads:?}");
    assert_eq!(*leads[0].0, lead_ref().pane.to_string());
    assert_eq!(leads[0].1.tokens.input, 15);
}

/// Answers that end together are taken by the engine as one turn (`run::dispatch::take_turn`),
/// up to a bound: a burst of several turns' worth loses none of them and counts each once.
#[tokio::test(start_paused = true)]
async fn a_burst_of_answers_larger_than_a_turn_is_counted_whole() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let first = ann_with(&disk, &fake, None, None).await;
    let account = admit(&first, "ann", KEY).await.expect("admitted");
    let burst = (0..150).map(|_| spend(&first, account, 1));
    futures_util::future::join_all(burst).await;
    let second = disk.restart(first, &fake).await;
    settle().await;
    let listed = second.list().await.expect("engine");
    let usage = listed[0].usage.clone().expect("ann's usage");
    // Each answer: 1 in, 1 out, 3 cache reads, 2 cache writes.
    assert_eq!(usage.total_tokens, 150 * 7, "{usage:?}");
    assert_eq!(
        second.usage_totals().await.expect("engine").trees["ann"].cost_micros,
        150
    );
}

#[tokio::test(start_paused = true)]
async fn a_budget_refuses_the_next_request_tells_the_lead_once_and_lifts_when_raised() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    let engine = ann_with(&disk, &fake, tokens(100), None).await;
    let account = admit(&engine, "ann", KEY).await.expect("admitted");
    spend(&engine, account, 30).await; // 70 of 100: past the warning at half
    settle().await;
    assert_eq!(incidents(&disk, "ann", "of its model budget").await, 1);
    spend(&engine, account, 20).await; // 110: over
    assert_eq!(
        pass(&engine, "ann", KEY),
        None,
        "gone once the answer is counted"
    );
    for _ in 0..3 {
        let refused = admit(&engine, "ann", KEY).await.expect_err("over budget");
        assert!(refused.starts_with("budget_reached"), "{refused}");
        assert!(refused.contains("110 of 100 tokens"), "{refused}");
    }
    settle().await;
    assert_eq!(
        incidents(&disk, "ann", "reached its model budget").await,
        1,
        "one incident however many requests are refused"
    );
    engine
        .set_budget(t("ann"), false, tokens(1000))
        .await
        .expect("engine")
        .expect("set");
    assert_eq!(pass(&engine, "ann", KEY), Some((t("ann"), account)), "back");
    settle().await;
    assert!(admit(&engine, "ann", KEY).await.is_ok(), "lifted");
    // A new episode: reaching the raised budget tells the lead again.
    spend(&engine, account, 500).await;
    let _ = admit(&engine, "ann", KEY).await.expect_err("over again");
    settle().await;
    assert_eq!(incidents(&disk, "ann", "reached its model budget").await, 2);
}

#[tokio::test(start_paused = true)]
async fn a_tree_budget_counts_every_member_under_its_head() {
    let (fake, disk) = ann_pane(AgentStatus::Idle);
    fake.add_pane("w2:p2", "t-b", "w2:t2", AgentStatus::Idle);
    let engine = ann_with(&disk, &fake, None, tokens(50)).await;
    // bo was spawned by ann: its lead is ann's pane.
    engine
        .add_member(NewMember {
            lead: Some(LeadRef {
                pane: qualified("w2:p1"),
                terminal: fleetd_core::TerminalId::new("t-a").expect("terminal"),
            }),
            backend: Some("lab".to_owned()),
            model: Some(MemberModel {
                backend: "lab".to_owned(),
                key_hash: "bo-key".to_owned(),
                budget: None,
                tree_budget: None,
            }),
            ..new_member("bo", "w2:p2", "t-b")
        })
        .await
        .expect("engine");
    let bo = admit(&engine, "bo", "bo-key").await.expect("admitted");
    spend(&engine, bo, 30).await; // the tree: 65 of 50
    assert_eq!(
        pass(&engine, "ann", KEY),
        None,
        "bo's answer spent ann's tree"
    );
    let refused = admit(&engine, "bo", "bo-key").await.expect_err("tree over");
    assert!(refused.contains("headed by ann"), "{refused}");
    assert!(admit(&engine, "ann", KEY).await.is_err(), "the head too");
    let listed = engine.list().await.expect("engine");
    let ann = listed
        .iter()
        .find(|m| m.target.as_str() == "ann")
        .expect("ann");
    assert_eq!(ann.tree_usage.as_ref().map(|u| u.total_tokens), Some(65));
    // The tree's budget is its head's: set on bo it would limit nothing, so it is refused.
    let refused = engine
        .set_budget(t("bo"), true, tokens(1000))
        .await
        .expect("engine")
        .expect_err("bo heads no tree");
    assert!(
        refused.message.contains("the tree ann heads"),
        "{}",
        refused.message
    );
    assert!(
        admit(&engine, "bo", "bo-key").await.is_err(),
        "nothing changed"
    );
    engine
        .set_budget(t("ann"), true, None)
        .await
        .expect("engine")
        .expect("lifted");
    assert!(admit(&engine, "bo", "bo-key").await.is_ok());
}

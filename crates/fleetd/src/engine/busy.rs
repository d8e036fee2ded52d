//! A request for a gateway that is behind (`gateway_busy`: `gateway.peerBacklogMax` messages
//! wait for it) is held rather than refused at once: it waits its turn for that gateway, first
//! come first asked, and the one whose turn it is is asked again every [`RETRY`] until the
//! engine takes it or [`HOLD`] has passed, when the refusal stands. While anyone waits for a
//! gateway, a newcomer for it queues behind them instead of asking first. So senders slow to
//! what the gateway takes, and a lead's one task waits behind the few requests ahead of it, not
//! behind whichever flood of senders asks most often. Requests for a gateway nobody waits for
//! go straight to the engine, many at once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::access::Refusal;
use fleetd_core::refusal::Code;

use super::EngineGone;

/// How long a request for a gateway that is behind waits for room before it is refused.
pub(super) const HOLD: Duration = Duration::from_secs(10);
/// How often the request whose turn it is asks again.
const RETRY: Duration = Duration::from_millis(20);

/// Who waits for each gateway.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    queues: Mutex<HashMap<String, Arc<Queue>>>,
}

/// The requests waiting for one gateway: a fair (first come, first served) lock, held by the
/// one whose turn it is, and how many wait.
#[derive(Debug, Default)]
struct Queue {
    turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
}

impl Turns {
    /// `ask` answered, asked again in turn while it is `gateway_busy` for `gateway`, for up to
    /// [`HOLD`].
    pub(super) async fn held<T, F, Fut>(
        &self,
        gateway: &str,
        mut ask: F,
    ) -> Result<Result<T, Refusal>, EngineGone>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Result<T, Refusal>, EngineGone>>,
    {
        let queue = self.queue(gateway);
        // Nobody waits: ask at once, alongside any other request.
        if queue.waiting.load(Ordering::SeqCst) == 0 {
            match ask().await? {
                Err(refusal) if refusal.code == Code::GatewayBusy => {}
                answer => {
                    self.forget(gateway, queue);
                    return Ok(answer);
                }
            }
        }
        let deadline = tokio::time::Instant::now() + HOLD;
        queue.waiting.fetch_add(1, Ordering::SeqCst);
        let answer = async {
            let _turn = queue.turn.lock().await;
            loop {
                match ask().await? {
                    Err(refusal)
                        if refusal.code == Code::GatewayBusy
                            && tokio::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(RETRY).await;
                    }
                    answer => return Ok(answer),
                }
            }
        };
        let answer = match tokio::time::timeout_at(deadline, answer).await {
            Ok(answer) => answer,
            // Its turn did not come: asked once more, the answer stands.
            Err(_) => ask().await,
        };
        queue.waiting.fetch_sub(1, Ordering::SeqCst);
        self.forget(gateway, queue);
        answer.map(|answer| {
            answer.map_err(|mut refusal| {
                if refusal.code == Code::GatewayBusy {
                    refusal.message.push_str(&format!(
                        " (this request waited {} s for room)",
                        HOLD.as_secs()
                    ));
                }
                refusal
            })
        })
    }

    fn queue(&self, gateway: &str) -> Arc<Queue> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(queues.entry(gateway.to_owned()).or_default())
    }

    /// Drops `queue`, and its gateway's entry once nobody else holds it.
    fn forget(&self, gateway: &str, queue: Arc<Queue>) {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        drop(queue);
        if queues
            .get(gateway)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(gateway);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway with `room` places: each request asked takes one, or is `gateway_busy`.
    fn asker(
        room: &Arc<AtomicUsize>,
        who: &'static str,
    ) -> impl FnMut() -> std::future::Ready<Result<Result<&'static str, Refusal>, EngineGone>> + use<>
    {
        let room = Arc::clone(room);
        move || {
            let taken = room
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            std::future::ready(Ok(if taken {
                Ok(who)
            } else {
                Err(Refusal::new(Code::GatewayBusy, "gateway b is behind"))
            }))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_for_a_busy_gateway_go_in_the_order_they_came_and_newcomers_wait_behind() {
        let turns = Arc::new(Turns::default());
        let room = Arc::new(AtomicUsize::new(0));
        let first = tokio::spawn({
            let (turns, ask) = (Arc::clone(&turns), asker(&room, "first"));
            async move { turns.held("b", ask).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = tokio::spawn({
            let (turns, ask) = (Arc::clone(&turns), asker(&room, "second"));
            async move { turns.held("b", ask).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // One place: the first to come takes it, though the second asks as often.
        room.store(1, Ordering::SeqCst);
        let first = first.await.expect("joined").expect("engine");
        assert_eq!(first.expect("taken"), "first");
        // A place opens while the second waits between two asks, and a newcomer comes at
        // that moment: it queues behind the second rather than asking first.
        room.store(1, Ordering::SeqCst);
        let third = tokio::spawn({
            let (turns, ask) = (Arc::clone(&turns), asker(&room, "third"));
            async move { turns.held("b", ask).await }
        });
        let second = second.await.expect("joined").expect("engine");
        assert_eq!(second.expect("taken"), "second");
        room.store(1, Ordering::SeqCst);
        let third = third.await.expect("joined").expect("engine");
        assert_eq!(third.expect("taken"), "third");
        // Another gateway is not held behind b's queue; all gone, nothing is kept.
        let other = turns
            .held("c", asker(&Arc::new(AtomicUsize::new(1)), "c"))
            .await;
        assert_eq!(other.expect("engine").expect("taken"), "c");
        assert!(turns.queues.lock().expect("lock").is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_for_a_gateway_nobody_waits_for_are_asked_together() {
        let turns = Arc::new(Turns::default());
        let started = tokio::time::Instant::now();
        let asks: Vec<_> = (0..8)
            .map(|_| {
                let turns = Arc::clone(&turns);
                tokio::spawn(async move {
                    turns
                        .held("b", || async {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            Ok(Ok(()))
                        })
                        .await
                })
            })
            .collect();
        for ask in asks {
            ask.await.expect("joined").expect("engine").expect("taken");
        }
        // One after another would take 80 ms.
        assert!(
            started.elapsed() < Duration::from_millis(20),
            "{:?}",
            started.elapsed()
        );
    }
}

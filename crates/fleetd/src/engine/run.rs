//! The engine task: receives commands and events, feeds them to [`State`] with the time read
//! when each one is handled, has [`Effects`] perform the I/O it asks for (results come back as
//! events), and sleeps until the next deadline. A supervisor watches the task: when it ends
//! (a panic, or every handle dropped) the engine's [`Life`] says so, so `/healthz` and `serve`
//! can act on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleetd_core::injector::TypeOutcome;
use fleetd_core::push::{InjectOutcome, LeadId, PushLoop};
use fleetd_core::{Message, QualifiedPaneId, Target, Ticket};
use jiff::SignedDuration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::effects::Effects;
use super::lead_tabs::{LeadTabs, ScanPane};
use super::state::{Io, Restored, State, push_config};
use super::{Command, ENGINE_QUEUE, EngineHandle, EngineParts};

mod dispatch;
use crate::mux::{PaneEvent, RoutedEvent};
use crate::store::{StateOp, StateStore, StoreError};

/// The longest sleep between ticks when nothing is due: a safety net, not a schedule.
const IDLE_TICK: Duration = Duration::from_secs(5);

/// What the engine task receives.
#[derive(Debug)]
pub(super) enum Msg {
    Command(Command),
    Event(Event),
}

/// Results of spawned I/O, and multiplexer events.
#[derive(Debug)]
pub(super) enum Event {
    /// Typing a task (or its Enter retry) finished: `gone` when the multiplexer says the pane
    /// is gone (the member is released), else how it went.
    Typed {
        target: Target,
        ticket: Ticket,
        outcome: TypeOutcome,
        gone: bool,
    },
    /// Whether a task in doubt after a restart reached its member's pane (`true` also when the
    /// pane could not be read: it is never typed twice).
    TypedFound {
        target: Target,
        ticket: Ticket,
        arrived: bool,
    },
    /// A turn-done fallback was not captured: the task's text still waits unsent in the
    /// member's input (`unsent`), or the member reads busy again (its turn goes on).
    TurnNotOver {
        target: Target,
        ticket: Ticket,
        unsent: bool,
    },
    /// A turn-done fallback was captured: `message` is `None` when it could not be stored (the
    /// ticket still ends).
    FallbackStored {
        target: Target,
        ticket: Ticket,
        message: Option<Message>,
    },
    Injected {
        lead: LeadId,
        outcome: InjectOutcome,
    },
    Depth {
        target: Target,
        pending: u64,
    },
    /// A member from before a restart was checked: `alive` when its incarnation still runs.
    Adopted {
        member: Box<crate::engine::NewMember>,
        alive: bool,
    },
    /// Watching a pane failed: `gone` when the multiplexer says it does not exist.
    WatchFailed {
        pane: QualifiedPaneId,
        gone: bool,
    },
    /// The lead-tab scanner's listing; `None` when it could not be read.
    LeadsScanned(Option<Vec<ScanPane>>),
    /// Replies found in an inbox for tickets still open (after a restart).
    Reconciled {
        replies: Vec<Message>,
    },
    /// What a member's worktree holds (`None`: git could not read it).
    WorktreeRead {
        target: Target,
        state: Option<crate::worktree::WorktreeState>,
    },
    /// A released member's worktree was settled (or git failed at it).
    WorktreeSettled {
        target: Target,
        info: crate::worktree::WorktreeInfo,
        outcome: Result<crate::worktree::Settled, String>,
    },
}

/// Whether the engine task still runs, and a token cancelled the moment it stops.
#[derive(Debug)]
pub(crate) struct Life {
    alive: AtomicBool,
    stopped: CancellationToken,
    /// The fleet's event stream: outlives the engine task, so subscribers of a daemon whose
    /// engine stopped see the stream end quietly rather than error.
    pub(crate) events: Arc<crate::events::EventHub>,
    /// The engine's clock, for readers of the hub that need "now" (the latency record).
    pub(crate) clock: crate::clock::SharedClock,
    /// The model gateway's passes, as the engine last published them (`state::passes`).
    pub(crate) passes: super::state::PassBoard,
    /// Requests held for gateways that are behind (`busy`).
    pub(crate) busy: super::busy::Turns,
}

impl Life {
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    pub(crate) fn stopped(&self) -> CancellationToken {
        self.stopped.clone()
    }

    fn end(&self) {
        self.alive.store(false, Ordering::Release);
        self.stopped.cancel();
    }
}

/// Starts the engine task and its supervisor; returns the handle. The task ends when every
/// handle is dropped (effect tasks hold only weak senders), or on [`EngineHandle::shutdown`].
pub fn spawn(parts: EngineParts) -> EngineHandle {
    let (tx, rx) = mpsc::channel(ENGINE_QUEUE);
    let config = &*parts.config.current();
    let push = PushLoop::new(push_config(config));
    let mut state = State::new(
        secs(config.tickets.ttl_after_finish_secs),
        SignedDuration::from_millis(
            i64::try_from(config.delivery.verify_grace_ms).unwrap_or(i64::MAX),
        ),
        push,
        LeadTabs::from_config(config),
        usize::try_from(config.delivery.max_inject_bytes).unwrap_or(4096),
        Arc::clone(&parts.clock),
    );
    let hub = Arc::new(crate::events::EventHub::default());
    let life = Arc::new(Life {
        alive: AtomicBool::new(true),
        stopped: CancellationToken::new(),
        events: Arc::clone(&hub),
        clock: Arc::clone(&parts.clock),
        passes: state.pass_board(),
        busy: super::busy::Turns::default(),
    });
    let handle = EngineHandle {
        tx: tx.clone(),
        life: Arc::clone(&life),
    };
    state.set_limits(config.limits, super::state::TreeLimits::from_config(config));
    state.set_gateway(parts.gateway.as_ref().map(|g| super::state::GatewayState {
        me: g.me.clone(),
        peers: g.peers.clone(),
        outbox_max: g.outbox_max,
        peer_backlog_max: g.peer_backlog_max,
    }));
    let events = parts.mux.events();
    let lagged = parts.mux.lagged();
    let reloads = parts.config.subscribe();
    let durable = parts.durable.clone();
    let effects = Effects {
        mux: parts.mux.clone(),
        store: Arc::clone(&parts.store),
        clock: Arc::clone(&parts.clock),
        redactor: parts.redactor.clone(),
        tx: tx.downgrade(),
        events: hub,
        forward: parts.gateway.as_ref().map(|g| g.forward.clone()),
    };
    drop(tx);
    // Durable state goes through one persister task, in order: each batch of changes is
    // committed before the replies that depend on it are sent and the I/O it asked for starts.
    // The persister is supervised with the engine: if it dies (a panic), nothing would ever be
    // committed, answered or typed again, so the engine's life ends with it (`/healthz` says
    // so, and the daemon exits for its service manager to restart it).
    let backlog = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let jobs = durable.as_ref().map(|d| {
        let (jobs, queue) = mpsc::unbounded_channel();
        let persister = tokio::spawn(persist(
            queue,
            Arc::clone(&d.store),
            effects.clone(),
            Arc::clone(&backlog),
        ));
        let life = Arc::clone(&life);
        tokio::spawn(async move {
            if let Err(e) = persister.await {
                tracing::error!(error = %e, "the fleet state's persister stopped; the engine stops with it");
                life.end();
            }
        });
        jobs
    });
    let task = tokio::spawn(
        Engine {
            parts,
            state,
            effects,
            jobs,
            backlog,
        }
        .run(rx, events, lagged, reloads),
    );
    tokio::spawn(async move {
        match task.await {
            Ok(()) => tracing::info!("the fleet engine stopped"),
            Err(e) if e.is_panic() => {
                let payload = e.into_panic();
                let why = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                tracing::error!(panic = %why, "the fleet engine panicked");
            }
            Err(e) => tracing::error!(error = %e, "the fleet engine was cancelled"),
        }
        life.end();
    });
    handle
}

fn secs(n: u64) -> SignedDuration {
    SignedDuration::from_secs(i64::try_from(n).unwrap_or(i64::MAX))
}

/// A reply held until the state change it reports is durable; it learns whether it is.
pub(super) type Deferred = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// One batch for the persister: state changes, then the replies and I/O that wait for them.
struct Job {
    ops: Vec<StateOp>,
    replies: Vec<Deferred>,
    io: Vec<Io>,
    /// Told once the batch is done (shutdown waits for the last one).
    done: Option<oneshot::Sender<()>>,
}

/// How often reading the kept fleet state is tried at start before the engine gives up (and
/// the daemon exits for its service manager to restart it), and the first wait between tries
/// (doubled each time: 1 + 2 + 4 + 8 s).
const LOAD_TRIES: u32 = 5;
const LOAD_RETRY: Duration = Duration::from_secs(1);

/// The most batches the persister commits at once (what queued up while the last commit ran).
const PERSIST_GROUP: usize = 256;

/// How long the persister waits before it tries a failed commit again (a full disk, say).
const STATE_RETRY: Duration = Duration::from_secs(1);

/// How many held changes and I/O requests, while the fleet state cannot be written, make the
/// engine refuse new tasks and spawns (`store_unavailable`) until they are written.
/// (Lower under test, so a test reaches it in a few calls.)
pub(super) const HELD_BOUND: usize = if cfg!(test) { 32 } else { 4096 };

/// What waits for a commit that failed: its changes, one per record (a later change to the same
/// record replaces the earlier, so a retry commits each record once however long the outage),
/// and the I/O that must not run before them.
#[derive(Default)]
struct Held {
    ops: std::collections::BTreeMap<(String, String), StateOp>,
    io: Vec<Io>,
}

impl Held {
    fn add(&mut self, ops: Vec<StateOp>) {
        for op in ops {
            self.ops
                .insert((op.kind().to_owned(), op.key().to_owned()), op);
        }
    }

    /// How much is held, for the bound.
    fn size(&self) -> usize {
        self.ops.len().max(self.io.len())
    }
}

/// The persister: commits each batch in order, then answers and performs what waited for it.
/// A commit that fails is answered with its error, and its changes and I/O are held: later
/// batches join them, nothing held is performed (no task is typed whose ticket is not kept),
/// and the whole is committed again every [`STATE_RETRY`] until the store takes it; then the
/// held I/O runs, in order.
async fn persist(
    mut jobs: mpsc::UnboundedReceiver<Job>,
    store: Arc<dyn StateStore>,
    effects: Effects,
    backlog: Arc<std::sync::atomic::AtomicUsize>,
) {
    let mut held = Held::default();
    let mut failing = false;
    loop {
        let job = if failing {
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(job) => Some(job),
                    None => break,
                },
                () = tokio::time::sleep(STATE_RETRY) => None,
            }
        } else {
            match jobs.recv().await {
                Some(job) => Some(job),
                None => break,
            }
        };
        let (mut replies, mut done) = (Vec::new(), Vec::new());
        if let Some(job) = job {
            // Batches that queued up while the last commit ran go in this one commit, in
            // order: concurrent callers share the fsync, as the inbox writer's group commit.
            let mut next = Some(job);
            let mut taken = 0;
            while let Some(job) = next.take() {
                held.add(job.ops);
                held.io.extend(job.io);
                replies.extend(job.replies);
                done.extend(job.done);
                taken += 1;
                if taken < PERSIST_GROUP {
                    next = jobs.try_recv().ok();
                }
            }
        }
        let ops: Vec<StateOp> = held.ops.values().cloned().collect();
        let stored = if ops.is_empty() {
            Ok(())
        } else if ops.iter().all(|op| op.kind() == super::state::ACCOUNT) {
            store.commit_state_unsynced(ops).await // model usage alone: see the trait
        } else {
            store.commit_state(ops).await
        };
        match &stored {
            Ok(()) => {
                if failing {
                    tracing::info!(
                        held = held.io.len(),
                        "the fleet state is written again; what waited for it goes ahead"
                    );
                }
                failing = false;
                held.ops.clear();
            }
            Err(e) if !failing => {
                failing = true;
                tracing::error!(error = %e, "failed to make the fleet state durable; tools that changed it say so, and nothing that depends on it is done until it is written (retried every second)");
            }
            Err(e) => tracing::debug!(error = %e, "the fleet state still cannot be written"),
        }
        for reply in replies {
            reply(stored.clone());
        }
        if !failing {
            for request in held.io.drain(..) {
                effects.perform(request);
            }
        }
        backlog.store(if failing { held.size() } else { 0 }, Ordering::Release);
        // Shutdown waits for this; it must not wait for a disk that may never have room.
        for done in done {
            if failing {
                tracing::error!(
                    changes = held.ops.len(),
                    "shutting down with fleet state that could not be written: a restart forgets it"
                );
            }
            let _ = done.send(());
        }
    }
}

/// One input to the engine loop, taken before the time is read.
enum Input {
    Msg(Msg),
    Pane(Result<RoutedEvent, broadcast::error::RecvError>),
    Reload(Arc<crate::config::Config>),
    ReloadsClosed,
    /// Events were missed on the way through the router.
    Lagged,
    Tick,
}

struct Engine {
    parts: EngineParts,
    state: State,
    effects: Effects,
    /// The persister's queue, when the state is kept durably.
    jobs: Option<mpsc::UnboundedSender<Job>>,
    /// How much waits for a failing commit (0 while the state is written).
    backlog: Arc<std::sync::atomic::AtomicUsize>,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Msg>,
        mut events: broadcast::Receiver<RoutedEvent>,
        mut lagged: tokio::sync::watch::Receiver<u64>,
        mut reloads: tokio::sync::watch::Receiver<Arc<crate::config::Config>>,
    ) {
        let Some((kept, legacy)) = self.load().await else {
            // The kept state cannot be read: never start an empty fleet over it.
            // The engine stops, so the daemon exits non-zero and its service manager retries.
            return;
        };
        let mut io = vec![Io::DepthAll];
        self.state.restore(kept, self.parts.clock.now(), &mut io);
        // Its members are in this first batch: the file goes once the batch is committed.
        io.extend(legacy.map(Io::RemoveLegacyRegistry));
        self.flush(io, Vec::new());
        // Without a reloader no new configuration ever comes: stop listening for one.
        let mut reloading = true;
        loop {
            let sleep = self.sleep_for();
            let input = tokio::select! {
                msg = rx.recv() => match msg {
                    Some(msg) => Input::Msg(msg),
                    // Every handle is gone.
                    None => return,
                },
                event = events.recv() => Input::Pane(event),
                Ok(()) = lagged.changed() => Input::Lagged,
                changed = reloads.changed(), if reloading => match changed {
                    Ok(()) => Input::Reload(Arc::clone(&reloads.borrow_and_update())),
                    Err(_) => Input::ReloadsClosed,
                },
                () = tokio::time::sleep(sleep) => Input::Tick,
            };
            // The time each input is handled at, read after waiting for it.
            let now = self.parts.clock.now();
            let mut io = Vec::new();
            let mut replies = Vec::new();
            let mut stop = None;
            match input {
                Input::Msg(msg) => stop = self.take_turn(msg, &mut rx, now, &mut io, &mut replies),
                Input::Pane(Ok(RoutedEvent { daemon, event })) => {
                    let pane = QualifiedPaneId::new(daemon, event.pane().clone());
                    match event {
                        PaneEvent::StatusChanged {
                            terminal, status, ..
                        } => {
                            self.state
                                .pane_status(&pane, &terminal, status, now, &mut io);
                        }
                        PaneEvent::Gone { terminal, .. } => {
                            self.state.pane_gone(&pane, terminal.as_ref(), now, &mut io);
                        }
                    }
                }
                Input::Pane(Err(broadcast::error::RecvError::Lagged(n))) => {
                    // Statuses were missed (a Gone among them, maybe): read every pane again.
                    tracing::warn!(
                        missed = n,
                        "pane events lagged; re-reading every watched pane"
                    );
                    self.state.rewatch_all(&mut io);
                }
                Input::Pane(Err(broadcast::error::RecvError::Closed)) => {
                    events = self.parts.mux.events();
                }
                Input::Lagged => {
                    tracing::warn!("pane events were missed; re-reading every watched pane");
                    self.state.rewatch_all(&mut io);
                }
                Input::Reload(config) => {
                    self.state.config_reloaded(&config, &mut io);
                    self.state.engine_config_reloaded(&config, now, &mut io);
                }
                Input::ReloadsClosed => reloading = false,
                Input::Tick => self.state.tick(now, &mut io),
            }
            self.flush(io, replies);
            if let Some(reply) = stop {
                self.shutdown().await;
                let _ = reply.send(());
                return;
            }
        }
    }

    /// The state kept before a restart (nothing without a durable store), with the members the
    /// legacy `members.json` holds when the store has none yet, and that file's path
    /// when it was read (to remove once they are committed). A store that cannot be read is
    /// tried [`LOAD_TRIES`] times, waiting longer each time; `None` when it still cannot be.
    async fn load(&self) -> Option<(Restored, Option<std::path::PathBuf>)> {
        let Some(durable) = &self.parts.durable else {
            return Some((Restored::default(), None));
        };
        let mut wait = LOAD_RETRY;
        let mut tries = 1;
        let kept = loop {
            match durable.store.load_state().await {
                Ok(records) => break Restored::decode(records),
                Err(e) if tries < LOAD_TRIES => {
                    tracing::warn!(error = %e, tries, retry_in = ?wait, "cannot read the fleet state kept before the restart; trying again");
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                    tries += 1;
                }
                Err(e) => {
                    tracing::error!(error = %e, tries, "cannot read the fleet state kept before the restart; stopping rather than starting an empty fleet over it");
                    return None;
                }
            }
        };
        let legacy = durable
            .legacy_members_file
            .as_ref()
            .filter(|path| path.exists())
            .cloned();
        match legacy {
            Some(path) => {
                let members = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || super::registry::load(&path)
                })
                .await
                .unwrap_or_default();
                tracing::info!(members = members.len(), path = %path.display(), "importing the member registry of fleetd's first releases");
                Some((kept.with_legacy_members(members), Some(path)))
            }
            None => Some((kept, None)),
        }
    }

    /// Sends what one input changed on its way: with a durable store, through the persister
    /// (commit first, then the replies and the I/O); without one, at once.
    fn flush(&mut self, mut io: Vec<Io>, replies: Vec<Deferred>) {
        self.state.end_turn(self.parts.clock.now(), &mut io);
        match &self.jobs {
            Some(jobs) => {
                let ops = self.state.take_ops();
                // What depends on no state change goes at once, not behind the commit: a
                // reply's nudge would otherwise wait for its ticket's fsync after its own.
                let (at_once, io): (Vec<Io>, Vec<Io>) =
                    io.into_iter().partition(Io::needs_no_commit);
                for request in at_once {
                    self.effects.perform(request);
                }
                let _ = jobs.send(Job {
                    ops,
                    replies,
                    io,
                    done: None,
                });
            }
            None => {
                self.state.discard_dirty();
                for reply in replies {
                    reply(Ok(()));
                }
                for request in io {
                    self.effects.perform(request);
                }
            }
        }
    }

    fn sleep_for(&self) -> Duration {
        let now = self.parts.clock.now();
        match self.state.next_wake() {
            Some(at) => {
                let wait = at.duration_since(now);
                Duration::try_from(wait)
                    .unwrap_or(Duration::ZERO)
                    .min(IDLE_TICK)
            }
            None => IDLE_TICK,
        }
    }

    /// Stops: the last batch of state is made durable before the store closes. Members keep
    /// running and their tickets stay open; the next daemon takes them back (SPEC §13.8).
    async fn shutdown(&mut self) {
        let Some(jobs) = &self.jobs else { return };
        let (done, finished) = oneshot::channel();
        let _ = jobs.send(Job {
            ops: self.state.take_ops(),
            replies: Vec::new(),
            io: Vec::new(),
            done: Some(done),
        });
        let _ = finished.await;
    }
}

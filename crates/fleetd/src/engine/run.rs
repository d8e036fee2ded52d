//! The engine task: receives commands and events, feeds them to [`State`] with the time read
//! when each one is handled, has [`Effects`] perform the I/O it asks for (results come back as
//! events), and sleeps until the next deadline. A supervisor watches the task: when it ends
//! (a panic, or every handle dropped) the engine's [`Life`] says so, so `/healthz` and `serve`
//! can act on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fleetd_core::push::{InjectOutcome, LeadId, PushConfig, PushLoop};
use fleetd_core::{Message, QualifiedPaneId, Target, Ticket};
use jiff::{SignedDuration, Timestamp};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::effects::Effects;
use super::leads::{LeadTabs, ScanPane};
use super::state::{Io, State};
use super::{Command, ENGINE_QUEUE, EngineHandle, EngineParts};
use crate::mux::{PaneEvent, RoutedEvent};

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
    Typed {
        target: Target,
        ticket: Ticket,
        ok: bool,
        gone: bool,
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
    /// A pane's status, read directly (after a watch starts).
    Status {
        pane: QualifiedPaneId,
        terminal: fleetd_core::TerminalId,
        status: fleetd_core::AgentStatus,
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
}

/// Whether the engine task still runs, and a token cancelled the moment it stops.
#[derive(Debug)]
pub(crate) struct Life {
    alive: AtomicBool,
    stopped: CancellationToken,
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
    let life = Arc::new(Life {
        alive: AtomicBool::new(true),
        stopped: CancellationToken::new(),
    });
    let handle = EngineHandle {
        tx: tx.clone(),
        life: Arc::clone(&life),
    };
    let config = &*parts.config.current();
    let push = PushLoop::new(push_config(config));
    let state = State::new(
        secs(config.tickets.ttl_after_finish_secs),
        SignedDuration::from_millis(
            i64::try_from(config.delivery.verify_grace_ms).unwrap_or(i64::MAX),
        ),
        push,
        LeadTabs::from_config(config),
        usize::try_from(config.delivery.max_inject_bytes).unwrap_or(4096),
    );
    let events = parts.mux.events();
    let reloads = parts.config.subscribe();
    let adopt = parts
        .members_file
        .as_deref()
        .map(super::registry::load)
        .unwrap_or_default();
    let saver = parts
        .members_file
        .clone()
        .map(|path| super::registry::writer(path, adopt.clone()));
    let effects = Effects {
        mux: parts.mux.clone(),
        store: Arc::clone(&parts.store),
        clock: Arc::clone(&parts.clock),
        redactor: parts.redactor.clone(),
        tx: tx.downgrade(),
    };
    drop(tx);
    let task = tokio::spawn(
        Engine {
            parts,
            state,
            effects,
            saver,
            adopt,
        }
        .run(rx, events, reloads),
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

fn push_config(config: &crate::config::Config) -> PushConfig {
    let (reminders, backoff, max) = match &config.primary {
        Some(p) => (p.push_reminders, p.push_backoff_ms, p.push_backoff_max_ms),
        None => (5, 30_000, 600_000),
    };
    let ms = |n: u64| SignedDuration::from_millis(i64::try_from(n).unwrap_or(i64::MAX));
    PushConfig {
        reminders,
        backoff: ms(backoff),
        backoff_max: ms(max),
    }
}

/// One input to the engine loop, taken before the time is read.
enum Input {
    Msg(Msg),
    Pane(Result<RoutedEvent, broadcast::error::RecvError>),
    Reload(Arc<crate::config::Config>),
    ReloadsClosed,
    Tick,
}

struct Engine {
    parts: EngineParts,
    state: State,
    effects: Effects,
    /// The member registry's writer, when it is kept on disk.
    saver: Option<tokio::sync::watch::Sender<Vec<crate::engine::NewMember>>>,
    /// Members from before a restart, to check and re-adopt at start.
    adopt: Vec<crate::engine::NewMember>,
}

impl Engine {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Msg>,
        mut events: broadcast::Receiver<RoutedEvent>,
        mut reloads: tokio::sync::watch::Receiver<Arc<crate::config::Config>>,
    ) {
        self.perform(Io::DepthAll);
        for member in std::mem::take(&mut self.adopt) {
            self.perform(Io::Adopt(Box::new(member)));
        }
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
                changed = reloads.changed(), if reloading => match changed {
                    Ok(()) => Input::Reload(Arc::clone(&reloads.borrow_and_update())),
                    Err(_) => Input::ReloadsClosed,
                },
                () = tokio::time::sleep(sleep) => Input::Tick,
            };
            // The time each input is handled at, read after waiting for it (review M1).
            let now = self.parts.clock.now();
            let mut io = Vec::new();
            match input {
                Input::Msg(Msg::Command(Command::Shutdown { reply })) => {
                    self.shutdown(now).await;
                    let _ = reply.send(());
                    return;
                }
                Input::Msg(Msg::Command(command)) => self.command(command, now, &mut io),
                Input::Msg(Msg::Event(event)) => self.event(event, now, &mut io),
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
                    tracing::warn!(
                        missed = n,
                        "pane events lagged; statuses refresh on the next change"
                    );
                }
                Input::Pane(Err(broadcast::error::RecvError::Closed)) => {
                    events = self.parts.mux.events();
                }
                Input::Reload(config) => self.state.config_reloaded(&config, &mut io),
                Input::ReloadsClosed => reloading = false,
                Input::Tick => self.state.tick(now, &mut io),
            }
            for request in io {
                self.perform(request);
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

    fn command(&mut self, command: Command, now: Timestamp, io: &mut Vec<Io>) {
        let s = &mut self.state;
        match command {
            Command::MemberAt {
                pane,
                terminal,
                reply,
            } => {
                let _ = reply.send(s.member_at(&pane, &terminal));
            }
            Command::Presence { target } => s.presence(&target, now, io),
            Command::PaneSeen { pane, terminal } => s.pane_seen(pane, terminal, now, io),
            Command::LeadSeen { lead } => s.lead_seen(&lead, now, io),
            Command::BackendHealth { name, down } => s.backend_health(&name, down, io),
            Command::Shutdown { reply } => {
                // Handled in `run` (it awaits the store); reaching here means it was not.
                let _ = reply.send(());
            }
            Command::Submit {
                lead,
                target,
                task,
                reply,
            } => {
                let _ = reply.send(s.submit(lead.as_ref(), target, task, now, io));
            }
            Command::Wait { ticket, reply } => s.wait(ticket, reply, now),
            Command::Ticket { ticket, reply } => {
                let _ = reply.send(s.ticket(ticket, now));
            }
            Command::TaskText { ticket, reply } => {
                let _ = reply.send(s.task_text(ticket, now));
            }
            Command::CurrentTicket { target, reply } => {
                let _ = reply.send(s.current_ticket(&target));
            }
            Command::ReplyStored { message, reply } => {
                let _ = reply.send(s.reply_stored(message, now, io));
            }
            Command::InboxChanged { target } => io.push(Io::Depth { target }),
            Command::Ask {
                target,
                question,
                reply,
            } => {
                let _ = reply.send(s.ask(target, question, now, io));
            }
            Command::Answer {
                question_id,
                answer,
                reply,
            } => {
                let _ = reply.send(s.answer(&question_id, answer, now, io));
            }
            Command::Questions { target, reply } => {
                let _ = reply.send(s.questions(target.as_ref()));
            }
            Command::List { reply } => {
                let _ = reply.send(s.list());
            }
            Command::Recent { target, reply } => {
                let _ = reply.send(s.recent(&target));
            }
            Command::Reserve { name, reply } => {
                let _ = reply.send(s.reserve(name, now));
            }
            Command::Unreserve { target } => s.unreserve(&target),
            Command::AddMember { member } => s.add_member(*member, now, io),
            Command::WhenReady { target, reply } => s.when_ready(target, reply),
            Command::Release {
                target,
                cause,
                reply,
            } => {
                let _ = reply.send(s.release(&target, &cause, now, io));
            }
            Command::SetStatus { target, status } => s.set_status(&target, None, status, now, io),
            Command::Panic => panic!("test fault: the engine was asked to panic"),
        }
    }

    fn event(&mut self, event: Event, now: Timestamp, io: &mut Vec<Io>) {
        match event {
            Event::Typed {
                target,
                ticket,
                ok,
                gone,
            } => {
                if gone {
                    self.state.release(&target, "exited", now, io);
                } else {
                    self.state.typed(target, ticket, ok, now, io);
                }
            }
            Event::FallbackStored {
                target,
                ticket,
                message,
            } => {
                match message {
                    Some(message) => {
                        self.state.reply_stored(message, now, io);
                    }
                    // The tail could not be stored: the ticket still ends (review M7).
                    None => self.state.turn_ended_unrecorded(ticket, now),
                }
                self.state.fallback_recorded(target, now, io);
            }
            Event::Injected { lead, outcome } => self.state.injected(lead, outcome, now, io),
            Event::Depth { target, pending } => self.state.inbox_depth(target, pending, now, io),
            Event::Status {
                pane,
                terminal,
                status,
            } => self.state.pane_status(&pane, &terminal, status, now, io),
            Event::Adopted { member, alive } => {
                if alive {
                    self.state.adopt(*member, now, io);
                } else {
                    self.state.adoption_failed(&member.target, io);
                }
            }
            Event::WatchFailed { pane, gone } => {
                if gone {
                    self.state.pane_gone(&pane, None, now, io);
                } else {
                    self.state.watch_failed(pane, now);
                }
            }
            Event::LeadsScanned(panes) => self.state.leads_scanned(panes, now, io),
        }
    }

    /// Releases every member with cause `shutdown` and stores the resulting notices before
    /// returning (the store is closed right after).
    async fn shutdown(&mut self, now: Timestamp) {
        let mut io = Vec::new();
        self.state.release_all("shutdown", now, &mut io);
        for request in io {
            if let Io::Notice {
                target,
                ticket,
                kind,
                text,
            } = request
            {
                self.effects.publish(&target, ticket, kind, text).await;
            }
        }
    }

    /// Has one I/O request performed. The member registry is written in order, here on the
    /// engine task (its writer keeps only the latest list); everything else runs in its own task.
    fn perform(&self, request: Io) {
        match request {
            Io::SaveMembers(members) => {
                if let Some(saver) = &self.saver {
                    saver.send_replace(members);
                }
            }
            other => self.effects.perform(other),
        }
    }
}

//! The engine task: receives commands and events, feeds them to [`State`], performs the I/O it
//! asks for in spawned tasks (whose results come back as events), and sleeps until the next
//! deadline. Owns the wiring between the state and the multiplexer, the store and the clock.

use std::sync::Arc;
use std::time::Duration;

use fleetd_core::push::{InjectOutcome, LeadId, PushConfig, PushLoop};
use fleetd_core::{Message, MessageKind, MsgId, QualifiedPaneId, Target, Ticket};
use jiff::SignedDuration;
use tokio::sync::{broadcast, mpsc};

use super::leads::{LeadTabs, ScanPane};
use super::state::{Io, State};
use super::{Command, ENGINE_QUEUE, EngineHandle, EngineParts};
use crate::mux::{MuxError, PaneEvent, RoutedEvent};
use crate::store::InboxStore;

/// How many lines of a member's pane a turn-done fallback carries.
const FALLBACK_TAIL_LINES: u32 = 40;
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
    FallbackStored {
        target: Target,
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

/// Starts the engine task; returns its handle. The task ends when every handle is dropped.
pub fn spawn(parts: EngineParts) -> EngineHandle {
    let (tx, rx) = mpsc::channel(ENGINE_QUEUE);
    let handle = EngineHandle { tx: tx.clone() };
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
    tokio::spawn(
        Engine {
            parts,
            state,
            tx,
            saver,
            adopt,
        }
        .run(rx, events, reloads),
    );
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

struct Engine {
    parts: EngineParts,
    state: State,
    tx: mpsc::Sender<Msg>,
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
            let mut io = Vec::new();
            let now = self.parts.clock.now();
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Command(Command::Shutdown { reply })) => {
                        self.shutdown(now).await;
                        let _ = reply.send(());
                        return;
                    }
                    Some(Msg::Command(command)) => self.command(command, now, &mut io),
                    Some(Msg::Event(event)) => self.event(event, now, &mut io),
                    None => return,
                },
                event = events.recv() => match event {
                    Ok(RoutedEvent { daemon, event }) => {
                        let pane = QualifiedPaneId::new(daemon, event.pane().clone());
                        match event {
                            PaneEvent::StatusChanged { terminal, status, .. } => {
                                self.state.pane_status(&pane, &terminal, status, now, &mut io);
                            }
                            PaneEvent::Gone { terminal, .. } => {
                                self.state.pane_gone(&pane, terminal.as_ref(), now, &mut io);
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "pane events lagged; statuses refresh on the next change");
                    }
                    Err(broadcast::error::RecvError::Closed) => {
                        events = self.parts.mux.events();
                    }
                },
                changed = reloads.changed(), if reloading => match changed {
                    Ok(()) => {
                        let config = Arc::clone(&reloads.borrow_and_update());
                        self.state.config_reloaded(&config, &mut io);
                    }
                    Err(_) => reloading = false,
                },
                () = tokio::time::sleep(sleep) => self.state.tick(now, &mut io),
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

    fn command(&mut self, command: Command, now: jiff::Timestamp, io: &mut Vec<Io>) {
        let s = &mut self.state;
        match command {
            Command::MemberAt {
                pane,
                terminal,
                reply,
            } => {
                let _ = reply.send(s.member_at(&pane, &terminal));
            }
            Command::Presence { target } => s.presence(target, now, io),
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
            Command::Release {
                target,
                cause,
                reply,
            } => {
                let _ = reply.send(s.release(&target, &cause, now, io));
            }
            Command::SetStatus { target, status } => s.set_status(&target, None, status, now, io),
        }
    }

    fn event(&mut self, event: Event, now: jiff::Timestamp, io: &mut Vec<Io>) {
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
            Event::FallbackStored { target, message } => {
                if let Some(message) = message {
                    self.state.reply_stored(message, now, io);
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
    async fn shutdown(&mut self, now: jiff::Timestamp) {
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
                publish(
                    &*self.parts.store,
                    &self.parts.clock,
                    &target,
                    ticket,
                    kind,
                    self.parts.redactor.redact(&text).into_owned(),
                )
                .await;
            }
        }
    }

    /// Runs one I/O request in its own task; its result comes back as an event.
    fn perform(&self, request: Io) {
        let request = match request {
            Io::SaveMembers(members) => {
                // In order, on the engine task: the writer keeps only the latest list.
                if let Some(saver) = &self.saver {
                    saver.send_replace(members);
                }
                return;
            }
            other => other,
        };
        let mux = self.parts.mux.clone();
        let store = Arc::clone(&self.parts.store);
        let clock = Arc::clone(&self.parts.clock);
        let redactor = self.parts.redactor.clone();
        let tx = self.tx.clone();
        let report = move |event: Event| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(Msg::Event(event)).await;
            }
        };
        tokio::spawn(async move {
            match request {
                Io::Type {
                    target,
                    ticket,
                    pane,
                    text,
                } => {
                    let result = mux.submit(&pane, &text).await.map(|_| ());
                    if let Err(e) = &result {
                        tracing::warn!(%target, %ticket, error = %e, "typing a task failed");
                    }
                    report(typed(target, ticket, &result)).await;
                }
                Io::Enter {
                    target,
                    ticket,
                    pane,
                } => {
                    let result = mux.press_enter(&pane).await;
                    report(typed(target, ticket, &result)).await;
                }
                Io::Fallback {
                    target,
                    ticket,
                    pane,
                } => {
                    let tail = mux
                        .read_tail(&pane, FALLBACK_TAIL_LINES)
                        .await
                        .unwrap_or_else(|e| {
                            format!("(fleetd could not read the pane's output: {e})")
                        });
                    // Raw pane text: a member may have printed its credentials.
                    let text = format!(
                        "[fleet] {target}'s turn for ticket {ticket} ended without fleet_reply; the last lines of its pane:\n{}",
                        redactor.redact(tail.trim_end())
                    );
                    let message = publish(
                        &*store,
                        &clock,
                        &target,
                        Some(ticket),
                        MessageKind::Fallback,
                        text,
                    )
                    .await;
                    report(Event::FallbackStored { target, message }).await;
                }
                Io::Notice {
                    target,
                    ticket,
                    kind,
                    text,
                } => {
                    let text = redactor.redact(&text).into_owned();
                    publish(&*store, &clock, &target, ticket, kind, text).await;
                    if let Ok(pending) = store.depth(&target).await {
                        report(Event::Depth { target, pending }).await;
                    }
                }
                Io::Nudge {
                    lead,
                    pane,
                    terminal,
                    text,
                } => {
                    let started = tokio::time::Instant::now();
                    let outcome = nudge(&mux, &pane, &terminal, &text).await;
                    if outcome == InjectOutcome::Delivered {
                        metrics::histogram!("fleetd_nudge_seconds")
                            .record(started.elapsed().as_secs_f64());
                    }
                    report(Event::Injected { lead, outcome }).await;
                }
                Io::Watch { pane } => {
                    // Watching a pane already watched is a no-op that reports nothing, and the
                    // incarnation may be new: read the status once so it is never missed.
                    let watched = match mux.watch(&pane).await {
                        Ok(()) => mux.pane(&pane).await,
                        Err(e) => Err(e),
                    };
                    match watched {
                        Ok(current) => {
                            report(Event::Status {
                                pane,
                                terminal: current.info.terminal,
                                status: current.info.status,
                            })
                            .await;
                        }
                        Err(e) => {
                            tracing::warn!(%pane, error = %e, "cannot watch pane status; will retry");
                            let gone = e.is_not_found();
                            report(Event::WatchFailed { pane, gone }).await;
                        }
                    }
                }
                Io::Unwatch { pane } => mux.unwatch(&pane),
                Io::Depth { target } => match store.depth(&target).await {
                    Ok(pending) => report(Event::Depth { target, pending }).await,
                    Err(e) => tracing::warn!(%target, error = %e, "cannot read inbox depth"),
                },
                Io::DepthAll => match store.targets().await {
                    Ok(targets) => {
                        for target in targets {
                            match store.depth(&target).await {
                                Ok(pending) => report(Event::Depth { target, pending }).await,
                                Err(e) => {
                                    tracing::warn!(%target, error = %e, "cannot read inbox depth");
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list inboxes; mail from before the start is found by fleet_poll")
                    }
                },
                Io::SaveMembers(_) => {}
                Io::Adopt(member) => {
                    // Only an affirmative answer drops it: gone, or another incarnation there.
                    let alive = match mux.pane(&member.pane).await {
                        Ok(current) => current.info.terminal == member.terminal,
                        Err(e) => !e.is_not_found(),
                    };
                    report(Event::Adopted { member, alive }).await;
                }
                Io::ScanLeads => {
                    let panes = match mux.list_panes().await {
                        Ok(panes) => Some(scan_panes(&mux, panes)),
                        Err(e) => {
                            tracing::debug!(error = %e, "lead-tab scan failed; keeping the last answer");
                            None
                        }
                    };
                    report(Event::LeadsScanned(panes)).await;
                }
                Io::Close { pane } => {
                    if let Err(e) = mux.close_pane(&pane).await {
                        tracing::warn!(%pane, error = %e, "cannot close a released member's pane");
                    }
                }
            }
        });
    }
}

/// How typing into a member's pane went (a submit or the one Enter retry).
fn typed(target: Target, ticket: Ticket, result: &Result<(), MuxError>) -> Event {
    Event::Typed {
        target,
        ticket,
        ok: result.is_ok(),
        gone: result.as_ref().err().is_some_and(MuxError::is_not_found),
    }
}

/// Publishes a daemon-authored message; `None` (and a warning) when the store refuses.
async fn publish(
    store: &dyn InboxStore,
    clock: &crate::clock::SharedClock,
    target: &Target,
    ticket: Option<Ticket>,
    kind: MessageKind,
    text: String,
) -> Option<Message> {
    let message = Message {
        msg_id: MsgId::from_uuid(uuid::Uuid::now_v7()),
        target: target.clone(),
        ticket,
        kind,
        text,
        from: "fleetd".to_owned(),
        created_at: clock.now(),
    };
    match store.publish(message.clone()).await {
        Ok(_) => Some(message),
        Err(e) => {
            tracing::error!(%target, error = %e, "failed to store a daemon notice");
            None
        }
    }
}

/// A listing reduced to what the lead-tab scanner needs. On tmux a window may be named by its
/// name as well as its index (`base:boss` as well as `base:3`).
fn scan_panes(mux: &crate::mux::MuxRouter, panes: Vec<crate::mux::RoutedPane>) -> Vec<ScanPane> {
    panes
        .into_iter()
        .map(|p| {
            let tmux = mux
                .daemon(p.id.daemon)
                .is_ok_and(|d| d.kind() == crate::mux::BackendKind::Tmux);
            let tab_by_name = p
                .info
                .label
                .as_ref()
                .filter(|_| tmux)
                .map(|label| format!("{}:{label}", p.info.workspace));
            ScanPane {
                tab: p.info.tab.to_string(),
                tab_by_name,
                agent: p.info.agent.is_some(),
                terminal: p.info.terminal,
                pane: p.id,
            }
        })
        .collect()
}

/// Types a nudge into a lead's pane if it still holds the same incarnation.
async fn nudge(
    mux: &crate::mux::MuxRouter,
    pane: &QualifiedPaneId,
    terminal: &fleetd_core::TerminalId,
    text: &str,
) -> InjectOutcome {
    match mux.pane(pane).await {
        Ok(current) if current.info.terminal != *terminal => return InjectOutcome::NotFound,
        Ok(_) => {}
        Err(e) if e.is_not_found() => return InjectOutcome::NotFound,
        Err(e) => {
            tracing::warn!(%pane, error = %e, "cannot read the lead's pane; will retry the nudge");
            return InjectOutcome::Transient;
        }
    }
    match mux.submit(pane, text).await {
        Ok(_) => InjectOutcome::Delivered,
        Err(e) if e.is_not_found() => InjectOutcome::NotFound,
        Err(e) => {
            tracing::warn!(%pane, error = %e, "nudge failed; will retry");
            InjectOutcome::Transient
        }
    }
}

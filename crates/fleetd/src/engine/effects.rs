//! The engine's effects: each [`Io`] request the state asks for, performed in its own task, its
//! result reported back to the engine as an [`Event`]. Owns the I/O against the multiplexer and
//! the store; decides nothing (a failure is reported, and the state decides what it means).
//! Effect tasks hold only a weak sender: they never keep a stopped engine's queue open.

use std::sync::Arc;

use fleetd_core::injector::TypeOutcome;
use fleetd_core::push::InjectOutcome;
use fleetd_core::{Message, MessageKind, MsgId, QualifiedPaneId, Target, Ticket};
use tokio::sync::mpsc;

use super::lead_tabs::ScanPane;
use super::run::{Event, Msg};
use super::state::Io;
use crate::clock::SharedClock;
use crate::mux::{MuxError, MuxRouter};
use crate::secrets::Redactor;
use crate::store::InboxStore;

/// How long a released member's pane may take to be seen closed before its worktree is settled;
/// past it the worktree is left as it is (and its lead told).
const CLOSE_CONFIRM: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the pane is read meanwhile.
const CLOSE_POLL: std::time::Duration = std::time::Duration::from_millis(100);
/// How many lines of a member's pane a turn-done fallback carries.
const FALLBACK_TAIL_LINES: u32 = 40;
/// Lines of a pane searched for a task in doubt after a restart.
const FIND_TYPED_LINES: u32 = 200;
/// How much of a typed text identifies it on a screen (short enough to fit on one line of a
/// narrow terminal, so a wrapped or boxed prompt still shows it whole).
const FIND_TYPED_CHARS: usize = 48;

/// Whether `screen` shows the start of `text`, ignoring whitespace (a TUI wraps and indents
/// what was typed). A TUI that draws a box around a long prompt still shows its first line.
fn shows(screen: &str, text: &str) -> bool {
    let needle: String = text
        .chars()
        .filter(|c| !c.is_whitespace())
        .take(FIND_TYPED_CHARS)
        .collect();
    if needle.is_empty() {
        return false;
    }
    // Whitespace (line ends included) removed: a prompt wrapped at the terminal's width reads
    // as one line again.
    let screen: String = screen.chars().filter(|c| !c.is_whitespace()).collect();
    screen.contains(&needle)
}
/// How many of a member's pending messages are read to settle its open tickets after a restart:
/// far more than the replies any member has outstanding. Read a bounded page at a time, keeping
/// only the replies to those tickets.
const RECONCILE_LIMIT: usize = 1000;
/// Most bytes of message text in one page of that read.
const RECONCILE_PAGE_BYTES: usize = 1024 * 1024;

/// What an effect task works with.
#[derive(Debug, Clone)]
pub(super) struct Effects {
    pub(super) mux: MuxRouter,
    pub(super) store: Arc<dyn InboxStore>,
    pub(super) clock: SharedClock,
    pub(super) redactor: Redactor,
    pub(super) tx: mpsc::WeakSender<Msg>,
    pub(super) events: Arc<crate::events::EventHub>,
    /// The gateway forwarder's queue (a multi-host fleet): outbox records, in order.
    pub(super) forward: Option<mpsc::UnboundedSender<(u64, Box<fleetd_core::gateway::Envelope>)>>,
}

impl Effects {
    /// The replies to `tickets` among the oldest [`RECONCILE_LIMIT`] pending messages of
    /// `target` (the last one per ticket, as they would have been stored), read a bounded page
    /// at a time: memory holds one page plus those replies, never the whole inbox.
    async fn reconcile(
        &self,
        target: &Target,
        tickets: &std::collections::BTreeSet<Ticket>,
    ) -> Result<Vec<Message>, crate::store::StoreError> {
        let mut replies = std::collections::BTreeMap::new();
        let mut after = None;
        let mut seen = 0;
        while seen < RECONCILE_LIMIT {
            let request = crate::store::PageRequest {
                after,
                limit: RECONCILE_LIMIT - seen,
                max_bytes: RECONCILE_PAGE_BYTES,
            };
            let page = self.store.page(target, request).await?;
            for message in page.messages {
                seen += 1;
                after = Some(message.msg_id);
                if message.kind == MessageKind::Reply
                    && let Some(ticket) = message.ticket.filter(|t| tickets.contains(t))
                {
                    replies.insert(ticket, message);
                }
            }
            if !page.more {
                break;
            }
        }
        let mut replies: Vec<Message> = replies.into_values().collect();
        replies.sort_by_key(|m| m.msg_id);
        Ok(replies)
    }

    /// Tells the engine, if it still runs.
    async fn report(&self, event: Event) {
        if let Some(tx) = self.tx.upgrade() {
            let _ = tx.send(Msg::Event(event)).await;
        }
    }

    /// Runs `request` in its own task.
    pub(super) fn perform(&self, request: Io) {
        if let Io::Event(event) = &request {
            // In order, at once: a task per event could reorder them.
            self.events.publish(event, self.clock.now());
            return;
        }
        if let Io::Forward { seq, envelope } = request {
            // In order too: the forwarder sends them as they come.
            if let Some(forward) = &self.forward {
                let _ = forward.send((seq, envelope));
            }
            return;
        }
        let this = self.clone();
        tokio::spawn(async move { this.run(request).await });
    }

    async fn run(&self, request: Io) {
        match request {
            Io::Type {
                target,
                ticket,
                pane,
                text,
            } => {
                tracing::debug!(member = %target, %ticket, %pane, "typing a task");
                let submitted = self.mux.submit(&pane, &text).await;
                // herdr saw the member reach working: the turn started.
                let started = submitted.as_ref().is_ok_and(|s| s.started == Some(true));
                let result = submitted.map(|_| ());
                match &result {
                    Ok(()) => {}
                    Err(e) if e.is_uncertain() => tracing::warn!(
                        %target, %ticket, error = %e,
                        "typing a task may have typed it; its status decides, it is not typed again"
                    ),
                    // A dialog came up since the status reading: it waits, it is no failure.
                    Err(e) if e.is_busy() => tracing::debug!(
                        %target, %ticket, error = %e,
                        "the member is busy after all; the task waits for it"
                    ),
                    Err(e) => tracing::warn!(%target, %ticket, error = %e, "typing a task failed"),
                }
                self.report(typed(target, ticket, &result, started)).await;
            }
            Io::Enter {
                target,
                ticket,
                pane,
            } => {
                let result = super::verify::enter_unless_blocked(&self.mux, &pane).await;
                self.report(typed(target, ticket, &result, false)).await;
            }
            Io::FindTyped {
                target,
                ticket,
                pane,
                text,
            } => {
                let arrived = self.find_typed(&pane, &text).await;
                self.report(Event::TypedFound {
                    target,
                    ticket,
                    arrived,
                })
                .await;
            }
            Io::Fallback {
                target,
                ticket,
                pane,
                text,
            } => self.fallback(target, ticket, pane, &text).await,
            Io::Notice {
                target,
                ticket,
                kind,
                text,
            } => {
                self.publish(&target, ticket, kind, text).await;
                if let Ok(pending) = self.store.depth(&target).await {
                    self.report(Event::Depth { target, pending }).await;
                }
            }
            Io::Nudge {
                lead,
                pane,
                terminal,
                text,
            } => {
                let started = tokio::time::Instant::now();
                let (outcome, verify) = nudge(&self.mux, &pane, &terminal, &text).await;
                if outcome == InjectOutcome::Delivered {
                    metrics::histogram!("fleetd_nudge_seconds")
                        .record(started.elapsed().as_secs_f64());
                }
                self.report(Event::Injected { lead, outcome }).await;
                if verify {
                    super::verify::submitted(&self.mux, &pane, &text).await;
                }
            }
            Io::Event(event) => self.events.publish(&event, self.clock.now()),
            Io::Watch { pane } => self.watch(pane).await,
            Io::Unwatch { pane } => self.mux.unwatch(&pane),
            Io::Depth { target } => match self.store.depth(&target).await {
                Ok(pending) => self.report(Event::Depth { target, pending }).await,
                Err(e) => tracing::warn!(%target, error = %e, "cannot read inbox depth"),
            },
            Io::DepthAll => self.depth_all().await,
            Io::Reconcile { target, tickets } => match self.reconcile(&target, &tickets).await {
                Ok(replies) => self.report(Event::Reconciled { replies }).await,
                Err(e) => {
                    tracing::warn!(%target, error = %e, "cannot read an inbox to settle its tickets")
                }
            },
            Io::Forward { .. } => {}
            Io::AckLocal { target, msg_id } => {
                if let Err(e) = self.store.ack(&target, msg_id).await {
                    tracing::warn!(%target, error = %e, "cannot remove a forwarded reply from this host's inbox");
                }
                if let Ok(pending) = self.store.depth(&target).await {
                    self.report(Event::Depth { target, pending }).await;
                }
            }
            Io::InspectWorktree { target, info } => {
                let state = match crate::worktree::inspect(&info).await {
                    Ok(state) => Some(state),
                    Err(e) => {
                        tracing::debug!(%target, error = %e, "cannot read a member's worktree");
                        None
                    }
                };
                self.report(Event::WorktreeRead { target, state }).await;
            }
            Io::SettleWorktree {
                target,
                info,
                orphan,
                after_close,
            } => {
                let closed = match &after_close {
                    Some((pane, terminal)) => self.close_and_confirm(pane, terminal).await,
                    None => Ok(()),
                };
                let outcome = match closed {
                    Err(e) => Err(e),
                    Ok(()) if orphan => crate::worktree::reclaim(&info).await,
                    Ok(()) => crate::worktree::settle(&info).await,
                };
                self.report(Event::WorktreeSettled {
                    target,
                    info,
                    outcome,
                })
                .await;
            }
            Io::Adopt(member) => {
                // Only an affirmative answer drops it: gone, or another incarnation there.
                let alive = match self.mux.pane(&member.pane).await {
                    Ok(current) => current.info.terminal == member.terminal,
                    Err(e) => !e.is_not_found(),
                };
                self.report(Event::Adopted { member, alive }).await;
            }
            Io::ScanLeads => {
                let panes = match self.mux.list_panes().await {
                    Ok(panes) => Some(scan_panes(&self.mux, panes)),
                    Err(e) => {
                        tracing::debug!(error = %e, "lead-tab scan failed; keeping the last answer");
                        None
                    }
                };
                self.report(Event::LeadsScanned(panes)).await;
            }
            Io::CloseRestored { pane, old } => self.close_restored(&pane, &old).await,
            Io::RemoveLegacyRegistry(path) => {
                let removed = tokio::task::spawn_blocking({
                    let path = path.clone();
                    move || std::fs::remove_file(&path)
                })
                .await;
                match removed {
                    Ok(Ok(())) => {
                        tracing::info!(path = %path.display(), "the imported member registry is in the fleet state now; removed it");
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot remove the imported member registry");
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "removing the imported member registry failed")
                    }
                }
            }
            Io::Close { pane } => {
                if let Err(e) = self.mux.close_pane(&pane).await {
                    tracing::warn!(%pane, error = %e, "cannot close a released member's pane");
                }
            }
        }
    }

    /// Closes a released member's pane incarnation and waits until the multiplexer no longer
    /// has it (gone, or another incarnation there), so nothing of the member runs in it when
    /// its worktree is judged. Gives up after [`CLOSE_CONFIRM`], saying so.
    async fn close_and_confirm(
        &self,
        pane: &QualifiedPaneId,
        terminal: &fleetd_core::TerminalId,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + CLOSE_CONFIRM;
        loop {
            match self.mux.pane(pane).await {
                Ok(current) if current.info.terminal != *terminal => return Ok(()),
                Err(e) if e.is_not_found() => return Ok(()),
                _ if tokio::time::Instant::now() >= deadline => {
                    return Err(format!(
                        "its pane {pane} was not seen closed within {} s, so nothing was removed",
                        CLOSE_CONFIRM.as_secs()
                    ));
                }
                Ok(_) => {
                    if let Err(e) = self.mux.close_pane(pane).await
                        && !e.is_not_found()
                    {
                        tracing::debug!(%pane, error = %e, "closing a released member's pane before settling its worktree");
                    }
                }
                Err(e) => tracing::debug!(%pane, error = %e, "reading a released member's pane"),
            }
            tokio::time::sleep(CLOSE_POLL).await;
        }
    }

    /// Closes the pane a released member had if it is back with another incarnation that is a
    /// shell alone (herdr's restored layout after a restart, v0.8.2 src/persist/restore.rs:
    /// 469-491, 537): nobody's work is there, and it would stay in the members' workspace.
    /// Anything else there — an agent, a program someone started — is left alone.
    async fn close_restored(&self, pane: &QualifiedPaneId, old: &fleetd_core::TerminalId) {
        let Ok(current) = self.mux.pane(pane).await else {
            return;
        };
        if current.info.terminal == *old || current.info.agent.is_some() {
            return;
        }
        let Ok(process) = self.mux.process_info(pane).await else {
            return;
        };
        let shell_alone = process.shell_pid.is_some_and(|shell| {
            !process.foreground_pids.is_empty()
                && process.foreground_pids.iter().all(|p| *p == shell)
        });
        if !shell_alone {
            return;
        }
        tracing::info!(%pane, "closing a released member's pane restored by the multiplexer with a fresh shell");
        if let Err(e) = self.mux.close_pane(pane).await {
            tracing::warn!(%pane, error = %e, "cannot close a released member's restored pane");
        }
    }

    /// Captures the tail of a member's pane and stores it as the ticket's fallback — unless the
    /// member reads busy again a moment later (its turn goes on), or the task's `text` still
    /// waits unsent in its input (the turn that ended was not the task's).
    async fn fallback(&self, target: Target, ticket: Ticket, pane: QualifiedPaneId, text: &str) {
        let busy = super::verify::busy_again(&self.mux, &pane).await;
        let tail = match busy {
            true => String::new(),
            false => (self.mux.read_tail(&pane, FALLBACK_TAIL_LINES).await)
                .unwrap_or_else(|e| format!("(fleetd could not read the pane's output: {e})")),
        };
        if busy || super::verify::unsent(&tail, text) {
            let unsent = !busy;
            let event = Event::TurnNotOver {
                target,
                ticket,
                unsent,
            };
            return self.report(event).await;
        }
        // Raw pane text: a member may have printed its credentials.
        let text = format!(
            "[fleet] {target}'s turn for ticket {ticket} ended without fleet_reply; the last lines of its pane:\n{}",
            self.redactor.redact(tail.trim_end())
        );
        let message = self
            .publish(&target, Some(ticket), MessageKind::Fallback, text)
            .await;
        self.report(Event::FallbackStored {
            target,
            ticket,
            message,
        })
        .await;
    }

    /// Whether `text`, handed to the multiplexer before a restart, reached `pane`: it shows in
    /// the pane's recent lines, or the member is busy (its turn runs). A pane that cannot be
    /// read counts as arrived: a task is never typed twice.
    async fn find_typed(&self, pane: &QualifiedPaneId, text: &str) -> bool {
        match self.mux.read_tail(pane, FIND_TYPED_LINES).await {
            Ok(screen) if shows(&screen, text) => return true,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(%pane, error = %e, "cannot read the pane to learn whether a task reached it; it is taken as typed");
                return true;
            }
        }
        match self.mux.pane(pane).await {
            Ok(found) => !found.info.status.is_at_rest(),
            Err(e) => {
                tracing::warn!(%pane, error = %e, "cannot read the pane's status; a task in doubt is taken as typed");
                true
            }
        }
    }

    /// Starts watching a pane, or has its watch publish the current status again: the reading
    /// comes on the pane's own event stream, in order with its other events.
    async fn watch(&self, pane: QualifiedPaneId) {
        if let Err(e) = self.mux.watch(&pane).await {
            tracing::warn!(%pane, error = %e, "cannot watch pane status; will retry");
            let gone = e.is_not_found();
            self.report(Event::WatchFailed { pane, gone }).await;
        }
    }

    /// Re-reads every inbox's depth (at start: mail from before a restart is nudged too).
    async fn depth_all(&self) {
        let targets = match self.store.targets().await {
            Ok(targets) => targets,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list inboxes; mail from before the start is found by fleet_poll");
                return;
            }
        };
        for target in targets {
            match self.store.depth(&target).await {
                Ok(pending) => self.report(Event::Depth { target, pending }).await,
                Err(e) => tracing::warn!(%target, error = %e, "cannot read inbox depth"),
            }
        }
    }

    /// Publishes a daemon-authored message (secret values redacted); `None` (and an error log)
    /// when the store refuses.
    pub(super) async fn publish(
        &self,
        target: &Target,
        ticket: Option<Ticket>,
        kind: MessageKind,
        text: String,
    ) -> Option<Message> {
        let message = Message {
            msg_id: MsgId::from_uuid(self.clock.new_id()),
            target: target.clone(),
            ticket,
            kind,
            text: self.redactor.redact(&text).into_owned(),
            from: "fleetd".to_owned(),
            created_at: self.clock.now(),
        };
        match self.store.publish(message.clone()).await {
            Ok(_) => Some(message),
            Err(e) => {
                tracing::error!(%target, error = %e, "failed to store a daemon notice");
                None
            }
        }
    }
}

/// How typing into a member's pane went (a submit or the one Enter retry); `started` when the
/// multiplexer saw the turn start.
fn typed(target: Target, ticket: Ticket, result: &Result<(), MuxError>, started: bool) -> Event {
    let outcome = match result {
        Ok(()) if started => TypeOutcome::Started,
        Ok(()) => TypeOutcome::Accepted,
        Err(e) if e.is_uncertain() => TypeOutcome::Uncertain,
        Err(_) => TypeOutcome::Failed,
    };
    Event::Typed {
        target,
        ticket,
        outcome,
        gone: result.as_ref().err().is_some_and(MuxError::is_not_found),
    }
}

/// A listing reduced to what the lead-tab scanner needs. On tmux a window may be named by its
/// name as well as its index (`base:boss` as well as `base:3`).
fn scan_panes(mux: &MuxRouter, panes: Vec<crate::mux::RoutedPane>) -> Vec<ScanPane> {
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

/// Types a nudge into a lead's pane if it still holds the same incarnation. The flag says
/// whether its submission is to be verified (`verify`), once the outcome is reported: for the
/// TUIs that take text arriving with its Enter as a paste (Claude Code, Codex; the pane's
/// command `claude`, `codex` or `node`) when fleetd pasted and pressed Enter itself (tmux).
/// herdr's `agent.prompt` waits for the turn on its own and answers `agent_prompt_stalled`
/// when none starts; no bare Enter follows that. Never for a pane showing a
/// dialog, where an Enter would answer it.
async fn nudge(
    mux: &MuxRouter,
    pane: &QualifiedPaneId,
    terminal: &fleetd_core::TerminalId,
    text: &str,
) -> (InjectOutcome, bool) {
    let tui = match mux.pane(pane).await {
        Ok(current) if current.info.terminal != *terminal => {
            return (InjectOutcome::NotFound, false);
        }
        // Codex from npm runs as `node` on tmux.
        Ok(current) => {
            matches!(
                current.info.agent.as_deref(),
                Some("claude" | "codex" | "node")
            ) && current.info.status != fleetd_core::AgentStatus::Blocked
        }
        Err(e) if e.is_not_found() => return (InjectOutcome::NotFound, false),
        Err(e) => {
            tracing::warn!(%pane, error = %e, "cannot read the lead's pane; will retry the nudge");
            return (InjectOutcome::Transient, false);
        }
    };
    // An earlier copy still in the input box is submitted, never joined by a second one.
    if tui && super::verify::waiting_in_input(mux, pane, text).await {
        tracing::info!(%pane, "the last nudge still waits in the input box; pressing Enter");
        return match mux.press_enter(pane).await {
            Ok(()) => (InjectOutcome::Delivered, true),
            Err(e) if e.is_not_found() => (InjectOutcome::NotFound, false),
            Err(e) => {
                tracing::warn!(%pane, error = %e, "cannot press Enter for the nudge; will retry");
                (InjectOutcome::Transient, false)
            }
        };
    }
    let mut pasted = false;
    let outcome = match mux.nudge(pane, text).await {
        Ok(submitted) => {
            pasted = submitted.path == crate::mux::SubmitPath::TmuxPaste;
            InjectOutcome::Delivered
        }
        Err(e) if e.is_not_found() => InjectOutcome::NotFound,
        Err(e) if e.is_uncertain() => {
            tracing::warn!(%pane, error = %e, "a nudge may have been typed; counted as sent");
            InjectOutcome::Uncertain
        }
        // A dialog came up between the status reading and the prompt: not a failure (SPEC §5).
        Err(e) if e.is_busy() => {
            tracing::debug!(%pane, error = %e, "the lead is busy after all; the nudge waits");
            InjectOutcome::Busy
        }
        Err(e) => {
            tracing::warn!(%pane, error = %e, "nudge failed; will retry");
            InjectOutcome::Transient
        }
    };
    (
        outcome,
        tui && pasted && outcome == InjectOutcome::Delivered,
    )
}

#[cfg(test)]
mod tests;

//! The engine's dispatch: each command and each event, handed to [`State`] with the time it is
//! handled, the replies that must wait for the durable commit deferred until it.

use fleetd_core::refusal::Code;
use jiff::Timestamp;

use super::super::Command;
use super::super::state::{GatewayOutcome, Io, TaskOrder};
use super::{Deferred, Engine, Event, Msg};
use fleetd_core::access::Refusal;
use tokio::sync::{mpsc, oneshot};

/// Inputs from the handles taken in one turn at most: a burst costs one flush and one commit,
/// and the multiplexer's events and the timers still come between bursts.
const TURN_MAX: usize = 64;

impl Engine {
    /// `first`, and what else already waits in the queue behind it (up to [`TURN_MAX`]), in
    /// one turn: their changes are committed together and their deferred replies sent after that
    /// one commit, so eight answers ending at once or sixty-four senders cost one end of turn
    /// (the delegation pass over open tickets, the passes, the commit) rather than one each.
    /// Each is handled with the time it is taken at, and the lead rule's busy spans follow each.
    /// A shutdown ends the turn: its reply is returned, for the loop to stop after the flush.
    pub(super) fn take_turn(
        &mut self,
        first: Msg,
        rx: &mut mpsc::Receiver<Msg>,
        now: Timestamp,
        io: &mut Vec<Io>,
        replies: &mut Vec<Deferred>,
    ) -> Option<oneshot::Sender<()>> {
        let (mut msg, mut now) = (first, now);
        for taken in 1..=TURN_MAX {
            match msg {
                Msg::Command(Command::Shutdown { reply }) => return Some(reply),
                Msg::Command(command) => self.command(command, now, io, replies),
                Msg::Event(event) => self.event(event, now, io),
            }
            self.state.follow_busy(now);
            // Nothing is taken from the queue that this turn would not handle.
            if taken == TURN_MAX {
                break;
            }
            let Ok(queued) = rx.try_recv() else {
                break;
            };
            (msg, now) = (queued, self.parts.clock.now());
        }
        None
    }

    pub(super) fn command(
        &mut self,
        command: Command,
        now: Timestamp,
        io: &mut Vec<Io>,
        replies: &mut Vec<Deferred>,
    ) {
        // The fleet state cannot be written and too much waits for it already: no new work is
        // taken (a task, a spawn) until it is, so what is held stays bounded.
        let backlog = self.backlog.load(std::sync::atomic::Ordering::Acquire);
        if backlog >= super::HELD_BOUND {
            let refusal = || {
                Refusal::new(
                    Code::StoreUnavailable,
                    format!(
                        "fleetd cannot write its fleet state (see its log) and {backlog} changes already wait for it: no new task or spawn is taken until they are written; retry shortly"
                    ),
                )
            };
            match command {
                Command::Submit { reply, .. } => {
                    let _ = reply.send(Err(refusal()));
                    return;
                }
                Command::Reserve { reply, .. } => {
                    let _ = reply.send(Err(refusal()));
                    return;
                }
                command => return self.command_taken(command, now, io, replies),
            }
        }
        self.command_taken(command, now, io, replies);
    }

    fn command_taken(
        &mut self,
        command: Command,
        now: Timestamp,
        io: &mut Vec<Io>,
        replies: &mut Vec<Deferred>,
    ) {
        let s = &mut self.state;
        match command {
            Command::Standing {
                pane,
                terminal,
                age,
                reply,
            } => {
                let _ = reply.send(s.standing(&pane, &terminal, age, now));
            }
            Command::MemberOfUser { uid, reply } => {
                let _ = reply.send(s.member_of_user(uid));
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
                by,
                target,
                task,
                reply,
            } => {
                let order = TaskOrder {
                    lead: lead.as_ref(),
                    by,
                    target,
                    task,
                };
                let submitted = s.submit(order, now, io);
                // The ticket is answered once it is durable; if it could not be kept, the
                // sender hears so rather than holding a ticket a restart would forget.
                replies.push(Box::new(move |stored| {
                    let answer = match stored {
                        Ok(()) => submitted,
                        Err(e) => Err(Refusal::new(Code::StoreUnavailable,
                            match &submitted {
                                Ok(ticket) => format!(
                                    "fleetd failed to {e}. Ticket {ticket} is held and its task is typed once the state is written (retried every second; a restart before then forgets it): do not send it again, poll the ticket"
                                ),
                                Err(_) => format!("fleetd failed to {e}: retry shortly"),
                            },
                        )),
                    };
                    let _ = reply.send(answer);
                }));
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
                let asked = s.ask(target, question, now, io);
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(held(stored, asked, |(id, _)| {
                        format!("question {id} is held and reaches your lead once it is written")
                    }));
                }));
            }
            Command::Answer {
                by,
                question_id,
                answer,
                reply,
            } => {
                let reach = match &by {
                    Some(by) => s.reach_question(by, &question_id, "fleet_answer"),
                    None => Ok(()),
                };
                let answered = reach.and_then(|()| s.answer(&question_id, answer, now, io));
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(held(stored, answered, |_| {
                        "the answer is held and reaches the member once it is written".to_owned()
                    }));
                }));
            }
            Command::Reach {
                by,
                target,
                tool,
                reply,
            } => {
                let _ = reply.send(s.reach(&by, &target, tool));
            }
            Command::Questions { target, reply } => {
                let _ = reply.send(s.questions(target.as_ref()));
            }
            Command::List { reply } => {
                let _ = reply.send(s.list());
            }
            Command::ModelAdmit {
                target,
                key_hash,
                backend,
                reply,
            } => {
                let _ = reply.send(s.model_admit(&target, &key_hash, &backend, io));
            }
            Command::ModelAdmitAt {
                pane,
                terminal,
                key_hash,
                backend,
                reply,
            } => {
                let admitted = s.member_at(&pane, &terminal).map(|(target, _)| {
                    s.model_admit(&target, &key_hash, &backend, io)
                        .map(|account| (target, account))
                });
                let _ = reply.send(admitted);
            }
            Command::ModelUsage {
                account,
                tokens,
                cost_micros,
                reply,
            } => {
                s.model_usage(account, tokens, cost_micros, io);
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(stored.map_err(|e| {
                        Refusal::new(Code::StoreUnavailable, format!("fleetd failed to {e}"))
                    }));
                }));
            }
            Command::SetBudget {
                target,
                tree,
                budget,
                reply,
            } => {
                let set = s.set_budget(&target, tree, budget);
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(held(stored, set, |_| {
                        "the budget is set in memory".to_owned()
                    }));
                }));
            }
            Command::UsageTotals { reply } => {
                let _ = reply.send(s.usage_totals());
            }
            Command::Recent { target, reply } => {
                let _ = reply.send(s.recent(&target));
            }
            Command::Reserve {
                name,
                delegator,
                reply,
            } => {
                let _ = reply.send(s.reserve(name, &delegator, now));
            }
            Command::Unreserve { target } => s.unreserve(&target),
            Command::WorktreeMaking {
                target,
                info,
                lead,
                reply,
            } => {
                s.worktree_making(&target, *info, lead);
                // Answered once durable: the spawn runs `git worktree add` only then.
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(stored.map_err(|e| {
                        Refusal::new(Code::StoreUnavailable,
                            format!(
                                "fleetd failed to {e}, so it cannot record the worktree it is about to make: retry shortly"
                            ),
                        )
                    }));
                }));
            }
            Command::AddMember { member } => s.add_member(*member, now, io),
            Command::WhenReady { target, reply } => s.when_ready(target, reply),
            Command::Release {
                target,
                cause,
                reply,
            } => {
                // A release goes ahead whatever the commit said: its pane is closed either way,
                // and a restart that still finds the member adopts it, sees its pane gone and
                // releases it again (cause `gone`).
                let released = s.release(&target, &cause, now, io);
                replies.push(Box::new(move |_| {
                    let _ = reply.send(released);
                }));
            }
            Command::SetStatus { target, status } => s.set_status(&target, None, status, now, io),
            Command::Panic => panic!("test fault: the engine was asked to panic"),
            Command::HandedTo { ticket, holder } => s.handed_to(ticket, holder),
            Command::Wake(command) => super::super::wake::dispatch(s, command, now, io, replies),
            Command::Unhand { ticket } => s.unhand(ticket, now, io),
            Command::TakeHanded { holder, reply } => {
                let _ = reply.send(s.take_handed(&holder));
            }
            Command::Acked { target, ids } => {
                s.acked(&target, &ids);
                io.push(Io::Depth { target });
            }
            Command::GatewayIn { envelope, reply } => {
                let outcome = s.gateway_in(*envelope, now, io);
                if matches!(outcome, GatewayOutcome::PublishReply(_)) {
                    // A reply changes nothing here until it is stored in the inbox, which the
                    // consumer does next: it need not wait for this turn's commit, which under
                    // load is other callers' tasks (up to 25 ms a round of `fleetd-bench gateway`).
                    let _ = reply.send(Ok(outcome));
                } else {
                    replies.push(Box::new(move |stored| {
                        let _ = reply.send(stored.map(|()| outcome).map_err(|e| e.to_string()));
                    }));
                }
            }
            Command::Forwarded { seq, unroutable } => {
                if unroutable {
                    s.unroutable(seq, now, io);
                } else {
                    s.forwarded(seq);
                }
            }
            Command::PeerQueued { gateway, depth } => s.peer_queued(gateway, depth),
            Command::StopRemote {
                target,
                cause,
                reply,
            } => {
                let sent = s.stop_remote(&target, &cause);
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(sent && stored.is_ok());
                }));
            }
            Command::SpawnRemote { request, reply } => {
                let asked = s.spawn_remote(*request, now);
                replies.push(Box::new(move |stored| {
                    let _ = reply.send(match stored {
                        Ok(()) => asked,
                        Err(e) => Err(fleetd_core::access::Refusal::new(
                            Code::StoreFailed,
                            format!("the spawn request could not be written: {e}"),
                        )),
                    });
                }));
            }
            Command::PeerSpawned { req, outcome } => s.peer_spawned(&req, outcome),
            Command::GatewayRefused { refused } => s.gateway_refused(refused, now, io),
        }
    }

    pub(super) fn event(&mut self, event: Event, now: Timestamp, io: &mut Vec<Io>) {
        match event {
            Event::Typed {
                target,
                ticket,
                outcome,
                gone,
            } => {
                if gone {
                    self.state.release(&target, "exited", now, io);
                } else {
                    self.state.typed(&target, ticket, outcome, now, io);
                }
            }
            Event::TypedFound {
                target,
                ticket,
                arrived,
            } => self.state.typed_found(&target, ticket, arrived, now, io),
            Event::TurnNotOver {
                target,
                ticket,
                unsent,
            } => self.state.turn_not_over(target, ticket, unsent, now, io),
            Event::FallbackStored {
                target,
                ticket,
                message,
            } => {
                match message {
                    Some(message) => {
                        self.state.reply_stored(message, now, io);
                    }
                    // The tail could not be stored: the ticket still ends.
                    None => self.state.turn_ended_unrecorded(ticket, now),
                }
                self.state.fallback_recorded(target, now, io);
            }
            Event::Injected { lead, outcome } => self.state.injected(lead, outcome, now, io),
            Event::Depth { target, pending } => self.state.inbox_depth(target, pending, now, io),
            Event::WorktreeRead { target, state } => self.state.worktree_read(&target, state),
            Event::WorktreeSettled {
                target,
                info,
                outcome,
            } => self.state.worktree_settled(&target, &info, outcome, io),
            Event::Adopted { member, alive } => self.state.adopted(&member, alive, now, io),
            Event::Reconciled { replies } => {
                for message in replies {
                    self.state.reply_stored(message, now, io);
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
}

/// A state change's answer once its commit is done: as decided when it was written; when the
/// commit failed, `store_unavailable` saying what is held (`held_what`) — it is written with the
/// next commit that succeeds, unless fleetd restarts first — so the caller neither believes it
/// kept nor does it twice.
fn held<T>(
    stored: Result<(), crate::store::StoreError>,
    outcome: Result<T, Refusal>,
    held_what: impl FnOnce(&T) -> String,
) -> Result<T, Refusal> {
    match (stored, outcome) {
        (Ok(()), outcome) | (Err(_), outcome @ Err(_)) => outcome,
        (Err(e), Ok(kept)) => Err(Refusal::new(
            Code::StoreUnavailable,
            format!(
                "fleetd failed to {e}: {} (retried every second; a restart before then forgets it). Do not do it again",
                held_what(&kept)
            ),
        )),
    }
}

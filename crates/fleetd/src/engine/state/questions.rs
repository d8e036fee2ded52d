//! Questions: `fleet_ask` opens one, `fleet_answer` closes it (to the waiting member, or as a
//! task when it stopped waiting).

use crate::events::FleetEvent;
use fleetd_core::Target;
use fleetd_core::access::Refusal;
use fleetd_core::push::PushInput;
use fleetd_core::refusal::Code;
use jiff::Timestamp;
use tokio::sync::oneshot;

use super::super::{AnswerRoute, QuestionView};
use super::{Io, Question, State, TaskOrder};

impl State {
    /// Opens a question of `target`, unless it already has `limits.maxOpenQuestions` open.
    pub(in crate::engine) fn ask(
        &mut self,
        target: Target,
        text: String,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<(String, oneshot::Receiver<String>), Refusal> {
        let open = self
            .questions
            .values()
            .filter(|q| q.target == target)
            .count();
        let max = self.limits.max_open_questions;
        if u64::try_from(open).unwrap_or(u64::MAX) >= max {
            return Err(Refusal::new(
                Code::TooManyQuestions,
                format!(
                    "{target} already has {open} open questions, the most allowed (limits.maxOpenQuestions = {max}): your lead has not answered them yet; keep working with what you know, or wait for the answers (they arrive as tasks) before asking again"
                ),
            ));
        }
        let id = self.ids.new_id().to_string();
        self.emit(FleetEvent::QuestionOpened {
            question_id: id.clone(),
            target: target.to_string(),
        });
        let (tx, rx) = oneshot::channel();
        self.dirty.questions.insert(id.clone());
        // A member working on another gateway's task asks that gateway's lead.
        let peer = self.ask_remote(&target, &id, &text);
        self.questions.insert(
            id.clone(),
            Question {
                target: target.clone(),
                text,
                waiter: Some(tx),
                peer: peer.clone(),
            },
        );
        // A member here asking about another gateway's task, or one whose ticket a live MCP
        // task watches (it reports the question): no nudge.
        if peer.is_some() || self.wake_holds_question(&target, &id, now) {
            return Ok((id, rx));
        }
        self.feed_push(
            PushInput::QuestionOpened {
                target,
                question_id: id.clone(),
            },
            now,
            io,
        );
        Ok((id, rx))
    }

    pub(in crate::engine) fn answer(
        &mut self,
        id: &str,
        answer: String,
        now: Timestamp,
        io: &mut Vec<Io>,
    ) -> Result<AnswerRoute, Refusal> {
        let removed = self.questions.remove(id);
        if removed.is_some() {
            self.dirty.questions.insert(id.to_owned());
        }
        let Some(mut question) = removed else {
            return Err(Refusal::new(
                Code::UnknownQuestion,
                format!(
                    "no open question {id}: it was answered already or never asked; fleet_poll(target=...) lists open questions"
                ),
            ));
        };
        self.emit(FleetEvent::QuestionClosed {
            question_id: id.to_owned(),
            target: question.target.to_string(),
            how: "answered".to_owned(),
        });
        self.feed_push(
            PushInput::QuestionClosed {
                question_id: id.to_owned(),
            },
            now,
            io,
        );
        if question.target.gateway().is_some()
            && let Some(peer) = &question.peer
        {
            self.done_with(super::gateway::done_key("question", id, peer), now);
            self.answer_remote(peer, id, answer);
            return Ok(AnswerRoute::Gateway);
        }
        let answer = match question.waiter.take() {
            Some(waiter) => match waiter.send(answer) {
                Ok(()) => return Ok(AnswerRoute::Waiter),
                Err(answer) => answer,
            },
            None => answer,
        };
        // The member stopped waiting: the answer reaches it as a task, in order with its others.
        // Past the queue cap too: the question was let in under its own cap, and its answer is
        // already taken out of the open questions, so refusing it here would lose it.
        let task = format!("Answer to your question {id} ({}): {answer}", question.text);
        let order = TaskOrder {
            lead: None,
            by: None,
            target: question.target.clone(),
            task,
        };
        match self.enqueue(order, now, io) {
            Ok(_) => Ok(AnswerRoute::Task),
            Err(refusal) => Err(refusal),
        }
    }

    /// A question's asker stopped waiting: it stays open for `fleet_answer`.
    pub(in crate::engine) fn questions(&self, target: Option<&Target>) -> Vec<QuestionView> {
        self.questions
            .iter()
            .filter(|(_, q)| target.is_none_or(|t| *t == q.target))
            .map(|(id, q)| QuestionView {
                question_id: id.clone(),
                target: Some(q.target.clone()),
                question: q.text.clone(),
            })
            .collect()
    }
}

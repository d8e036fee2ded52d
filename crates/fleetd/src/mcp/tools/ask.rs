//! `fleet_ask`: a member asks its lead a question and waits for the answer.

use fleetd_core::refusal::Code;
use std::time::Duration;

use fleetd_core::access::ToolClass;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, calling_member, gone, output};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Default and longest wait for an answer, in seconds.
const DEFAULT_WAIT_SECS: u64 = 300;
const MAX_WAIT_SECS: u64 = 3600;

/// Arguments of `fleet_ask`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The question for your lead.
    question: String,
    /// How long to wait for the answer, in seconds (default 300, at most 3600). If it passes
    /// first, you get {status: pending, questionId} and the answer arrives later as a task.
    wait_secs: Option<u64>,
}

pub(crate) struct Ask;

impl FleetTool for Ask {
    const NAME: &'static str = "fleet_ask";
    const DESCRIPTION: &'static str = "Ask the lead who gave you your task a question and wait for the answer: returns {answer}. If no answer comes within waitSecs, returns {status: pending, questionId}; keep working if you can, the answer will arrive later as a task message.";
    const CLASS: ToolClass = ToolClass::Worker;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let target = calling_member(caller, Self::NAME)?;
        if args.question.trim().is_empty() {
            return Err(ToolError::new(Code::EmptyQuestion, "the question is empty"));
        }
        let max = super::max_message_bytes(fleet);
        if args.question.len() > max {
            return Err(ToolError::new(
                Code::QuestionTooLarge,
                format!("the question is over {max} bytes"),
            ));
        }
        let (id, answer) = fleet
            .engine
            .ask_question(
                target.clone(),
                fleet.redactor.redact(&args.question).into_owned(),
            )
            .await
            .map_err(gone)??;
        let secs = args
            .wait_secs
            .unwrap_or(DEFAULT_WAIT_SECS)
            .min(MAX_WAIT_SECS);
        let answer = tokio::select! {
            answer = tokio::time::timeout(Duration::from_secs(secs), answer) => answer,
            () = caller.cancel.cancelled() => {
                return Err(ToolError::new(Code::Cancelled, format!("the request was abandoned; question {id} stays open")));
            }
        };
        match answer {
            Ok(Ok(answer)) => output(
                json!({ "questionId": id, "answer": answer }),
                format!("answer to {id}"),
            ),
            _ => output(
                json!({ "questionId": id, "status": "pending" }),
                format!("question {id} pending; the answer will arrive as a task"),
            ),
        }
    }
}

//! `fleet_answer`: answer a member's open question.

use fleetd_core::access::ToolClass;
use fleetd_core::refusal::Code;
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{FleetTool, gone, member_of, output};
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};

/// Arguments of `fleet_answer`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Args {
    /// The question's id (from fleet_poll or fleet_status).
    question_id: String,
    /// Your answer.
    answer: String,
}

pub(crate) struct Answer;

impl FleetTool for Answer {
    const NAME: &'static str = "fleet_answer";
    const DESCRIPTION: &'static str = "Answer a member's question (from fleet_ask). If the member is still waiting it gets the answer at once (deliveredTo: waiter); otherwise the answer is delivered to it as a task (deliveredTo: task); a member on another host (name@gateway) gets it through its gateway (deliveredTo: gateway). A delegating member may answer only questions of its own subtree (not_your_member).";
    const CLASS: ToolClass = ToolClass::Orchestration;
    type Args = Args;

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        let max = super::max_message_bytes(fleet);
        if args.answer.len() > max {
            return Err(ToolError::new(
                Code::AnswerTooLarge,
                format!("the answer is over {max} bytes (inbox.maxMessageBytes)"),
            ));
        }
        let route = fleet
            .engine
            .answer(member_of(caller), args.question_id.clone(), args.answer)
            .await
            .map_err(gone)??;
        output(
            json!({ "questionId": args.question_id, "deliveredTo": route }),
            format!("answered question {}", args.question_id),
        )
    }
}

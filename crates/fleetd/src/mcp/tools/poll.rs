//! `fleet_poll`: read a ticket's state, or a member's pending replies and questions a page at a
//! time (SPEC §3: `limit`, `after`, `more`, a byte budget per answer). Never destructive:
//! messages stay until `fleet_ack`. Holds one page of bodies in memory, however deep the inbox.

use fleetd_core::access::{Role, ToolClass};
use fleetd_core::refusal::Code;
use fleetd_core::{Message, MessageKind, MsgId, Target, Ticket};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{FleetTool, gone, output, store_error, target, within_reach};
use crate::engine::TicketAnswer;
use crate::mcp::{Caller, Fleet, ToolError, ToolOutput};
use crate::store::{InboxStore, PageRequest, StoreError};

/// Replies in one answer when the caller gives no `limit` (SPEC §3).
pub(crate) const DEFAULT_LIMIT: u64 = 20;
/// The largest `limit` a caller may ask for.
pub(crate) const MAX_LIMIT: u64 = 100;
/// Most bytes of reply text in one answer (~1 MiB, SPEC §3). The first reply of a page is always
/// included whatever its size, so a reply as large as `inbox.maxMessageBytes` can be read.
pub(crate) const PAGE_BYTES: usize = 1024 * 1024;
/// How many of a member's oldest pending messages `fleet_poll{ticket}` looks through for the
/// ticket's reply, a page at a time. A reply further back is read with `fleet_poll{target}`.
const TICKET_SCAN: usize = 100;

/// Arguments of `fleet_poll`: exactly one of `ticket` or `target`.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(crate) struct Args {
    /// A ticket from fleet_send: returns its state and reply.
    ticket: Option<String>,
    /// A member's name: returns a page of its pending replies and its open questions.
    target: Option<String>,
    /// With target: most replies in this answer (default 20, at most 100). An answer also holds
    /// at most about 1 MiB of reply text (always at least one reply).
    #[schemars(with = "Option<u32>", range(min = 1, max = 100))]
    limit: Option<Value>,
    /// With target: the msgId of the last reply you have seen; the page starts after it. Omit it
    /// for the oldest. If that reply is no longer pending (acknowledged), the page starts from the
    /// oldest pending reply and says afterNotPending=true.
    after: Option<String>,
    /// With ticket: true waits for the ticket's next news (a reply, a question from its member,
    /// the end of its turn) as an MCP task your client polls, when your client takes MCP tasks
    /// (Claude Code does): your next turn starts with it. Other clients get the state at once.
    wait: Option<bool>,
}

pub(crate) struct Poll;

impl FleetTool for Poll {
    const NAME: &'static str = "fleet_poll";
    const DESCRIPTION: &'static str = "Read without removing. ticket=T → {ticket, state, reply?}; with wait=true, to a client that takes MCP tasks, a background task that completes on the ticket's next news (use it to keep waiting after answering a question). target=NAME → {target, replies:[{msgId, kind, ticket?, text, createdAt}], questions:[{questionId, question}], more}: one page of the member's pending replies, oldest first — at most `limit` (default 20, max 100) and about 1 MiB of text. When more=true, call again with after=<the last msgId you got> for the next page, or fleet_ack what you have read and poll again. Acknowledge what you have read with fleet_ack so it is not shown (or nudged about) again. A member may call it with its own ticket to read a long task; a delegating member may read the tickets it sent and the inboxes of its own subtree (not_your_member).";
    const CLASS: ToolClass = ToolClass::ReadOnly;
    type Args = Args;

    /// Reading one ticket is its own class: a member may read its own task through it (the
    /// pointer it is given for a task too long to type).
    fn class_of(args: &serde_json::Value) -> ToolClass {
        if args.get("ticket").is_some_and(|t| !t.is_null()) {
            ToolClass::Ticket
        } else {
            Self::CLASS
        }
    }

    async fn call(fleet: &Fleet, caller: &Caller, args: Args) -> Result<ToolOutput, ToolError> {
        match (args.ticket, args.target) {
            (Some(ticket), None) => {
                // `wait` is served before the tool runs (`mcp::wake`); here it is the state now.
                let _ = args.wait;
                if args.limit.is_some() || args.after.is_some() {
                    return Err(ToolError::new(
                        Code::InvalidArguments,
                        "`limit` and `after` page a member's inbox: give them with `target`, not `ticket`",
                    ));
                }
                by_ticket(fleet, caller, &ticket).await
            }
            (None, Some(name)) => {
                let request = page_request(args.limit.as_ref(), args.after.as_deref())?;
                by_target(fleet, caller, &name, request).await
            }
            _ => Err(ToolError::new(
                Code::InvalidArguments,
                "give exactly one of `ticket` (a ticket from fleet_send) or `target` (a member's name)",
            )),
        }
    }
}

async fn by_ticket(fleet: &Fleet, caller: &Caller, text: &str) -> Result<ToolOutput, ToolError> {
    let ticket =
        Ticket::parse(text).map_err(|e| ToolError::new(Code::InvalidTicket, e.to_string()))?;
    let answer = fleet.engine.ticket(ticket).await.map_err(gone)?;
    if let Role::Member {
        target,
        allow_delegation,
    } = &caller.role
    {
        // A member reads its own task (the pointer for a task too long to type); a delegating
        // member reads the tickets it sent, like a lead.
        let sent_it = *allow_delegation
            && matches!(&answer, TicketAnswer::Live(view) if view.sent_by.as_deref() == Some(target.as_str()));
        if !sent_it {
            return match fleet.engine.task_text(ticket).await.map_err(gone)? {
                Some((owner, task)) if owner == *target => output(
                    json!({ "ticket": ticket, "task": task }),
                    format!("task {ticket} ({} bytes)", task.len()),
                ),
                _ => Err(ToolError::new(
                    Code::NotYourTicket,
                    format!(
                        "ticket {ticket} is not one of yours; answer your current task with fleet_reply"
                    ),
                )),
            };
        }
    }
    match answer {
        TicketAnswer::Live(view) => {
            let reply = find_reply(&*fleet.store, &view.target, ticket)
                .await
                .map_err(|e| store_error(&e))?;
            let mut value = json!({ "ticket": ticket, "target": view.target, "state": view.state, "cause": view.cause });
            if let Some(reply) = &reply {
                value["reply"] = super::send::reply_json(reply);
            }
            output(value, format!("ticket {ticket}: {}", view.state.as_str()))
        }
        TicketAnswer::Expired => output(
            json!({ "ticket": ticket, "state": "expired", "hint": "the ticket finished longer ago than tickets.ttlAfterFinishSecs; its reply, if unread, is in the member's inbox: fleet_poll(target=...)" }),
            format!("ticket {ticket} expired; read the member's inbox with fleet_poll(target=...)"),
        ),
        TicketAnswer::Unknown => Err(ToolError::new(
            Code::UnknownTicket,
            format!(
                "fleetd never issued ticket {ticket} (or restarted since): read the member's inbox with fleet_poll(target=...)"
            ),
        )),
    }
}

/// The page `limit` and `after` ask for; a bad value is refused naming its argument.
fn page_request(limit: Option<&Value>, after: Option<&str>) -> Result<PageRequest, ToolError> {
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(value) => value
            .as_u64()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ToolError::new(Code::InvalidArguments,
                    format!(
                        "`limit` must be a whole number from 1 to {MAX_LIMIT} (got {value}); omit it for {DEFAULT_LIMIT}"
                    ),
                )
            })?,
    };
    let after = after
        .map(|id| {
            MsgId::parse(id).map_err(|e| {
                ToolError::new(Code::InvalidArguments,
                    format!(
                        "`after` must be the msgId of a reply you have seen ({e}); omit it to start from the oldest"
                    ),
                )
            })
        })
        .transpose()?;
    Ok(PageRequest {
        after,
        limit: usize::try_from(limit).unwrap_or(usize::MAX),
        max_bytes: PAGE_BYTES,
    })
}

/// The reply to `ticket` among the oldest [`TICKET_SCAN`] pending messages of `target` (its
/// `reply`, else any message for it, such as the turn-end fallback), read a bounded page at a
/// time so only one page and the match are held.
pub(crate) async fn find_reply(
    store: &dyn InboxStore,
    target: &Target,
    ticket: Ticket,
) -> Result<Option<Message>, StoreError> {
    let mut other = None;
    let mut after = None;
    let mut seen = 0;
    while seen < TICKET_SCAN {
        let request = PageRequest {
            after,
            limit: TICKET_SCAN - seen,
            max_bytes: PAGE_BYTES,
        };
        let page = store.page(target, request).await?;
        for message in page.messages {
            seen += 1;
            after = Some(message.msg_id);
            if message.ticket == Some(ticket) {
                if message.kind == MessageKind::Reply {
                    return Ok(Some(message));
                }
                other.get_or_insert(message);
            }
        }
        if !page.more {
            break;
        }
    }
    Ok(other)
}

async fn by_target(
    fleet: &Fleet,
    caller: &Caller,
    name: &str,
    request: PageRequest,
) -> Result<ToolOutput, ToolError> {
    let target = target(name)?;
    within_reach(fleet, caller, &target, Poll::NAME).await?;
    let page = fleet
        .store
        .page(&target, request)
        .await
        .map_err(|e| store_error(&e))?;
    let questions = fleet
        .engine
        .questions(Some(target.clone()))
        .await
        .map_err(gone)?;
    let replies: Vec<_> = page.messages.iter().map(super::send::reply_json).collect();
    let mut summary = format!(
        "{target}: {} pending messages on this page, {} open questions",
        replies.len(),
        questions.len()
    );
    if let Some(last) = page.messages.last().filter(|_| page.more) {
        summary.push_str(&format!(
            "; more follow: fleet_poll(target={target}, after={})",
            last.msg_id
        ));
    }
    let mut value = json!({
        "target": target,
        "replies": replies,
        "questions": questions,
        "more": page.more,
    });
    if page.after_not_pending {
        value["afterNotPending"] = json!(true);
        summary.push_str(
            "; `after` is no longer pending (acknowledged?), so this page starts from the oldest",
        );
    }
    output(value, summary)
}

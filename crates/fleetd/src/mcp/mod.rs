//! MCP: fleetd's tool contract (SPEC §3) served over streamable HTTP at `/mcp` and over the unix
//! socket the `fleetd mcp` stdio shim relays to. Owns the MCP wire (rmcp), tool dispatch, error
//! mapping and caller identity; the only module that knows MCP. Tools decide nothing themselves:
//! they ask the engine, the store and the multiplexer.
//!
//! Identity comes from the connection only (SPEC §2), decided by `identity` exactly as for the
//! REST API: a loopback TCP peer is traced to its user, process and pane by the locator (cached
//! for the life of the connection), a unix-socket peer by `SO_PEERCRED`. Tool arguments are
//! never consulted.

pub(crate) mod tools;
pub mod wake;

use std::sync::Arc;

use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    DiscoverResult, GetTaskParams, GetTaskResult, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ServerCapabilities,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::clock::SharedClock;
use crate::config::Live;
use crate::engine::EngineHandle;
pub use crate::identity::Caller;
use crate::identity::{self, ConnInfo};
use crate::locate::Locator;
use crate::mux::MuxRouter;
use crate::store::InboxStore;

/// The MCP endpoint as a tower service, mounted by `http` at `/mcp`.
pub type HttpService = StreamableHttpService<FleetMcp, LocalSessionManager>;

/// Room for a request body: enough for a task or reply at the configured limit to reach the
/// tool (which refuses it with the limit named) rather than being cut off by the transport.
const MIN_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Builds the `/mcp` service: stateless JSON mode (identity comes from the connection, so no
/// session is needed, and a daemon restart never strands a client's session). The `Host` and
/// `Origin` rules are `http`'s, applied to every route alike, so rmcp's own host check is off.
pub fn http_service(fleet: Arc<Fleet>) -> HttpService {
    // `inbox` is boot-only, so the limit read at start holds for the daemon's life.
    let max_message = tools::max_message_bytes(&fleet);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_max_request_body_bytes(MIN_BODY_BYTES.max(max_message.saturating_mul(2)))
        .disable_allowed_hosts();
    StreamableHttpService::new(
        move || Ok(FleetMcp::new(Arc::clone(&fleet))),
        Arc::new(LocalSessionManager::default()),
        config,
    )
}

/// How long after an agent listed fleetd's tools it counts as ready for a task. Claude Code
/// answers `tools/list` before it has put the tools in its next model request: a task typed
/// within ~100 ms of the list went out without them (measured with 2.1.332; 250 ms was enough).
pub const TOOLS_SETTLE: Duration = Duration::from_millis(500);

/// How long after connecting an agent that never lists tools counts as ready (then as soon as
/// it shows idle). Every agent measured lists them within 50 ms of connecting.
pub const UNLISTED_BOUND: Duration = Duration::from_secs(5);

/// How often a waiting tool call whose client gave a `progressToken` hears that it is still
/// running. Claude Code fails a call that sends nothing for 60 s; a progress notification turns
/// the answer into an event stream and keeps it alive.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// The longest a waiting call (`fleet_send`, `fleet_ask`) waits for a client that gave no
/// `progressToken`, which fleetd therefore cannot keep alive: under the 60 s after which Claude
/// Code and Codex give up on a silent call. The caller gets its ticket; the reply is nudged.
pub const SILENT_WAIT_CAP_SECS: u64 = 50;

/// The tools that wait, and the argument that says how long.
const WAITING_TOOLS: [(&str, &str); 2] = [("fleet_send", "timeoutSecs"), ("fleet_ask", "waitSecs")];

/// What tools work with.
#[derive(Debug, Clone)]
pub struct Fleet {
    /// The engine.
    pub engine: EngineHandle,
    /// The inbox.
    pub store: Arc<dyn InboxStore>,
    /// The multiplexers.
    pub mux: MuxRouter,
    /// The caller locator.
    pub locator: Locator,
    /// The running configuration: read `current()` once per tool call (a reload swaps it).
    pub config: Live,
    /// The clock.
    pub clock: SharedClock,
    /// The API token's value, when configured (compared with a caller's bearer token).
    pub api_token: Option<crate::secrets::SecretValue>,
    /// Takes secret values out of what members send towards a lead (replies, questions).
    pub redactor: crate::secrets::Redactor,
    /// The inbox with its engine notifications (acks, replies handed to waiters).
    pub inbox: crate::inbox::Inbox,
    /// Spawns members (`fleet_spawn`), each on a task of its own.
    pub spawner: crate::members::Spawner,
    /// Other gateways' members and profiles as their presence said (empty on one host).
    pub peers: crate::gateway::presence::Peers,
    /// Each member's calls under way (`connections.perMember`).
    pub calls: crate::conn::MemberCalls,
    /// Members waiting on a dialog, and answering them (SPEC §20).
    pub human: crate::human::Human,
}

impl Fleet {
    /// Whether `given` is the configured API token (false when none is configured). Compared
    /// in constant time.
    pub fn token_matches(&self, given: &str) -> bool {
        self.api_token.as_ref().is_some_and(|expected| {
            identity::constant_time_eq(expected.expose().as_bytes(), given.as_bytes())
        })
    }
}

/// A tool's successful answer: structured JSON plus a one-line summary.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    /// `structuredContent`.
    pub value: Value,
    /// The one-line text content.
    pub summary: String,
}

/// A refusal or failure with a stable code and what to do next.
pub type ToolError = fleetd_core::access::Refusal;

/// The MCP server for one transport. Cheap to clone; rmcp makes one per HTTP request.
#[derive(Debug, Clone)]
pub struct FleetMcp {
    fleet: Arc<Fleet>,
    /// The connection of a unix-socket session, known before any request (the stdio shim).
    fixed_conn: Option<ConnInfo>,
    /// That session's slot in the connection gate: busy while a tool call or a task poll is
    /// under way, idle (so closable to make room) otherwise.
    session: Option<Arc<crate::conn::Admission>>,
}

/// A request under way on a stdio shim session: the session is not idle until it ends.
struct Busy(Option<Arc<crate::conn::Admission>>);

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(admission) = &self.0 {
            admission.request_finished();
        }
    }
}

/// A JSON-RPC error line (id `null`: it answers no particular request) for a stdio session the
/// daemon refuses before any request: what a `fleetd mcp` relay's client reads instead of a hang.
pub fn refusal_line(code: &str, message: &str) -> String {
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32000, "message": format!("{code}: {message}") },
    });
    format!("{error}\n")
}

const INSTRUCTIONS: &str = "fleetd connects a lead agent with member agents in other panes. \
Leads: fleet_profiles / fleet_spawn to start members, fleet_send to delegate (waits for the reply \
by default), fleet_poll to read replies and questions, fleet_ack once read, fleet_answer to answer \
a member's question, fleet_stop to release a member. Members: answer your task with fleet_reply \
(text you only print in your pane reaches nobody); ask the lead with fleet_ask.";

impl FleetMcp {
    /// A server for HTTP requests (identity from each request's connection).
    pub fn new(fleet: Arc<Fleet>) -> Self {
        Self {
            fleet,
            fixed_conn: None,
            session: None,
        }
    }

    /// A server for one unix-socket connection (the stdio shim's), holding `session`, its slot
    /// in the connection gate.
    pub fn for_connection(
        fleet: Arc<Fleet>,
        conn: ConnInfo,
        session: Arc<crate::conn::Admission>,
    ) -> Self {
        Self {
            fleet,
            fixed_conn: Some(conn),
            session: Some(session),
        }
    }

    /// Marks a request under way on this session (nothing for HTTP, whose door does it); an
    /// error when the gate has just closed the session to make room.
    fn busy(&self) -> Result<Busy, ErrorData> {
        match &self.session {
            Some(admission) if !admission.request_started() => Err(ErrorData::internal_error(
                "this session was closed to make room for another connection; reconnect",
                None,
            )),
            session => Ok(Busy(session.clone())),
        }
    }

    async fn caller(&self, ctx: &RequestContext<RoleServer>) -> Caller {
        if let Some(conn) = &self.fixed_conn {
            return identity::resolve(&self.fleet, Some(conn), None, ctx.ct.clone()).await;
        }
        // Over HTTP, rmcp passes the request's parts along: the connection axum accepted and the
        // headers (for the API token).
        let parts = ctx.extensions.get::<http::request::Parts>();
        let conn = parts.and_then(|p| {
            p.extensions
                .get::<axum::extract::ConnectInfo<ConnInfo>>()
                .map(|c| &c.0)
        });
        let bearer = parts.and_then(|p| crate::http::bearer(&p.headers));
        identity::resolve(&self.fleet, conn, bearer, ctx.ct.clone()).await
    }

    /// Notes the caller's presence (what makes a member ready for its task) after `delay`, on a
    /// task of its own so the request is answered first. `what` names the request in the log.
    async fn note_presence_after(
        &self,
        ctx: &RequestContext<RoleServer>,
        what: &'static str,
        delay: Duration,
    ) {
        let caller = self.caller(ctx).await;
        let pane = caller.pane.as_ref().or(caller.unregistered.as_ref());
        tracing::debug!(caller = %caller, pane = ?pane.map(|p| p.pane.to_string()), "MCP {what}");
        // Readiness is a member's: a lead's presence is noted as it comes, without a task.
        if matches!(caller.role, fleetd_core::access::Role::Lead) {
            identity::note_presence(&self.fleet, &caller).await;
            return;
        }
        let fleet = Arc::clone(&self.fleet);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            identity::note_presence(&fleet, &caller).await;
        });
    }
}

/// `args` with the wait of a waiting tool capped at [`SILENT_WAIT_CAP_SECS`] (set to it when
/// absent), for a client fleetd cannot keep alive.
fn cap_silent_wait(tool: &str, args: &mut serde_json::Map<String, Value>) {
    if let Some((_, key)) = WAITING_TOOLS.iter().find(|(name, _)| *name == tool) {
        let asked = args.get(*key).and_then(Value::as_u64);
        let capped = asked.map_or(SILENT_WAIT_CAP_SECS, |s| s.min(SILENT_WAIT_CAP_SECS));
        // A malformed value is left for the tool to refuse with its own message.
        if asked.is_some() || !args.contains_key(*key) {
            args.insert((*key).to_owned(), Value::from(capped));
        }
    }
}

/// Runs `call`, telling the client every [`HEARTBEAT`] that it is still running (the first
/// notification turns the HTTP answer into an event stream, which the client keeps open).
async fn with_heartbeat<F: std::future::Future>(
    call: F,
    peer: &Peer<RoleServer>,
    token: ProgressToken,
) -> F::Output {
    tokio::pin!(call);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    let mut beats = 0u32;
    loop {
        tokio::select! {
            out = &mut call => return out,
            _ = ticks.tick() => {
                beats += 1;
                let mut note = ProgressNotificationParam::new(token.clone(), f64::from(beats));
                note.message = Some("still waiting".to_owned());
                if let Err(e) = peer.notify_progress(note).await {
                    tracing::debug!(error = %e, "progress notification not sent");
                }
            }
        }
    }
}

impl ServerHandler for FleetMcp {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("fleetd", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // A stdio session that shook hands is an agent's, not a flood's socket: when the gate
        // must close an idle connection, those that never served a request go first.
        let _busy = self.busy()?;
        // An agent connects to its MCP servers at start-up, then lists the tools: ready is when
        // it has them (`list_tools`), or a while after connecting for one that never lists them.
        self.note_presence_after(&context, "initialize", UNLISTED_BOUND)
            .await;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        // MCP 2026-07-28's handshake (Claude Code 2.1.332): no `initialize` comes.
        let _busy = self.busy()?;
        self.note_presence_after(&context, "server/discover", UNLISTED_BOUND)
            .await;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.note_presence_after(&context, "tools listed", TOOLS_SETTLE)
            .await;
        Ok(ListToolsResult {
            tools: tools::definitions(),
            ..ListToolsResult::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _busy = self.busy()?;
        let caller = self.caller(&context).await;
        identity::note_presence(&self.fleet, &caller).await;
        let name = request.name.to_string();
        let progress = context
            .meta
            .get_progress_token()
            .or_else(|| request.meta.as_ref()?.get_progress_token());
        let mut args = request.arguments.unwrap_or_default();
        let takes_tasks = context
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks());
        if takes_tasks && wake::takes_task(&name, &args) {
            // The keystroke-free wake: a task now, the reply when the client polls it.
            return match wake::call_as_task(&self.fleet, &caller, &name, args).await {
                Ok(task) => Ok(CallToolResponse::Task(task)),
                Err(outcome) => Ok(tool_result(&name, &caller, outcome).into()),
            };
        }
        if progress.is_none() {
            cap_silent_wait(&name, &mut args);
        }
        let call = tools::call(&self.fleet, &caller, &name, Value::Object(args));
        let outcome = match progress {
            Some(token) => with_heartbeat(call, &context.peer, token).await,
            None => call.await,
        };
        Ok(tool_result(&name, &caller, outcome).into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let _busy = self.busy()?;
        let caller = self.caller(&context).await;
        wake::get(&self.fleet, &caller, &request.task_id, &context.ct)
            .await
            .map(GetTaskResult::new)
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&context).await;
        wake::cancel(&self.fleet, &caller, &request.task_id).await
    }
}

/// A tool's outcome as its MCP result: structured content and a one-line text, or the
/// refusal's code and message.
fn tool_result(
    name: &str,
    caller: &Caller,
    outcome: Result<ToolOutput, ToolError>,
) -> CallToolResult {
    match outcome {
        Ok(out) => {
            tracing::debug!(tool = %name, caller = %caller, "tool call ok");
            let mut result = CallToolResult::structured(out.value);
            result.content = vec![ContentBlock::text(out.summary)];
            result
        }
        Err(err) => {
            tracing::info!(tool = %name, caller = %caller, code = err.code.as_str(), "tool call refused");
            let mut result = CallToolResult::structured_error(serde_json::json!({
                "code": err.code,
                "message": err.message,
            }));
            result.content = vec![ContentBlock::text(format!("{}: {}", err.code, err.message))];
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn capped(tool: &str, args: Value) -> Value {
        let Value::Object(mut map) = args else {
            panic!("an object")
        };
        cap_silent_wait(tool, &mut map);
        Value::Object(map)
    }

    #[test]
    fn a_silent_wait_is_capped_under_a_minute_and_nothing_else_changes() {
        assert_eq!(
            capped("fleet_send", json!({"target": "a", "task": "t"})),
            json!({"target": "a", "task": "t", "timeoutSecs": SILENT_WAIT_CAP_SECS})
        );
        assert_eq!(
            capped("fleet_send", json!({"timeoutSecs": 10})),
            json!({"timeoutSecs": 10}),
            "a shorter wait stays"
        );
        assert_eq!(
            capped("fleet_ask", json!({"waitSecs": 600})),
            json!({"waitSecs": SILENT_WAIT_CAP_SECS})
        );
        assert_eq!(
            capped("fleet_send", json!({"timeoutSecs": "soon"})),
            json!({"timeoutSecs": "soon"}),
            "a malformed wait is the tool's to refuse"
        );
        assert_eq!(
            capped("fleet_poll", json!({"target": "a"})),
            json!({"target": "a"})
        );
    }
}

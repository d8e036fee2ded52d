//! What the crate's driver tests share: an engine's parts on the fake multiplexer and the
//! memory store (no durable state, no gateway, tokio's pausable clock at the Unix epoch), the
//! fleet the tools serve on such an engine and a caller of them, the member they register, and
//! the reply a member stores; and a loopback TCP connection for the tests that trace a
//! connection to its process.

use std::sync::Arc;

use fleetd_core::{
    Message, MessageKind, MessageLimits, MsgId, MuxDaemon, PaneId, QualifiedPaneId, Target,
    TerminalId, Ticket,
};
use jiff::Timestamp;

use crate::clock::TokioClock;
use crate::engine::{EngineParts, NewMember};
use crate::mcp::{Caller, Fleet};
use crate::mux::MuxRouter;
use crate::mux::fake::FakeMux;
use crate::store::{InboxStore, MemoryStore};

/// `yaml` as the daemon's configuration (no environment variables); it must be valid.
pub(crate) fn config(yaml: &str) -> crate::config::Config {
    crate::config::Config::parse(yaml, "test", &crate::config::Environment::default())
        .expect("config")
}

/// An empty memory store (the inbox and the fleet state) taking messages of up to 1 MiB.
pub(crate) fn memory_store() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(MessageLimits {
        max_message_bytes: 1 << 20,
    }))
}

/// An engine's parts on `fake`'s panes and `store`, with `config`: no durable state, no gateway,
/// a clock at the Unix epoch that tokio's paused time drives.
pub(crate) fn engine_parts(
    fake: &FakeMux,
    store: &Arc<MemoryStore>,
    config: crate::config::Live,
) -> EngineParts {
    EngineParts {
        durable: None,
        config,
        clock: Arc::new(TokioClock::new(Timestamp::UNIX_EPOCH)),
        store: Arc::clone(store) as Arc<dyn InboxStore>,
        mux: MuxRouter::new(Arc::new(fake.clone()), None),
        redactor: crate::secrets::Redactor::empty(),
        gateway: None,
    }
}

/// The fleet the MCP tools and the REST API serve, on an engine spawned from `parts` (its
/// spawner's MCP URL leads nowhere).
pub(crate) fn fleet(parts: EngineParts) -> Fleet {
    let live = parts.config.clone();
    let clock = Arc::clone(&parts.clock);
    let store = Arc::clone(&parts.store);
    let router = parts.mux.clone();
    let engine = crate::engine::spawn(parts);
    let locator = crate::locate::Locator::new(router.clone(), Default::default());
    let redactor = crate::secrets::Redactor::empty();
    let spawner = crate::members::Spawner {
        engine: engine.clone(),
        mux: router.clone(),
        locator: locator.clone(),
        config: live.clone(),
        redactor: redactor.clone(),
        url: "http://127.0.0.1:1".to_owned(),
    };
    let inbox = crate::inbox::Inbox::new(Arc::clone(&store), engine.clone());
    let human = crate::human::Human::new(
        engine.clone(),
        router.clone(),
        live.clone(),
        redactor.clone(),
        Arc::clone(&clock),
        "http://127.0.0.1:1".to_owned(),
    );
    Fleet {
        engine,
        store,
        mux: router,
        locator,
        config: live,
        clock,
        api_token: None,
        redactor,
        inbox,
        spawner,
        peers: crate::gateway::presence::Peers::default(),
        calls: crate::conn::MemberCalls::default(),
        human,
    }
}

/// The names of `engine`'s members, in its order.
pub(crate) async fn member_names(engine: &crate::engine::EngineHandle) -> Vec<String> {
    let list = engine.list().await.expect("engine");
    list.iter().map(|m| m.target.to_string()).collect()
}

/// A caller of the tools in `role`, from no pane, whose call is never cancelled.
pub(crate) fn caller(role: fleetd_core::access::Role) -> Caller {
    Caller {
        spawning_user: None,
        role,
        pane: None,
        unregistered: None,
        via_daemon: None,
        stray: None,
        cancel: tokio_util::sync::CancellationToken::new(),
    }
}

/// `pane` on the lead's multiplexer daemon.
pub(crate) fn qualified(pane: &str) -> QualifiedPaneId {
    QualifiedPaneId::new(MuxDaemon::Lead, PaneId::new(pane).expect("pane"))
}

/// Member `name` of profile `p` (a claude agent) in `pane`, incarnation `terminal`: not
/// delegating, no lead, no idle timeout, backend or worktree.
pub(crate) fn new_member(name: &str, pane: &str, terminal: &str) -> NewMember {
    NewMember {
        user: None,
        target: Target::new(name).expect("target"),
        profile: "p".to_owned(),
        agent: "claude".to_owned(),
        pane: qualified(pane),
        terminal: TerminalId::new(terminal).expect("terminal"),
        allow_delegation: false,
        idle_timeout_secs: None,
        backend: None,
        lead: None,
        worktree: None,
        model: None,
    }
}

/// A reply from member `member` in its own inbox, to `ticket` when given.
pub(crate) fn reply_from(member: &str, ticket: Option<Ticket>, text: impl Into<String>) -> Message {
    Message {
        msg_id: MsgId::from_uuid(crate::clock::Clock::new_id(&crate::clock::SystemClock)),
        target: Target::new(member).expect("target"),
        ticket,
        kind: MessageKind::Reply,
        text: text.into(),
        from: member.to_owned(),
        created_at: Timestamp::UNIX_EPOCH,
    }
}

/// A loopback TCP connection within this process, as the server accepted it: the client's
/// stream, the server's, and the two addresses as the server sees them.
pub(crate) struct Loopback {
    /// The connecting side.
    pub(crate) client: std::net::TcpStream,
    /// The accepted side, held so the connection stays established while the test looks it up.
    #[expect(dead_code, reason = "held open, never read")]
    server: std::net::TcpStream,
    /// The client's address.
    pub(crate) peer: std::net::SocketAddr,
    /// The server's address.
    pub(crate) local: std::net::SocketAddr,
}

/// Opens a [`Loopback`] connection on a free port of 127.0.0.1.
pub(crate) fn loopback() -> Loopback {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let local = listener.local_addr().expect("addr");
    let client = std::net::TcpStream::connect(local).expect("connect");
    let (server, peer) = listener.accept().expect("accept");
    Loopback {
        client,
        server,
        peer,
        local,
    }
}

//! Configuration (SPEC §10) in two stages: `raw` mirrors the YAML file, `validate` turns it into
//! the `Config` the daemon runs on, with every default applied. Owns parsing and judging the file;
//! must not open sockets or stores, and never reads a secret's value.

mod connections;
mod delegation;
mod diff;
mod gateway;
mod human;
mod live;
mod models;
mod profiles;
mod raw;
mod sandbox;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use diff::{Change, ConfigDiff, KeyClass};
pub use human::{Approvals, ApprovalsBy, NoticeKind, Notify, Sink, SinkKind};
pub use live::{Live, Publisher, channel};
pub use models::{BudgetError, BudgetSpec, Prices, budget_from, micros};
pub use profiles::{is_env_name, is_known_agent};
pub use raw::{LogFormat, MultiplexerChoice, StoreKind};
pub use sandbox::Sandbox;

/// Default listener (SPEC §10).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7797";

/// Where a configuration problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("failed to read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The YAML did not match the schema (unknown key, wrong type, bad syntax).
    #[error("{origin}: {message}")]
    Syntax {
        /// File name or `<string>`.
        origin: String,
        /// serde-saphyr's message, which names the key, line and column and shows the snippet.
        message: String,
    },
    /// A value was well-formed YAML but not acceptable.
    #[error("{origin}:{}: `{key}`: {message}", display_position(*.at))]
    Invalid {
        /// File name or `<string>`.
        origin: String,
        /// The dotted key, e.g. `primary.tab`.
        key: String,
        /// Where it is, when known.
        at: Option<Position>,
        /// What is wrong and what to do.
        message: String,
    },
}

fn display_position(at: Option<Position>) -> String {
    match at {
        Some(p) => format!("{}:{}", p.line, p.column),
        None => "-".to_owned(),
    }
}

/// The process environment the defaults depend on, captured once in `main` so tests can pass
/// their own without touching the real environment.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `$HOME`.
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME`.
    pub xdg_config_home: Option<PathBuf>,
    /// `$XDG_STATE_HOME`.
    pub xdg_state_home: Option<PathBuf>,
    /// `$HERDR_SOCKET_PATH`.
    pub herdr_socket_path: Option<PathBuf>,
    /// `$HERDR_SESSION`.
    pub herdr_session: Option<String>,
    /// The machine's host name, up to its first dot (`uname`): a gateway's default name.
    pub hostname: Option<String>,
    /// `$CODEX_HOME`.
    pub codex_home: Option<PathBuf>,
}

impl Environment {
    /// Reads the variables fleetd's defaults depend on from the real process environment.
    pub fn from_process() -> Self {
        let path = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Self {
            home: path("HOME"),
            xdg_config_home: path("XDG_CONFIG_HOME"),
            xdg_state_home: path("XDG_STATE_HOME"),
            herdr_socket_path: path("HERDR_SOCKET_PATH"),
            codex_home: path("CODEX_HOME"),
            herdr_session: std::env::var("HERDR_SESSION")
                .ok()
                .filter(|v| !v.is_empty()),
            hostname: rustix::system::uname()
                .nodename()
                .to_str()
                .ok()
                .and_then(|n| n.split('.').next())
                .filter(|n| !n.is_empty())
                .map(str::to_lowercase),
        }
    }

    /// Codex's home: `$CODEX_HOME`, else `~/.codex`.
    pub fn codex_home(&self) -> PathBuf {
        self.xdg_dir(self.codex_home.as_ref(), ".codex")
    }

    fn xdg_dir(&self, explicit: Option<&PathBuf>, fallback: &str) -> PathBuf {
        match (explicit, &self.home) {
            (Some(dir), _) => dir.clone(),
            (None, Some(home)) => home.join(fallback),
            // No HOME at all (a bare service environment): stay relative to the working
            // directory rather than guess at /root.
            (None, None) => PathBuf::from(fallback),
        }
    }

    /// `$XDG_CONFIG_HOME/fleetd/fleetd.yaml` (or `~/.config/...`).
    pub fn default_config_path(&self) -> PathBuf {
        self.xdg_dir(self.xdg_config_home.as_ref(), ".config")
            .join("fleetd/fleetd.yaml")
    }

    /// `$XDG_STATE_HOME/fleetd` (or `~/.local/state/fleetd`).
    pub fn default_state_dir(&self) -> PathBuf {
        self.xdg_dir(self.xdg_state_home.as_ref(), ".local/state")
            .join("fleetd")
    }

    /// herdr's own socket discovery (PROTOCOL.md §1), the same function the herdr client uses:
    /// `HERDR_SOCKET_PATH`, then `HERDR_SESSION`, then `<config>/herdr.sock` with `<config>` =
    /// `$XDG_CONFIG_HOME/herdr` or `~/.config/herdr`.
    pub fn default_herdr_socket(&self) -> PathBuf {
        let text = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let lookup = |key: &str| match key {
            "HERDR_SOCKET_PATH" => text(&self.herdr_socket_path),
            "HERDR_SESSION" => self.herdr_session.clone(),
            "XDG_CONFIG_HOME" => text(&self.xdg_config_home),
            "HOME" => text(&self.home),
            _ => None,
        };
        crate::mux::herdr::HerdrConfig::discover_socket(lookup)
            // No HOME at all (a bare service environment): relative to the working directory.
            .unwrap_or_else(|| PathBuf::from(".config/herdr/herdr.sock"))
    }
}

/// What the command line sets over the file (`fleetd serve --listen`, `--log-format`). Kept so a
/// reload re-applies them: the file alone would otherwise look like a change to those keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
}

impl Overrides {
    /// Sets the overridden keys in `config`.
    pub fn apply(&self, config: &mut Config) {
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(format) = self.log_format {
            config.log.format = format;
        }
    }
}

/// The validated configuration the daemon runs on. Every default is applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// HTTP listener for `/mcp`, `/healthz` and the REST API. Boot-only.
    pub listen: SocketAddr,
    /// Secret name of the bearer token; required when `listen` is not loopback.
    pub api_token: Option<String>,
    /// Host names the HTTP listener answers to besides its address and `localhost` (a request
    /// naming any other host is refused: DNS rebinding). Lower-case.
    pub allowed_hosts: Vec<String>,
    /// Which multiplexer drives panes.
    pub multiplexer: MultiplexerChoice,
    /// The lead herdr daemon's socket (explicit or discovered). Boot-only.
    pub herdr_socket: PathBuf,
    /// True when `herdr_socket` came from the file rather than discovery.
    pub herdr_socket_explicit: bool,
    /// Optional second herdr daemon for members. Boot-only.
    pub member_herdr_socket: Option<PathBuf>,
    /// Codex's home for members without their own `CODEX_HOME` (`$CODEX_HOME`, else
    /// `~/.codex`): where fleetd reads how the user's Codex reaches it. From the environment.
    pub codex_home: PathBuf,
    /// tmux `-S` socket; `None` means the user's default tmux server. Boot-only.
    pub tmux_socket: Option<PathBuf>,
    /// herdr workspace label / tmux session holding member panes.
    pub members_workspace: String,
    /// The primary lead and push budget, when configured.
    pub primary: Option<Primary>,
    /// Extra lead tabs.
    pub leads: Vec<Lead>,
    /// Directory for the embedded store and other state.
    pub state_dir: PathBuf,
    /// The inbox backend. Boot-only.
    pub store: Store,
    /// Inbox limits.
    pub inbox: Inbox,
    /// Ticket retention.
    pub tickets: Tickets,
    /// Task delivery.
    pub delivery: Delivery,
    /// Per-member caps.
    pub limits: Limits,
    /// How deep a delegation tree may grow: a lead is depth 0, its members 1, theirs 2; a
    /// member at this depth may not spawn or send (SPEC §7).
    pub max_delegation_depth: u64,
    /// Most members bound to one lead (or delegating member) at once; a spawn beyond it is
    /// refused.
    pub max_members_per_lead: u64,
    /// Connection limits of every door.
    pub connections: Connections,
    /// Member profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// Model backends by name.
    pub backends: BTreeMap<String, Backend>,
    /// Secret sources by name (never values).
    pub secrets: BTreeMap<String, SecretSource>,
    /// Watch the file and apply valid changes.
    pub config_reload: bool,
    /// Logging.
    pub log: Log,
    /// This fleetd as one gateway of a multi-host fleet; `None`: a fleet on this host alone.
    /// Boot-only.
    pub gateway: Option<Gateway>,
    /// Who may answer a member's dialog.
    pub approvals: Approvals,
    /// Where people are told that a member waits on them.
    pub notify: Notify,
}

/// `gateway:` (SPEC §12).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    /// This gateway's name (also its broker user unless `broker.user` says otherwise).
    pub name: fleetd_core::gateway::GatewayName,
    /// The shared broker.
    pub broker: GatewayBroker,
    /// What each other gateway may ask of this one (default: nothing).
    pub peers: BTreeMap<String, Vec<PeerRight>>,
    /// How often this gateway broadcasts its members and profiles to the others, in seconds; a
    /// peer silent for three of its intervals is shown unreachable.
    pub presence_interval_secs: u64,
    /// Messages waiting in the outbox for the broker beyond which `/healthz` is degraded and
    /// the log warns (a link down too long, or a peer's queue full).
    pub outbox_alarm: u64,
    /// Messages waiting in the outbox at which new requests to other gateways (tasks, spawns,
    /// stops) are refused (`gateway_backlog`) until the broker takes some. Answers
    /// owed to other gateways are never refused.
    pub outbox_max: u64,
    /// Messages waiting for one other gateway (in its queue on the broker and in this outbox)
    /// at which new tasks and spawns for it are refused (`gateway_busy`) until it takes some:
    /// a gateway that falls behind slows its senders instead of queueing for minutes.
    pub peer_backlog_max: u64,
}

/// `gateway.broker:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBroker {
    /// Broker URLs (`amqp://host:5672/vhost`), tried in turn; no credentials in them.
    pub urls: Vec<String>,
    /// The broker user: always the gateway's name (a `user:` that differs is refused).
    pub user: String,
    /// The secret holding its password.
    pub password_secret: Option<String>,
    /// AMQP heartbeat: a link that carries nothing this long is found dead.
    pub heartbeat_secs: u64,
    /// TLS settings for `amqps://` URLs (`None`: not written; an `amqps://` URL then trusts the
    /// system's roots).
    pub tls: Option<GatewayTls>,
}

/// `gateway.broker.tls:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTls {
    /// The PEM bundle of the CAs the broker's certificate must chain to, and the only ones
    /// trusted; `None`: the system's roots. Read once, at start.
    pub ca_file: Option<PathBuf>,
}

/// What another gateway may ask of this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerRight {
    /// Hand its tasks to this gateway's members.
    Send,
    /// Spawn members here.
    Spawn,
    /// Stop members here.
    Stop,
    /// Answer this gateway's members' questions.
    Answer,
}

/// `primary:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Primary {
    /// herdr tab id (`w1:t1`) or tmux `session:window`.
    pub tab: String,
    /// Nudges per pending batch before giving up (mail kept).
    pub push_reminders: u32,
    /// First backoff between nudges, in milliseconds.
    pub push_backoff_ms: u64,
    /// Cap of the exponential backoff, in milliseconds.
    pub push_backoff_max_ms: u64,
}

/// An extra lead tab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lead {
    /// Tab id.
    pub tab: String,
    /// Human name.
    pub name: String,
}

/// The inbox backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Store {
    /// SQLite file.
    Embedded {
        /// The database file.
        path: PathBuf,
    },
    /// AMQP broker.
    Amqp {
        /// Where the URL comes from.
        url: AmqpUrl,
    },
}

/// The broker URL, literal or held in a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum AmqpUrl {
    /// Written in the file; shown with its password redacted.
    Literal(#[serde(serialize_with = "serialize_redacted_url")] String),
    /// The name of a secret whose value is the URL.
    Secret(String),
}

fn serialize_redacted_url<S: serde::Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&redact_url(url))
}

/// Replaces the password in `scheme://user:password@host...` with `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// `inbox:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inbox {
    /// Largest accepted message text, in bytes.
    pub max_message_bytes: u64,
}

/// `tickets:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tickets {
    /// How long a finished ticket is kept, counted from its finish.
    pub ttl_after_finish_secs: u64,
}

/// `delivery:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// How long a member may stay idle after a submit before delivery counts as failed.
    pub verify_grace_ms: u64,
    /// Longest text injected into a pane; longer tasks go as a pointer to `fleet_poll`.
    pub max_inject_bytes: u64,
}

/// `limits:` — per-member caps on what may pile up in the daemon. Applied by a reload at once
/// (to what is asked next: nothing already queued or open is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Most tasks queued for one member and not yet typed into its pane; `fleet_send` beyond it
    /// is refused (`queue_full`).
    pub max_queued_tasks: u64,
    /// Most open questions (`fleet_ask`) of one member; another is refused
    /// (`too_many_questions`).
    pub max_open_questions: u64,
}

/// `connections:` — what any one connection, and any one local user, may hold of the daemon's
/// doors (SPEC §9). Read by every door as each connection arrives, so a reload applies to the
/// connections that come next; established ones keep the timeouts they started with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Connections {
    /// Most connections open at once, over every door together.
    pub max: u64,
    /// Most connections one user other than the daemon's own may hold (peers not on this
    /// machine, or whose user cannot be found, count as one such user).
    pub per_uid: u64,
    /// Connections only the daemon's own user (its leads, members and operator) may take: other
    /// users together hold at most `max - ownerReserve`.
    pub owner_reserve: u64,
    /// Most calls one member may have under way at once, over every door (a call in flight
    /// holds its connection, which is then never closed to make room).
    pub per_member: u64,
    /// How long an HTTP connection may take to send a request head, counted from its first byte.
    pub header_read_timeout_ms: u64,
    /// How long an HTTP connection may sit with no request in flight and no byte received.
    pub idle_timeout_ms: u64,
}

/// A member profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// Agent kind (`claude`, `codex`, `pi`, ... or `custom`).
    pub agent: String,
    /// Command to run; defaults to the agent kind's own command.
    pub command: Option<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Model name passed to the agent.
    pub model: Option<String>,
    /// Backend name (a key of `backends`).
    pub backend: Option<String>,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// Release the member after this long idle; `None` never.
    pub idle_timeout_secs: Option<u64>,
    /// May this member call orchestration tools.
    pub allow_delegation: bool,
    /// Extra environment for the member's process.
    pub env: BTreeMap<String, String>,
    /// A git worktree per member, when set.
    pub worktree: Option<Worktree>,
    /// What each member of this profile may spend on its model backend.
    pub budget: Option<BudgetSpec>,
    /// What the delegation tree a member of this profile heads may spend.
    pub tree_budget: Option<BudgetSpec>,
    /// The sandbox its members run in, when set.
    pub sandbox: Option<Sandbox>,
    /// The user its members run as (a second uid, SPEC §19), when set.
    pub run_as: Option<String>,
}

/// A profile's `worktree:` (SPEC §7): at spawn, `git worktree add` on a new branch for the
/// member; it starts there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Worktree {
    /// The repository to branch from; `None`: the lead pane's directory.
    pub repo: Option<PathBuf>,
    /// The branch is this followed by the member's name (default `fleet/`).
    pub branch_prefix: String,
    /// What the branch starts from; `None`: the repository's `HEAD`.
    pub base: Option<String>,
}

/// A model backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// Base URL given to members as e.g. `ANTHROPIC_BASE_URL`.
    pub base_url: String,
    /// Secret name of the auth token.
    pub auth_token_secret: Option<String>,
    /// URL probed for health.
    pub health_url: Option<String>,
    /// Probe interval.
    pub health_interval_secs: u64,
    /// Members reach it through fleetd's model gateway (`/model/<name>`), with a token of their
    /// own, and never see its credential (the default); `false`: they get its URL and token.
    pub through_fleetd: bool,
    /// What its tokens cost, for accounting and budgets.
    pub prices: Prices,
}

/// Where a secret's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SecretSource {
    /// An environment variable of the daemon's process.
    Env(String),
    /// A file (must not be world-readable).
    File(PathBuf),
}

/// `log:`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Log {
    /// Human or JSON lines.
    pub format: LogFormat,
    /// A `tracing` filter directive such as `info` or `fleetd=debug,info`.
    pub level: String,
}

impl Config {
    /// Parses and validates YAML text. `origin` names the source in error messages.
    pub fn parse(text: &str, origin: &str, env: &Environment) -> Result<Self, ConfigError> {
        let raw: raw::RawConfig = if text.trim().is_empty() {
            raw::RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?
        };
        validate::validate(raw, origin, env)
    }

    /// Loads the configuration: `explicit` must exist; without it the default path is used if
    /// present, and no file at all means every default.
    pub fn load(explicit: Option<&Path>, env: &Environment) -> Result<Self, ConfigError> {
        let path = match explicit {
            Some(path) => path.to_path_buf(),
            None => {
                let path = env.default_config_path();
                if !path.exists() {
                    return Self::parse("", "<defaults>", env);
                }
                path
            }
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string(), env)
    }

    /// The effective configuration as YAML, for `fleetd config check`. Secrets are names only and
    /// a password in a literal broker URL is redacted.
    pub fn to_yaml(&self) -> String {
        serde_saphyr::to_string(self)
            .unwrap_or_else(|e| format!("# could not render the configuration: {e}\n"))
    }

    /// True when the listener only accepts local connections.
    pub fn listen_is_loopback(&self) -> bool {
        self.listen.ip().is_loopback()
    }
}

#[cfg(test)]
mod tests;

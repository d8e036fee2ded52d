//! Stage one of configuration: the YAML file exactly as written, as serde structs with
//! `deny_unknown_fields`. Owns the key names; must not apply defaults or judge values — that is
//! `config::validate`'s job. No `flatten`/`untagged` here: they ruin error messages.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use serde_saphyr::Spanned;

/// A value with the place in the file it came from, for validation errors.
pub(crate) type At<T> = Spanned<T>;

/// The whole file. Every key of SPEC §10.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawConfig {
    pub(crate) listen: Option<At<String>>,
    pub(crate) api_token: Option<At<String>>,
    pub(crate) allowed_hosts: Option<Vec<At<String>>>,
    pub(crate) multiplexer: Option<MultiplexerChoice>,
    pub(crate) herdr_socket: Option<PathBuf>,
    pub(crate) member_herdr_socket: Option<PathBuf>,
    pub(crate) tmux_socket: Option<PathBuf>,
    pub(crate) members_workspace: Option<At<String>>,
    pub(crate) primary: Option<At<RawPrimary>>,
    pub(crate) leads: Option<Vec<At<RawLead>>>,
    pub(crate) store: Option<At<RawStore>>,
    pub(crate) inbox: Option<RawInbox>,
    pub(crate) tickets: Option<RawTickets>,
    pub(crate) delivery: Option<RawDelivery>,
    pub(crate) limits: Option<RawLimits>,
    pub(crate) max_delegation_depth: Option<At<u64>>,
    pub(crate) max_members_per_lead: Option<At<u64>>,
    pub(crate) connections: Option<RawConnections>,
    pub(crate) profiles: Option<BTreeMap<String, At<RawProfile>>>,
    pub(crate) backends: Option<BTreeMap<String, At<RawBackend>>>,
    pub(crate) secrets: Option<BTreeMap<String, At<RawSecret>>>,
    pub(crate) config_reload: Option<bool>,
    pub(crate) log: Option<RawLog>,
    pub(crate) gateway: Option<At<RawGateway>>,
    pub(crate) approvals: Option<At<super::human::RawApprovals>>,
    pub(crate) notify: Option<At<super::human::RawNotify>>,
}

/// `gateway:` — this fleetd as one host of a multi-host fleet (SPEC §12).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawGateway {
    pub(crate) name: Option<At<String>>,
    pub(crate) broker: Option<At<RawBroker>>,
    pub(crate) peers: Option<BTreeMap<String, At<RawPeer>>>,
    pub(crate) presence_interval_secs: Option<At<u64>>,
    pub(crate) outbox_alarm: Option<At<u64>>,
    pub(crate) outbox_max: Option<At<u64>>,
    pub(crate) peer_backlog_max: Option<At<u64>>,
}

/// `gateway.broker:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawBroker {
    pub(crate) urls: Option<Vec<At<String>>>,
    pub(crate) user: Option<At<String>>,
    pub(crate) password_secret: Option<At<String>>,
    pub(crate) heartbeat_secs: Option<At<u64>>,
    pub(crate) tls: Option<At<RawBrokerTls>>,
}

/// `gateway.broker.tls:` — how an `amqps://` broker proves itself.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawBrokerTls {
    pub(crate) ca_file: Option<At<PathBuf>>,
}

/// One entry of `gateway.peers:`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawPeer {
    pub(crate) allow: Option<Vec<At<String>>>,
}

/// Which multiplexer drives the panes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MultiplexerChoice {
    /// A running herdr if one answers, else tmux.
    #[default]
    Auto,
    /// herdr only.
    Herdr,
    /// tmux only.
    Tmux,
}

/// `primary:` — the primary lead's tab and the push loop's budget.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawPrimary {
    pub(crate) tab: Option<String>,
    /// Retired: present only so it can be refused with a hint instead of "unknown field".
    pub(crate) terminal: Option<serde::de::IgnoredAny>,
    pub(crate) push_reminders: Option<u32>,
    pub(crate) push_backoff_ms: Option<u64>,
    pub(crate) push_backoff_max_ms: Option<u64>,
}

/// One entry of `leads:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLead {
    pub(crate) tab: String,
    pub(crate) name: String,
}

/// `store:` — where the inbox lives.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawStore {
    pub(crate) kind: Option<StoreKind>,
    pub(crate) path: Option<PathBuf>,
    pub(crate) url: Option<String>,
}

/// The inbox backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// SQLite file under the state directory.
    #[default]
    Embedded,
    /// An AMQP 0.9.1 broker.
    Amqp,
}

/// `inbox:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawInbox {
    pub(crate) max_message_bytes: Option<At<u64>>,
}

/// `tickets:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawTickets {
    pub(crate) ttl_after_finish_secs: Option<u64>,
}

/// `delivery:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawDelivery {
    pub(crate) verify_grace_ms: Option<u64>,
    pub(crate) max_inject_bytes: Option<At<u64>>,
}

/// `limits:` — per-member caps on what may pile up in the daemon.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLimits {
    pub(crate) max_queued_tasks: Option<At<u64>>,
    pub(crate) max_open_questions: Option<At<u64>>,
}

/// `connections:` — limits of every door.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawConnections {
    pub(crate) max: Option<At<u64>>,
    pub(crate) per_uid: Option<At<u64>>,
    pub(crate) per_member: Option<At<u64>>,
    pub(crate) owner_reserve: Option<At<u64>>,
    pub(crate) header_read_timeout_ms: Option<At<u64>>,
    pub(crate) idle_timeout_ms: Option<At<u64>>,
}

/// One entry of `profiles:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawProfile {
    pub(crate) agent: Option<String>,
    pub(crate) command: Option<String>,
    pub(crate) args: Option<Vec<String>>,
    pub(crate) model: Option<String>,
    pub(crate) backend: Option<String>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) idle_timeout_secs: Option<u64>,
    pub(crate) allow_delegation: Option<bool>,
    pub(crate) env: Option<BTreeMap<String, String>>,
    pub(crate) worktree: Option<At<RawWorktree>>,
    pub(crate) budget: Option<At<super::models::RawBudget>>,
    pub(crate) tree_budget: Option<At<super::models::RawBudget>>,
    pub(crate) sandbox: Option<At<super::sandbox::RawSandbox>>,
    pub(crate) run_as: Option<String>,
}

/// A profile's `worktree:` — each member gets a git worktree on a branch of its own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawWorktree {
    pub(crate) repo: Option<PathBuf>,
    pub(crate) branch_prefix: Option<At<String>>,
    pub(crate) base: Option<At<String>>,
}

/// One entry of `backends:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawBackend {
    pub(crate) base_url: Option<String>,
    pub(crate) auth_token_secret: Option<String>,
    pub(crate) health_url: Option<String>,
    pub(crate) health_interval_secs: Option<u64>,
    pub(crate) through_fleetd: Option<bool>,
    pub(crate) prices: Option<At<super::models::RawPrices>>,
}

/// One entry of `secrets:` — exactly one of `env` or `file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawSecret {
    pub(crate) env: Option<String>,
    pub(crate) file: Option<PathBuf>,
}

/// `log:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawLog {
    pub(crate) format: Option<LogFormat>,
    pub(crate) level: Option<At<String>>,
}

/// How log lines are written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

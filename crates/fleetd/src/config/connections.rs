//! `connections:` judged (stage two of configuration, for this section): the caps and timeouts of
//! every door, with defaults applied and every refusal naming its key. Pure.

use super::validate::{Judge, bounded};
use super::{ConfigError, Connections};

/// A fleet of a hundred agents holds a few hundred connections; 2048 leaves room for the CLI, the
/// dashboard and bursts while staying far below a raised open-file limit.
const DEFAULT_MAX_CONNECTIONS: u64 = 2_048;
/// Beyond this the open-file limit, not the cap, would be what stops connections.
const MAX_MAX_CONNECTIONS: u64 = 1_000_000;
/// Another local user has no role but `nobody` (health checks, metrics scrapes): 64 is plenty.
const DEFAULT_PER_UID: u64 = 64;
/// A quarter of the default cap stays for the daemon's own user whatever others do.
const DEFAULT_OWNER_RESERVE: u64 = 512;
/// A real client sends its request head at once; ten seconds covers a loaded machine.
const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
const MAX_HEADER_READ_TIMEOUT_MS: u64 = 600_000;
/// MCP clients keep a connection between calls; a minute idle is closed (they reconnect).
const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
const MAX_IDLE_TIMEOUT_MS: u64 = 86_400_000;

pub(super) fn connections(
    judge: &Judge<'_>,
    raw: Option<super::raw::RawConnections>,
) -> Result<Connections, ConfigError> {
    let raw = raw.unwrap_or_default();
    let max = bounded(
        judge,
        "connections.max",
        raw.max,
        DEFAULT_MAX_CONNECTIONS,
        MAX_MAX_CONNECTIONS,
    )?;
    let per_uid = bounded(
        judge,
        "connections.perUid",
        raw.per_uid,
        DEFAULT_PER_UID.min(max),
        max,
    )?;
    let owner_reserve = match raw.owner_reserve {
        None => DEFAULT_OWNER_RESERVE.min(max / 4),
        Some(v) if v.value <= max => v.value,
        Some(v) => {
            return Err(judge.at(
                "connections.ownerReserve",
                &v,
                format!(
                    "{} is more than connections.max ({max}): use 0 to {max} (default a quarter of max, at most {DEFAULT_OWNER_RESERVE})",
                    v.value
                ),
            ));
        }
    };
    let per_member = bounded(
        judge,
        "connections.perMember",
        raw.per_member,
        (max / 4).max(1),
        max,
    )?;
    Ok(Connections {
        max,
        per_uid,
        owner_reserve,
        per_member,
        header_read_timeout_ms: bounded(
            judge,
            "connections.headerReadTimeoutMs",
            raw.header_read_timeout_ms,
            DEFAULT_HEADER_READ_TIMEOUT_MS,
            MAX_HEADER_READ_TIMEOUT_MS,
        )?,
        idle_timeout_ms: bounded(
            judge,
            "connections.idleTimeoutMs",
            raw.idle_timeout_ms,
            DEFAULT_IDLE_TIMEOUT_MS,
            MAX_IDLE_TIMEOUT_MS,
        )?,
    })
}

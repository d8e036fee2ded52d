//! Log set-up: one `tracing` subscriber writing human or JSON lines to stderr. Owns the subscriber;
//! must never be asked to log secret values or message bodies at info level (callers' duty, stated
//! in ARCHITECTURE.md).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `FLEETD_LOG` (a tracing filter) overrides `level` when set.
/// rmcp logs every HTTP request's session start and end at info; unless the filter names rmcp
/// itself, it is held to warn so fleetd's own lines stay readable.
/// Calling it twice is harmless: the second call leaves the first subscriber in place.
pub fn init(format: LogFormat, level: &str) {
    let level = if level.contains("rmcp") {
        level.to_owned()
    } else {
        format!("{level},rmcp=warn")
    };
    let filter = std::env::var("FLEETD_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(&level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _already_set = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

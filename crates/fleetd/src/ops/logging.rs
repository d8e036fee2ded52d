//! Log set-up: one `tracing` subscriber writing human or JSON lines to stderr, whose level filter
//! a config reload may replace. Owns the subscriber; must never be asked to log secret values or
//! message bodies at info level (callers' duty, stated in ARCHITECTURE.md).

use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Replaces the installed subscriber's filter; set once by [`init`].
type SetFilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// How to change the level of the subscriber [`init`] installed, and whether `FLEETD_LOG` pins it.
struct Installed {
    set_filter: SetFilter,
    pinned_by_env: bool,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Crates held to a level unless a filter names them: rmcp logs every HTTP request's session
/// start and end at info; the file watcher (`notify`, `notify_debouncer_full`) logs every raw
/// event at trace — with a log file in the watched config directory, each of those lines is an
/// event of its own, a loop that wrote tens of MB a second while idle.
const QUIET: &[(&str, &str)] = &[
    ("rmcp", "warn"),
    ("notify", "info"),
    ("notify_debouncer_full", "info"),
];

/// `filter` with [`QUIET`]'s directives added for the crates it does not name.
fn quieted(filter: &str) -> String {
    let mut out = filter.to_owned();
    let names = |krate: &str| {
        filter.split(',').any(|directive| {
            let target = directive.split(['=', '[']).next().unwrap_or("").trim();
            target == krate || target.starts_with(&format!("{krate}::"))
        })
    };
    for (krate, level) in QUIET {
        if !names(krate) {
            out.push_str(&format!(",{krate}={level}"));
        }
    }
    out
}

/// `level` as a filter, with the [`QUIET`] crates held back.
fn filter_for(level: &str) -> Option<EnvFilter> {
    EnvFilter::try_new(quieted(level)).ok()
}

/// Installs the global subscriber. `FLEETD_LOG` (a tracing filter) overrides `level` when set
/// ([`QUIET`] applies to it too, unless it names those crates).
/// Calling it twice is harmless: the second call leaves the first subscriber in place.
pub fn init(format: LogFormat, level: &str) {
    let from_env = std::env::var("FLEETD_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(quieted(&f)).ok());
    let pinned_by_env = from_env.is_some();
    let filter = from_env
        .or_else(|| filter_for(level))
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let set_filter: Option<SetFilter> = match format {
        LogFormat::Human => {
            let builder = builder.with_filter_reloading();
            let handle = builder.reload_handle();
            builder.try_init().ok().map(|()| -> SetFilter {
                Box::new(move |f| handle.reload(f).map_err(|e| e.to_string()))
            })
        }
        LogFormat::Json => {
            let builder = builder.json().flatten_event(true).with_filter_reloading();
            let handle = builder.reload_handle();
            builder.try_init().ok().map(|()| -> SetFilter {
                Box::new(move |f| handle.reload(f).map_err(|e| e.to_string()))
            })
        }
    };
    if let Some(set_filter) = set_filter {
        let _first_wins = INSTALLED.set(Installed {
            set_filter,
            pinned_by_env,
        });
    }
}

/// Applies a reloaded `log.level`. Does nothing (and says so at debug) when `FLEETD_LOG` pins
/// the filter or no subscriber was installed by [`init`]. Validation has already accepted
/// `level`, so a refusal here means the subscriber itself is gone.
pub fn set_level(level: &str) {
    let Some(installed) = INSTALLED.get() else {
        return;
    };
    if installed.pinned_by_env {
        tracing::info!("log.level changed, but FLEETD_LOG sets the filter; it stays");
        return;
    }
    let Some(filter) = filter_for(level) else {
        tracing::warn!(level, "log.level is not a valid filter; the level stays");
        return;
    };
    if let Err(e) = (installed.set_filter)(filter) {
        tracing::warn!(error = %e, "failed to change the log level");
    }
}

#[cfg(test)]
mod tests {
    use super::quieted;

    #[test]
    fn the_watcher_and_rmcp_are_held_back_unless_named() {
        assert_eq!(
            quieted("trace"),
            "trace,rmcp=warn,notify=info,notify_debouncer_full=info"
        );
        assert_eq!(
            quieted("debug,notify::inotify=trace,rmcp=debug"),
            "debug,notify::inotify=trace,rmcp=debug,notify_debouncer_full=info"
        );
    }
}

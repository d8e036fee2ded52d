//! Config hot reload (SPEC §10): re-reads the config file when it changes (its directory watched,
//! so an editor's atomic rename is seen; the watcher runs only while `configReload` is true, and
//! events naming other files are dropped before a reload is asked for) and on every SIGHUP,
//! then applies the new configuration whole, or nothing of it. Owns the watcher, the signal and
//! the decision to publish; must not judge keys itself (that is `config::ConfigDiff`) nor reach
//! into the parts that read the configuration (they read `config::Live` per call or subscribe).
//!
//! A reload is refused, and the running configuration stays, when the file does not read or
//! validate, or when it changes a boot-only key; each refusal is one warn line naming the file and
//! why. An applied reload is one info line naming the changed keys (never a value).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use notify_debouncer_full::notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind};
use notify_debouncer_full::notify::{EventKind, RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{DebounceEventResult, DebouncedEvent, Debouncer, RecommendedCache};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::config::{Config, ConfigDiff, ConfigError, Environment, Overrides, Publisher};
use crate::serve::Daemon;

/// How long the file must be quiet before it is re-read. Editors save in several steps (write a
/// temp file, fsync, rename, sometimes chmod); one reload after the last of them is the aim.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Pending "the file changed" requests. One is enough: a pending reload reads the file as it is
/// when it runs, so further requests queued behind it would only re-read the same text.
const REQUESTS_QUEUE: usize = 1;

/// Where the configuration comes from, as `fleetd serve` was started.
#[derive(Debug, Clone)]
pub struct ReloadSource {
    /// The config file: `--config`, else the default path (which may not exist yet).
    pub path: PathBuf,
    /// The environment the defaults were computed from at start.
    pub env: Environment,
    /// What the command line set over the file; re-applied to every reload.
    pub overrides: Overrides,
}

/// What started a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The watcher saw the file change.
    FileChanged,
    /// SIGHUP.
    Hangup,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FileChanged => "file change",
            Self::Hangup => "SIGHUP",
        })
    }
}

/// What a reload did.
#[derive(Debug)]
pub enum Outcome {
    /// The file reads as the running configuration.
    Unchanged,
    /// The new configuration is running.
    Applied(ConfigDiff),
    /// A boot-only key changed; nothing was applied.
    Refused(ConfigDiff),
    /// The file did not read or validate; nothing was applied.
    Invalid(ConfigError),
}

/// Loads, judges and publishes. One reload at a time (the reload task runs them in turn).
#[derive(Debug)]
pub struct Reloader {
    source: ReloadSource,
    publisher: Arc<Publisher>,
}

impl Reloader {
    /// A reloader publishing through `publisher`.
    pub fn new(source: ReloadSource, publisher: Arc<Publisher>) -> Self {
        Self { source, publisher }
    }

    /// Re-reads the file and applies it whole, or keeps the running configuration; logs what
    /// happened. A missing file keeps the running configuration too: a file deleted (or not yet
    /// renamed into place) must not reset every key to its default.
    pub fn reload(&self, trigger: Trigger) -> Outcome {
        let path = &self.source.path;
        let outcome = match Config::load(Some(path), &self.source.env) {
            Err(e) => Outcome::Invalid(e),
            Ok(mut new) => {
                self.source.overrides.apply(&mut new);
                let diff = ConfigDiff::between(&self.publisher.current(), &new);
                if diff.is_empty() {
                    Outcome::Unchanged
                } else if !diff.boot_only().is_empty() {
                    Outcome::Refused(diff)
                } else {
                    let level = diff.touches("log.level").then(|| new.log.level.clone());
                    crate::members::log_secret_names(&new);
                    self.publisher.publish(new);
                    if let Some(level) = level {
                        crate::ops::logging::set_level(&level);
                    }
                    Outcome::Applied(diff)
                }
            }
        };
        log(&outcome, trigger, path);
        outcome
    }

    /// Whether file changes are acted on now (`configReload` of the running configuration).
    fn watching(&self) -> bool {
        self.publisher.current().config_reload
    }
}

fn log(outcome: &Outcome, trigger: Trigger, path: &Path) {
    let file = path.display();
    match outcome {
        Outcome::Unchanged if trigger == Trigger::Hangup => {
            tracing::info!(%trigger, %file, "configuration reload: nothing changed");
        }
        Outcome::Unchanged => {
            tracing::debug!(%trigger, %file, "configuration reload: nothing changed");
        }
        Outcome::Invalid(e) => {
            tracing::warn!(%trigger, %file, "configuration reload failed, keeping the running configuration: {e}");
        }
        Outcome::Refused(diff) => {
            let keys: Vec<String> = diff.boot_only().iter().map(|c| format!("`{c}`")).collect();
            let keys = keys.join(", ");
            tracing::warn!(
                %trigger, %file, boot_only = %keys,
                "configuration reload refused: {keys} cannot change while fleetd runs (boot-only; restart fleetd to change it); nothing of this reload was applied"
            );
        }
        Outcome::Applied(diff) => {
            let summary = diff.summary();
            tracing::info!(%trigger, %file, changed = %summary, "configuration reloaded: {summary}");
        }
    }
}

/// The running reload task; stopped (watcher and signal handler released) when dropped.
#[derive(Debug)]
pub struct ReloadTask {
    handle: JoinHandle<()>,
}

impl Drop for ReloadTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Starts reloading `daemon`'s configuration from `source`: on SIGHUP always, on file changes
/// while `configReload` is true. The signal handler and (with `configReload: true`) the watcher
/// are in place when this returns, so a SIGHUP sent afterwards reloads instead of ending the
/// process. The watcher exists only while `configReload` is true: a reload that turns it off
/// drops the watcher (no inotify watch, nothing woken by the directory's other files), one that
/// turns it on starts it.
pub fn start(daemon: &Daemon, source: ReloadSource) -> anyhow::Result<ReloadTask> {
    let mut hangup =
        signal(SignalKind::hangup()).context("failed to listen for SIGHUP (config reload)")?;
    let (tx, mut requests) = mpsc::channel(REQUESTS_QUEUE);
    let path = source.path.clone();
    let reloader = Reloader::new(source, daemon.publisher());
    let mut watcher = if reloader.watching() {
        watch_file(&path, tx.clone())
    } else {
        None
    };
    let handle = tokio::spawn(async move {
        loop {
            tokio::select! {
                signalled = hangup.recv() => {
                    if signalled.is_none() {
                        break;
                    }
                    reloader.reload(Trigger::Hangup);
                }
                // Never `None`: this task holds a sender for the watchers it starts.
                Some(()) = requests.recv() => {
                    if reloader.watching() {
                        reloader.reload(Trigger::FileChanged);
                    }
                }
            }
            // What was just applied may have turned `configReload` on or off.
            match (reloader.watching(), watcher.is_some()) {
                (true, false) => watcher = watch_file(&path, tx.clone()),
                (false, true) => {
                    // Dropping the debouncer stops its thread and the inotify watch.
                    watcher = None;
                    tracing::info!(
                        "configReload is false: the config file is no longer watched; SIGHUP still reloads"
                    );
                }
                _ => {}
            }
        }
    });
    Ok(ReloadTask { handle })
}

/// Watches the directory holding `path` (an atomic save replaces the file, so a watch on the
/// file itself would go stale) and asks for a reload when an event names the file. `None` when
/// the directory cannot be watched; SIGHUP still reloads then.
fn watch_file(
    path: &Path,
    requests: mpsc::Sender<()>,
) -> Option<Debouncer<RecommendedWatcher, RecommendedCache>> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name()?.to_owned();
    let recheck = requests.clone();
    let handler = move |result: DebounceEventResult| match result {
        Ok(events) => {
            if events.iter().any(|e| concerns(e, &name)) {
                // Full means a reload is already pending; it will read this change too.
                let _ = requests.try_send(());
            }
        }
        Err(errors) => {
            for e in errors {
                tracing::warn!(error = %e, "the config file watcher reported an error");
            }
        }
    };
    let watched =
        notify_debouncer_full::new_debouncer(DEBOUNCE, None, handler).and_then(|mut d| {
            d.watch(&dir, RecursiveMode::NonRecursive)?;
            Ok(d)
        });
    match watched {
        Ok(debouncer) => {
            tracing::debug!(dir = %dir.display(), "watching the config file's directory");
            // An edit saved between the read that started this watch and the watch itself
            // raised no event: read the file once more now that no later edit can go unseen.
            let _ = recheck.try_send(());
            Some(debouncer)
        }
        Err(e) => {
            tracing::warn!(
                dir = %dir.display(), error = %e,
                "cannot watch the config file's directory; configReload has no effect, SIGHUP still reloads"
            );
            None
        }
    }
}

/// True when `event` may have changed the file named `name`. Opening or reading the file (the
/// reload itself does both) and access-time updates are not changes.
fn concerns(event: &DebouncedEvent, name: &std::ffi::OsStr) -> bool {
    let change = match event.kind {
        EventKind::Access(kind) => kind == AccessKind::Close(AccessMode::Write),
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        _ => true,
    };
    change && event.paths.iter().any(|p| p.file_name() == Some(name))
}

#[cfg(test)]
mod tests;

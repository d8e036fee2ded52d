//! The running configuration as a shared, swappable value: one publisher (the daemon, which the
//! reloader drives) and any number of `Live` readers. Owns the hand-over only; must not parse,
//! judge or watch anything — that is `config::parse`, `config::diff` and the daemon's `reload`.
//!
//! A reader asks for `current()` at the start of each piece of work (a tool call) and keeps that
//! snapshot to the end, so one call never sees half of an old and half of a new configuration.

use std::sync::Arc;

use tokio::sync::watch;

use super::Config;

/// A reader of the running configuration. Cheap to clone; every clone sees every applied reload.
#[derive(Debug, Clone)]
pub struct Live {
    rx: watch::Receiver<Arc<Config>>,
}

impl Live {
    /// A configuration that never changes (in-process daemons and tests without a reloader).
    pub fn fixed(config: Config) -> Self {
        let (_publisher, live) = channel(config);
        live
    }

    /// The configuration in force now. Hold the returned snapshot for the length of one piece
    /// of work rather than calling this repeatedly.
    pub fn current(&self) -> Arc<Config> {
        Arc::clone(&self.rx.borrow())
    }

    /// A receiver that wakes (`changed()`) once per applied reload, carrying the new snapshot.
    /// This is how a long-running part (the engine) learns of reloads; refused or invalid
    /// reloads never reach it. When the daemon has no reloader, `changed()` returns an error
    /// at once (no further value will ever come) and `borrow()` still gives the configuration.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Config>> {
        let mut rx = self.rx.clone();
        rx.mark_unchanged();
        rx
    }
}

/// The one writer of the running configuration.
#[derive(Debug)]
pub struct Publisher {
    tx: watch::Sender<Arc<Config>>,
}

impl Publisher {
    /// The configuration in force now.
    pub fn current(&self) -> Arc<Config> {
        Arc::clone(&self.tx.borrow())
    }

    /// Makes `config` the running configuration for every reader at once.
    pub fn publish(&self, config: Config) {
        self.tx.send_replace(Arc::new(config));
    }

    /// Another reader.
    pub fn live(&self) -> Live {
        Live {
            rx: self.tx.subscribe(),
        }
    }
}

/// A publisher and a first reader, starting at `config`.
pub fn channel(config: Config) -> (Publisher, Live) {
    let (tx, rx) = watch::channel(Arc::new(config));
    (Publisher { tx }, Live { rx })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(workspace: &str) -> Config {
        let mut c = Config::parse("", "test", &super::super::Environment::default())
            .expect("defaults are valid");
        c.members_workspace = workspace.to_owned();
        c
    }

    #[tokio::test]
    async fn readers_see_a_publish_and_subscribers_wake_once() {
        let (publisher, live) = channel(config("a"));
        let mut updates = live.subscribe();
        let other = publisher.live();
        assert_eq!(live.current().members_workspace, "a");
        publisher.publish(config("b"));
        assert_eq!(live.current().members_workspace, "b");
        assert_eq!(other.current().members_workspace, "b");
        updates.changed().await.expect("the publisher is alive");
        assert_eq!(updates.borrow_and_update().members_workspace, "b");
        assert!(!updates.has_changed().expect("alive"));
    }

    #[test]
    fn a_fixed_config_stays_readable() {
        let live = Live::fixed(config("x"));
        assert_eq!(live.current().members_workspace, "x");
        assert!(live.subscribe().has_changed().is_err(), "no publisher");
    }
}

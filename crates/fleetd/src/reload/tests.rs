//! Reloader tests on a real file in a tempdir: applied whole, refused whole, invalid kept, the
//! command-line overrides re-applied, and a missing file never resetting to defaults.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::config::{LogFormat, channel};

struct Case {
    dir: tempfile::TempDir,
    reloader: Reloader,
    live: crate::config::Live,
}

impl Case {
    fn new(text: &str, overrides: Overrides) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("fleetd.yaml");
        std::fs::write(&path, text).expect("write config");
        let env = Environment {
            home: Some(PathBuf::from("/home/u")),
            ..Environment::default()
        };
        let mut config = Config::load(Some(&path), &env).expect("first config is valid");
        overrides.apply(&mut config);
        let (publisher, live) = channel(config);
        let source = ReloadSource {
            path,
            env,
            overrides,
        };
        Self {
            reloader: Reloader::new(source, Arc::new(publisher)),
            dir,
            live,
        }
    }

    fn rewrite(&self, text: &str) -> Outcome {
        std::fs::write(self.dir.path().join("fleetd.yaml"), text).expect("rewrite config");
        self.reloader.reload(Trigger::Hangup)
    }

    fn profiles(&self) -> Vec<String> {
        self.live.current().profiles.keys().cloned().collect()
    }
}

const ONE: &str = "profiles:\n  coder: {agent: claude}\n";
const TWO: &str = "profiles:\n  coder: {agent: claude}\n  reviewer: {agent: pi}\n";

#[test]
fn a_valid_change_is_published() {
    let case = Case::new(ONE, Overrides::default());
    let updates = case.live.subscribe();
    match case.rewrite(TWO) {
        Outcome::Applied(diff) => assert_eq!(diff.summary(), "profiles (+reviewer)"),
        other => panic!("expected applied, got {other:?}"),
    }
    assert_eq!(case.profiles(), ["coder", "reviewer"]);
    assert!(updates.has_changed().expect("publisher alive"));
    assert!(matches!(case.rewrite(TWO), Outcome::Unchanged));
}

#[test]
fn invalid_yaml_keeps_the_running_config() {
    let case = Case::new(ONE, Overrides::default());
    let mut updates = case.live.subscribe();
    match case.rewrite("profiles: [\n") {
        Outcome::Invalid(e) => assert!(e.to_string().contains("fleetd.yaml"), "{e}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    match case.rewrite("profiles:\n  coder: {agent: nonsense}\n") {
        Outcome::Invalid(e) => assert!(e.to_string().contains("profiles.coder"), "{e}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    assert_eq!(case.profiles(), ["coder"]);
    assert!(!updates.has_changed().expect("publisher alive"));
    assert!(updates.borrow_and_update().profiles.contains_key("coder"));
}

#[test]
fn a_boot_only_change_refuses_the_whole_reload() {
    let case = Case::new(ONE, Overrides::default());
    let text = format!("listen: 127.0.0.1:7001\n{TWO}");
    match case.rewrite(&text) {
        Outcome::Refused(diff) => {
            let keys: Vec<&str> = diff.boot_only().iter().map(|c| c.key.as_str()).collect();
            assert_eq!(keys, ["listen"]);
        }
        other => panic!("expected refused, got {other:?}"),
    }
    assert_eq!(
        case.profiles(),
        ["coder"],
        "nothing of a refused reload applies"
    );
}

#[test]
fn command_line_overrides_are_not_mistaken_for_changes() {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".parse().expect("address")),
        log_format: Some(LogFormat::Json),
    };
    let case = Case::new(ONE, overrides);
    assert!(matches!(case.rewrite(TWO), Outcome::Applied(_)));
    assert_eq!(case.live.current().listen.port(), 0);
    assert_eq!(case.live.current().log.format, LogFormat::Json);
}

#[test]
fn a_missing_file_keeps_the_running_config() {
    let case = Case::new(ONE, Overrides::default());
    std::fs::remove_file(case.dir.path().join("fleetd.yaml")).expect("remove");
    match case.reloader.reload(Trigger::FileChanged) {
        Outcome::Invalid(ConfigError::Read { .. }) => {}
        other => panic!("expected a read failure, got {other:?}"),
    }
    assert_eq!(case.profiles(), ["coder"]);
}

#[tokio::test]
async fn a_new_watch_asks_for_one_read_so_an_edit_saved_before_it_is_not_missed() {
    // Turning configReload on reads the file, then starts the watch: an edit saved in between
    // raises no event, so the watch asks for one more read as it starts.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fleetd.yaml");
    std::fs::write(&path, "configReload: true\n").expect("write");
    let (tx, mut requests) = tokio::sync::mpsc::channel(1);
    let watcher = super::watch_file(&path, tx).expect("the directory can be watched");
    assert_eq!(requests.try_recv(), Ok(()), "one read asked for at once");
    assert!(requests.try_recv().is_err(), "and only one");
    drop(watcher);
}

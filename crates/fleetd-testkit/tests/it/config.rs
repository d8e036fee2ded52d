//! Integration tests: `fleetd config check` on real files, by the built binary, with exit codes.

use std::path::{Path, PathBuf};

use fleetd_testkit::daemon::command;

fn check(home: &Path, file: &Path) -> (i32, String, String) {
    let out = command(home)
        .args(["config", "check"])
        .arg(file)
        .output()
        .expect("fleetd runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write config");
    path
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fleetd.example.yaml")
}

#[test]
fn example_config_checks_ok_and_prints_the_effective_config() {
    let home = tempfile::tempdir().expect("tempdir");
    let (code, stdout, stderr) = check(home.path(), &example());
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.contains("listen: 127.0.0.1:7797"), "{stdout}");
    assert!(stdout.contains("pushReminders: 5"), "{stdout}");
    assert!(stderr.contains("configuration is valid"), "{stderr}");
}

#[test]
fn defaults_come_from_the_isolated_home() {
    let home = tempfile::tempdir().expect("tempdir");
    let file = write(home.path(), "empty.yaml", "");
    let (code, stdout, _) = check(home.path(), &file);
    assert_eq!(code, 0);
    let state = home.path().join("state/fleetd/inbox.db");
    assert!(stdout.contains(&state.display().to_string()), "{stdout}");
}

#[test]
fn bad_files_exit_1_with_the_reason() {
    let home = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "unknown.yaml",
            "listen: 127.0.0.1:1\nbogus: 1\n",
            "unknown field `bogus`",
        ),
        (
            "terminal.yaml",
            "primary:\n  terminal: term_1\n",
            "tab: w1:t1",
        ),
        (
            "notab.yaml",
            "primary:\n  pushReminders: 2\n",
            "needs `tab:`",
        ),
        ("types.yaml", "configReload: 7\n", "configReload"),
        ("syntax.yaml", "listen: [\n", "line"),
        (
            "user.yaml",
            "gateway:\n  name: laptop\n  broker:\n    urls: [amqp://rmq:5672/fleet]\n    user: fleet-laptop\n",
            "`gateway.broker.user`: the broker user \"fleet-laptop\" is not gateway.name \"laptop\"",
        ),
    ];
    for (name, text, fragment) in cases {
        let file = write(home.path(), name, text);
        let (code, stdout, stderr) = check(home.path(), &file);
        assert_eq!(code, 1, "{name}: stdout {stdout} stderr {stderr}");
        assert!(
            stderr.contains(fragment),
            "{name}: {stderr:?} lacks {fragment:?}"
        );
        assert!(
            stdout.is_empty(),
            "{name}: nothing on stdout for a refused file"
        );
    }
    let (code, _, stderr) = check(home.path(), &home.path().join("missing.yaml"));
    assert_eq!(code, 1);
    assert!(stderr.contains("failed to read config file"), "{stderr}");
}

#[test]
fn secrets_are_shown_by_name_only() {
    let home = tempfile::tempdir().expect("tempdir");
    let file = write(
        home.path(),
        "secret.yaml",
        "store:\n  kind: amqp\n  url: amqp://fleet:s3cr3t-value@127.0.0.1:5672/%2f\n",
    );
    let (code, stdout, _) = check(home.path(), &file);
    assert_eq!(code, 0);
    assert!(!stdout.contains("s3cr3t-value"), "{stdout}");
    assert!(
        stdout.contains("amqp://fleet:***@127.0.0.1:5672/%2f"),
        "{stdout}"
    );
}

//! Integration tests: the `fleetd` binary's command line — help, version, exit codes.

use std::process::Output;

use fleetd_testkit::daemon::command;

/// What `fleetd args` did, run with a fresh home of its own (no daemon, no config).
fn fleetd(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("tempdir");
    command(home.path())
        .args(args)
        .output()
        .expect("fleetd runs")
}

#[test]
fn help_describes_every_subcommand() {
    let out = fleetd(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "serve", "config", "mcp", "status", "inbox", "ack", "send", "budget", "install", "demo",
    ] {
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(sub))
            .unwrap_or_else(|| panic!("--help lacks {sub}: {help}"));
        assert!(
            line.trim().len() > sub.len() + 10,
            "{sub} has no description: {line:?}"
        );
    }
    let out = fleetd(&["config", "--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("check"));
}

#[test]
fn version_prints_the_crate_version() {
    let out = fleetd(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("fleetd "), "{text}");
    assert!(text.trim().ends_with(env!("CARGO_PKG_VERSION")), "{text}");
}

#[test]
fn unknown_subcommand_fails_with_usage() {
    let out = fleetd(&["frobnicate"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage"));
}

#[test]
fn budget_needs_a_limit_or_lift_and_not_both() {
    for args in [
        &["budget", "ann"][..],
        &["budget", "ann", "--lift", "--tokens", "5"][..],
    ] {
        let out = fleetd(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("--tokens") && said.contains("--lift"),
            "{args:?}: {said}"
        );
    }
}

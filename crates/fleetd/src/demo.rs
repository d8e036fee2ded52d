//! `fleetd demo`: finds the `fleetd-demo` program next to the running `fleetd` (the way cargo
//! finds its subcommands) and replaces this process with it, handing it this binary's path so
//! the demo runs exactly this fleetd. The scenario itself lives in the test kit
//! (`fleetd_testkit::demo`), which the daemon must never depend on; this module only launches it.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The demo program's file name.
pub const DEMO_BINARY: &str = "fleetd-demo";

/// Why the demo could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The running binary's path is unknown.
    #[error("failed to find the running fleetd binary: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// `fleetd-demo` is not next to `fleetd`.
    #[error(
        "failed to find {}: `fleetd demo` runs the fleetd-demo program built next to fleetd; \
         build both with `cargo build --release --workspace` and run target/release/fleetd demo",
        .0.display()
    )]
    Missing(PathBuf),
    /// `exec` failed.
    #[error("failed to run {}: {source}", .path.display())]
    Exec {
        /// The demo program.
        path: PathBuf,
        /// What `exec` said.
        #[source]
        source: std::io::Error,
    },
}

/// The command that runs the demo for the `fleetd` at `fleetd`: `fleetd-demo --fleetd <fleetd>`
/// plus `--no-pause` when asked. Fails when `fleetd-demo` is not in `fleetd`'s directory.
pub fn command(fleetd: &Path, no_pause: bool) -> Result<Command, DemoError> {
    let demo = fleetd.with_file_name(DEMO_BINARY);
    if !demo.is_file() {
        return Err(DemoError::Missing(demo));
    }
    let mut cmd = Command::new(&demo);
    cmd.arg("--fleetd").arg(fleetd);
    if no_pause {
        cmd.arg("--no-pause");
    }
    Ok(cmd)
}

/// Replaces this process with the demo; returns only when that failed.
pub fn exec(no_pause: bool) -> DemoError {
    let fleetd = match std::env::current_exe() {
        Ok(path) => path,
        Err(e) => return DemoError::CurrentExe(e),
    };
    match command(&fleetd, no_pause) {
        Ok(mut cmd) => DemoError::Exec {
            path: fleetd.with_file_name(DEMO_BINARY),
            source: cmd.exec(),
        },
        Err(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_is_found_next_to_fleetd_or_named_with_the_build_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fleetd = dir.path().join("fleetd");
        let missing = command(&fleetd, false).expect_err("no fleetd-demo yet");
        let text = missing.to_string();
        assert!(text.contains("cargo build --release --workspace"), "{text}");
        assert!(text.contains(&dir.path().join(DEMO_BINARY).display().to_string()));

        std::fs::write(dir.path().join(DEMO_BINARY), "").expect("write");
        let cmd = command(&fleetd, true).expect("found");
        assert_eq!(cmd.get_program(), dir.path().join(DEMO_BINARY));
        let args: Vec<_> = cmd.get_args().collect();
        assert_eq!(
            args,
            [
                "--fleetd".as_ref(),
                fleetd.as_os_str(),
                "--no-pause".as_ref()
            ]
        );
    }
}

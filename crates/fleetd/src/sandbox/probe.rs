//! Whether this machine can give a sandbox: bubblewrap on the member's `PATH`, and user
//! namespaces it may create — and when it cannot, which of them is missing and how to fix it,
//! read from the kernel's switches (`diagnose`, pure).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long bubblewrap gets to start and end an empty box.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// `name` as the shell would find it on `path_var`.
pub fn find_on_path(name: &str, path_var: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path_var)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Starts and ends an empty box with the namespaces a member's uses; the reason when it cannot.
pub(super) async fn user_namespaces(bwrap: &Path) -> Result<(), String> {
    let run = tokio::process::Command::new(bwrap)
        .args([
            "--unshare-user",
            "--unshare-pid",
            "--ro-bind",
            "/",
            "/",
            "--",
            "true",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(PROBE_TIMEOUT, run)
        .await
        .map_err(|_| {
            format!(
                "{} did not start an empty sandbox within {}s",
                bwrap.display(),
                PROBE_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("cannot run {}: {e}", bwrap.display()))?;
    if output.status.success() {
        return Ok(());
    }
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Err(diagnose(
        &Switches {
            max_user_namespaces: read("/proc/sys/user/max_user_namespaces"),
            unprivileged_userns_clone: read("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict: read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        },
        String::from_utf8_lossy(&output.stderr).trim(),
    ))
}

/// The kernel's switches for unprivileged user namespaces (`None`: the kernel has no such
/// switch).
#[derive(Debug, Clone, Copy, Default)]
pub struct Switches {
    /// `user.max_user_namespaces`.
    pub max_user_namespaces: Option<u64>,
    /// `kernel.unprivileged_userns_clone` (Debian's older kernels).
    pub unprivileged_userns_clone: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 23.10 and later).
    pub apparmor_restrict: Option<u64>,
}

/// Why bubblewrap could not make a box, and what to do, from the switches and its own words.
pub fn diagnose(switches: &Switches, said: &str) -> String {
    let why = if switches.max_user_namespaces == Some(0) {
        "user namespaces are disabled on this machine (sysctl user.max_user_namespaces = 0): set it above 0, e.g. `sysctl -w user.max_user_namespaces=15000`".to_owned()
    } else if switches.unprivileged_userns_clone == Some(0) {
        "unprivileged user namespaces are disabled on this machine (sysctl kernel.unprivileged_userns_clone = 0): enable them with `sysctl -w kernel.unprivileged_userns_clone=1`".to_owned()
    } else if switches.apparmor_restrict == Some(1) {
        "AppArmor restricts unprivileged user namespaces on this machine (kernel.apparmor_restrict_unprivileged_userns = 1): give bwrap an AppArmor profile that allows `userns` (Ubuntu ships one as bwrap-userns-restrict), or set the sysctl to 0".to_owned()
    } else {
        "bubblewrap cannot create the namespaces a sandbox needs here (inside a container, the container must allow user namespaces)".to_owned()
    };
    if said.is_empty() {
        format!("a sandbox cannot be made: {why}")
    } else {
        format!("a sandbox cannot be made: {why}; bwrap said: {said}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_switch_that_is_off_is_named_with_its_fix() {
        let off = |s: Switches| diagnose(&s, "bwrap: No permissions to creating new namespace");
        let max = off(Switches {
            max_user_namespaces: Some(0),
            ..Switches::default()
        });
        assert!(
            max.contains("user.max_user_namespaces = 0") && max.contains("sysctl -w"),
            "{max}"
        );
        let clone = off(Switches {
            max_user_namespaces: Some(1000),
            unprivileged_userns_clone: Some(0),
            ..Switches::default()
        });
        assert!(
            clone.contains("kernel.unprivileged_userns_clone"),
            "{clone}"
        );
        let apparmor = off(Switches {
            apparmor_restrict: Some(1),
            ..Switches::default()
        });
        assert!(apparmor.contains("AppArmor"), "{apparmor}");
        let other = off(Switches::default());
        assert!(
            other.contains("container") && other.contains("bwrap said: bwrap: No permissions"),
            "{other}"
        );
    }

    #[test]
    fn a_name_is_found_only_as_an_executable_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plain = dir.path().join("tool");
        std::fs::write(&plain, "").expect("write");
        let path = dir.path().display().to_string();
        assert_eq!(find_on_path("tool", &path), None, "not executable");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(
            find_on_path("tool", &format!("/nowhere:{path}")),
            Some(plain)
        );
        assert_eq!(find_on_path("absent", &path), None);
    }
}

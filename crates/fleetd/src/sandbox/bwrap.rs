//! The bubblewrap command line that boxes one member (SPEC §19), from a [`Plan`] of what it may
//! see. Pure: the paths are found by `sandbox::prepare`, the command is run by the multiplexer.
//!
//! The box starts from an empty root (`--tmpfs /`) and adds, in this order, so that a later
//! bind lies over an earlier one: the system read-only (`/usr`, `/etc`, `/opt` and the
//! top-level links or directories into them), a fresh `/dev`, a `/proc` of its own PID
//! namespace, a private `/tmp`; the member's home (a directory of its own, at the user's
//! `$HOME` path); what it must read (the agent's install, the `PATH` directories holding it,
//! fleetd's binary, the profile's `readOnly`); its repository's git directory read-only with
//! the parts a commit on its own branch writes made writable; the profile's `writable`; its
//! working directory writable; and the directory holding fleetd's stdio door. Nothing else of
//! the host's filesystem exists inside: not fleetd's state directory, the user's home, tmux's
//! or herdr's sockets, the lead's checkout or another member's worktree. It runs in new user,
//! PID, IPC and UTS namespaces (and a network namespace of its own when the profile turns the
//! network off), with every capability dropped, and dies with the pane's process.

use std::path::{Path, PathBuf};

/// Environment variables that name the user's multiplexer; unset inside (their sockets are not
/// there either).
pub const MUX_VARS: &[&str] = &[
    "TMUX",
    "TMUX_PANE",
    "HERDR_SOCKET_PATH",
    "HERDR_CONFIG_PATH",
    "HERDR_ENV",
];

/// The name of the stdio door's socket in its directory.
pub const DOOR_SOCKET: &str = "fleetd.sock";

/// The variable the stdio relay (`fleetd mcp`) reads its socket from inside a sandbox.
pub const SHIM_SOCKET_VAR: &str = "FLEETD_SHIM_SOCKET";

/// A top-level entry of the host's root the box recreates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// A directory, bound read-only (skipped where the host has none).
    Dir(PathBuf),
    /// A symbolic link (`/bin` → `usr/bin` on a merged-`/usr` system), recreated as it is.
    Link {
        /// The link's path.
        path: PathBuf,
        /// What it points to.
        target: PathBuf,
    },
}

/// The git directories a member's worktree commits through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitDirs {
    /// The repository's git directory (`<repo>/.git`): read-only.
    pub common: PathBuf,
    /// This worktree's own directory in it (`<repo>/.git/worktrees/<name>`): writable.
    pub admin: PathBuf,
    /// Files that say where git finds the repository and its configuration (the worktree's
    /// `.git`, the admin directory's `gitdir`, `commondir` and `config.worktree`): read-only
    /// over the writable binds, so the member cannot point git — fleetd's or the lead's, run
    /// outside the box on its worktree — at a configuration of its own making.
    pub pinned: Vec<PathBuf>,
}

/// What one member's box holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The host's system entries.
    pub system: Vec<SystemEntry>,
    /// The member's home on the host, bound writable at `home_at`.
    pub home: PathBuf,
    /// Where its home appears (the user's `$HOME` path).
    pub home_at: PathBuf,
    /// Read-only binds, each at its own path.
    pub read_only: Vec<PathBuf>,
    /// Its worktree's git directories, when it has a worktree.
    pub git: Option<GitDirs>,
    /// Writable binds, each at its own path.
    pub writable: Vec<PathBuf>,
    /// Its working directory, writable; it starts there.
    pub workdir: PathBuf,
    /// The directory holding fleetd's stdio door (its socket [`DOOR_SOCKET`]), bound
    /// read-only.
    pub door: PathBuf,
    /// Whether it keeps the host's network.
    pub network: bool,
}

fn push(argv: &mut Vec<String>, parts: &[&str]) {
    argv.extend(parts.iter().map(|s| (*s).to_owned()));
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

impl Plan {
    /// `bwrap …options… -- command…`.
    pub fn argv(&self, bwrap: &Path, command: &[String]) -> Vec<String> {
        let mut argv = vec![path(bwrap).to_owned()];
        push(
            &mut argv,
            &[
                "--unshare-user",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--die-with-parent",
                "--cap-drop",
                "ALL",
            ],
        );
        if !self.network {
            push(&mut argv, &["--unshare-net"]);
        }
        push(&mut argv, &["--tmpfs", "/"]);
        for entry in &self.system {
            match entry {
                SystemEntry::Dir(d) => push(&mut argv, &["--ro-bind-try", path(d), path(d)]),
                SystemEntry::Link { path: p, target } => {
                    push(&mut argv, &["--symlink", path(target), path(p)]);
                }
            }
        }
        push(
            &mut argv,
            &["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"],
        );
        push(
            &mut argv,
            &["--bind", path(&self.home), path(&self.home_at)],
        );
        for p in &self.read_only {
            push(&mut argv, &["--ro-bind", path(p), path(p)]);
        }
        if let Some(git) = &self.git {
            push(
                &mut argv,
                &["--ro-bind", path(&git.common), path(&git.common)],
            );
            // What `git commit` on the member's branch writes: objects, the branch's ref and
            // its log, and the worktree's own HEAD and index.
            for part in ["objects", "refs", "logs"] {
                let p = git.common.join(part);
                push(&mut argv, &["--bind-try", path(&p), path(&p)]);
            }
            push(&mut argv, &["--bind", path(&git.admin), path(&git.admin)]);
        }
        for p in &self.writable {
            push(&mut argv, &["--bind", path(p), path(p)]);
        }
        push(
            &mut argv,
            &["--bind", path(&self.workdir), path(&self.workdir)],
        );
        for p in self.git.iter().flat_map(|g| &g.pinned) {
            push(&mut argv, &["--ro-bind", path(p), path(p)]);
        }
        push(
            &mut argv,
            &["--ro-bind", path(&self.door), path(&self.door)],
        );
        push(&mut argv, &["--chdir", path(&self.workdir)]);
        let door_socket = self.door.join(DOOR_SOCKET);
        push(
            &mut argv,
            &[
                "--setenv",
                "HOME",
                path(&self.home_at),
                "--setenv",
                "TMPDIR",
                "/tmp",
                "--setenv",
                SHIM_SOCKET_VAR,
                path(&door_socket),
            ],
        );
        for var in MUX_VARS {
            push(&mut argv, &["--unsetenv", var]);
        }
        argv.push("--".to_owned());
        argv.extend(command.iter().cloned());
        argv
    }
}

/// The first of `binds` that would show the box `hidden` (it is `hidden` or holds it), if any.
pub fn exposes<'a>(binds: impl IntoIterator<Item = &'a Path>, hidden: &Path) -> Option<&'a Path> {
    binds.into_iter().find(|b| hidden.starts_with(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            system: vec![
                SystemEntry::Dir("/usr".into()),
                SystemEntry::Link {
                    path: "/bin".into(),
                    target: "usr/bin".into(),
                },
            ],
            home: "/state/sandboxes/ann/home".into(),
            home_at: "/home/u".into(),
            read_only: vec!["/home/u/.cache/agents/claude".into()],
            git: Some(GitDirs {
                common: "/repo/.git".into(),
                admin: "/repo/.git/worktrees/ann".into(),
                pinned: vec!["/state/worktrees/ann/.git".into()],
            }),
            writable: vec![],
            workdir: "/state/worktrees/ann".into(),
            door: "/state/door".into(),
            network: true,
        }
    }

    fn position(argv: &[String], window: &[&str]) -> usize {
        argv.windows(window.len())
            .position(|w| w.iter().zip(window).all(|(a, b)| a == b))
            .unwrap_or_else(|| panic!("{window:?} not in {argv:?}"))
    }

    #[test]
    fn the_box_starts_empty_and_later_binds_lie_over_earlier_ones() {
        let argv = plan().argv(Path::new("/usr/bin/bwrap"), &["claude".into()]);
        assert_eq!(argv[0], "/usr/bin/bwrap");
        let root = position(&argv, &["--tmpfs", "/"]);
        let usr = position(&argv, &["--ro-bind-try", "/usr", "/usr"]);
        let home = position(&argv, &["--bind", "/state/sandboxes/ann/home", "/home/u"]);
        let agent = position(&argv, &["--ro-bind", "/home/u/.cache/agents/claude"]);
        let git = position(&argv, &["--ro-bind", "/repo/.git", "/repo/.git"]);
        let objects = position(&argv, &["--bind-try", "/repo/.git/objects"]);
        let work = position(&argv, &["--bind", "/state/worktrees/ann"]);
        let pinned = position(&argv, &["--ro-bind", "/state/worktrees/ann/.git"]);
        assert!(root < usr && usr < home && home < agent && agent < git && git < objects);
        assert!(objects < work && work < pinned);
        position(&argv, &["--symlink", "usr/bin", "/bin"]);
        position(&argv, &["--cap-drop", "ALL"]);
        position(&argv, &["--unshare-pid"]);
        position(&argv, &["--chdir", "/state/worktrees/ann"]);
        position(&argv, &["--setenv", "HOME", "/home/u"]);
        position(&argv, &["--unsetenv", "TMUX"]);
        assert!(!argv.iter().any(|a| a == "--unshare-net"), "network kept");
        assert_eq!(&argv[argv.len() - 2..], ["--", "claude"]);
    }

    #[test]
    fn network_off_is_a_namespace_of_its_own() {
        let argv = Plan {
            network: false,
            ..plan()
        }
        .argv(Path::new("bwrap"), &[]);
        position(&argv, &["--unshare-net"]);
    }

    #[test]
    fn a_bind_that_holds_the_state_directory_is_named() {
        let binds = [Path::new("/opt/tools"), Path::new("/home/u")];
        assert_eq!(
            exposes(binds, Path::new("/home/u/.local/state/fleetd")),
            Some(Path::new("/home/u"))
        );
        assert_eq!(exposes(binds, Path::new("/var/lib/fleetd")), None);
        assert_eq!(
            exposes([Path::new("/")], Path::new("/var/lib/fleetd")),
            Some(Path::new("/"))
        );
    }
}

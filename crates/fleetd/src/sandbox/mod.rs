//! Members in a sandbox (SPEC §19): a profile's `sandbox:` starts each member's agent inside
//! bubblewrap, in a box `bwrap` describes. This module finds what the box needs on this machine
//! — bubblewrap and user namespaces (or the reason there are none), the member's private home,
//! its git directories, the agent's install — and turns a member's launch into the boxed one.
//! A sandbox the machine cannot give is an error naming what is missing and how to get it: the
//! spawn fails, and no member ever runs unboxed in its place.
//!
//! Identity is untouched: the box's processes descend from the member's pane on the host, so
//! the locator finds them by ancestry as it finds any member's (its PID namespace hides the
//! host from the member, not the member from fleetd). The stdio relay reaches fleetd through
//! `<state>/door/fleetd.sock`, a second name of the shim's socket in a directory of its own,
//! which is all of the state directory the box shows.

#[cfg(not(target_os = "linux"))]
compile_error!(
    "fleetd: sandboxed members (sandbox) use bubblewrap and Linux's user, PID, IPC and UTS \
     namespaces. Another platform needs its own box (macOS: sandbox-exec profiles), or a build \
     that refuses profiles with `sandbox:`."
);

pub mod bwrap;
mod probe;
pub mod relay;
pub mod user;

use std::path::{Path, PathBuf};

use fleetd_core::Target;

pub use bwrap::{GitDirs, Plan, SHIM_SOCKET_VAR, SystemEntry};
pub use probe::{diagnose, find_on_path};

use crate::config::Sandbox;

/// The directory under the state directory that holds the stdio door, the only part of the
/// state directory a box binds.
pub fn door_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("door")
}

/// `<state>/door/http.sock`: fleetd's HTTP door for boxed members without a network, which
/// their in-box relay (`fleetd box-relay`, [`relay`]) forwards fleetd's address to.
pub fn http_door(state_dir: &Path) -> PathBuf {
    door_dir(state_dir).join("http.sock")
}

/// Makes `<state>/door/fleetd.sock` a second name of the shim's socket at `socket` (replacing
/// one a previous daemon left), so a box that binds the door's directory reaches this daemon's
/// socket, and the next daemon's after a restart.
pub fn link_door(state_dir: &Path, socket: &Path) -> std::io::Result<()> {
    let dir = door_dir(state_dir);
    crate::state_dir::private_dir(&dir)?;
    let door = dir.join(bwrap::DOOR_SOCKET);
    match std::fs::remove_file(&door) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::hard_link(socket, &door)
}

/// What one boxed member is started from.
#[derive(Debug)]
pub struct Request<'a> {
    /// The profile's name (for messages).
    pub profile: &'a str,
    /// The profile's sandbox.
    pub spec: &'a Sandbox,
    /// fleetd's state directory (hidden from the box; its homes live under it).
    pub state_dir: &'a Path,
    /// The member.
    pub target: &'a Target,
    /// Its working directory (its worktree, or the spawn's `cwd`).
    pub workdir: Option<&'a Path>,
    /// Whether that directory is a worktree fleetd made (its git directories are bound).
    pub worktree: bool,
    /// The member's environment (its profile's `env` and what fleetd adds).
    pub env: &'a std::collections::BTreeMap<String, String>,
    /// fleetd's address as members reach it (`FLEETD_URL`'s): where a box without a network
    /// relays it.
    pub fleet_addr: Option<std::net::SocketAddr>,
}

impl Request<'_> {
    /// A variable of the member's environment, else of fleetd's own (which its pane inherits
    /// through the multiplexer, as `PATH` and `HOME` do).
    fn var(&self, name: &str) -> String {
        self.env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .unwrap_or_default()
    }
}

/// What a box is made from, as found on this machine for one request.
struct Found {
    /// The `PATH` its command is found on.
    path_var: String,
    /// The user's home, where the box shows the member's own.
    home_at: PathBuf,
}

/// Where member `target`'s private home lives on the host.
pub fn home_of(state_dir: &Path, target: &Target) -> PathBuf {
    state_dir
        .join("sandboxes")
        .join(target.as_str())
        .join("home")
}

/// The boxed form of `command` for `request`: bubblewrap's argv. Makes the member's private
/// home (fresh, from `homeFrom` when set). Errors say what is missing and what to do.
pub async fn boxed(request: &Request<'_>, command: &[String]) -> Result<Vec<String>, String> {
    let home_at = request.var("HOME");
    let found = Found {
        path_var: request.var("PATH"),
        home_at: PathBuf::from(if home_at.is_empty() {
            "/home/member"
        } else {
            &home_at
        }),
    };
    let bwrap = find_on_path("bwrap", &found.path_var).ok_or_else(|| {
        format!(
            "profile {} asks for a sandbox, but bubblewrap is not installed (no `bwrap` on the member's PATH): install it (Debian and Ubuntu: apt-get install bubblewrap), or remove `sandbox:` from the profile",
            request.profile
        )
    })?;
    probe::user_namespaces(&bwrap).await?;
    let workdir = request.workdir.ok_or_else(|| {
        format!(
            "profile {} puts its members in a sandbox, which needs a directory for the member to work in: give the profile a `worktree:` or a `cwd`, or pass `cwd` to fleet_spawn",
            request.profile
        )
    })?;
    let workdir = std::fs::canonicalize(workdir)
        .map_err(|e| format!("the member's directory {}: {e}", workdir.display()))?;
    // (The agent's install is found from its own command, not the relay's in front of it.)
    let plan = plan(request, &found, &workdir, command)?;
    let command = if request.spec.network {
        command.to_vec()
    } else {
        relayed(request, command)?
    };
    let home = plan.home.clone();
    let from = request.spec.home_from.clone();
    tokio::task::spawn_blocking(move || make_home(&home, from.as_deref()))
        .await
        .map_err(|e| format!("making the member's home: {e}"))??;
    Ok(plan.argv(&bwrap, &command))
}

/// `command` as profile `profile`'s `runAs` user `name` runs it: the user found and taken (its
/// leftovers ended), `env` and `cwd` made its own (its home, unless the spawn gives a
/// directory). Hold the claim until the member is registered.
pub async fn as_user(
    engine: &crate::engine::EngineHandle,
    profile: &str,
    name: &str,
    env: &mut std::collections::BTreeMap<String, String>,
    cwd: &mut Option<PathBuf>,
    command: &[String],
) -> Result<(Vec<String>, user::Claim, crate::engine::MemberUser), String> {
    let found = user::find(profile, name).await?;
    let claim = user::take(engine, profile, &found).await?;
    let path = env
        .get("PATH")
        .cloned()
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
    user::environment(&found, env);
    cwd.get_or_insert_with(|| found.home.clone());
    let argv = user::switched(&found, &path, command, crate::locate::own_uid() == 0);
    let member = crate::engine::MemberUser {
        name: found.name,
        uid: found.uid,
    };
    Ok((argv, claim, member))
}

/// `command` run behind `fleetd box-relay`, which gives a box without a network fleetd's
/// address through the boxed HTTP door.
fn relayed(request: &Request<'_>, command: &[String]) -> Result<Vec<String>, String> {
    let addr = request.fleet_addr.ok_or_else(|| {
        format!(
            "profile {} turns its sandbox's network off, but fleetd's own address is not one the box can relay",
            request.profile
        )
    })?;
    let exe = std::env::current_exe()
        .map_err(|e| format!("fleetd cannot find its own binary for the box's relay: {e}"))?;
    let mut argv = vec![
        exe.display().to_string(),
        "box-relay".to_owned(),
        "--listen".to_owned(),
        addr.to_string(),
        "--socket".to_owned(),
        http_door(request.state_dir).display().to_string(),
        "--".to_owned(),
    ];
    argv.extend(command.iter().cloned());
    Ok(argv)
}

fn plan(
    request: &Request<'_>,
    found: &Found,
    workdir: &Path,
    command: &[String],
) -> Result<Plan, String> {
    let key = format!("profiles.{}.sandbox", request.profile);
    for (field, paths) in [
        ("readOnly", &request.spec.read_only),
        ("writable", &request.spec.writable),
    ] {
        if let Some(missing) = paths.iter().find(|p| !p.exists()) {
            return Err(format!(
                "{key}.{field} names {}, which does not exist: create it or take it out",
                missing.display()
            ));
        }
        if let Some(bad) = bwrap::exposes(paths.iter().map(PathBuf::as_path), request.state_dir) {
            return Err(format!(
                "{key}.{field} names {}, which holds fleetd's state directory {}: a member must never see it; name the directories it needs below that instead",
                bad.display(),
                request.state_dir.display()
            ));
        }
    }
    if bwrap::exposes([workdir], request.state_dir).is_some() {
        return Err(format!(
            "the member's directory {} holds fleetd's state directory: give it a directory of its own",
            workdir.display()
        ));
    }
    let mut read_only = install_paths(command, request.state_dir, found);
    read_only.extend(
        std::env::current_exe()
            .ok()
            .filter(|exe| !exe.starts_with(request.state_dir)),
    );
    read_only.extend(request.spec.read_only.iter().cloned());
    let git = if request.worktree {
        Some(git_dirs(workdir)?)
    } else {
        None
    };
    let door = door_dir(request.state_dir);
    Ok(Plan {
        system: system_entries(),
        home: home_of(request.state_dir, request.target),
        home_at: found.home_at.clone(),
        read_only,
        git,
        writable: request.spec.writable.clone(),
        workdir: workdir.to_owned(),
        door,
        network: request.spec.network,
    })
}

/// The host's top-level system entries: directories bound read-only, links recreated.
fn system_entries() -> Vec<SystemEntry> {
    let mut entries = Vec::new();
    for name in [
        "/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ] {
        let path = PathBuf::from(name);
        match std::fs::read_link(&path) {
            Ok(target) => entries.push(SystemEntry::Link { path, target }),
            Err(_) if path.is_dir() => entries.push(SystemEntry::Dir(path)),
            Err(_) => {}
        }
    }
    entries
}

/// Whether `dir` is already in the box as part of the system.
fn in_system(dir: &Path) -> bool {
    ["/usr", "/etc", "/opt", "/bin", "/sbin", "/lib", "/lib64"]
        .iter()
        .any(|s| dir.starts_with(s))
}

/// What the member's command needs to be found and run: the `PATH` directories outside the
/// system's (so a bare name resolves inside as outside, and its interpreter too), and the
/// install its executable lives in — the directory holding the outermost `node_modules` for an
/// npm-installed CLI (its package and the packages beside it), else the real file's directory.
/// None that is, or holds, the state directory or the user's home.
fn install_paths(command: &[String], state_dir: &Path, found: &Found) -> Vec<PathBuf> {
    let safe = |p: &Path| {
        p.is_absolute()
            && !in_system(p)
            && bwrap::exposes([p], state_dir).is_none()
            && !p.starts_with(state_dir)
            && bwrap::exposes([p], &found.home_at).is_none()
            && p.is_dir()
    };
    let mut paths: Vec<PathBuf> = std::env::split_paths(&found.path_var)
        .filter(|p| safe(p))
        .collect();
    let exe = command.first().and_then(|c| {
        if c.contains('/') {
            Some(PathBuf::from(c))
        } else {
            find_on_path(c, &found.path_var)
        }
    });
    if let Some(real) = exe.and_then(|e| std::fs::canonicalize(e).ok()) {
        let root = real
            .ancestors()
            .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
            .last()
            .and_then(Path::parent)
            .or_else(|| real.parent())
            .map(Path::to_owned);
        paths.extend(root.filter(|r| safe(r)));
    }
    paths.sort();
    paths.dedup();
    paths
}

/// A worktree's git directories: its own (`.git` names it) and the repository's it shares.
fn git_dirs(workdir: &Path) -> Result<GitDirs, String> {
    let dotgit = workdir.join(".git");
    let text = std::fs::read_to_string(&dotgit)
        .map_err(|e| format!("reading {}: {e}", dotgit.display()))?;
    let admin = text
        .trim()
        .strip_prefix("gitdir:")
        .map(|p| workdir.join(p.trim()))
        .ok_or_else(|| format!("{} names no gitdir", dotgit.display()))?;
    let common = std::fs::read_to_string(admin.join("commondir"))
        .map(|c| admin.join(c.trim()))
        .unwrap_or_else(|_| admin.join("../.."));
    let canonical =
        |p: PathBuf| std::fs::canonicalize(&p).map_err(|e| format!("{}: {e}", p.display()));
    let admin = canonical(admin)?;
    // Present, so it can be pinned: git reads it when the repository turns
    // `extensions.worktreeConfig` on, and a member must not be able to write one.
    let worktree_config = admin.join("config.worktree");
    if !worktree_config.exists() {
        std::fs::write(&worktree_config, "")
            .map_err(|e| format!("{}: {e}", worktree_config.display()))?;
    }
    let pinned = [
        dotgit,
        admin.join("gitdir"),
        admin.join("commondir"),
        worktree_config,
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect();
    Ok(GitDirs {
        common: canonical(common)?,
        admin,
        pinned,
    })
}

/// Makes `home` afresh (a previous member of the same name leaves nothing behind), copying
/// `from` into it when given.
fn make_home(home: &Path, from: Option<&Path>) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("making the member's home {}: {e}", home.display());
    match std::fs::remove_dir_all(home) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    if let Some(parent) = home.parent() {
        crate::state_dir::private_dir(parent).map_err(fail)?;
    }
    crate::state_dir::private_dir(home).map_err(fail)?;
    if let Some(from) = from {
        copy_tree(from, home).map_err(|e| {
            format!(
                "copying the sandbox's homeFrom {} into the member's home: {e}",
                from.display()
            )
        })?;
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            std::fs::create_dir_all(&dst)?;
            copy_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// Homes being made by spawns not yet registered, which a sweep leaves alone.
static IN_FLIGHT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// A spawn's hold on its member's home until the member is registered (or the spawn fails).
#[derive(Debug)]
pub struct Claim(PathBuf);

/// Holds member `target`'s home against [`sweep_homes`] while its spawn runs.
pub fn claim(state_dir: &Path, target: &Target) -> Claim {
    let home = home_of(state_dir, target);
    crate::sync::lock(&IN_FLIGHT).push(home.clone());
    Claim(home)
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&IN_FLIGHT);
        if let Some(i) = held.iter().position(|h| *h == self.0) {
            held.swap_remove(i);
        }
    }
}

/// Keeps `<state>/sandboxes/` to the members that are here, and the profiles' `runAs` users
/// to their members' processes, for the daemon's life: swept once now (a restart leaves the
/// homes and processes of members released while it was down) and again at each
/// `member.released` (or when the event stream outran this task).
pub fn tidy(engine: crate::engine::EngineHandle, config: crate::config::Live) {
    tokio::spawn(async move {
        let mut events = engine.events().subscribe(None).live;
        loop {
            let Ok(members) = engine.list().await else {
                return;
            };
            let current: Vec<Target> = members.into_iter().map(|m| m.target).collect();
            let snapshot = config.current();
            let dir = snapshot.state_dir.clone();
            let _ = tokio::task::spawn_blocking(move || sweep_homes(&dir, &current)).await;
            let users = snapshot.profiles.values().filter_map(|p| p.run_as.clone());
            user::sweep(&engine, users.collect()).await;
            loop {
                match events.recv().await {
                    Ok(event) if event.kind == "member.released" => break,
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
}

/// Takes away the homes of members no longer here (`<state>/sandboxes/<name>` for each name
/// neither in `current` nor held by a spawn under way).
pub fn sweep_homes(state_dir: &Path, current: &[Target]) {
    let Ok(entries) = std::fs::read_dir(state_dir.join("sandboxes")) else {
        return;
    };
    let held = crate::sync::lock(&IN_FLIGHT).clone();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let home = entry.path().join("home");
        if current.iter().any(|t| name == t.as_str()) || held.contains(&home) {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            tracing::debug!(dir = %entry.path().display(), error = %e, "cannot remove a released member's sandbox home");
        }
    }
}

//! `runAs`: members that run as a second user (SPEC §19), the other way to keep a member from
//! the user's things. Where bubblewrap shows a member only part of the filesystem, a second
//! user meets the kernel's own checks everywhere: the user's files, tmux's and herdr's sockets,
//! fleetd's state directory, other processes' `/proc` and signals are refused to it by their
//! owners and modes, with or without user namespaces.
//!
//! One member at a time per user: every process of a user can read and signal every other, so
//! to fleetd that user *is* the member, and a connection from it is the member's whether or not
//! the connection's process can be traced to the pane (fleetd, running as someone else without
//! root, cannot trace another user's TCP sockets to their processes; the kernel still says whose
//! they are). Each member starts with its user's slate clean and its user's processes end with
//! it: leftovers of a member released, or of a daemon that was killed, are killed before the
//! user is given to another.
//!
//! fleetd becomes the user with `setpriv` when it runs as root, else with `sudo -n`, which needs
//! a rule letting fleetd's user run anything as that user without a password, keeping the
//! environment (`alice ALL=(fleet-agent) NOPASSWD:SETENV: ALL`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use fleetd_core::Target;

/// How long `getent`, `sudo -n … true` or a sweep's `kill` may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Variables that name the owner's own per-user places; a member's user has its own or none.
const OWNER_PLACES: &[&str] = &[
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "DBUS_SESSION_BUS_ADDRESS",
];

/// A user a member runs as, as the system's user database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary group.
    pub gid: u32,
    /// Its home directory.
    pub home: PathBuf,
}

/// A `passwd` line (`name:x:uid:gid:gecos:home:shell`) as a [`User`].
pub fn parse_passwd(line: &str) -> Option<User> {
    let fields: Vec<&str> = line.trim_end().split(':').collect();
    let [name, _, uid, gid, _, home, ..] = fields.as_slice() else {
        return None;
    };
    Some(User {
        name: (*name).to_owned(),
        uid: uid.parse().ok()?,
        gid: gid.parse().ok()?,
        home: PathBuf::from(home),
    })
}

async fn run(program: &str, args: &[&str]) -> Result<std::process::Output, String> {
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(STEP_TIMEOUT, output)
        .await
        .map_err(|_| {
            format!(
                "`{program}` did not answer within {}s",
                STEP_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("cannot run `{program}`: {e}"))
}

/// User `name` (a name or a uid) as the system's user database has it (`getent passwd`, so
/// users from NSS count too); `None` when it has none.
async fn lookup(name: &str) -> Result<Option<User>, String> {
    let out = run("getent", &["passwd", name]).await?;
    Ok(std::str::from_utf8(&out.stdout)
        .ok()
        .and_then(|s| s.lines().next())
        .and_then(parse_passwd)
        .filter(|_| out.status.success()))
}

/// Finds user `name` for profile `profile` and checks fleetd can become it. Errors say what is
/// missing and how to give it.
pub async fn find(profile: &str, name: &str) -> Result<User, String> {
    let key = format!("profiles.{profile}.runAs");
    let user = lookup(name).await?.ok_or_else(|| {
            format!(
                "{key} names user {name}, which this machine does not have: create it (useradd --create-home {name}) or take runAs out"
            )
        })?;
    let own = crate::locate::own_uid();
    if user.uid == 0 || user.uid == own {
        return Err(format!(
            "{key} names {name}, which is {}: a member must run as a second user of its own",
            if user.uid == 0 {
                "root"
            } else {
                "fleetd's own user"
            }
        ));
    }
    if own != 0 {
        let probe = run("sudo", &["-n", "-u", name, "-E", "--", "true"]).await;
        if !probe.is_ok_and(|o| o.status.success()) {
            let me = match lookup(&own.to_string()).await {
                Ok(Some(me)) => me.name,
                _ => own.to_string(),
            };
            return Err(format!(
                "{key}: fleetd runs as {me}, not root, and cannot start programs as {name} without a password: add `{me} ALL=({name}) NOPASSWD:SETENV: ALL` to the sudoers (visudo -f /etc/sudoers.d/fleetd), or take runAs out"
            ));
        }
    }
    Ok(user)
}

/// `command` as `user` runs it: its own home, without the owner's per-user places, on the
/// member's `path`. The environment is otherwise kept (the member's variables reach it).
pub fn switched(user: &User, path: &str, command: &[String], as_root: bool) -> Vec<String> {
    let mut argv: Vec<String> = if as_root {
        vec![
            "setpriv".into(),
            format!("--reuid={}", user.uid),
            format!("--regid={}", user.gid),
            "--init-groups".into(),
            "--no-new-privs".into(),
            "--".into(),
        ]
    } else {
        ["sudo", "-n", "-u", &user.name, "-E", "--"]
            .map(str::to_owned)
            .to_vec()
    };
    argv.push("env".into());
    for var in OWNER_PLACES {
        argv.extend(["-u".to_owned(), (*var).to_owned()]);
    }
    argv.push(format!("PATH={path}"));
    argv.extend(command.iter().cloned());
    argv
}

/// The member's variables that say who and where it is, as `user`: its home is the user's,
/// unless the profile's `env` names another (one the user owns).
pub fn environment(user: &User, env: &mut BTreeMap<String, String>) {
    env.entry("HOME".into())
        .or_insert_with(|| user.home.display().to_string());
    env.insert("USER".into(), user.name.clone());
    env.insert("LOGNAME".into(), user.name.clone());
}

/// Users given to members being spawned, which a sweep leaves alone and no second spawn takes,
/// each with whether it has spoken MCP to fleetd yet.
static IN_FLIGHT: std::sync::Mutex<Vec<(u32, bool)>> = std::sync::Mutex::new(Vec::new());

/// Held while a user is looked at and taken, or swept: a sweep never ends the processes of a
/// member being started, and two spawns never take one user.
static TAKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A spawn's hold on its user until its member is registered (or the spawn fails).
#[derive(Debug)]
pub struct Claim(u32);

fn claim(uid: u32) -> Option<Claim> {
    let mut held = crate::sync::lock(&IN_FLIGHT);
    if held.iter().any(|(u, _)| *u == uid) {
        return None;
    }
    held.push((uid, false));
    Some(Claim(uid))
}

impl Claim {
    /// Whether the member's agent spoke MCP before it was registered (it may not again).
    pub fn seen(&self) -> bool {
        crate::sync::lock(&IN_FLIGHT)
            .iter()
            .any(|(u, seen)| *u == self.0 && *seen)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut held = crate::sync::lock(&IN_FLIGHT);
        if let Some(i) = held.iter().position(|(u, _)| *u == self.0) {
            held.swap_remove(i);
        }
    }
}

/// Whether `uid` is the user of a member being spawned.
pub fn being_spawned(uid: u32) -> bool {
    crate::sync::lock(&IN_FLIGHT).iter().any(|(u, _)| *u == uid)
}

/// A process of `uid`, the user of a member being spawned, spoke MCP.
pub fn seen(uid: u32) {
    for (u, seen) in crate::sync::lock(&IN_FLIGHT).iter_mut() {
        if *u == uid {
            *seen = true;
        }
    }
}

/// Takes `user` for a member of `profile`: refused while another member (or spawn) has it;
/// then whatever still runs as it is ended, so the member starts alone. Hold the claim until
/// the member is registered.
pub async fn take(
    engine: &crate::engine::EngineHandle,
    profile: &str,
    user: &User,
) -> Result<Claim, String> {
    let _taking = TAKING.lock().await;
    let busy = |other: Option<&Target>| {
        format!(
            "profiles.{profile}.runAs: user {} already runs {}; one member at a time per user (every process of a user is that member to fleetd): give this profile a user of its own, or stop that member",
            user.name,
            other.map_or_else(
                || "a member being spawned".to_owned(),
                |t| format!("member {t}")
            )
        )
    };
    let Some(held) = claim(user.uid) else {
        return Err(busy(None));
    };
    match engine.member_of_user(user.uid).await {
        Ok(Some((other, _))) => return Err(busy(Some(&other))),
        Ok(None) => {}
        Err(_) => return Err("fleetd is shutting down".to_owned()),
    }
    end_processes(user).await?;
    Ok(held)
}

/// The command that ends every process of `user`: `kill -KILL -1` as that user.
pub fn ending(user: &User, as_root: bool) -> Vec<String> {
    let kill = ["kill", "-KILL", "--", "-1"].map(str::to_owned);
    switched(user, "/usr/bin:/bin", &kill, as_root)
}

/// Ends every process of `user`: leftovers of its last member.
async fn end_processes(user: &User) -> Result<(), String> {
    let argv = ending(user, crate::locate::own_uid() == 0);
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let out = run(&argv[0], &args).await?;
    let said = String::from_utf8_lossy(&out.stderr);
    // `kill -1` fails when there was nothing to end: that is a clean slate too.
    if out.status.success() || said.trim().is_empty() || said.contains("No such process") {
        Ok(())
    } else {
        Err(format!(
            "ending what still runs as user {} before its member starts: {}",
            user.name,
            said.trim()
        ))
    }
}

/// Ends the processes of each user in `configured` (the profiles' `runAs`) that no member has
/// and no spawn is taking: the leftovers of members released, or of a daemon killed.
pub async fn sweep(engine: &crate::engine::EngineHandle, configured: Vec<String>) {
    let _taking = TAKING.lock().await;
    // Claims first: one dropped after this was registered, so the engine lists its member.
    let held: Vec<u32> = crate::sync::lock(&IN_FLIGHT)
        .iter()
        .map(|(u, _)| *u)
        .collect();
    for name in configured {
        let Ok(Some(user)) = lookup(&name).await else {
            continue;
        };
        if held.contains(&user.uid) || user.uid == 0 || user.uid == crate::locate::own_uid() {
            continue;
        }
        if !matches!(engine.member_of_user(user.uid).await, Ok(None)) {
            continue;
        }
        if let Err(e) = end_processes(&user).await {
            tracing::debug!(user = %user.name, error = %e, "cannot end a released member's processes");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent() -> User {
        User {
            name: "fleet-agent".into(),
            uid: 1001,
            gid: 1002,
            home: "/home/fleet-agent".into(),
        }
    }

    #[test]
    fn a_passwd_line_reads_as_a_user() {
        assert_eq!(
            parse_passwd("fleet-agent:x:1001:1002:Fleet agent,,,:/home/fleet-agent:/bin/sh\n"),
            Some(agent())
        );
        assert_eq!(parse_passwd("broken:x:uid"), None);
        assert_eq!(parse_passwd("a:x:notanumber:1:g:/h:/s"), None);
    }

    #[test]
    fn root_becomes_the_user_with_setpriv_and_others_with_sudo() {
        let command = vec!["claude".to_owned(), "--x".to_owned()];
        let root = switched(&agent(), "/usr/bin", &command, true);
        assert_eq!(
            root[..6],
            [
                "setpriv",
                "--reuid=1001",
                "--regid=1002",
                "--init-groups",
                "--no-new-privs",
                "--"
            ]
        );
        assert!(root.ends_with(&["PATH=/usr/bin".into(), "claude".into(), "--x".into()]));
        assert!(root.windows(2).any(|w| w == ["-u", "XDG_RUNTIME_DIR"]));
        let user = switched(&agent(), "/usr/bin", &command, false);
        assert_eq!(user[..6], ["sudo", "-n", "-u", "fleet-agent", "-E", "--"]);
        assert_eq!(user[6], "env");
    }

    #[test]
    fn a_user_is_held_by_one_spawn_at_a_time() {
        let first = claim(4_000_123).expect("free");
        assert!(claim(4_000_123).is_none(), "held by the first spawn");
        drop(first);
        assert!(claim(4_000_123).is_some(), "free again");
    }

    #[test]
    fn the_member_is_told_its_own_home_and_name() {
        let mut env = BTreeMap::new();
        environment(&agent(), &mut env);
        assert_eq!(env["HOME"], "/home/fleet-agent");
        assert_eq!(env["USER"], "fleet-agent");
        assert_eq!(env["LOGNAME"], "fleet-agent");
        let mut env = BTreeMap::from([("HOME".to_owned(), "/srv/agent-home".to_owned())]);
        environment(&agent(), &mut env);
        assert_eq!(env["HOME"], "/srv/agent-home", "the profile's own");
    }
}

//! Integration tests: config hot reload of the built binary on the real file system — a valid
//! change (saved the way editors save: temp file, then rename) reaches `fleet_profiles` with its
//! secrets resolved from the new file; invalid YAML and boot-only changes keep the running
//! config whole and say why in the log; SIGHUP reloads even with `configReload: false`; and a
//! profile added by a reload spawns a member.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetd_testkit::daemon::{Daemon, isolated_config, write_config};
use fleetd_testkit::rig::{Rig, sim_profile, structured_ok};
use fleetd_testkit::{http, wait_until};
use serde_json::{Value, json};

/// Generous: a 2-core machine running other daemons' tests, a 300 ms debounce, and inotify.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

fn config_path(home: &Path) -> PathBuf {
    home.join("config/fleetd/fleetd.yaml")
}

/// Saves `text` as editors do: a temp file in the same directory renamed over the config, so
/// the config's inode is replaced rather than written.
fn save_atomically(home: &Path, text: &str) {
    let path = config_path(home);
    let tmp = path.with_file_name(".fleetd.yaml.swp");
    std::fs::write(&tmp, text).expect("write temp file");
    std::fs::rename(&tmp, &path).expect("rename over the config");
}

/// Saves the isolated config plus `extra` atomically, as [`start`] wrote it first.
fn save_config(home: &Path, extra: &str) {
    save_atomically(home, &format!("{}{extra}", isolated_config(home)));
}

/// The profile names `fleet_profiles` lists, called over MCP from the test process (no pane: a
/// read-only caller, which `fleet_profiles` allows).
fn profiles(daemon: &Daemon) -> Vec<Value> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": { "name": "fleet_profiles", "arguments": {} } });
    let resp =
        http::request(daemon.addr, "POST", "/mcp", Some(&body.to_string())).expect("mcp answers");
    let v: Value =
        serde_json::from_str(&resp.body).unwrap_or_else(|e| panic!("{e}: {}", resp.body));
    structured_ok(&v["result"])["profiles"]
        .as_array()
        .expect("a list of profiles")
        .clone()
}

fn profile_names(daemon: &Daemon) -> Vec<String> {
    profiles(daemon)
        .iter()
        .map(|p| p["name"].as_str().expect("a name").to_owned())
        .collect()
}

/// A daemon on the isolated config plus `extra`.
fn start(home: &Path, extra: &str) -> Daemon {
    write_config(home, &format!("{}{extra}", isolated_config(home)));
    Daemon::start(home, &[])
}

const CODER: &str = "profiles:\n  coder: {agent: claude}\n";

#[test]
fn reload_applies_an_atomically_saved_change_with_secrets_from_the_new_file() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut daemon = start(home.path(), &format!("configReload: true\n{CODER}"));
    assert_eq!(profile_names(&daemon), ["coder"]);
    let token = home.path().join("reviewer-token");
    std::fs::write(&token, "tok-5f2a9c").expect("write token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    save_config(
        home.path(),
        &format!(
            "configReload: true\n{CODER}  reviewer: {{agent: pi, backend: lab}}\nbackends:\n  lab: {{baseUrl: 'http://127.0.0.1:9', authTokenSecret: lab-token}}\nsecrets:\n  lab-token: {{file: {}}}\n",
            token.display()
        ),
    );
    wait_until("the reviewer profile to be listed", RELOAD_TIMEOUT, || {
        profile_names(&daemon).contains(&"reviewer".to_owned())
    });
    let reviewer = profiles(&daemon)
        .into_iter()
        .find(|p| p["name"] == "reviewer")
        .expect("listed");
    assert_eq!(reviewer["ready"], true, "its secret resolves: {reviewer}");
    assert_eq!(reviewer["backend"], "lab");
    let line = daemon.wait_for_log("the reload's log line", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reloaded")
    });
    assert!(line.contains("profiles (+reviewer)"), "{line}");
    assert!(line.contains("backends (+lab)"), "{line}");
    assert!(line.contains("secrets (+lab-token)"), "{line}");
    assert!(line.contains("file change"), "{line}");
    assert!(
        daemon.seen_logs().iter().all(|l| !l.contains("tok-5f2a9c")),
        "no secret value is logged"
    );
    // The watch survives the rename: a second save is seen too, and removal takes effect.
    save_config(home.path(), "configReload: true\n");
    wait_until("every profile to be gone", RELOAD_TIMEOUT, || {
        profile_names(&daemon).is_empty()
    });
}

#[test]
fn reload_keeps_the_old_config_when_the_yaml_is_invalid() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut daemon = start(home.path(), &format!("configReload: true\n{CODER}"));
    let base = isolated_config(home.path());
    // Written in place (not renamed): the watcher sees plain writes too.
    std::fs::write(
        config_path(home.path()),
        format!("{base}configReload: true\nprofiles: [\n"),
    )
    .expect("write broken config");
    let line = daemon.wait_for_log("the refusal of broken YAML", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reload failed")
    });
    assert!(line.contains("fleetd.yaml"), "names the file: {line}");
    assert!(line.contains("line"), "names the position: {line}");
    assert_eq!(profile_names(&daemon), ["coder"], "the old config runs on");
    // A valid value in a wrong place is refused the same way, naming the key.
    save_config(
        home.path(),
        "configReload: true\nprofiles:\n  coder: {agent: nonsense}\n",
    );
    let line = daemon.wait_for_log("the refusal of an invalid agent", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reload failed") && l.contains("profiles.coder")
    });
    assert!(line.contains("fleetd.yaml"), "{line}");
    assert_eq!(profile_names(&daemon), ["coder"]);
    // Fixing the file applies it: a failed reload does not stop the watcher.
    save_config(
        home.path(),
        "configReload: true\nprofiles:\n  fixed: {agent: pi}\n",
    );
    wait_until("the fixed file to apply", RELOAD_TIMEOUT, || {
        profile_names(&daemon) == ["fixed"]
    });
}

#[test]
fn reload_refuses_a_boot_only_change_and_applies_nothing_of_it() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut daemon = start(home.path(), &format!("configReload: true\n{CODER}"));
    // The same save moves the tmux socket (boot-only) and adds a profile.
    let other_socket = home.path().join("other-tmux.sock");
    save_atomically(
        home.path(),
        &format!(
            "multiplexer: tmux\ntmuxSocket: {}\nconfigReload: true\n{CODER}  reviewer: {{agent: pi}}\n",
            other_socket.display()
        ),
    );
    let line = daemon.wait_for_log("the boot-only refusal", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reload refused")
    });
    assert!(line.contains("`tmuxSocket`"), "names the key: {line}");
    assert!(
        !line.contains("reviewer"),
        "names only the refused key: {line}"
    );
    assert_eq!(profile_names(&daemon), ["coder"], "nothing of it applied");
    // `/healthz` still reports the socket the daemon started with.
    let health = http::get(daemon.addr, "/healthz").expect("healthz").json();
    let socket = health["lead"]["socket"].as_str().unwrap_or_default();
    assert!(socket.ends_with("no-tmux.sock"), "{health}");
}

#[test]
fn reload_on_sighup_even_with_config_reload_false() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut daemon = start(home.path(), &format!("configReload: false\n{CODER}"));
    // No watcher at all while configReload is false: nothing is woken by the directory.
    assert_eq!(daemon.inotify_instances(), 0, "no config watcher");
    save_config(
        home.path(),
        &format!("configReload: false\n{CODER}  reviewer: {{agent: pi}}\n"),
    );
    assert_eq!(
        profile_names(&daemon),
        ["coder"],
        "not applied without SIGHUP"
    );
    daemon.signal("HUP");
    wait_until("the reviewer profile after SIGHUP", RELOAD_TIMEOUT, || {
        profile_names(&daemon).contains(&"reviewer".to_owned())
    });
    let line = daemon.wait_for_log("the reload's log line", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reloaded")
    });
    assert!(line.contains("SIGHUP"), "{line}");
    assert!(line.contains("profiles (+reviewer)"), "{line}");
    // A SIGHUP with nothing changed is harmless and says so; the daemon keeps serving.
    daemon.signal("HUP");
    daemon.wait_for_log("the no-change line", RELOAD_TIMEOUT, |l| {
        l.contains("nothing changed") && l.contains("SIGHUP")
    });
    assert!(
        daemon.child.try_wait().expect("try_wait").is_none(),
        "still running"
    );
}

#[test]
fn the_watcher_follows_config_reload_and_ignores_the_directorys_other_files() {
    // Issue 15: with the log at trace and a log file in the config directory, each log write was
    // a watcher event the watcher logged at trace: a loop writing tens of MB a second while
    // idle. The watcher now runs only while configReload is true, and its own crates stay at
    // info whatever the level.
    let home = tempfile::tempdir().expect("tempdir");
    let log = "log: {level: trace}\n";
    let mut daemon = start(home.path(), &format!("configReload: false\n{log}{CODER}"));
    assert_eq!(
        daemon.inotify_instances(),
        0,
        "off while configReload is false"
    );
    save_config(home.path(), &format!("configReload: true\n{log}{CODER}"));
    daemon.signal("HUP");
    daemon.wait_for_log("the SIGHUP reload", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reloaded") && l.contains("configReload")
    });
    wait_until("the watcher to start", RELOAD_TIMEOUT, || {
        daemon.inotify_instances() == 1
    });
    // A busy neighbour of the config file: a log file in the same directory.
    let neighbour = config_path(home.path()).with_file_name("fleetd.log");
    for n in 0..200 {
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&neighbour)
            .expect("open the neighbour");
        writeln!(f, "line {n}").expect("write the neighbour");
    }
    // Then a real edit: once it is applied, the watcher has handled the neighbour's events.
    save_config(
        home.path(),
        &format!("configReload: true\n{log}{CODER}  reviewer: {{agent: pi}}\n"),
    );
    let line = daemon.wait_for_log("the watcher's reload", RELOAD_TIMEOUT, |l| {
        l.contains("configuration reloaded") && l.contains("profiles (+reviewer)")
    });
    assert!(line.contains("file"), "{line}");
    let noisy: Vec<&String> = daemon
        .seen_logs()
        .iter()
        .filter(|l| l.contains("\"target\":\"notify") || l.contains("raw event"))
        .collect();
    assert!(noisy.is_empty(), "the watcher's own trace lines: {noisy:?}");
    let reloads = daemon
        .seen_logs()
        .iter()
        .filter(|l| l.contains("file changed") || l.contains("nothing changed"))
        .count();
    assert!(
        reloads <= 1,
        "the neighbour's writes asked for reloads: {reloads}"
    );
    // And off again.
    save_config(
        home.path(),
        &format!("configReload: false\n{log}{CODER}  reviewer: {{agent: pi}}\n"),
    );
    daemon.wait_for_log("the reload that turns it off", RELOAD_TIMEOUT, |l| {
        l.contains("no longer watched")
    });
    assert_eq!(daemon.inotify_instances(), 0, "off again");
}

#[test]
fn e2e_reload_a_profile_added_by_reload_spawns_a_member() {
    let Some(rig) = Rig::start_if_tmux("configReload: true\n") else {
        return;
    };
    let path = config_path(rig.dir());
    let before = std::fs::read_to_string(&path).expect("read the rig's config");
    save_atomically(
        rig.dir(),
        &format!("{before}profiles:\n{}", sim_profile("late", &[])),
    );
    wait_until("the late profile to be listed", RELOAD_TIMEOUT, || {
        profile_names(&rig.daemon).contains(&"late".to_owned())
    });
    let spawned = rig.spawn("late", "ivy");
    assert_eq!(spawned["profile"], "late", "{spawned}");
}

//! Tidy: repository rules checked as a test — every `.rs` file opens with a `//!` line, no test
//! is skipped with the ignore attribute, the core crate depends on no async runtime or I/O crate
//! (read from `cargo metadata`), no file is far over the house size, only the named modules read
//! the process environment, only the inbox facade takes mail out of the store, and the daemon's
//! platform-specific code stays behind its platform seams.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable dir").flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn all_rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&repo_root().join("crates"), &mut files);
    assert!(files.len() > 10, "found too few .rs files: {files:?}");
    files
}

/// Every Rust file of the daemon (`crates/fleetd/src`): its path below that directory, and its
/// text.
fn daemon_sources() -> Vec<(String, String)> {
    let src = repo_root().join("crates/fleetd/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|file| {
            let rel = file
                .strip_prefix(&src)
                .expect("under src")
                .to_string_lossy()
                .into_owned();
            (rel, std::fs::read_to_string(file).expect("readable source"))
        })
        .collect()
}

#[test]
fn every_rust_file_starts_with_a_module_doc() {
    let bad: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|f| {
            !std::fs::read_to_string(f)
                .unwrap_or_default()
                .starts_with("//!")
        })
        .collect();
    assert!(bad.is_empty(), "files without a leading //! line: {bad:#?}");
}

#[test]
fn no_test_is_ignored() {
    let needle = format!("#[{}", "ignore");
    let bad: Vec<_> = all_rust_files()
        .into_iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .contains(&needle)
        })
        .collect();
    assert!(bad.is_empty(), "ignored tests are not allowed: {bad:#?}");
}

/// The daemon's platform seams, relative to the repository root: the only places that may use a
/// Linux-only API or a `target_os` cfg. Each fails to compile on other targets with a message
/// naming what a port must supply (ARCHITECTURE.md, "Platforms").
const PLATFORM_SEAMS: &[&str] = &[
    "crates/fleetd/src/locate/platform/",
    "crates/fleetd/src/ops/readiness.rs",
    "crates/fleetd/src/sandbox/",
];

/// Code (not comments) that works on Linux alone, or picks a platform: `/proc` paths, the
/// `procfs` crate, netlink sockets, `std::os::linux`, and `target_os` cfgs. Found anywhere else
/// in the daemon, it would make a port fail somewhere no `compile_error!` names.
const PLATFORM_SPECIFIC: &[&str] = &[
    "std::os::linux",
    "\"/proc",
    "procfs::",
    "netlink",
    "target_os",
];

/// The lines of `text` that name a [`PLATFORM_SPECIFIC`] pattern outside a comment line, as
/// `line number: text`.
fn platform_specific_lines(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .filter(|(_, line)| PLATFORM_SPECIFIC.iter().any(|p| line.contains(p)))
        .map(|(n, line)| format!("{}: {}", n + 1, line.trim()))
        .collect()
}

#[test]
fn platform_specific_code_stays_behind_its_seams() {
    let mut bad = Vec::new();
    let mut seams_seen = std::collections::BTreeSet::new();
    for (rel, text) in daemon_sources() {
        let rel = format!("crates/fleetd/src/{rel}");
        if let Some(seam) = PLATFORM_SEAMS.iter().find(|seam| rel.starts_with(**seam)) {
            seams_seen.insert(*seam);
            continue;
        }
        bad.extend(
            platform_specific_lines(&text)
                .into_iter()
                .map(|line| format!("{rel}:{line}")),
        );
    }
    // A seam moved without this list would leave an entry that exempts nothing: say so.
    assert_eq!(
        seams_seen.len(),
        PLATFORM_SEAMS.len(),
        "every listed seam exists; found {seams_seen:?}"
    );
    assert!(
        bad.is_empty(),
        "platform-specific code outside the platform seams {PLATFORM_SEAMS:?} (move it behind \
         one, or give it a seam of its own with a compile_error! naming what other targets \
         lack):\n{}",
        bad.join("\n")
    );
    // The scan itself: a seam's own code is what it would flag.
    let seam = std::fs::read_to_string(repo_root().join("crates/fleetd/src/ops/readiness.rs"))
        .expect("readiness");
    assert!(
        !platform_specific_lines(&seam).is_empty(),
        "the patterns still match the code they exist to find"
    );
}

/// Crates whose presence in the core's dependency tree would mean it can do I/O or run async.
const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio",
    "mio",
    "async-std",
    "futures-io",
    "socket2",
    "rusqlite",
    "lapin",
    "procfs",
    "axum",
    "hyper",
    "rmcp",
    "reqwest",
    "libsqlite3-sys",
    "nix",
    "notify",
];

/// `cargo metadata` for the host platform: the resolved graph (with the features the workspace
/// turns on) and its packages.
fn metadata() -> serde_json::Value {
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host");
    let out = fleetd_testkit::run_ok(
        Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                "--locked",
                "--filter-platform",
                &host,
            ])
            .current_dir(repo_root()),
        "cargo metadata",
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

#[test]
fn core_crate_has_no_runtime_or_io_dependency() {
    let meta = metadata();
    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve graph");
    let packages = meta["packages"].as_array().expect("packages");
    let name_of = |id: &str| {
        packages
            .iter()
            .find(|p| p["id"] == id)
            .and_then(|p| p["name"].as_str())
            .unwrap_or("?")
            .to_owned()
    };
    let core = packages
        .iter()
        .find(|p| p["name"] == "fleetd-core")
        .and_then(|p| p["id"].as_str())
        .expect("fleetd-core is a workspace member");
    // Walk normal (non-dev, non-build) dependencies from the core.
    let mut stack = vec![core.to_owned()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let node = nodes
            .iter()
            .find(|n| n["id"] == id.as_str())
            .expect("node in graph");
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].is_null());
            if normal && let Some(pkg) = dep["pkg"].as_str() {
                stack.push(pkg.to_owned());
            }
        }
    }
    let names: Vec<String> = seen.iter().map(|id| name_of(id)).collect();
    let bad: Vec<&String> = names
        .iter()
        .filter(|n| FORBIDDEN_IN_CORE.contains(&n.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "fleetd-core depends on I/O or runtime crates: {bad:?} (all: {names:?})"
    );
    assert!(
        names.iter().any(|n| n == "uuid"),
        "walk found the core's real dependencies: {names:?}"
    );
}

/// C TLS stacks, kept out of every build of the workspace (DEPENDENCIES.md): the gateway's TLS is
/// rustls with the ring provider. lapin's default `rustls` feature, or any crate's default TLS,
/// would bring aws-lc (a C build of minutes) or OpenSSL.
const FORBIDDEN_ANYWHERE: &[&str] = &[
    "aws-lc-rs",
    "aws-lc-sys",
    "openssl",
    "openssl-sys",
    "native-tls",
];

#[test]
fn no_c_tls_stack_enters_the_build() {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let names: Vec<&str> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve graph")
        .iter()
        .filter_map(|n| {
            packages
                .iter()
                .find(|p| p["id"] == n["id"])
                .and_then(|p| p["name"].as_str())
        })
        .collect();
    let bad: Vec<&&str> = names
        .iter()
        .filter(|n| FORBIDDEN_ANYWHERE.contains(n))
        .collect();
    assert!(bad.is_empty(), "a C TLS stack is in the build: {bad:?}");
    for needed in ["rustls", "ring"] {
        assert!(
            names.contains(&needed),
            "the walk saw the real graph (lapin's TLS on rustls and ring): {needed} missing"
        );
    }
}

/// The house size for code (STYLE.md: "files around 500 lines"), with the margin a file may
/// run over it before it has to be split. Counted whole — comments, blanks and any inline test
/// module too: what a reader scrolls through.
const MAX_CODE_LINES: usize = 600;

/// The same for test files, whose cases read as transcripts and may run longer.
const MAX_TEST_LINES: usize = 800;

/// Test code: integration tests, `tests.rs` / `tests_*.rs` modules and the directories they
/// became.
fn is_test_file(path: &Path) -> bool {
    path.components().any(|c| {
        let c = c.as_os_str().to_str().unwrap_or("");
        c == "tests" || c == "tests.rs" || c.starts_with("tests_")
    })
}

#[test]
fn no_file_is_far_over_the_house_size() {
    let mut big: Vec<(usize, usize, PathBuf)> = all_rust_files()
        .into_iter()
        .map(|f| {
            let limit = if is_test_file(&f) {
                MAX_TEST_LINES
            } else {
                MAX_CODE_LINES
            };
            let lines = std::fs::read_to_string(&f)
                .unwrap_or_default()
                .lines()
                .count();
            (lines, limit, f)
        })
        .filter(|(lines, limit, _)| lines > limit)
        .collect();
    big.sort();
    assert!(
        big.is_empty(),
        "files over the house size — {MAX_CODE_LINES} lines of code, {MAX_TEST_LINES} of tests, \
         whole files (split them by concern): {big:#?}"
    );
    // The classes themselves.
    for (path, test) in [
        ("crates/fleetd/src/engine/mod.rs", false),
        ("crates/fleetd/src/engine/tests/push.rs", true),
        ("crates/fleetd/src/engine/tests_durable/faults.rs", true),
        ("crates/fleetd/src/config/tests.rs", true),
        ("crates/fleetd-testkit/tests/it/gateway/mod.rs", true),
    ] {
        assert_eq!(is_test_file(Path::new(path)), test, "{path}");
    }
}

/// The daemon's sources that may read the process environment, and what each reads (the
/// ARCHITECTURE.md invariant under "Configuration defaults").
const ENV_READERS: &[(&str, &str)] = &[
    ("config/mod.rs", "config::Environment, read once in main"),
    ("ops/logging.rs", "FLEETD_LOG, when the subscriber is built"),
    ("main.rs", "NOTIFY_SOCKET, at start"),
    ("ops/readiness.rs", "NOTIFY_SOCKET, at start"),
    ("secrets.rs", "secret values, when a secret is resolved"),
    (
        "mux/tmux/launch.rs",
        "the allowlist tmux runs with, when the backend is built",
    ),
    (
        "sandbox/mod.rs",
        "PATH and HOME a member's pane inherits, at a sandboxed spawn",
    ),
];

#[test]
fn only_the_named_modules_read_the_environment() {
    let needles = ["env::var(", "env::var_os(", "env::vars("];
    let mut bad = Vec::new();
    let mut seen = 0;
    for (rel, text) in daemon_sources() {
        let reads = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .count();
        seen += reads;
        if reads > 0 && !ENV_READERS.iter().any(|(path, _)| *path == rel) {
            bad.push(rel);
        }
    }
    assert!(
        bad.is_empty(),
        "these read the process environment; take the value from config::Environment (or \
         secrets::process_env for a secret), or add the file to ENV_READERS and ARCHITECTURE.md: {bad:?}"
    );
    assert!(seen >= 4, "the scan found the known readers ({seen})");
}

#[test]
fn only_the_inbox_facade_takes_mail_out_of_the_store() {
    // Review L2: "after a store mutation, tell the engine" was a convention repeated in four
    // places; `inbox::Inbox` does both, so nothing else may ack or drain the store directly.
    let needles = [
        "store.ack(",
        "store().ack(",
        "store.drain(",
        "store().drain(",
    ];
    let bad: Vec<String> = daemon_sources()
        .into_iter()
        .filter(|(rel, _)| !is_test_file(Path::new(rel)))
        // The engine's own I/O may: it reports the inbox's depth back to the engine as it does
        // (a reply on its way to the gateway that owns its ticket leaves this host's inbox).
        .filter(|(rel, _)| {
            rel != "inbox.rs" && rel != "engine/effects.rs" && !rel.starts_with("store/")
        })
        .filter(|(_, text)| {
            // Whitespace removed: a call chain split over lines still reads `store.ack(`.
            let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            needles.iter().any(|n| text.contains(n))
        })
        .map(|(rel, _)| rel)
        .collect();
    assert!(
        bad.is_empty(),
        "these take mail out of the store without telling the engine; use inbox::Inbox: {bad:?}"
    );
}

/// Programs the daemon names to run, and the one module that runs each (ARCHITECTURE.md: each
/// external technology is known by exactly one module). tmux is run by its configured path,
/// from `mux::tmux` only.
const PROGRAM_RUNNERS: &[(&str, &[&str])] = &[("git", &["worktree.rs", "worktree/tests.rs"])];

#[test]
fn only_the_worktree_module_runs_git() {
    let mut bad = Vec::new();
    let mut seen = 0;
    for (rel, text) in daemon_sources() {
        for (program, owners) in PROGRAM_RUNNERS {
            let needle = format!("Command::new(\"{program}\")");
            if text.contains(&needle) {
                seen += 1;
                if !owners.contains(&rel.as_str()) {
                    bad.push(format!("{rel} runs {program}"));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "only their modules run these programs: {bad:?}"
    );
    assert!(seen >= 1, "the scan found the known runners ({seen})");
}

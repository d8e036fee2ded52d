//! Cleanup when the demo is interrupted (Ctrl-C, SIGTERM, SIGHUP): a registry of what the demo
//! started — the private tmux server's socket, fleetd's pid, the temp dirs — and a thread that,
//! on a signal, kills the tmux server and fleetd, removes the dirs and exits 130. On a normal
//! finish or a failure the owners' `Drop`s clean up instead; this covers the case where the
//! demo is stopped mid-step and no destructor would run.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

/// What to remove if a signal arrives.
#[derive(Debug, Default)]
struct Started {
    tmux_socket: Option<PathBuf>,
    daemon_pid: Option<u32>,
    dirs: Vec<PathBuf>,
    /// A signal came before anything was registered: the next registration cleans up and exits.
    interrupted: bool,
}

static STARTED: Mutex<Started> = Mutex::new(Started {
    tmux_socket: None,
    daemon_pid: None,
    dirs: Vec::new(),
    interrupted: false,
});

/// Exit status after an interruption (128 + SIGINT, as shells report it).
const INTERRUPTED: i32 = 130;

/// Installs the signal handlers (before anything is started, so no signal finds the default
/// action) and the thread that cleans up when one arrives.
pub(crate) fn install() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the signal runtime")?;
    let (mut int, mut term, mut hup) = {
        let _entered = runtime.enter();
        (
            signal(SignalKind::interrupt()).context("failed to handle SIGINT")?,
            signal(SignalKind::terminate()).context("failed to handle SIGTERM")?,
            signal(SignalKind::hangup()).context("failed to handle SIGHUP")?,
        )
    };
    std::thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
        });
        eprintln!("\nfleetd demo: interrupted; cleaning up");
        let mut started = lock();
        if started.tmux_socket.is_none() && started.daemon_pid.is_none() {
            // Still starting up: whoever registers next cleans up.
            started.interrupted = true;
            return;
        }
        clean(&started);
        std::process::exit(INTERRUPTED);
    });
    Ok(())
}

fn lock() -> std::sync::MutexGuard<'static, Started> {
    STARTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Registers the tmux server, fleetd and the temp dirs (replacing earlier registrations). If a
/// signal already came, cleans up and exits.
pub(crate) fn register(tmux_socket: PathBuf, daemon_pid: u32, dirs: Vec<PathBuf>) {
    let mut started = lock();
    started.tmux_socket = Some(tmux_socket);
    started.daemon_pid = Some(daemon_pid);
    started.dirs = dirs;
    if started.interrupted {
        clean(&started);
        std::process::exit(INTERRUPTED);
    }
}

/// Records the pid of a restarted fleetd.
pub(crate) fn daemon_restarted(pid: u32) {
    lock().daemon_pid = Some(pid);
}

fn clean(started: &Started) {
    if let Some(socket) = &started.tmux_socket {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(socket)
            .arg("kill-server")
            .output();
    }
    if let Some(pid) = started.daemon_pid {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .output();
    }
    for dir in &started.dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

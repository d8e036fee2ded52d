//! One fake-herdr pane at run time: a real process in a real PTY (session leader, like a herdr
//! pane shell), a vt100 screen fed from the PTY, and herdr-style agent detection. Must not know
//! the socket protocol; `api` turns this state into herdr's JSON.
//!
//! Agent detection is herdr's (see `detect`):
//! 1. Identification from the PTY's foreground process group (`/proc`), herdr's rules.
//! 2. State from the screen and title by the agent's manifest rules. Headless herdr reports a
//!    finished turn that nobody has seen as `done`, so a working → idle transition reads `done`.
//! 3. No agent ⇒ `unknown`.

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// Agent kinds herdr recognises by argv0 or `HERDR_AGENT`.
pub(crate) use fleetd::mux::herdr::KNOWN_AGENT_KINDS as KNOWN_AGENTS;

/// Screen size of every fake pane: headless herdr's default (v0.8.2 src/config.rs:56-57);
/// `--rows` changes the rows (a tall client attached to herdr makes tall panes).
pub(crate) const ROWS: u16 = 40;
const COLS: u16 = 120;
/// Lines of history kept for `pane.read source=recent`.
const HISTORY_LINES: usize = 5000;
/// How often the detector looks at a pane.
const DETECT_TICK: Duration = Duration::from_millis(120);
/// How often identification re-reads `/proc` when the screen has not changed.
const IDENTIFY_EVERY: u32 = 8;

/// What a pane runs; kept so a restart can start it again.
#[derive(Debug, Clone)]
pub(crate) struct PaneSpec {
    /// The argv; `None` runs the shell.
    pub(crate) command: Option<Vec<String>>,
    /// Caller-supplied env (herdr's own values are applied over it).
    pub(crate) env: BTreeMap<String, String>,
    /// Working directory.
    pub(crate) cwd: Option<PathBuf>,
    /// Pane label.
    pub(crate) label: Option<String>,
}

/// Identity facts handed to a pane process.
#[derive(Debug, Clone)]
pub(crate) struct PaneIdentity {
    pub(crate) pane_id: String,
    pub(crate) tab_id: String,
    pub(crate) workspace_id: String,
    pub(crate) terminal_id: String,
    pub(crate) socket: PathBuf,
}

/// Detection output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detected {
    pub(crate) agent: Option<String>,
    pub(crate) status: &'static str,
    pub(crate) state_change_seq: u64,
}

struct ScreenState {
    parser: vt100::Parser<Recorder>,
    revision: u64,
}

#[derive(Default)]
struct Recorder {
    title: Option<String>,
    history: VecDeque<String>,
}

impl vt100::Callbacks for Recorder {
    fn set_window_title(&mut self, _: &mut vt100::Screen, title: &[u8]) {
        self.title = Some(String::from_utf8_lossy(title).into_owned());
    }

    fn on_scroll(&mut self, contents: vt100::capture::RowContents<'_>, _alternate: bool) {
        let mut formatted = String::new();
        let mut state = vt100::capture::BasicFormattedCaptureState::new();
        if contents
            .write_formatted_basic(&mut formatted, &mut state)
            .is_ok()
        {
            let plain: String = vt100::capture::basic_formatted_to_plain(&formatted).collect();
            if self.history.len() == HISTORY_LINES {
                self.history.pop_front();
            }
            self.history.push_back(plain.trim_end().to_owned());
        }
    }
}

/// A running pane.
pub(crate) struct PaneRt {
    pub(crate) identity: PaneIdentity,
    pub(crate) spec: PaneSpec,
    pub(crate) shell_pid: u32,
    /// Rows and columns of its screen.
    size: (u16, u16),
    writer: tokio::sync::Mutex<pty_process::OwnedWritePty>,
    screen: Mutex<ScreenState>,
    detected: Mutex<Detected>,
    exited: AtomicBool,
    /// Wakes the pane's waiter task to kill the process.
    kill: Notify,
    /// Signalled whenever `detected` changes.
    pub(crate) changed: Notify,
    worked_since_rest: AtomicBool,
    seq: AtomicU64,
}

impl std::fmt::Debug for PaneRt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaneRt")
            .field("pane", &self.identity.pane_id)
            .field("shell_pid", &self.shell_pid)
            .finish()
    }
}

/// Callbacks from a pane into the server.
pub(crate) trait PaneHost: Send + Sync + 'static {
    /// The detected agent or status changed.
    fn status_changed(&self, pane: &Arc<PaneRt>);
    /// The pane's process exited (not via an explicit kill).
    fn exited(&self, pane: &Arc<PaneRt>);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PaneRt {
    /// Starts the pane's process in a new PTY and its reader, detector and waiter tasks.
    pub(crate) fn spawn(
        identity: PaneIdentity,
        spec: PaneSpec,
        shell: &str,
        rows: u16,
        host: Arc<dyn PaneHost>,
    ) -> anyhow::Result<Arc<PaneRt>> {
        let (pty, pts) = pty_process::open()?;
        pty.resize(pty_process::Size::new(rows, COLS))?;
        let argv = spec
            .command
            .clone()
            .unwrap_or_else(|| vec![shell.to_owned()]);
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("empty command"))?;
        let mut cmd = pty_process::Command::new(program).args(args);
        for (k, v) in &spec.env {
            cmd = cmd.env(k, v);
        }
        // herdr's own values override caller-supplied env.
        cmd = cmd
            .env("HERDR_ENV", "1")
            .env("HERDR_SOCKET_PATH", &identity.socket)
            .env("HERDR_WORKSPACE_ID", &identity.workspace_id)
            .env("HERDR_TAB_ID", &identity.tab_id)
            .env("HERDR_PANE_ID", &identity.pane_id)
            .env("TERM", "xterm-256color");
        if let Ok(exe) = std::env::current_exe() {
            cmd = cmd.env("HERDR_BIN_PATH", exe);
        }
        if let Some(cwd) = &spec.cwd {
            cmd = cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn(pts)?;
        let shell_pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("child exited before it had a pid"))?;
        let (mut reader, writer) = pty.into_split();
        let size = (rows, COLS);
        let rows = NonZeroU16::new(rows).unwrap_or(NonZeroU16::MIN);
        let cols = NonZeroU16::new(COLS).expect("COLS is non-zero");
        let pane = Arc::new(PaneRt {
            identity,
            spec,
            shell_pid,
            size,
            writer: tokio::sync::Mutex::new(writer),
            screen: Mutex::new(ScreenState {
                parser: vt100::Parser::new_with_callbacks(rows, cols, 0, Recorder::default()),
                revision: 0,
            }),
            detected: Mutex::new(Detected {
                agent: None,
                status: "unknown",
                state_change_seq: 0,
            }),
            exited: AtomicBool::new(false),
            kill: Notify::new(),
            changed: Notify::new(),
            worked_since_rest: AtomicBool::new(false),
            seq: AtomicU64::new(0),
        });

        let reading = Arc::clone(&pane);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut screen = lock(&reading.screen);
                        screen.parser.process(&buf[..n]);
                        screen.revision += 1;
                    }
                }
            }
        });

        let detecting = Arc::clone(&pane);
        let detect_host = Arc::clone(&host);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(DETECT_TICK);
            let mut seen_revision = u64::MAX;
            let mut since_identify = IDENTIFY_EVERY;
            let mut agent = None;
            while !detecting.exited.load(Ordering::Relaxed) {
                tick.tick().await;
                let revision = lock(&detecting.screen).revision;
                since_identify += 1;
                if revision != seen_revision || since_identify >= IDENTIFY_EVERY {
                    agent = super::detect::identify(detecting.shell_pid);
                    since_identify = 0;
                }
                seen_revision = revision;
                if detecting.update(agent.clone()) {
                    detect_host.status_changed(&detecting);
                }
            }
        });

        let waiting = Arc::clone(&pane);
        tokio::spawn(async move {
            let killed = tokio::select! {
                _ = child.wait() => false,
                () = waiting.kill.notified() => true,
            };
            if killed {
                kill_session(waiting.shell_pid);
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            waiting.exited.store(true, Ordering::Relaxed);
            if !killed {
                host.exited(&waiting);
            }
        });
        Ok(pane)
    }

    /// Recomputes status from the screen; true when it changed.
    fn update(&self, agent: Option<String>) -> bool {
        let status = match &agent {
            None => "unknown",
            Some(kind) => {
                let screen = lock(&self.screen);
                super::detect::classify(
                    kind,
                    screen.parser.callbacks().title.as_deref(),
                    &screen.parser.screen().contents(),
                )
            }
        };
        let status = match status {
            "working" | "blocked" => {
                self.worked_since_rest
                    .store(status == "working", Ordering::Relaxed);
                status
            }
            "idle" if self.worked_since_rest.load(Ordering::Relaxed) => "done",
            other => other,
        };
        let mut detected = lock(&self.detected);
        if detected.agent == agent && detected.status == status {
            return false;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        *detected = Detected {
            agent,
            status,
            state_change_seq: seq,
        };
        drop(detected);
        self.changed.notify_waiters();
        true
    }

    /// The current detection result.
    pub(crate) fn detected(&self) -> Detected {
        lock(&self.detected).clone()
    }

    /// The terminal title the program set.
    pub(crate) fn title(&self) -> Option<String> {
        lock(&self.screen).parser.callbacks().title.clone()
    }

    /// The screen revision (bumped on every output chunk).
    pub(crate) fn revision(&self) -> u64 {
        lock(&self.screen).revision
    }

    /// Whether the app asked for bracketed paste.
    pub(crate) fn bracketed_paste(&self) -> bool {
        lock(&self.screen).parser.screen().bracketed_paste()
    }

    /// `pane.read` text, as herdr v0.8.2 builds it. `recent`: the last `lines` rows of history
    /// plus *every* row of the screen, blank rows below the cursor included, chosen before
    /// blank rows are trimmed (src/pane/terminal.rs:2727-2739, 2693, 3284-3298) — so a tall
    /// pane with short output answers "" for a small `lines`. `visible`: the screen's rows
    /// trimmed, then the last `lines` (terminal.rs:2510-2527; src/app/api_helpers.rs:143-158).
    /// Rows are right-trimmed; non-empty text ends with a newline. `output_only` (herdr 0.9 as
    /// modelled in `version`): `recent` trims the blank rows first, then counts its `lines`.
    pub(crate) fn read(&self, recent: bool, lines: Option<usize>, output_only: bool) -> String {
        let screen = lock(&self.screen);
        let rows: Vec<String> = screen
            .parser
            .screen()
            .rows(0, self.size.1)
            .map(|l| l.trim_end().to_owned())
            .collect();
        let mut all: Vec<String> = if recent {
            let mut all: Vec<String> = screen.parser.callbacks().history.iter().cloned().collect();
            all.extend(rows);
            if output_only {
                while all.last().is_some_and(String::is_empty) {
                    all.pop();
                }
            }
            // herdr's default and cap for the recent sources (api_helpers.rs:109-141).
            let keep = lines.unwrap_or(80).min(1000).min(all.len());
            all.split_off(all.len() - keep)
        } else {
            rows
        };
        while all.last().is_some_and(String::is_empty) {
            all.pop();
        }
        if !recent && let Some(n) = lines {
            let keep = n.min(all.len());
            all = all.split_off(all.len() - keep);
        }
        if all.is_empty() {
            return String::new();
        }
        let mut text = all.join("\n");
        text.push('\n');
        text
    }

    /// Writes raw bytes to the PTY.
    pub(crate) async fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut writer = self.writer.lock().await;
        writer.write_all(bytes).await?;
        writer.flush().await
    }

    /// Whether the process has exited.
    pub(crate) fn is_exited(&self) -> bool {
        self.exited.load(Ordering::Relaxed)
    }

    /// Kills every process in the pane's session (herdr's close and stop do the same).
    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// Screen rules (see the module header).
/// SIGKILLs every process whose session id is `sid` (the pane's session).
pub(crate) fn kill_session(sid: u32) {
    let Ok(all) = procfs::process::all_processes() else {
        return;
    };
    for process in all.flatten() {
        if let Ok(stat) = process.stat()
            && u32::try_from(stat.session).ok() == Some(sid)
            && let Some(pid) = rustix::process::Pid::from_raw(stat.pid)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

//! The tmux backend: a `Multiplexer` over tmux on one server (`-L name` / `-S path`). The only
//! module that runs `tmux`. Panes come from `list-panes -a -F`, members from `new-window` (or
//! `new-session` / `split-window`) running a launcher (`launch`), text as one `paste-buffer -p -r`
//! and, once the screen shows it, a separate `Enter`, output from `capture-pane -p`.
//!
//! Commands go over one persistent control-mode client per server (`control`, `run`): `tmux -N
//! -C attach-session -f ignore-size,no-output`, commands written one per line and quoted for
//! tmux's command parser, replies matched in order. So a nudge, a screen read or a listing costs
//! no process. Without a server, or when control mode fails, each command runs as its own `tmux`
//! process as before (the `new-session` that starts a server does, with the user's umask); the
//! client is attached again on the next command after it exits (its session destroyed, the
//! server restarted), at most once a second while that fails.
//!
//! Status is derived, and weaker than herdr's: tmux knows nothing about agents. A braille spinner
//! (U+2800–U+28FF) leading the pane title, as Claude Code sets it, means `working`; a pane whose
//! foreground command is a shell has no agent (`unknown`); an approval UI in the bottom screen lines
//! means `blocked`; anything else is `idle`. There is no `done` and no state-change sequence; a
//! watched pane is read again when tmux reports its output or a window's coming or going (`watch`),
//! with a slow safety poll. Server-level failures ("no server running", a bad socket) are transient; only
//! tmux's "can't find pane/window/session" is an affirmative not-found. A `send-keys` that timed
//! out or lost its server (or control client), or an Enter that failed after the text went in, may
//! have typed: `submit` and `press_enter` report those as uncertain, never as transient.
//!
//! tmux runs with a cleared environment (a short allowlist such as `PATH` and `HOME`): a tmux
//! server started by fleetd must not inherit fleetd's secrets into every pane.
//!
//! A member's environment never passes through tmux: `-e NAME=VALUE` would put the value on the
//! tmux client's argv (readable in `/proc/*/cmdline` by every user) and, on `new-session`, into
//! the session's environment (`tmux show-environment`, and every later window). Instead the
//! values go into a 0600 file in the owner-only launch directory, and the window runs a POSIX
//! `sh` that reads the file, removes it and `exec`s the member's command with the values in its
//! environment only. Only the file's path is ever on an argv.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetd_core::{PaneId, TabId, TerminalId, WorkspaceId};
use tokio::sync::broadcast;

use crate::mux::{
    BackendKind, Multiplexer, MuxError, MuxFuture, OpenPane, PaneEvent, PaneInfo, Placement,
    ProcessInfo, ServerInfo, SplitDirection, Submitted, TabInfo,
};

use crate::mux::screen_status::SHELLS;
/// Field separator in `-F` formats (a control character no id or name contains).
pub use crate::mux::screen_status::derive_status;

mod commands;
mod control;
mod launch;
mod typing;
mod watch;

const SEP: char = '\u{1f}';
/// Pane fields, in order; the title goes last because it may contain anything.
const PANE_FORMAT: &str = "#{pane_id}\u{1f}#{pane_pid}\u{1f}#{session_name}\u{1f}#{window_index}\u{1f}#{window_name}\u{1f}#{pane_current_command}\u{1f}#{pane_title}";

/// Which tmux server to drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TmuxSocket {
    /// The user's default server.
    Default,
    /// `-L name`.
    Name(String),
    /// `-S path`.
    Path(PathBuf),
}

/// How to drive tmux.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TmuxConfig {
    /// The server.
    pub socket: TmuxSocket,
    /// Bound on one `tmux` invocation.
    pub call_timeout: Duration,
    /// How often watched panes are read while some watched session has no event client
    /// (control mode off or failing).
    pub poll_interval: Duration,
    /// How often watched panes are read anyway while event clients report their output: the
    /// safety net for a change that printed nothing (a title set alone).
    pub safety_poll_interval: Duration,
    /// Where a pane's environment waits for its launcher (an owner-only directory). A pane
    /// opened with environment and no launch directory is refused.
    pub launch_dir: Option<PathBuf>,
    /// The umask a tmux server fleetd starts is given (the user's own, not fleetd's
    /// owner-only one); `None` leaves fleetd's.
    pub server_umask: Option<u32>,
    /// The `tmux` executable (looked up on `PATH` when it is a bare name).
    pub program: PathBuf,
    /// Commands go over one persistent control-mode client (`tmux -C`) while one can attach;
    /// `false` runs every command as its own `tmux` process.
    pub control_mode: bool,
}

impl TmuxConfig {
    /// Defaults for `socket`.
    pub fn new(socket: TmuxSocket) -> Self {
        Self {
            socket,
            call_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(400),
            safety_poll_interval: Duration::from_secs(5),
            launch_dir: None,
            server_umask: None,
            program: PathBuf::from("tmux"),
            control_mode: true,
        }
    }
}

/// The tmux backend. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Tmux {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: TmuxConfig,
    /// The allowlisted part of fleetd's environment every `tmux` runs with, read once when the
    /// backend is built.
    inherited: Vec<(&'static str, std::ffi::OsString)>,
    /// Each watched pane's polling task and the poke that makes it read at once.
    watches: Mutex<watch::Watches>,
    events: broadcast::Sender<PaneEvent>,
    /// The control client commands go over.
    commands: commands::CommandSlot,
    /// Keeps fleetd's changes to tmux away from its control clients' attaches.
    gate: commands::AttachGate,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.watches
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stop();
    }
}

/// A parsed `PANE_FORMAT` line.
struct RawPane {
    pane: String,
    pid: u32,
    session: String,
    window: String,
    window_name: String,
    command: String,
    title: String,
}

/// Replaces characters fleetd's ids refuse (whitespace, controls) so every pane has an id.
fn id_text(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if cleaned.is_empty() {
        "_".to_owned()
    } else {
        cleaned
    }
}

impl Tmux {
    /// A backend for `config`; does no I/O.
    pub fn new(config: TmuxConfig) -> Self {
        let (events, _) = broadcast::channel(crate::mux::PANE_EVENT_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                config,
                inherited: launch::inherited_env(),
                watches: Mutex::new(watch::Watches::default()),
                events,
                commands: commands::CommandSlot::default(),
                gate: commands::AttachGate::default(),
            }),
        }
    }

    fn parse_pane_line(line: &str) -> Option<RawPane> {
        let mut f = line.splitn(7, SEP);
        Some(RawPane {
            pane: f.next()?.to_owned(),
            pid: f.next()?.parse().ok()?,
            session: f.next()?.to_owned(),
            window: f.next()?.to_owned(),
            window_name: f.next()?.to_owned(),
            command: f.next()?.to_owned(),
            title: f.next().unwrap_or("").to_owned(),
        })
    }

    fn convert(raw: &RawPane, screen: Option<&str>) -> Result<PaneInfo, MuxError> {
        let bad = |e: fleetd_core::PaneIdError| MuxError::transient("tmux list-panes", e);
        let (agent, status) = derive_status(&raw.title, &raw.command, screen);
        let session = id_text(&raw.session);
        Ok(PaneInfo {
            pane: PaneId::new(raw.pane.clone()).map_err(bad)?,
            terminal: TerminalId::new(format!("{}@{}", raw.pane, raw.pid)).map_err(bad)?,
            tab: TabId::new(format!("{session}:{}", raw.window)).map_err(bad)?,
            workspace: WorkspaceId::new(session).map_err(bad)?,
            label: Some(raw.window_name.clone()),
            title: Some(raw.title.clone()),
            agent,
            status,
            shell_pid: Some(raw.pid),
            workspace_label: Some(raw.session.clone()),
        })
    }

    /// Every pane of the server, in tmux's order: one `list-panes -a`.
    async fn raw_panes(&self) -> Result<Vec<RawPane>, MuxError> {
        let out = self
            .run(
                &[
                    "list-panes".into(),
                    "-a".into(),
                    "-F".into(),
                    PANE_FORMAT.into(),
                ],
                "panes",
            )
            .await?;
        Ok(out.lines().filter_map(Self::parse_pane_line).collect())
    }

    async fn list_panes_inner(&self) -> Result<Vec<PaneInfo>, MuxError> {
        self.raw_panes()
            .await?
            .iter()
            .map(|raw| Self::convert(raw, None))
            .collect()
    }

    async fn raw_pane(&self, pane: &PaneId) -> Result<RawPane, MuxError> {
        let what = format!("pane {pane}");
        // A filter, not `-t`: tmux answers an unknown `-t` target in surprising ways (an empty
        // line with success, or the current pane), whereas an empty filtered list from a live
        // server is an affirmative "no such pane".
        let filter = format!("#{{==:#{{pane_id}},{pane}}}");
        let out = self
            .run(
                &[
                    "list-panes".into(),
                    "-a".into(),
                    "-f".into(),
                    filter,
                    "-F".into(),
                    PANE_FORMAT.into(),
                ],
                &what,
            )
            .await?;
        out.lines()
            .filter_map(Self::parse_pane_line)
            .find(|raw| raw.pane == pane.as_str())
            .ok_or_else(|| MuxError::NotFound {
                what,
                code: "tmux_not_found".to_owned(),
                message: format!("tmux lists no pane {pane}"),
            })
    }

    async fn pane_inner(&self, pane: &PaneId) -> Result<PaneInfo, MuxError> {
        let raw = self.raw_pane(pane).await?;
        let screen = if SHELLS.contains(&raw.command.as_str()) {
            None
        } else {
            Some(self.read_tail_inner(pane, 40).await?)
        };
        Self::convert(&raw, screen.as_deref())
    }

    async fn list_tabs_inner(&self) -> Result<Vec<TabInfo>, MuxError> {
        let format =
            "#{session_name}\u{1f}#{window_index}\u{1f}#{window_panes}\u{1f}#{window_name}";
        let out = self
            .run(
                &[
                    "list-windows".into(),
                    "-a".into(),
                    "-F".into(),
                    format.into(),
                ],
                "tabs",
            )
            .await?;
        let bad = |e: fleetd_core::PaneIdError| MuxError::transient("tmux list-windows", e);
        out.lines()
            .filter_map(|line| {
                let mut f = line.splitn(4, SEP);
                Some((f.next()?, f.next()?, f.next()?, f.next().unwrap_or("")))
            })
            .map(|(session, window, panes, name)| {
                let session = id_text(session);
                Ok(TabInfo {
                    tab: TabId::new(format!("{session}:{window}")).map_err(bad)?,
                    workspace: WorkspaceId::new(session).map_err(bad)?,
                    label: name.to_owned(),
                    pane_count: panes.parse().unwrap_or(0),
                })
            })
            .collect()
    }

    async fn open_pane_inner(&self, req: OpenPane) -> Result<PaneInfo, MuxError> {
        let mut args: Vec<String> = Vec::new();
        let command = self.window_command(&req)?;
        let placement_args = |args: &mut Vec<String>| {
            if let Some(cwd) = &req.cwd {
                args.push("-c".into());
                args.push(cwd.display().to_string());
            }
            args.extend(["-P".into(), "-F".into(), "#{pane_id}".into()]);
            if let Some(command) = command {
                args.push(command);
            }
        };
        match &req.placement {
            Placement::NewTab { workspace } => {
                let exists = self
                    .run(
                        &["has-session".into(), "-t".into(), format!("={workspace}")],
                        "session",
                    )
                    .await;
                let no_server = |e: &MuxError| {
                    e.is_transient()
                        && (e.to_string().contains("no server running")
                            || e.to_string().contains("error connecting to"))
                };
                match exists {
                    Ok(_) => {
                        args.extend([
                            "new-window".into(),
                            "-d".into(),
                            "-t".into(),
                            format!("={workspace}:"),
                        ]);
                    }
                    // No such session, or no server yet: new-session creates (and starts) it.
                    Err(e) if e.is_not_found() || no_server(&e) => {
                        args.extend([
                            "new-session".into(),
                            "-d".into(),
                            "-s".into(),
                            workspace.clone(),
                        ]);
                    }
                    Err(e) => return Err(e),
                }
                if let Some(label) = &req.label {
                    args.extend(["-n".into(), label.clone()]);
                }
            }
            Placement::Split { of, direction } => {
                let flag = match direction {
                    SplitDirection::Right => "-h",
                    SplitDirection::Down => "-v",
                };
                args.extend([
                    "split-window".into(),
                    "-d".into(),
                    flag.into(),
                    "-t".into(),
                    of.to_string(),
                ]);
            }
        }
        placement_args(&mut args);
        let out = self.run(&args, "session").await?;
        let pane =
            PaneId::new(out.trim()).map_err(|e| MuxError::transient("tmux new-window", e))?;
        self.pane_inner(&pane).await
    }

    async fn read_tail_inner(&self, pane: &PaneId, lines: u32) -> Result<String, MuxError> {
        let out = self
            .run(
                &[
                    "capture-pane".into(),
                    "-p".into(),
                    "-J".into(),
                    "-t".into(),
                    pane.to_string(),
                    "-S".into(),
                    format!("-{lines}"),
                ],
                &format!("pane {pane}"),
            )
            .await?;
        let mut all: Vec<&str> = out.lines().map(str::trim_end).collect();
        while all.last().is_some_and(|l| l.is_empty()) {
            all.pop();
        }
        let keep = usize::try_from(lines).unwrap_or(usize::MAX).min(all.len());
        Ok(all[all.len() - keep..].join("\n"))
    }

    async fn process_info_inner(&self, pane: &PaneId) -> Result<ProcessInfo, MuxError> {
        let raw = self.raw_pane(pane).await?;
        Ok(ProcessInfo {
            pane: pane.clone(),
            shell_pid: Some(raw.pid),
            foreground_pids: Vec::new(),
        })
    }
}

impl Multiplexer for Tmux {
    fn kind(&self) -> BackendKind {
        BackendKind::Tmux
    }

    fn ping(&self) -> MuxFuture<'_, ServerInfo> {
        Box::pin(async move {
            let out = self
                .run(
                    &["display-message".into(), "-p".into(), "#{version}".into()],
                    "server",
                )
                .await?;
            Ok(ServerInfo {
                backend: BackendKind::Tmux,
                version: format!("tmux {}", out.trim()),
                protocol: None,
            })
        })
    }

    super::reading_methods!();

    fn press_enter<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            let what = format!("pane {pane}");
            self.run_input(
                &[
                    "send-keys".into(),
                    "-t".into(),
                    pane.to_string(),
                    "Enter".into(),
                ],
                &what,
            )
            .await
            .map(|_| ())
        })
    }

    fn type_keys<'a>(&'a self, pane: &'a PaneId, keys: &'a str) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            let what = format!("pane {pane}");
            // `-l`: the keys literally (`1` is the digit, never a key name).
            let args = [
                "send-keys".into(),
                "-l".into(),
                "-t".into(),
                pane.to_string(),
                "--".into(),
                keys.to_owned(),
            ];
            self.run_input(&args, &what).await.map(|_| ())
        })
    }

    fn submit<'a>(&'a self, pane: &'a PaneId, text: &'a str) -> MuxFuture<'a, Submitted> {
        Box::pin(self.submit_inner(pane, text))
    }

    fn read_tail<'a>(&'a self, pane: &'a PaneId, lines: u32) -> MuxFuture<'a, String> {
        Box::pin(self.read_tail_inner(pane, lines))
    }

    fn close_pane<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            self.run(
                &["kill-pane".into(), "-t".into(), pane.to_string()],
                &format!("pane {pane}"),
            )
            .await
            .map(|_| ())
        })
    }

    fn watch<'a>(&'a self, pane: &'a PaneId) -> MuxFuture<'a, ()> {
        Box::pin(async move {
            self.raw_pane(pane).await?;
            self.start_watch(pane.clone());
            Ok(())
        })
    }

    fn unwatch(&self, pane: &PaneId) {
        self.stop_watch(pane);
    }

    fn events(&self) -> broadcast::Receiver<PaneEvent> {
        self.inner.events.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pane_lines_parse_with_titles_containing_anything() {
        let line = "%3\u{1f}123\u{1f}my session\u{1f}2\u{1f}win\u{1f}sim-agent\u{1f}a \u{1f} title";
        let raw = Tmux::parse_pane_line(line).expect("parses");
        assert_eq!(
            (raw.pane.as_str(), raw.pid, raw.title.as_str()),
            ("%3", 123, "a \u{1f} title")
        );
        let info = Tmux::convert(&raw, None).expect("converts");
        assert_eq!(info.tab.as_str(), "my_session:2");
        assert_eq!(info.terminal.as_str(), "%3@123");
    }
}

//! Running one tmux command: over the persistent control client (`control`) when one is up,
//! otherwise as a plain `tmux` client process. Owns the command connection's life (connect on
//! first use, again after it exits, at most once a second while connecting fails) and the one
//! reading of a failure: not-found, transient, or may-have-been-carried-out.
//!
//! Fallback: no server yet (the `new-session` that starts one must run as a process, with the
//! user's umask), a server whose control mode fails, or `TmuxConfig::control_mode` off. A command
//! that never reached the control client runs as a process instead; one that reached it and got
//! no answer is never run again (it may have typed).
//!
//! No command that changes anything runs while a control client attaches ([`AttachGate`]): tmux
//! before 3.7 crashes — the whole server, every pane of the user's — when it notifies a control
//! client that is half identified.

use std::sync::Arc;
use std::time::Duration;

use super::control::{self, CallError, Conn};
use super::{Tmux, TmuxSocket};
use crate::mux::MuxError;

/// How long after a failed connect commands go straight to processes before the control client
/// is tried again: a missing server costs one failed `tmux -C` a second, not one per command.
const RECONNECT_BACKOFF: Duration = Duration::from_secs(1);

/// A failed `tmux` command: the error, and whether the command may have been carried out (tmux
/// had it and then the time ran out, or the server or control client went away) — what tells a
/// typing that wrote nothing from one that may have written.
pub(super) struct RunFailure {
    pub(super) error: MuxError,
    pub(super) maybe_done: bool,
}

impl RunFailure {
    fn not_done(op: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            error: MuxError::transient(op, reason),
            maybe_done: false,
        }
    }

    fn maybe_done(op: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            error: MuxError::transient(op, reason),
            maybe_done: true,
        }
    }
}

/// Keeps fleetd's own changes to tmux away from its control clients' attaches.
///
/// tmux marks a control client `CLIENT_CONTROL` on its identify flags but builds its control
/// state only on the last identify message (tmux 3.3a `server-client.c:2984`, `control_start`);
/// a notification in between — a session or window created or closed, a paste buffer set or
/// deleted — reaches it with no state and segfaults the server (`control-notify.c:26` checks
/// only the flag; `control.c:414` dereferences the state). The identify messages carrying file
/// descriptors go in separate writes, so on a busy machine the server runs other clients'
/// commands between them: fleetd's event client attaching while it opened a member's session
/// killed the tmux server. Fixed in tmux 3.7 (commit e5a2a25, tmux issue 4980). Attaches take
/// the gate alone, until tmux has answered the attach (the client is then fully identified);
/// every command that may notify shares it.
#[derive(Debug, Default)]
pub(super) struct AttachGate(tokio::sync::RwLock<()>);

/// The command connection: the live control client, or when to try one again.
#[derive(Debug, Default)]
pub(super) struct CommandSlot {
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    conn: Option<Arc<Conn>>,
    retry_at: Option<tokio::time::Instant>,
    /// How many control clients this slot has started (a reconnect is a new generation).
    generation: u64,
}

impl Tmux {
    /// `tmux` with the server's socket arguments and the allowlisted environment.
    pub(super) fn base_command(&self, program: &std::path::Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.env_clear();
        cmd.envs(self.inner.inherited.iter().map(|(k, v)| (k, v)));
        self.socket_args(&mut cmd);
        cmd
    }

    fn socket_args(&self, cmd: &mut tokio::process::Command) {
        match &self.inner.config.socket {
            TmuxSocket::Default => {}
            TmuxSocket::Name(name) => {
                cmd.arg("-L").arg(name);
            }
            TmuxSocket::Path(path) => {
                cmd.arg("-S").arg(path);
            }
        }
    }

    /// The live command connection, connecting when there is none (and none failed just now).
    pub(super) async fn command_conn(&self) -> Option<Arc<Conn>> {
        let config = &self.inner.config;
        if !config.control_mode {
            return None;
        }
        let mut slot = self.inner.commands.state.lock().await;
        if let Some(conn) = slot.conn.as_ref().filter(|c| !c.is_closed()) {
            return Some(Arc::clone(conn));
        }
        slot.conn = None;
        let now = tokio::time::Instant::now();
        if slot.retry_at.is_some_and(|at| now < at) {
            return None;
        }
        match self.attach(None, false).await {
            Ok(conn) => {
                slot.generation += 1;
                tracing::debug!(generation = slot.generation, "tmux control client attached");
                let conn = Arc::new(conn);
                slot.conn = Some(Arc::clone(&conn));
                slot.retry_at = None;
                Some(conn)
            }
            Err(reason) => {
                tracing::debug!(%reason, "no tmux control client; running tmux processes");
                slot.retry_at = Some(now + RECONNECT_BACKOFF);
                None
            }
        }
    }

    /// Starts a control client (attached to `session` when given, with pane output when
    /// `output`), no change of fleetd's to tmux running meanwhile ([`AttachGate`]).
    pub(super) async fn attach(&self, session: Option<&str>, output: bool) -> Result<Conn, String> {
        let config = &self.inner.config;
        let cmd = self.base_command(&config.program);
        let _alone = self.inner.gate.0.write().await;
        control::connect(cmd, session, output, config.call_timeout).await
    }

    /// Runs `tmux <socket args> <args>` and returns stdout; `what` names the looked-up object for
    /// not-found errors.
    pub(super) async fn run(&self, args: &[String], what: &str) -> Result<String, MuxError> {
        self.exec(args, what).await.map_err(|failure| failure.error)
    }

    /// Runs a `tmux` command that types into a pane: a failure after the command may have
    /// reached the server is [`MuxError::Uncertain`].
    pub(super) async fn run_input(&self, args: &[String], what: &str) -> Result<String, MuxError> {
        self.exec(args, what)
            .await
            .map_err(|failure| match failure.error {
                MuxError::Transient { op, reason } if failure.maybe_done => {
                    MuxError::Uncertain { op, reason }
                }
                error => error,
            })
    }

    /// [`Tmux::run`], saying on failure whether the command may have been carried out.
    pub(super) async fn exec(&self, args: &[String], what: &str) -> Result<String, RunFailure> {
        let op = format!("tmux {}", args.first().map_or("", String::as_str));
        let conn = self.command_conn().await;
        // Taken after the command client is up: its own attach takes the gate alone.
        let _shared = if reads_only(args) {
            None
        } else {
            Some(self.inner.gate.0.read().await)
        };
        if let Some(conn) = conn {
            let Some(line) = control::command_line(args) else {
                return Err(RunFailure {
                    error: MuxError::Rejected {
                        op,
                        code: "tmux_nul_argument".to_owned(),
                        message: "a tmux argument cannot hold a NUL character".to_owned(),
                    },
                    maybe_done: false,
                });
            };
            match conn.call(&line, self.inner.config.call_timeout).await {
                Ok(reply) if reply.ok => return Ok(reply.output),
                Ok(reply) => {
                    return Err(classify(&op, what, reply.output.trim(), "tmux error"));
                }
                Err(CallError::Unanswered(reason)) => {
                    return Err(RunFailure::maybe_done(&op, reason));
                }
                // The client left (its session was destroyed under it): a command that only
                // reads is run again as a process; one that changes something may have.
                Err(CallError::Lost(reason)) if !reads_only(args) => {
                    return Err(RunFailure::maybe_done(&op, reason));
                }
                Err(CallError::Lost(reason)) => {
                    tracing::debug!(%op, %reason, "tmux control client left; reading with a tmux process");
                }
                // Nothing reached tmux: the process below is the first attempt.
                Err(CallError::NotWritten(reason)) => {
                    tracing::debug!(%op, %reason, "tmux control client gone; running a tmux process");
                }
            }
        }
        self.exec_process(args, what, &op).await
    }

    /// One `tmux` client process for `args`.
    async fn exec_process(
        &self,
        args: &[String],
        what: &str,
        op: &str,
    ) -> Result<String, RunFailure> {
        let config = &self.inner.config;
        // `new-session` may start the server, which then keeps the umask it was started with
        // for every pane: give it the user's own, through a shell (std cannot set a child's
        // umask without unsafe code).
        let starts_server = args.first().is_some_and(|a| a == "new-session");
        let mut cmd = match config.server_umask {
            Some(mask) if starts_server => {
                let mut sh = tokio::process::Command::new("/bin/sh");
                sh.args(["-c", &format!("umask {mask:04o}; exec \"$0\" \"$@\"")])
                    .arg(&config.program);
                sh.env_clear();
                sh.envs(self.inner.inherited.iter().map(|(k, v)| (k, v)));
                self.socket_args(&mut sh);
                sh
            }
            _ => self.base_command(&config.program),
        };
        if let Some((name, rest)) = args.split_first() {
            cmd.arg(name).args(rest.iter().map(|a| literal_arg(a)));
        }
        cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
        // Killed at the timeout (`kill_on_drop`), the client may already have handed the command
        // to the server.
        let output = tokio::time::timeout(config.call_timeout, cmd.output())
            .await
            .map_err(|_| RunFailure::maybe_done(op, "tmux did not answer in time"))?
            .map_err(|e| RunFailure::not_done(op, format!("cannot run tmux: {e}")))?;
        if output.status.success() {
            // The command ran; only its output is unreadable.
            return String::from_utf8(output.stdout)
                .map_err(|e| RunFailure::maybe_done(op, format!("non-UTF-8 output: {e}")));
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        Err(classify(op, what, &stderr, &output.status.to_string()))
    }
}

/// `text` as a tmux argument on a process's argv that stays literal (every argument fleetd
/// passes is meant literally). tmux reads an argument ending in `;` as the end
/// of a command (the `;` dropped) and one ending in `\;` as a literal `;` (the backslash dropped),
/// and nothing else: so a backslash before the final `;` keeps any text whole — `a;` → `a\;`,
/// `a\;` → `a\\;`. tmux 3.3a `cmd-parse.c`, `cmd_parse_from_arguments`.
fn literal_arg(text: &str) -> String {
    match text.strip_suffix(';') {
        Some(head) => format!("{head}\\;"),
        None => text.to_owned(),
    }
}

/// Commands that change nothing, so running one again after a lost answer is harmless.
fn reads_only(args: &[String]) -> bool {
    args.first().is_some_and(|name| {
        matches!(
            name.as_str(),
            "list-panes"
                | "list-windows"
                | "list-sessions"
                | "capture-pane"
                | "has-session"
                | "display-message"
        )
    })
}

/// What tmux's error text says: an affirmative not-found, the server lost while it had the
/// command (may have been carried out), or anything else (tmux did nothing).
fn classify(op: &str, what: &str, message: &str, status: &str) -> RunFailure {
    if message.contains("can't find pane")
        || message.contains("can't find window")
        || message.contains("can't find session")
    {
        return RunFailure {
            error: MuxError::NotFound {
                what: what.to_owned(),
                code: "tmux_not_found".to_owned(),
                message: message.to_owned(),
            },
            maybe_done: false,
        };
    }
    let reason = format!("{status}: {message}");
    if message.contains("server exited unexpectedly") || message.contains("lost server") {
        return RunFailure::maybe_done(op, reason);
    }
    RunFailure::not_done(op, reason)
}

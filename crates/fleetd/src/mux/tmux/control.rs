//! One tmux control-mode client (`tmux -C attach-session`): a persistent `tmux` process whose
//! stdin takes commands, one per line, and whose stdout answers each in order with a
//! `%begin <time> <number> <flags>` … `%end`/`%error` block (flags `1`: a command this client
//! sent; the attach itself answers with flags `0`), interleaved with `%`-notifications between
//! blocks. This module knows the line protocol only: how to quote an argument for tmux's command
//! parser, how to match replies to commands, how to parse notifications. Which commands to send,
//! and what their failures mean, is `mux::tmux`'s business.
//!
//! The client attaches with `ignore-size` (it never sizes a window) and, when nobody wants pane
//! output, `no-output`. A command connection attaches without `-t`: tmux then picks the session
//! it would pick for a plain `tmux attach` (the most recently active), and attaching only bumps
//! that session's activity, so a user's `tmux attach` still lands where it did. The client is
//! listed by `tmux list-clients` and marks its session `(attached)`; it draws nothing.
//!
//! A command is written whole, with its newline, under the writer lock, and queued there, so the
//! queue's order is the order tmux reads them in. A command that could not be written did
//! nothing (tmux acts on a line when its newline arrives); one that was written and then got no
//! answer — the time ran out, or the client exited — may have been carried out.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::{broadcast, oneshot};

/// Capacity of a connection's notification broadcast. Notifications come in bursts (a chatty
/// pane's `%output`, a window's lifecycle); a receiver that lags learns it (`Lagged`) and reads
/// every watched pane again.
const NOTIFICATION_CAPACITY: usize = 1024;

/// A command's reply block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Reply {
    /// `%end` (true) or `%error` (false).
    pub(super) ok: bool,
    /// The block's lines, each with its newline, as the command printed them.
    pub(super) output: String,
}

/// Why a command got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CallError {
    /// Nothing reached tmux: the connection was closed, or the write failed.
    NotWritten(String),
    /// The command was written and then no answer came in time: it may have been carried out.
    Unanswered(String),
    /// The command was written and then the client exited (its session was destroyed, or the
    /// server went): it may have been carried out.
    Lost(String),
}

/// A tmux notification (a `%`-line outside a reply block) fleetd cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Notification {
    /// `%output %<pane> …`: the pane wrote something (the data itself is not kept).
    Output { pane: String },
    /// `%window-add`, `%window-close`, `%unlinked-window-add`, `%unlinked-window-close`,
    /// `%session-window-changed`, `%sessions-changed`, `%pane-mode-changed`, ...: panes may have
    /// come or gone. `pane` when the notification names one.
    Layout { pane: Option<String> },
    /// `%exit`: the client is leaving (its session was destroyed, or the server is going).
    Exit,
}

/// Parses one notification line; `None` for lines fleetd ignores.
pub(super) fn parse_notification(line: &str) -> Option<Notification> {
    let mut words = line.split(' ');
    let kind = words.next()?;
    match kind {
        "%output" | "%extended-output" => Some(Notification::Output {
            pane: words.next()?.to_owned(),
        }),
        "%pane-mode-changed" => Some(Notification::Layout {
            pane: words.next().map(str::to_owned),
        }),
        "%window-add"
        | "%window-close"
        | "%unlinked-window-add"
        | "%unlinked-window-close"
        | "%session-window-changed"
        | "%sessions-changed"
        | "%window-pane-changed"
        | "%layout-change" => Some(Notification::Layout { pane: None }),
        "%exit" => Some(Notification::Exit),
        _ => None,
    }
}

/// `arg` as one token of tmux's command parser (tmux 3.3a `cmd-parse.y`), standing for exactly
/// its own text: single-quoted (no expansion of `$`, `~`, `#{`, no `;` or `#` meaning anything),
/// a `'` written as `'\''`, and every control character (a newline would end the command line
/// of the control protocol) as a double-quoted octal escape such as `"\012"`, which the parser
/// turns back into that byte. Adjacent quoted pieces form one token, as in `sh`. `None` for a
/// NUL, which no tmux argument can hold.
pub(super) fn quote(arg: &str) -> Option<String> {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('\'');
    for c in arg.chars() {
        match c {
            '\0' => return None,
            '\'' => out.push_str("'\\''"),
            c if c.is_ascii_control() => {
                out.push_str(&format!("'\"\\{:03o}\"'", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    Some(out)
}

/// The command line for `args` (the first is the command's name, passed as it is).
pub(super) fn command_line(args: &[String]) -> Option<String> {
    let (name, rest) = args.split_first()?;
    let mut line = name.clone();
    for arg in rest {
        line.push(' ');
        line.push_str(&quote(arg)?);
    }
    Some(line)
}

/// One live control client.
#[derive(Debug)]
pub(super) struct Conn {
    /// The client process; killed when the connection is dropped.
    _child: Child,
    writer: tokio::sync::Mutex<ChildStdin>,
    shared: std::sync::Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Commands written and not yet answered, oldest first.
    pending: Mutex<VecDeque<oneshot::Sender<Reply>>>,
    closed: AtomicBool,
    notifications: broadcast::Sender<Notification>,
}

impl Shared {
    fn pending(&self) -> std::sync::MutexGuard<'_, VecDeque<oneshot::Sender<Reply>>> {
        crate::sync::lock(&self.pending)
    }

    /// Marks the connection closed and fails every unanswered command (dropping its sender).
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.pending().clear();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// Starts a control client with `cmd` (the `tmux` command with its socket arguments and
/// environment set) and waits until its attach is answered, at most `timeout`.
pub(super) async fn connect(
    mut cmd: tokio::process::Command,
    session: Option<&str>,
    output: bool,
    timeout: Duration,
) -> Result<Conn, String> {
    // `-N`: a control client must never start a server (one started here would have fleetd's
    // umask and no session, and exit again at once).
    cmd.arg("-N").arg("-C").arg("attach-session");
    if let Some(session) = session {
        cmd.arg("-t").arg(session);
    }
    let flags = if output {
        "ignore-size"
    } else {
        "ignore-size,no-output"
    };
    cmd.arg("-f")
        .arg(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run tmux -C: {e}"))?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("tmux -C has no pipes".to_owned());
    };
    let (notifications, _) = broadcast::channel(NOTIFICATION_CAPACITY);
    let shared = std::sync::Arc::new(Shared {
        pending: Mutex::new(VecDeque::new()),
        closed: AtomicBool::new(false),
        notifications,
    });
    let (ready_tx, ready_rx) = oneshot::channel();
    tokio::spawn(read_loop(stdout, std::sync::Arc::clone(&shared), ready_tx));
    let conn = Conn {
        _child: child,
        writer: tokio::sync::Mutex::new(stdin),
        shared,
    };
    match tokio::time::timeout(timeout, ready_rx).await {
        Ok(Ok(Ok(()))) => Ok(conn),
        Ok(Ok(Err(reason))) => Err(reason),
        Ok(Err(_)) => Err("tmux -C exited before attaching".to_owned()),
        Err(_) => Err("tmux -C did not attach in time".to_owned()),
    }
}

impl Conn {
    /// True once the client has exited (or failed); a closed connection is never used again.
    pub(super) fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// The client's notifications from now on.
    pub(super) fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.shared.notifications.subscribe()
    }

    /// Sends one command line and waits at most `timeout` for its reply.
    pub(super) async fn call(&self, line: &str, timeout: Duration) -> Result<Reply, CallError> {
        debug_assert!(!line.contains('\n'), "one command, one line");
        let rx = {
            let mut writer = self.writer.lock().await;
            if self.is_closed() {
                return Err(CallError::NotWritten(
                    "the control client has exited".into(),
                ));
            }
            let (tx, rx) = oneshot::channel();
            self.shared.pending().push_back(tx);
            let mut bytes = Vec::with_capacity(line.len() + 1);
            bytes.extend_from_slice(line.as_bytes());
            bytes.push(b'\n');
            // Within the bound too: a client that stopped reading must not hold the writer.
            let written = tokio::time::timeout(timeout, async {
                writer.write_all(&bytes).await?;
                writer.flush().await
            })
            .await;
            match written {
                Ok(Ok(())) => rx,
                Ok(Err(e)) => {
                    // A broken pipe: the client is gone and read none of this line, so the
                    // command was not carried out. Ours is the newest entry (the writer lock
                    // orders them).
                    self.shared.pending().pop_back();
                    self.shared.close();
                    return Err(CallError::NotWritten(format!(
                        "cannot write to tmux -C: {e}"
                    )));
                }
                Err(_) => {
                    // Part of the line may be with tmux; never use this connection again.
                    self.shared.close();
                    return Err(CallError::Unanswered(
                        "tmux -C did not take the command in time".into(),
                    ));
                }
            }
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(CallError::Lost(
                "the tmux control client exited before answering".into(),
            )),
            Err(_) => Err(CallError::Unanswered("tmux did not answer in time".into())),
        }
    }
}

/// A reply block being read.
struct Block {
    /// `<time> <number> <flags>`, which its `%end`/`%error` repeats.
    key: String,
    ours: bool,
    output: String,
}

/// Reads the client's stdout to its end: reply blocks to their commands, notifications to the
/// broadcast. The first block with flags `0` answers the attach (`ready`).
async fn read_loop(
    stdout: ChildStdout,
    shared: std::sync::Arc<Shared>,
    ready: oneshot::Sender<Result<(), String>>,
) {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stdout);
    let mut buf = Vec::new();
    let mut block: Option<Block> = None;
    loop {
        buf.clear();
        match lines.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        let line = String::from_utf8_lossy(&buf);
        if let Some(open) = block.as_mut() {
            let end = line
                .strip_prefix("%end ")
                .map(|key| (true, key))
                .or_else(|| line.strip_prefix("%error ").map(|key| (false, key)));
            match end {
                Some((ok, key)) if key == open.key => {
                    let Some(done) = block.take() else { continue };
                    let reply = Reply {
                        ok,
                        output: done.output,
                    };
                    if done.ours {
                        if let Some(tx) = shared.pending().pop_front() {
                            // The caller may have given up (timed out): nothing to do.
                            let _ = tx.send(reply);
                        }
                    } else if let Some(ready) = ready.take() {
                        let _ = ready.send(if ok {
                            Ok(())
                        } else {
                            Err(format!("tmux attach failed: {}", reply.output.trim()))
                        });
                    }
                }
                _ => {
                    open.output.push_str(&line);
                    open.output.push('\n');
                }
            }
            continue;
        }
        if let Some(key) = line.strip_prefix("%begin ") {
            block = Some(Block {
                key: key.to_owned(),
                ours: key.rsplit(' ').next() == Some("1"),
                output: String::new(),
            });
            continue;
        }
        if let Some(note) = parse_notification(&line) {
            let _ = shared.notifications.send(note);
        }
    }
    shared.close();
    if let Some(ready) = ready.take() {
        let _ = ready.send(Err("tmux -C exited before attaching".to_owned()));
    }
    let _ = shared.notifications.send(Notification::Exit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_single_quoted_with_controls_escaped() {
        let check =
            |arg: &str, want: &str| assert_eq!(quote(arg).as_deref(), Some(want), "{arg:?}");
        check("plain", "'plain'");
        check("", "''");
        check("it's", "'it'\\''s'");
        check("a;", "'a;'");
        check("$HOME ~ #{x} \\", "'$HOME ~ #{x} \\'");
        check("a\nb", "'a'\"\\012\"'b'");
        check("\u{1f}", "''\"\\037\"''");
        check("\u{7f}", "''\"\\177\"''");
        check("ünï ✓", "'ünï ✓'");
        assert_eq!(quote("a\0b"), None);
    }

    #[test]
    fn quoted_command_lines_never_hold_a_newline() {
        let line =
            command_line(&["send-keys".into(), "-l".into(), "a\r\nb\n".into()]).expect("no NUL");
        assert!(!line.contains('\n') && !line.contains('\r'), "{line}");
    }

    #[test]
    fn notifications_name_their_pane() {
        assert_eq!(
            parse_notification("%output %3 hello\\015\\012"),
            Some(Notification::Output { pane: "%3".into() })
        );
        assert_eq!(
            parse_notification("%window-close @4"),
            Some(Notification::Layout { pane: None })
        );
        assert_eq!(
            parse_notification("%pane-mode-changed %2"),
            Some(Notification::Layout {
                pane: Some("%2".into())
            })
        );
        assert_eq!(parse_notification("%exit"), Some(Notification::Exit));
        assert_eq!(parse_notification("%client-detached c"), None);
    }
}

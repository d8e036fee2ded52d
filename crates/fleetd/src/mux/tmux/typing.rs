//! Typing into a tmux pane (SPEC §5): the text as one paste, Enter as a command of its own once
//! the pane shows the paste.

use fleetd_core::PaneId;

use super::Tmux;
use crate::mux::{MuxError, SubmitPath, Submitted};

/// Least time between a paste and its Enter: Claude Code 2.1.197 lost the Enter of 5 of 12
/// first prompts pasted with no gap, and none with 20 ms or more.
const ENTER_GAP: std::time::Duration = std::time::Duration::from_millis(50);
/// Longest wait for a paste to show before Enter goes anyway (a program that echoes nothing).
const ENTER_WAIT: std::time::Duration = std::time::Duration::from_millis(1500);
/// How often the screen is read while waiting for a paste to show.
const SHOWN_POLL: std::time::Duration = std::time::Duration::from_millis(20);
/// Lines of the screen compared before and after a paste.
const SUBMIT_SCREEN_LINES: u32 = 40;

/// A fresh tmux paste-buffer name suffix for each submit (buffers are server-wide).
fn next_buffer() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Tmux {
    /// Types `text` as one paste, waits until the pane shows it, then presses Enter as a
    /// command of its own (SPEC §5: a typed line is submitted and verified).
    ///
    /// Agent TUIs tell typing from pasting by how much arrives in one read: Claude Code takes 64
    /// bytes or more in one read as a paste, Codex as few as 11, and an Enter inside a paste is a
    /// newline, not a submit. Two `send-keys` written back to back on the control client reach
    /// the pane in one write. So the text goes in with `paste-buffer -p` (bracketed, where the
    /// program asked for bracketed paste; plain otherwise), and Enter follows only once the
    /// screen has changed since before the paste (the program took the text in: a short text
    /// shows itself, a long one Claude Code's `[Pasted text #1]`) and at least
    /// [`ENTER_GAP`] has passed, or after [`ENTER_WAIT`] when the screen never changes.
    ///
    /// The paste wrote nothing when it fails before tmux could act (tmux not runnable, no
    /// server, no such pane); it timing out, or anything but a not-found after it succeeded, is
    /// uncertain: the text may be in the pane.
    pub(super) async fn submit_inner(
        &self,
        pane: &PaneId,
        text: &str,
    ) -> Result<Submitted, MuxError> {
        let what = format!("pane {pane}");
        let target = pane.to_string();
        if !text.is_empty() {
            let before = self.read_tail_inner(pane, SUBMIT_SCREEN_LINES).await?;
            let buffer = format!("fleetd-{}", next_buffer());
            self.run(
                &[
                    "set-buffer".into(),
                    "-b".into(),
                    buffer.clone(),
                    "--".into(),
                    text.to_owned(),
                ],
                &what,
            )
            .await?;
            let pasted = self
                .run_input(
                    &[
                        "paste-buffer".into(),
                        "-p".into(),
                        "-r".into(),
                        "-d".into(),
                        "-b".into(),
                        buffer.clone(),
                        "-t".into(),
                        target.clone(),
                    ],
                    &what,
                )
                .await;
            if let Err(e) = pasted {
                // Not pasted (or not known to be): the buffer must not outlive the call.
                let _ = self
                    .run(&["delete-buffer".into(), "-b".into(), buffer], &what)
                    .await;
                return Err(e);
            }
            self.wait_shown(pane, &before).await;
        }
        let enter = self
            .run_input(
                &["send-keys".into(), "-t".into(), target, "Enter".into()],
                &what,
            )
            .await;
        match enter {
            Ok(_) => {}
            // The pane is gone: an affirmative answer, whatever was typed before.
            Err(e) if e.is_not_found() || text.is_empty() => return Err(e),
            Err(e) => {
                return Err(MuxError::uncertain(
                    "tmux send-keys",
                    format!("the text was typed, then Enter failed: {e}"),
                ));
            }
        }
        Ok(Submitted {
            path: SubmitPath::TmuxPaste,
            started: None,
        })
    }

    /// Waits until the pane's screen differs from `before` and [`ENTER_GAP`] has passed, or
    /// [`ENTER_WAIT`] passes. A failed read ends the wait: Enter goes anyway.
    async fn wait_shown(&self, pane: &PaneId, before: &str) {
        let start = tokio::time::Instant::now();
        tokio::time::sleep(ENTER_GAP).await;
        while start.elapsed() < ENTER_WAIT {
            match self.read_tail_inner(pane, SUBMIT_SCREEN_LINES).await {
                Ok(now) if now != before => return,
                Ok(_) => tokio::time::sleep(SHOWN_POLL).await,
                Err(_) => return,
            }
        }
    }
}

//! When text shows in a tmux pane, without polling it: a control-mode client of the bench's own
//! (`tmux -C attach-session`, output on) attached to the pane's session, whose `%output` lines
//! carry every byte the pane prints the moment tmux has it. A thread reads them and timestamps
//! each new occurrence of a needle in that pane's output, so a benchmark waits on a channel
//! instead of running `capture-pane` processes in a loop (which, on a 2-core machine, took a
//! core away from the daemon being measured).

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context as _;

/// A control client following one pane's output.
pub struct PaneOutput {
    child: Child,
    seen: mpsc::Receiver<(usize, i64)>,
}

impl PaneOutput {
    /// Follows pane `pane` (a tmux target such as `base:boss`) of the server `tmux` runs on,
    /// counting occurrences of `needle` in its output from now on.
    pub fn follow(tmux: impl Fn() -> Command, pane: &str, needle: &str) -> anyhow::Result<Self> {
        let id = tmux()
            .args([
                "display-message",
                "-p",
                "-t",
                pane,
                "#{pane_id} #{session_name}",
            ])
            .output()
            .context("tmux display-message")?;
        let text = String::from_utf8_lossy(&id.stdout).trim().to_owned();
        let (pane_id, session) = text
            .split_once(' ')
            .with_context(|| format!("no pane {pane}: {text:?}"))?;
        let mut child = crate::tmux::attach_control(tmux(), session)?;
        let stdout = child.stdout.take().context("stdout is piped")?;
        let (tx, seen) = mpsc::channel();
        let prefix = format!("%output {pane_id} ");
        let needle = needle.as_bytes().to_vec();
        std::thread::spawn(move || {
            let mut printed: Vec<u8> = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Some(data) = line.strip_prefix(&prefix) else {
                    continue;
                };
                printed.extend(unescape(data));
                let found = printed
                    .windows(needle.len())
                    .filter(|w| *w == needle.as_slice())
                    .count();
                if found > 0 && tx.send((found, super::nudge::now_us())).is_err() {
                    return;
                }
                // Keep only what may be the start of a needle the next output completes (it
                // holds no whole one: those were counted).
                let keep = needle.len().saturating_sub(1);
                if printed.len() > keep {
                    printed.drain(..printed.len() - keep);
                }
            }
        });
        Ok(Self { child, seen })
    }

    /// Waits up to `timeout` for the next occurrence of the needle; its wall-clock time in µs.
    pub fn next(&self, timeout: Duration) -> anyhow::Result<i64> {
        self.seen
            .recv_timeout(timeout)
            .map(|(_, at)| at)
            .context("the text did not show in the pane")
    }

    /// Drops occurrences seen so far (ones from before the measured step).
    pub fn skip_seen(&self) {
        while self.seen.try_recv().is_ok() {}
    }
}

impl Drop for PaneOutput {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `%output` payload as bytes: tmux writes bytes below 32 and `\` as a backslash and three
/// octal digits (tmux 3.3a control.c, control_append_data).
fn unescape(data: &str) -> Vec<u8> {
    let bytes = data.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = bytes.get(i + 1..i + 4)
            && let Some(byte) = std::str::from_utf8(octal)
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(byte);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn octal_escapes_are_bytes_again() {
        assert_eq!(unescape(r"a\015\012b\134c"), b"a\r\nb\\c");
        assert_eq!(unescape("[fleet] 1 message"), b"[fleet] 1 message");
    }
}

//! A typed nudge is submitted, and verified (SPEC §5): after a nudge is typed, fleetd watches
//! for the lead's turn to start and presses Enter once more if it did not while the text still
//! sits at the bottom of the screen; and a nudge is not typed a second time while an earlier
//! copy sits in Claude Code's input box — that copy is submitted instead. Only where fleetd
//! pasted and pressed Enter itself (tmux; herdr's `agent.prompt` waits for the turn on its own),
//! and never into a dialog.
//!
//! A member's task is held to the same: its turn-done fallback waits for the turn's end to hold
//! ([`busy_again`]), its text counts as unsent only alone in the input line ([`unsent`]), and
//! its Enter retry is never pressed into a dialog ([`enter_unless_blocked`]).
//!
//! Found with the real Claude Code 2.1.332: a nudge typed the moment a long turn ended (0.2 ms
//! after the pane read idle) sat in the input box with its Enter lost, and each reminder added a
//! copy below it.

use std::time::Duration;

use fleetd_core::{AgentStatus, QualifiedPaneId};

use crate::mux::{MuxError, MuxRouter};

/// How long a nudge's turn has to show before Enter is pressed once more.
const TURN_WAIT: Duration = Duration::from_millis(1500);
/// How often the pane is read meanwhile.
const POLL: Duration = Duration::from_millis(100);
/// How long a turn's end must hold before its fallback is recorded.
const SETTLE: Duration = Duration::from_millis(300);
/// The bottom lines of the screen where an input box sits.
const INPUT_LINES: u32 = 12;
/// How much of a text identifies it on screen (whitespace ignored).
const TEXT_CHARS: usize = 40;

/// `s` without its whitespace: a TUI wraps and indents what was typed.
fn squeeze(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Whether `text`'s start is on one of `screen`'s lines (whitespace ignored), and, with
/// `input_box_only`, on a line of Claude Code's input box (`❯` and a no-break space; a
/// submitted prompt in its transcript has an ordinary space).
fn sits(screen: &str, text: &str, input_box_only: bool) -> bool {
    let needle: String = squeeze(text).chars().take(TEXT_CHARS).collect();
    if needle.is_empty() {
        return false;
    }
    if input_box_only {
        // The box runs from its `❯` line to the rule under it (a long text wraps).
        let lines: Vec<&str> = screen.lines().collect();
        lines.iter().enumerate().any(|(i, line)| {
            let Some(first) = line.trim_start().strip_prefix("❯\u{a0}") else {
                return false;
            };
            let rest = lines[i + 1..]
                .iter()
                .take_while(|l| !l.trim_start().starts_with('─'))
                .copied();
            let boxed: String = std::iter::once(first).chain(rest).collect();
            squeeze(&boxed).starts_with(&needle)
        })
    } else {
        squeeze(screen).contains(&needle)
    }
}

/// Whether `text` waits unsent in an agent's input line: the screen's last line opening with a
/// prompt glyph (Claude Code's `❯`, Codex's `›`: its transcript shows submitted prompts with the
/// same glyph above, so the last one is the input), read with the lines that follow it up to a
/// blank line or the box's rule (a long text wraps), holds `text`'s start and nothing that is
/// not `text` (whitespace ignored): an echoed line with the agent's output under it was taken in.
pub(super) fn unsent(screen: &str, text: &str) -> bool {
    let text = squeeze(text);
    let needle: String = text.chars().take(TEXT_CHARS).collect();
    let lines: Vec<&str> = screen.lines().collect();
    let Some(at) = lines
        .iter()
        .rposition(|l| l.trim_start().starts_with(['❯', '›']))
    else {
        return false;
    };
    let wrapped = lines[at + 1..]
        .iter()
        .take_while(|l| !l.trim().is_empty() && !l.trim_start().starts_with('─'));
    let input: String = std::iter::once(&lines[at])
        .chain(wrapped)
        .copied()
        .collect();
    let input = squeeze(&input);
    let input = input.trim_start_matches(['❯', '›']);
    !needle.is_empty() && input.starts_with(&needle) && text.starts_with(input)
}

/// Presses Enter in a member's pane for a task typed there — unless a dialog is up: Enter would
/// answer it, and the dialog is the task's turn all the same.
pub(super) async fn enter_unless_blocked(
    mux: &MuxRouter,
    pane: &QualifiedPaneId,
) -> Result<(), MuxError> {
    match mux.pane(pane).await {
        Ok(p) if p.info.status == AgentStatus::Blocked => {
            tracing::info!(%pane, "a dialog is up in the member's pane: no Enter to answer it");
            Ok(())
        }
        _ => mux.press_enter(pane).await,
    }
}

/// Whether a member whose turn seemed to end reads busy again [`SETTLE`] later: an agent's
/// title can read at rest a moment before the dialog it is drawing shows.
pub(super) async fn busy_again(mux: &MuxRouter, pane: &QualifiedPaneId) -> bool {
    tokio::time::sleep(SETTLE).await;
    mux.pane(pane)
        .await
        .is_ok_and(|p| matches!(p.info.status, AgentStatus::Working | AgentStatus::Blocked))
}

/// Whether an earlier copy of `text` waits unsubmitted in the lead's input box.
pub(super) async fn waiting_in_input(mux: &MuxRouter, pane: &QualifiedPaneId, text: &str) -> bool {
    mux.read_tail(pane, INPUT_LINES)
        .await
        .is_ok_and(|screen| sits(&screen, text, true))
}

/// After `text` was typed and Enter pressed: waits for the turn to start; if it does not and
/// the text still shows at the bottom of the screen, presses Enter once more. Returns whether
/// the turn was seen to start.
pub(super) async fn submitted(mux: &MuxRouter, pane: &QualifiedPaneId, text: &str) -> bool {
    match turn(mux, pane).await {
        Some(AgentStatus::Working) => return true,
        // A dialog came up: an Enter would answer it.
        Some(AgentStatus::Blocked) => return false,
        _ => {}
    }
    let shown = mux
        .read_tail(pane, INPUT_LINES)
        .await
        .is_ok_and(|screen| sits(&screen, text, false));
    if !shown {
        // Taken in and already done, or never shown: nothing to press.
        return false;
    }
    tracing::info!(%pane, "the nudge did not start a turn; pressing Enter once more");
    if let Err(e) = mux.press_enter(pane).await {
        tracing::warn!(%pane, error = %e, "cannot press Enter for the nudge");
        return false;
    }
    turn(mux, pane).await == Some(AgentStatus::Working)
}

/// The pane's status once it reads `working` or `blocked`, or as last read when
/// [`TURN_WAIT`] runs out (`None`: it could not be read).
async fn turn(mux: &MuxRouter, pane: &QualifiedPaneId) -> Option<AgentStatus> {
    let until = tokio::time::Instant::now() + TURN_WAIT;
    loop {
        let status = mux.pane(pane).await.ok().map(|p| p.info.status);
        if matches!(status, Some(AgentStatus::Working | AgentStatus::Blocked))
            || tokio::time::Instant::now() >= until
        {
            return status;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::{sits, unsent};

    /// Screens as captured from the real TUIs (Codex 0.171, Claude Code 2.1.332).
    #[test]
    fn a_task_unsent_in_the_input_is_told_from_one_submitted() {
        let task = "@reply forty-two and a long tail that wraps past the composer's width";
        let codex_unsent = format!(
            "  >_ OpenAI Codex (v0.171.0)\n     ~/work\n\n\n› {}\n  {}\n\n  gpt-5 default · ~/work\n  ← for agents · ? for shortcuts",
            &task[..40],
            &task[40..]
        );
        assert!(unsent(&codex_unsent, task));
        let codex_sent = format!(
            "› {task}\n\n• NO TOOL fleet_reply\n\n  Worked for <1s • 17:46\n\n› Ask Codex to do anything\n\n  gpt-5 default · ~/work"
        );
        assert!(!unsent(&codex_sent, task));
        let claude_unsent =
            format!("❯ earlier prompt\n● OK\n────\n❯\u{a0}{task}\n────\n  ? for shortcuts");
        assert!(unsent(&claude_unsent, task));
        let claude_sent = format!("❯ {task}\n● DONE\n────\n❯\u{a0}\n────\n  ? for shortcuts");
        assert!(!unsent(&claude_sent, task));
        assert!(!unsent("no prompt here", task));
        // A line agent echoes what it read on its prompt line, and its turn's output follows:
        // read the moment its title went idle, before the dialog it was drawing showed.
        let echoed = format!("sim-agent ready\n❯ {task}\n✻ Working… (esc to interrupt)\n");
        assert!(!unsent(&echoed, task), "its output is under it: taken in");
    }

    const NUDGE: &str = "[fleet] 1 message from carol waiting — call fleet_poll(target=\"carol\")";

    #[test]
    fn a_copy_in_claudes_input_box_is_told_from_one_in_its_transcript() {
        let waiting = format!("● busy\n────\n❯\u{a0}{NUDGE}\n────\n  ⏵⏵ auto mode on");
        assert!(sits(&waiting, NUDGE, true));
        let submitted = format!("❯ {NUDGE}\n● Called fleet\n────\n❯\u{a0}\n────");
        assert!(
            !sits(&submitted, NUDGE, true),
            "the transcript's copy was sent"
        );
        assert!(
            sits(&submitted, NUDGE, false),
            "it is on screen all the same"
        );
        let wrapped =
            "❯\u{a0}[fleet] 1 message from carol\n  waiting — call fleet_poll(target=\"carol\")";
        assert!(sits(wrapped, NUDGE, true), "a wrapped line still reads");
        assert!(!sits("❯\u{a0}", NUDGE, true));
        assert!(
            !sits("anything", "  ", false),
            "an empty text is never found"
        );
    }
}

//! Status derivation for agents the multiplexer does not know: what it shows (the terminal
//! title, the foreground command, the screen's bottom lines) turned into an agent status. Used
//! for every tmux pane and for herdr panes herdr reports `unknown` (a `custom` agent, SPEC §8).
//! Weaker than herdr's own detection by design; pure, no multiplexer calls.
//!
//! The signals, strongest first:
//! - a **spinner** leading the title is `working`: Claude Code up to 2.1.227 (braille), 2.1.228
//!   on (half circles), Codex (braille);
//! - a **dialog** in the bottom lines is `blocked` (nothing may be typed: the text and its Enter
//!   would answer the dialog), and so is Codex's `Action Required` title;
//! - a **live turn on screen** is `working`: Claude Code from 2.1.3xx never changes its title
//!   (it sets `✳ Claude Code` once), so its footer (`… · esc to interrupt`) and its activity line
//!   (`✻ Cultivating… (1s · ↓ 5 tokens)`) are the only signs of a turn; Codex shows
//!   `• Working (3s • esc to interrupt)`;
//! - a shell in the foreground is no agent (`unknown`) — unless the title names one: a lead
//!   started by a wrapper that does not `exec` it (`sh -c 'claude; …'`) leaves tmux reporting
//!   the shell, while Claude Code's title (`✳ Claude Code`, set at start and kept) still names
//!   it, and the screen is read as for any agent; anything else is `idle`.
//!
//! The rules follow herdr's detection manifests (claude.toml at herdr commit ffc4e263
//! `live_turn_working`, lines 16-25, and `osc_title_working` lines 7-14; codex.toml at v0.8.2
//! `osc_title_blocked`, `osc_title_working` and `screen_working_fallback`), written out by hand
//! (fleetd carries no regex engine).

use fleetd_core::AgentStatus;

/// Foreground commands that mean "no agent here".
pub(crate) const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "csh", "tcsh", "nu", "elvish", "xonsh",
];

/// Lines that mean an agent is waiting on a dialog, from herdr's own detection manifests (v0.8.2
/// src/detect/manifests/: claude.toml:140-192, codex.toml:45-56, and the gemini, opencode,
/// cursor and amp manifests), lower-cased. Only the strong ones: a bare `[y/n]` in output is
/// too common to mean a dialog.
const DIALOG_LINES: &[&str] = &[
    "do you want to proceed?",
    "waiting for permission",
    "do you want to allow this connection?",
    "press enter to confirm or esc to cancel",
    "enter to submit answer",
    "allow command?",
    "│ apply this change",
    "│ allow execution",
    "△ permission required",
    "run this command?",
    "waiting for approval",
    // Codex 0.171's MCP approval: `Allow the fleet MCP server to run tool "fleet_reply"?` above
    // `enter to submit | esc to cancel` (seen on the real TUI).
    "mcp server to run tool",
];

/// How many non-empty bottom lines a live turn is looked for in (herdr's
/// `bottom_non_empty_lines(12)`).
const TURN_LINES: usize = 12;
/// How many non-empty bottom lines a dialog is looked for in.
const DIALOG_BOTTOM: usize = 5;

/// Claude Code's activity glyphs (`✻ Cultivating…`): `*`, `·`, `✢`, `✶`, `✻`, `✽`.
const ACTIVITY_GLYPHS: &[char] = &['*', '·', '✢', '✶', '✻', '✽'];

/// A spinner leading the title: braille (U+2800–U+28FF; Claude Code ≤ 2.1.227, Codex) or
/// Claude Code 2.1.228's half circles (U+25D0–U+25D3).
pub(crate) fn has_spinner(title: &str) -> bool {
    title.chars().next().is_some_and(|c| {
        ('\u{2800}'..='\u{28FF}').contains(&c) || ('\u{25D0}'..='\u{25D3}').contains(&c)
    })
}

/// The agent a pane's title names when a shell is in the foreground: Claude Code keeps
/// `✳ Claude Code` (2.1.3xx) or its spinner and the same words (earlier releases) as its title.
/// Codex's title names its task, not itself: a Codex behind a shell stays `unknown`.
fn agent_named_by(title: &str) -> Option<&'static str> {
    title.contains("Claude Code").then_some("claude")
}

/// The last `n` non-empty lines of `screen`, bottom first.
fn bottom(screen: &str, n: usize) -> Vec<&str> {
    screen
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .collect()
}

/// Whether the bottom lines show a dialog.
fn shows_dialog(screen: &str) -> bool {
    let bottom: Vec<String> = bottom(screen, DIALOG_BOTTOM)
        .into_iter()
        .map(str::to_lowercase)
        .collect();
    let has = |n: &str| bottom.iter().any(|l| l.contains(n));
    (has("esc to cancel")
        && (has("enter to confirm") || has("enter to select") || has("enter to submit")))
        || DIALOG_LINES.iter().any(|n| has(n))
        // A question over a numbered choice list, however long (Claude Code 2.1.332's Bash
        // prompt has four options, its question six lines up: `fleetd_core::dialog`).
        || fleetd_core::dialog::recognise(screen).is_some_and(|d| !d.choices.is_empty())
}

/// Whether the bottom lines show a turn running.
fn shows_turn(screen: &str) -> bool {
    bottom(screen, TURN_LINES).into_iter().any(|line| {
        let line = line.trim();
        footer_interrupt(line) || claude_activity(line) || codex_working(line)
    })
}

/// Claude Code's footer while a turn runs: `⏵⏵ bypass permissions on … · esc to interrupt`
/// (herdr: `^\s*[⏸⏵].*esc to interrupt(?:\s|·|$)`), and the same words after a `·` in a
/// footer of another permission mode.
fn footer_interrupt(line: &str) -> bool {
    let Some(at) = line.find("esc to interrupt") else {
        return false;
    };
    let after_ok = line[at + "esc to interrupt".len()..]
        .chars()
        .next()
        .is_none_or(|c| c.is_whitespace() || c == '·');
    let before = line[..at].trim_end();
    after_ok && (line.starts_with(['⏸', '⏵']) || before.ends_with('·') || before.is_empty())
}

/// Claude Code's activity line while a turn runs: a glyph, a space, a word ending in `…`, then
/// nothing or its clock (`✻ Cultivating… (1s · ↓ 5 tokens)`); herdr:
/// `^\s*[*·✢✶✻✽]\s+\S.*…(?:\s+\(\d+[smh](?:\s|·)|\s*$)`. A finished turn's line
/// (`✻ Cogitated for 0s`) has no `…`.
fn claude_activity(line: &str) -> bool {
    let mut chars = line.chars();
    if !chars.next().is_some_and(|c| ACTIVITY_GLYPHS.contains(&c)) {
        return false;
    }
    let rest = chars.as_str();
    if !rest.starts_with(char::is_whitespace) || rest.trim_start().is_empty() {
        return false;
    }
    let Some(dots) = rest.rfind('…') else {
        return false;
    };
    let tail = rest[dots + '…'.len_utf8()..].trim_start();
    if tail.is_empty() {
        return true;
    }
    // `(<digits><s|m|h>` then a space or `·`.
    let Some(clock) = tail.strip_prefix('(') else {
        return false;
    };
    let digits = clock.chars().take_while(char::is_ascii_digit).count();
    let mut after = clock[digits..].chars();
    digits > 0
        && after.next().is_some_and(|u| matches!(u, 's' | 'm' | 'h'))
        && after.next().is_some_and(|c| c.is_whitespace() || c == '·')
}

/// Codex's status line while a turn runs: `• Working (3s • esc to interrupt)` (herdr
/// codex.toml `screen_working_fallback`).
fn codex_working(line: &str) -> bool {
    let Some(rest) = line.strip_prefix(['•', '◦']) else {
        return false;
    };
    let rest = rest.trim_start();
    rest.starts_with("Working (") && rest.contains("esc to interrupt)")
}

/// Status from what tmux knows: title, foreground command and (optionally) the screen.
pub fn derive_status(
    title: &str,
    command: &str,
    screen: Option<&str>,
) -> (Option<String>, AgentStatus) {
    let agent = if SHELLS.contains(&command) {
        agent_named_by(title).map(str::to_owned)
    } else {
        (!command.is_empty()).then(|| command.to_owned())
    };
    if has_spinner(title) {
        return (agent, AgentStatus::Working);
    }
    if agent.is_none() {
        return (None, AgentStatus::Unknown);
    }
    if title.contains("Action Required") || screen.is_some_and(shows_dialog) {
        return (agent, AgentStatus::Blocked);
    }
    if screen.is_some_and(shows_turn) {
        return (agent, AgentStatus::Working);
    }
    (agent, AgentStatus::Idle)
}

/// Whether a status must be read from the screen (the title and command alone cannot tell).
pub(crate) fn needs_screen(title: &str, command: &str) -> bool {
    (!SHELLS.contains(&command) || agent_named_by(title).is_some()) && !has_spinner(title)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_derived_from_title_command_and_screen() {
        assert_eq!(
            derive_status("⠙ working", "claude", None).1,
            AgentStatus::Working
        );
        assert_eq!(
            derive_status("◐ Claude Code", "claude", None).1,
            AgentStatus::Working
        );
        assert_eq!(
            derive_status("host", "bash", None),
            (None, AgentStatus::Unknown)
        );
        assert_eq!(
            derive_status("claude", "node", Some("❯ ")).1,
            AgentStatus::Idle
        );
        assert_eq!(
            derive_status("claude", "node", Some("Do you want to proceed?\n❯ 1. Yes")).1,
            AgentStatus::Blocked
        );
        for dialog in [
            "Allow command?\n  rm -rf build",
            "  Press enter to confirm or esc to cancel",
            "△ Permission required\n  edit src/main.rs",
            "Waiting for approval...",
        ] {
            assert_eq!(
                derive_status("agent", "node", Some(dialog)).1,
                AgentStatus::Blocked,
                "{dialog}"
            );
        }
        // The same words far above the bottom lines are history, not a dialog.
        let scrolled = format!("Allow command?\n{}❯ ", "output\n".repeat(8));
        assert_eq!(
            derive_status("agent", "node", Some(&scrolled)).1,
            AgentStatus::Idle
        );
    }

    /// Claude Code 2.1.332 keeps its title at `✳ Claude Code` in every state: only the screen
    /// tells a running turn (screens as captured from the real TUI at 200 columns).
    #[test]
    fn claude_code_without_a_title_spinner_is_read_from_its_screen() {
        let title = "✳ Claude Code";
        for (why, screen, expected) in [
            (
                "a turn's spinner line",
                "❯ fix the flaky test\n✽ Beboppin'…\n  ⎿  Tip: use /clear\n────\n❯\u{a0}\n────\n  ⏵⏵ bypass permissions on (shift+tab to cycle) · esc to interrupt",
                AgentStatus::Working,
            ),
            (
                "a turn's clock",
                "✻ Cultivating… (1s · ↓ 5 tokens)\n────\n❯\u{a0}\n────\n  ? for shortcuts",
                AgentStatus::Working,
            ),
            (
                "a finished turn",
                "❯ fix the flaky test\n● OK\n✻ Cogitated for 0s · done 9:29 PM\n────\n❯\u{a0}\n────\n  ⏵⏵ bypass permissions on (shift+tab to cycle) · ← for agents",
                AgentStatus::Idle,
            ),
            (
                "typed words are not a turn",
                "────\n❯\u{a0}please press esc to interrupt the build\n────\n  ? for shortcuts",
                AgentStatus::Idle,
            ),
            (
                "a three-choice dialog",
                " Do you want to proceed?\n ❯ 1. Yes\n   2. Yes, and don't ask again\n   3. No\n\n Esc to cancel · Tab to amend",
                AgentStatus::Blocked,
            ),
            (
                "2.1.332 offers four choices: the question is six non-empty lines up",
                " Do you want to proceed?\n ❯ 1. Yes\n   2. Yes, and always allow access to /w from this project\n   3. Yes, and switch to auto mode · auto mode handles these prompts for you\n   4. No\n\n Esc to cancel · Tab to amend",
                AgentStatus::Blocked,
            ),
        ] {
            assert_eq!(
                derive_status(title, "claude", Some(screen)).1,
                expected,
                "{why}"
            );
        }
    }

    /// A lead started without `exec` (`sh -c 'claude; …'`): tmux reports `sh`, the title still
    /// names Claude Code (as seen on the real 2.1.332).
    #[test]
    fn claude_code_behind_a_shell_is_read_from_its_title_and_screen() {
        let title = "✳ Claude Code";
        assert!(needs_screen(title, "sh"));
        let idle = "────\n❯\u{a0}\n────\n  ? for shortcuts";
        assert_eq!(
            derive_status(title, "sh", Some(idle)),
            (Some("claude".to_owned()), AgentStatus::Idle)
        );
        let working = "✽ Beboppin'…\n────\n❯\u{a0}\n────\n  esc to interrupt";
        assert_eq!(
            derive_status(title, "sh", Some(working)).1,
            AgentStatus::Working
        );
        // A shell titled otherwise is still no agent.
        assert!(!needs_screen("host", "bash"));
        assert_eq!(
            derive_status("host", "bash", Some(idle)),
            (None, AgentStatus::Unknown)
        );
    }

    #[test]
    fn codex_turns_and_approvals_are_read() {
        let working =
            "› fix it\n\n• Working (3s • esc to interrupt)\n\n› \n  gpt-5 · 100% context left";
        assert_eq!(
            derive_status("codex", "codex", Some(working)).1,
            AgentStatus::Working
        );
        assert_eq!(
            derive_status(
                "[ ! ] Action Required | Fleet task | work",
                "node",
                Some("› ")
            )
            .1,
            AgentStatus::Blocked
        );
        let approval = "  Field 1/1\n  Allow the fleet MCP server to run tool \"fleet_reply\"?\n\n  text: ping\n\n  › 1. Allow                   Run the tool and continue\n    2. Allow for this session\n    3. Always allow\n    4. Cancel                  Cancel this tool call\n  enter to submit | esc to cancel";
        assert_eq!(
            derive_status("work", "node", Some(approval)).1,
            AgentStatus::Blocked
        );
    }
}

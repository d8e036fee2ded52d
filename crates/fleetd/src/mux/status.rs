//! Status derivation for agents the multiplexer does not know: what it shows (the terminal
//! title, the foreground command, the screen's bottom lines) turned into an agent status. Used
//! for every tmux pane and for herdr panes herdr reports `unknown` (a `custom` agent, SPEC §8).
//! Weaker than herdr's own detection by design; pure, no multiplexer calls.

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
];

/// A braille spinner (U+2800–U+28FF) leading the title: Claude Code's "working".
pub(crate) fn has_spinner(title: &str) -> bool {
    title
        .chars()
        .next()
        .is_some_and(|c| ('\u{2800}'..='\u{28FF}').contains(&c))
}

/// Status from what tmux knows: title, foreground command and (optionally) the screen.
pub fn derive_status(
    title: &str,
    command: &str,
    screen: Option<&str>,
) -> (Option<String>, AgentStatus) {
    let spinner = has_spinner(title);
    let is_shell = SHELLS.contains(&command);
    let agent = (!is_shell && !command.is_empty()).then(|| command.to_owned());
    if spinner {
        return (agent, AgentStatus::Working);
    }
    if agent.is_none() {
        return (None, AgentStatus::Unknown);
    }
    let blocked = screen.is_some_and(|s| {
        let bottom: Vec<String> = s
            .lines()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(5)
            .map(str::to_lowercase)
            .collect();
        let has = |n: &str| bottom.iter().any(|l| l.contains(n));
        (has("esc to cancel") && (has("enter to confirm") || has("enter to select")))
            || DIALOG_LINES.iter().any(|n| has(n))
    });
    (
        agent,
        if blocked {
            AgentStatus::Blocked
        } else {
            AgentStatus::Idle
        },
    )
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
}

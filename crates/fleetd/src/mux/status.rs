//! Status derivation for agents the multiplexer does not know: what it shows (the terminal
//! title, the foreground command, the screen's bottom lines) turned into an agent status. Used
//! for every tmux pane and for herdr panes herdr reports `unknown` (a `custom` agent, SPEC §8).
//! Weaker than herdr's own detection by design; pure, no multiplexer calls.

use fleetd_core::AgentStatus;

/// Foreground commands that mean "no agent here".
pub(crate) const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "fish", "ksh", "mksh", "csh", "tcsh", "nu", "elvish", "xonsh",
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
            || has("do you want to proceed?")
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
    }
}

//! The dialog on an agent's screen, when fleetd recognises one (SPEC §20): its lines as shown,
//! and the choices it offers with what to type for each. Pure: a screen's text in.
//!
//! What is matched, each from the real CLI's screen:
//! - **A numbered choice list under a question**, the form Claude Code's permission prompt and
//!   Codex's approval prompts take: a line ending in `?`, then options `1. …`, `2. …` in order
//!   (one marked by the cursor, `❯` in Claude Code, `›` or `>` in Codex), then a footer naming
//!   Esc. Claude Code 2.1.332, a Bash command waiting:
//!   ```text
//!    Do you want to proceed?
//!    ❯ 1. Yes
//!      2. Yes, and always allow access to /work from this project
//!      3. Yes, and switch to auto mode · auto mode handles these prompts for you
//!      4. No
//!
//!    Esc to cancel · Tab to amend
//!   ```
//!   A digit picks its option in Claude Code's list. Codex 0.171 marks an option's own key in
//!   parentheses (`1. Yes, proceed (y)`), sometimes on the option's wrapped second line; that
//!   key is typed where shown (both captured from the real CLIs: the tests below).
//! - **A question alone** (`Allow command?`, `Run this command?`, herdr's manifests' dialog
//!   lines): recognised, with no choices fleetd would type.
//!
//! The dialog's lines run from the rule (`───`) or blank line above its header down to its
//! footer, at most [`MAX_LINES`], each cleaned of control sequences (`sanitize::clean_line`).

use crate::sanitize::clean_line;

/// The most lines of a dialog kept.
pub const MAX_LINES: usize = 24;

/// How many non-empty bottom lines a dialog is looked for in.
const LOOK: usize = 30;

/// Questions that are a dialog on their own, lower-cased (herdr 0.8.2's detection manifests,
/// `src/detect/manifests/`: claude.toml:140-192, codex.toml:45-56, and the gemini, opencode,
/// cursor and amp manifests).
const QUESTIONS: &[&str] = &[
    "do you want to proceed?",
    "do you want to allow this connection?",
    "allow command?",
    "run this command?",
    "would you like to run the following command?",
    "mcp server to run tool",
];

/// One choice a dialog offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// How it is named: its number (`1`).
    pub key: String,
    /// Its words as shown (`Yes, and always allow access to /work from this project`).
    pub label: String,
    /// What typing it takes: its own shortcut where the dialog shows one, else its number.
    pub keys: String,
}

/// A dialog on screen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialog {
    /// Its lines as shown, top to bottom, cleaned.
    pub lines: Vec<String>,
    /// Its question.
    pub question: String,
    /// Its choices, in order (empty when fleetd knows none to type).
    pub choices: Vec<Choice>,
}

impl Dialog {
    /// A short stable name of this dialog's text: the same dialog on screen again has the same
    /// one, so an answer meant for it is typed only while it is still there. (FNV-1a 64 over
    /// its question and choices, which the cursor's place does not change.)
    pub fn fingerprint(&self) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |s: &str| {
            for b in s.bytes().chain([0]) {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(&self.question);
        for c in &self.choices {
            eat(&c.key);
            eat(&c.label);
        }
        format!("{hash:016x}")
    }

    /// The choice named `key` (its number, or its label, case-insensitive).
    pub fn choice(&self, key: &str) -> Option<&Choice> {
        let key = key.trim();
        self.choices
            .iter()
            .find(|c| c.key == key || c.label.eq_ignore_ascii_case(key))
    }
}

/// An option line: `❯ 1. Yes`, `  2. No`, `› 1. Yes, proceed (y)`: its number and words.
fn option(line: &str) -> Option<(u32, String)> {
    let t = line.trim_start();
    let t = t
        .strip_prefix(['❯', '›', '>', '▶'])
        .map_or(t, str::trim_start);
    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || digits.len() > 2 {
        return None;
    }
    let label = t[digits.len()..].strip_prefix(". ")?.trim();
    let n = digits.parse().ok()?;
    (!label.is_empty()).then(|| (n, label.to_owned()))
}

/// Codex's own key for an option, shown last in parentheses: `Yes, proceed (y)` → `y`.
fn shortcut(label: &str) -> Option<String> {
    let inner = label.strip_suffix(')')?.rsplit_once('(')?.1;
    let one = inner.chars().count() == 1 && inner.chars().all(|c| c.is_ascii_alphanumeric());
    one.then(|| inner.to_owned())
}

/// Whether `line` is a box rule (`────`, `╌╌╌╌`).
fn rule(line: &str) -> bool {
    let t = line.trim();
    t.chars().count() >= 8 && t.chars().all(|c| matches!(c, '─' | '╌' | '━' | '═' | '-'))
}

/// The dialog at the bottom of `screen`, if fleetd recognises one.
pub fn recognise(screen: &str) -> Option<Dialog> {
    let lines: Vec<&str> = screen.lines().collect();
    let end = lines.iter().rposition(|l| !l.trim().is_empty())? + 1;
    let mut seen = 0;
    let mut start = end;
    while start > 0 && seen < LOOK {
        start -= 1;
        if !lines[start].trim().is_empty() {
            seen += 1;
        }
    }
    let window = &lines[start..end];
    numbered(window).or_else(|| question_alone(window))
}

/// A question followed by a numbered list starting at 1, in the bottom `window`.
fn numbered(window: &[&str]) -> Option<Dialog> {
    // The last list on screen: its first option `1.`, then the options in order.
    let first = window
        .iter()
        .rposition(|l| option(l).is_some_and(|(n, _)| n == 1))?;
    let mut choices: Vec<Choice> = Vec::new();
    let mut last = first;
    let mut blank = false;
    for (i, line) in window.iter().enumerate().skip(first) {
        match option(line) {
            Some((n, label)) if n as usize == choices.len() + 1 => {
                choices.push(Choice {
                    key: n.to_string(),
                    keys: String::new(),
                    label: clean_line(&label),
                });
                last = i;
                blank = false;
            }
            Some(_) => break,
            None if line.trim().is_empty() => blank = true,
            // A long option wrapped onto the next line, indented under its words (Codex 0.171:
            // "2. Yes, and don't ask again for commands that start with `echo approved >" then
            // "     ran.txt` (p)"); the footer comes after a blank line.
            None if !blank
                && line.starts_with("   ")
                && !line.to_lowercase().contains("esc to") =>
            {
                if let Some(choice) = choices.last_mut() {
                    choice.label = format!("{} {}", choice.label, clean_line(line));
                    last = i;
                }
            }
            None => {}
        }
    }
    if choices.len() < 2 {
        return None;
    }
    for choice in &mut choices {
        choice.keys = shortcut(&choice.label).unwrap_or_else(|| choice.key.clone());
    }
    // The question: the nearest line above the list ending in `?` (a tip may sit between in
    // Claude Code; Codex shows the environment, the reason and the command between).
    let asked = window[..first]
        .iter()
        .rev()
        .take(12)
        .position(|l| l.trim_end().ends_with('?'))
        .map(|back| first - 1 - back)?;
    // After the list: a footer naming Esc, within a few lines (the form both CLIs close with).
    let footer = window[last + 1..]
        .iter()
        .take(4)
        .position(|l| l.to_lowercase().contains("esc"))
        .map(|at| last + 1 + at);
    let bottom = footer.unwrap_or(last);
    if footer.is_none() && !is_known_question(window[asked]) {
        return None;
    }
    Some(Dialog {
        lines: shown(window, asked, bottom),
        question: clean_line(window[asked]),
        choices,
    })
}

fn is_known_question(line: &str) -> bool {
    let lower = line.to_lowercase();
    QUESTIONS.iter().any(|q| lower.contains(q))
}

/// One of the known questions alone, in the bottom lines.
fn question_alone(window: &[&str]) -> Option<Dialog> {
    let at = window
        .iter()
        .enumerate()
        .rev()
        .take(8)
        .find(|(_, l)| is_known_question(l))
        .map(|(i, _)| i)?;
    let bottom = window
        .iter()
        .rposition(|l| !l.trim().is_empty())
        .unwrap_or(at);
    Some(Dialog {
        lines: shown(window, at, bottom),
        question: clean_line(window[at]),
        choices: Vec::new(),
    })
}

/// The dialog's lines: from the solid rule that opens its box (Claude Code draws one, with
/// the command between dashed rules below it), else the blank line above its question, down to
/// `bottom`; at most [`MAX_LINES`] (the bottom ones kept), cleaned, rules left out.
fn shown(window: &[&str], question: usize, bottom: usize) -> Vec<String> {
    let above = &window[..question];
    let solid = above
        .iter()
        .rposition(|l| rule(l) && l.trim_start().starts_with('─'))
        .filter(|&s| question - s <= 12);
    let top = match solid {
        Some(s) => s + 1,
        None => above
            .iter()
            .rposition(|l| l.trim().is_empty())
            .filter(|&b| question - b <= 6)
            .map_or(question, |b| b + 1),
    };
    let top = top.max(bottom.saturating_sub(MAX_LINES - 1));
    window[top..=bottom]
        .iter()
        .map(|l| clean_line(l))
        .filter(|l| !l.is_empty() && !rule(l))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts `dialog` shows the command it asks about as the line `command` and ends with
    /// `last` (the agent's own hint of how to answer).
    fn assert_shows(dialog: &Dialog, command: &str, last: &str) {
        assert!(
            dialog.lines.iter().any(|l| l == command),
            "{command:?}: {:#?}",
            dialog.lines
        );
        assert_eq!(dialog.lines.last().map(String::as_str), Some(last));
    }

    /// Claude Code 2.1.332 asking for a Bash command, as tmux shows it (captured from the real
    /// CLI in the real-agents suite).
    const CLAUDE: &str = "\
❯ @bash echo approved > ran.txt @reply done

  Running what the task asks
  ⎿  $ echo approved > ran.txt

────────────────────────────────────────────────────────────────────────────────
 Bash command
 Tip: auto mode handles these prompts for you — choose \"switch to auto mode\"
 below
 Run what the task asks
╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌
 echo approved > ran.txt
╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌╌
 Do you want to proceed?
 ❯ 1. Yes
   2. Yes, and always allow access to /tmp/w/work from this project
   3. Yes, and switch to auto mode · auto mode handles these prompts for you
   4. No

 Esc to cancel · Tab to amend

";

    #[test]
    fn claude_codes_permission_prompt_is_read_whole_with_its_choices() {
        let d = recognise(CLAUDE).expect("a dialog");
        assert_eq!(d.question, "Do you want to proceed?");
        let keys: Vec<(&str, &str)> = d
            .choices
            .iter()
            .map(|c| (c.key.as_str(), c.keys.as_str()))
            .collect();
        assert_eq!(keys, [("1", "1"), ("2", "2"), ("3", "3"), ("4", "4")]);
        assert_eq!(d.choices[0].label, "Yes");
        assert_eq!(d.choices[3].label, "No");
        assert_eq!(d.lines.first().map(String::as_str), Some("Bash command"));
        assert_shows(
            &d,
            "echo approved > ran.txt",
            "Esc to cancel · Tab to amend",
        );
        assert!(
            !d.lines.iter().any(|l| l.contains("@bash")),
            "the prompt above is not the dialog"
        );
        assert_eq!(d.choice("4"), d.choice("no"));
    }

    /// The fingerprint of the dialog on `screen`, which must show one.
    fn fingerprint(screen: &str) -> String {
        recognise(screen).expect("a dialog").fingerprint()
    }

    #[test]
    fn the_cursor_moving_keeps_the_same_dialog() {
        let moved = CLAUDE
            .replace(" ❯ 1. Yes", "   1. Yes")
            .replace("   4. No", " ❯ 4. No");
        assert_eq!(fingerprint(CLAUDE), fingerprint(&moved));
        let other = CLAUDE
            .replace("echo approved", "rm -rf build")
            .replace("/tmp/w/work", "/x");
        assert_ne!(fingerprint(CLAUDE), fingerprint(&other));
    }

    /// Codex 0.171 asking to run a command outside its sandbox (`approval_policy =
    /// "on-request"`), as tmux shows it (captured from the real CLI in the real-agents suite).
    const CODEX: &str = "\
› @exec echo approved > ran.txt @reply done


• Running echo approved > ran.txt


  Would you like to run the following command?

  Environment: local

  Reason: the task asks for it

  $ echo approved > ran.txt


› 1. Yes, proceed (y)
  2. Yes, and don't ask again for commands that start with `echo approved >
     ran.txt` (p)
  3. No, and tell Codex what to do differently (esc)

  Press enter to confirm or esc to cancel
";

    #[test]
    fn codex_options_are_typed_by_their_own_key_even_when_wrapped() {
        let d = recognise(CODEX).expect("a dialog");
        assert_eq!(d.question, "Would you like to run the following command?");
        let keys: Vec<&str> = d.choices.iter().map(|c| c.keys.as_str()).collect();
        // (`esc` is not one key: the number is typed for it.)
        assert_eq!(keys, ["y", "p", "3"]);
        assert_eq!(
            d.choices[1].label,
            "Yes, and don't ask again for commands that start with `echo approved > ran.txt` (p)"
        );
        assert_shows(
            &d,
            "$ echo approved > ran.txt",
            "Press enter to confirm or esc to cancel",
        );
    }

    #[test]
    fn a_known_question_alone_is_a_dialog_without_choices() {
        let d = recognise("output\nAllow command?\n  rm -rf build\n").expect("a dialog");
        assert!(d.choices.is_empty());
        assert_eq!(d.question, "Allow command?");
    }

    #[test]
    fn a_numbered_list_in_an_answer_is_no_dialog() {
        let answer = "\
● Here is the plan:
  1. Read the code
  2. Write the test
  3. Run it

❯ \n";
        assert_eq!(recognise(answer), None);
        assert_eq!(recognise(""), None);
        assert_eq!(recognise("❯ "), None);
    }
}

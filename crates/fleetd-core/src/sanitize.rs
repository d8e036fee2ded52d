//! What may be typed into a terminal pane. Owns the rule that injected text carries no terminal
//! control sequences and stays within a byte budget; a task too long to type is replaced by a
//! short pointer to the inbox. Pure text in, text out.

use crate::ids::Ticket;

/// What to type into a member's pane for one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Injection {
    /// The task itself, cleaned; it fits the budget.
    Inline(String),
    /// The task is too long to type: a one-line pointer telling the agent where to read it.
    Pointer(String),
}

impl Injection {
    /// The text to type.
    pub fn text(&self) -> &str {
        match self {
            Self::Inline(t) | Self::Pointer(t) => t,
        }
    }
}

/// Removes every terminal control sequence and control character from `text` and folds line
/// breaks and tabs into single spaces, so typing the result can neither drive the terminal nor
/// submit early. ESC sequences (CSI, OSC, DCS and two-byte forms) are dropped whole, as are C0
/// and C1 controls and DEL.
pub fn clean_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut pending_space = false;
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => skip_escape(&mut chars),
            // 8-bit CSI/OSC/DCS introducers: skip their bodies like the 7-bit forms.
            '\u{9b}' => skip_until_final(&mut chars),
            '\u{9d}' | '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            '\n' | '\r' | '\t' | ' ' => pending_space = !out.is_empty(),
            c if c.is_control() => {}
            c => {
                if pending_space {
                    out.push(' ');
                    pending_space = false;
                }
                out.push(c);
            }
        }
    }
    out
}

fn skip_escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    match chars.next() {
        Some('[') => skip_until_final(chars),
        Some(']' | 'P' | 'X' | '^' | '_') => skip_string(chars),
        // Two-byte escapes with an intermediate (e.g. `ESC ( B`): drop the next char too.
        Some('(' | ')' | '*' | '+' | '#' | '%') => {
            chars.next();
        }
        _ => {}
    }
}

/// CSI: parameters and intermediates up to a final byte in `@`..=`~`.
fn skip_until_final(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    for c in chars.by_ref() {
        if ('@'..='~').contains(&c) {
            break;
        }
    }
}

/// OSC/DCS/SOS/PM/APC: a string ended by BEL or ST (`ESC \` or U+009C).
fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => break,
            '\u{1b}' => {
                if chars.peek() == Some(&'\\') {
                    chars.next();
                }
                break;
            }
            _ => {}
        }
    }
}

/// Decides what to type for `task`: the cleaned task when it fits in `max_bytes`, else a pointer
/// naming `ticket`.
pub fn plan_injection(task: &str, ticket: Ticket, max_bytes: usize) -> Injection {
    let cleaned = clean_line(task);
    if !cleaned.is_empty() && cleaned.len() <= max_bytes {
        Injection::Inline(cleaned)
    } else {
        Injection::Pointer(format!(
            "[fleet] task {ticket} is too long to type here: call fleet_poll(ticket=\"{ticket}\") to read it, then do it and answer with fleet_reply"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(input: &str, expect: &str) {
        assert_eq!(clean_line(input), expect, "input {input:?}");
    }

    #[test]
    fn control_sequences_are_removed() {
        check("plain text", "plain text");
        check("red \u{1b}[31mword\u{1b}[0m", "red word");
        check("title\u{1b}]0;evil\u{7}after", "titleafter");
        check("osc st\u{1b}]52;c;ZXZpbA==\u{1b}\\done", "osc stdone");
        check("dcs\u{1b}P1;2|data\u{1b}\\ok", "dcsok");
        check("charset\u{1b}(Bok", "charsetok");
        check("c1 \u{9b}2Jcsi", "c1 csi");
        check("bell\u{7} del\u{7f} nul\u{0}", "bell del nul");
        check("line one\nline two\r\n\tthree", "line one line two three");
        check("  leading and trailing  ", "leading and trailing");
        check(
            "quotes \"'` and unicode ✓ 日本",
            "quotes \"'` and unicode ✓ 日本",
        );
    }

    #[test]
    fn long_or_empty_tasks_become_a_pointer() {
        let ticket = Ticket::from_parts(1, [1; 10]);
        assert_eq!(
            plan_injection("do it", ticket, 4096),
            Injection::Inline("do it".into())
        );
        let long = "x".repeat(5000);
        let plan = plan_injection(&long, ticket, 4096);
        assert!(matches!(plan, Injection::Pointer(_)));
        assert!(plan.text().contains(&ticket.to_string()));
        assert!(matches!(
            plan_injection("\u{1b}[2J", ticket, 10),
            Injection::Pointer(_)
        ));
    }

    proptest! {
        #[test]
        fn cleaned_text_never_has_controls(s in any::<String>()) {
            let out = clean_line(&s);
            prop_assert!(!out.chars().any(char::is_control), "{out:?}");
        }

        #[test]
        fn injections_fit_their_budget(s in any::<String>(), max in 200usize..5000) {
            let ticket = Ticket::from_parts(7, [2; 10]);
            let plan = plan_injection(&s, ticket, max);
            prop_assert!(plan.text().len() <= max);
            prop_assert!(!plan.text().chars().any(char::is_control));
        }
    }
}

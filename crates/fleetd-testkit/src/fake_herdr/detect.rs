//! herdr's agent detection, as fake-herdr models it: which agent runs in a pane, and what state
//! its screen shows. Paths and lines are herdr's (`github:herdrdev/herdr`, tag v0.8.2).
//!
//! **Identification** (`src/pane.rs:613-666`, `src/detect/mod.rs:188-250, 338-389, 468-653`): the
//! pane's foreground process group (`tpgid` of the shell). Its leader's `HERDR_AGENT` hint, then
//! the leader's name; then the other members' hints, then their names (best score, lowest pid on
//! a tie). A name is the process's `comm`, lowercased, with one of `.exe .cmd .bat .ps1 .js`
//! stripped; a generic runtime (`node`, `bun`, a shell, `python`) is looked through to the
//! script it runs (its first argument that is no option; `-e`/`-p`/`-c`/`-m` give up); failing
//! that, the basename of argv[0]. So the Claude Code npm package's native `claude.exe` is
//! `claude`, and Codex's `node …/bin/codex` is `codex`.
//!
//! **State** (`src/detect/manifest.rs:424-542, 1144-1499`): every rule of the agent's manifest is
//! tried, the highest priority that matches wins, none means idle; `contains` is
//! case-insensitive. Claude follows `src/detect/manifests/claude.toml` with the rules herdr's
//! manifest update of 2026-08-21 adds (`live_turn_working` and the background ones, priority
//! 970/965): herdr 0.8.2 downloads newer manifests at run time (`manifest_update.rs:15-16`), and
//! Claude Code 2.1.332 never spins its title, so without them its turns read idle. Codex follows
//! `codex.toml`. Left out: the rules that freeze the state (transcript viewers, the model
//! picker) and Claude's `/btw` overlay.

use procfs::process::Process;

use super::pane::KNOWN_AGENTS;

/// The agent state `agent`'s pane shows: `working`, `blocked` or `idle`.
pub(crate) fn classify(agent: &str, title: Option<&str>, screen: &str) -> &'static str {
    let screen = Screen::new(screen);
    match agent {
        "codex" => codex(title, &screen),
        _ => claude(title, &screen),
    }
}

/// A screen's lines, lowercased for `contains` rules.
struct Screen {
    raw: Vec<String>,
    lower: Vec<String>,
}

impl Screen {
    fn new(text: &str) -> Self {
        let raw: Vec<String> = text.lines().map(|l| l.trim_end().to_owned()).collect();
        let lower = raw.iter().map(|l| l.to_lowercase()).collect();
        Self { raw, lower }
    }

    /// The last `n` non-empty lines (lowercased).
    fn bottom(&self, n: usize) -> Vec<&str> {
        let mut lines: Vec<&str> = self
            .lower
            .iter()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(n)
            .map(String::as_str)
            .collect();
        lines.reverse();
        lines
    }

    /// Indexes of horizontal rules: `─` only, or three or more then text (manifest.rs:1480-1499).
    fn rules(&self) -> Vec<usize> {
        self.raw
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                let t = l.trim();
                let dashes = t.chars().take_while(|c| *c == '─').count();
                (dashes > 0 && dashes == t.chars().count()) || dashes >= 3
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The lines after the last horizontal rule (all of them when there is none).
    fn after_last_rule(&self) -> &[String] {
        let from = self.rules().last().map_or(0, |i| i + 1);
        &self.lower[from..]
    }

    /// The prompt box: between the second-to-last rule and the last.
    fn prompt_box(&self) -> &[String] {
        match self.rules().as_slice() {
            [.., a, b] => &self.lower[a + 1..*b],
            _ => &[],
        }
    }

    /// The lines after the last prompt marker (`›` alone or `› …`), all when there is none.
    fn after_last_marker(&self) -> &[String] {
        let from = self
            .raw
            .iter()
            .rposition(|l| {
                let t = l.trim();
                t == "›" || t.starts_with("› ")
            })
            .map_or(0, |i| i + 1);
        &self.lower[from..]
    }

    fn has(&self, needle: &str) -> bool {
        has(&self.lower, needle)
    }
}

fn has<S: AsRef<str>>(lines: &[S], needle: &str) -> bool {
    lines.iter().any(|l| l.as_ref().contains(needle))
}

/// The title's first character is one of `glyphs` and a space follows.
fn title_spins(title: Option<&str>, glyph: impl Fn(char) -> bool) -> bool {
    title.is_some_and(|t| {
        let mut chars = t.chars();
        chars.next().is_some_and(&glyph) && chars.next() == Some(' ')
    })
}

/// A dialog's option line: `1. Yes`, `❯ 2. No` (case-insensitive).
fn option_line(line: &str, numbers: &[char], word: &str) -> bool {
    let t = line.trim_start().trim_start_matches('❯').trim_start();
    let mut chars = t.chars();
    chars.next().is_some_and(|c| numbers.contains(&c))
        && chars.as_str().starts_with('.')
        && chars.as_str()[1..].trim_start().starts_with(word)
}

fn claude(title: Option<&str>, s: &Screen) -> &'static str {
    // 1100 osc_title_working.
    if title_spins(title, |c| {
        ('\u{2800}'..='\u{28FF}').contains(&c) || ('\u{25D0}'..='\u{25D3}').contains(&c)
    }) {
        return "working";
    }
    // 980 live_blocked_form.
    let form = s.after_last_rule();
    let navigate = [
        "tab/arrow keys to navigate",
        "arrow keys to navigate",
        "arrows to navigate",
        "↑/↓ to navigate",
        "↑↓ to navigate",
    ];
    if has(form, "esc to cancel")
        && (has(form, "enter to confirm")
            || (has(form, "enter to select") && navigate.iter().any(|n| has(form, n))))
    {
        return "blocked";
    }
    // 970 live_turn_working, 965 the background rules.
    let bottom = s.bottom(12);
    if bottom
        .iter()
        .any(|l| claude_footer_interrupt(l) || claude_activity(l) || claude_background(l))
    {
        return "working";
    }
    // 950 live_prompt_box.
    let prompt = s.prompt_box();
    let modal = [
        "enter to select",
        "esc to cancel",
        "tab/arrow keys",
        "arrow keys to navigate",
        "↑/↓ to navigate",
    ];
    if prompt.iter().any(|l| l.trim_start().starts_with('❯'))
        && !modal.iter().any(|m| has(prompt, m))
    {
        return "idle";
    }
    // 850 bash_permission_prompt, 840 generic_permission_prompt.
    let options = |lines: &[String]| {
        lines.iter().any(|l| {
            option_line(l, &['1', '2'], "yes")
                || option_line(l, &['2', '3'], "no")
                || l.trim_start()
                    .trim_start_matches('❯')
                    .trim_start()
                    .starts_with("yes")
        })
    };
    if s.has("do you want to proceed?") {
        let bash = [
            "bash command",
            "bash(",
            "contains expansion",
            "tab to amend",
            "ctrl+e to explain",
        ];
        if bash.iter().any(|b| s.has(b)) && options(&s.lower) {
            return "blocked";
        }
        if has(form, "do you want to proceed?") && has(form, "esc to cancel") && options(form) {
            return "blocked";
        }
    }
    // 300 legacy_no_prompt_blocker.
    let bare_prompt = s.raw.iter().any(|l| l.trim() == "❯");
    let asks = |q: &str| s.has(q) && (s.has("yes") || s.has("❯"));
    if !bare_prompt
        && (asks("do you want to")
            || asks("would you like to")
            || s.has("waiting for permission")
            || s.has("do you want to allow this connection?")
            || s.has("tab to amend")
            || s.has("ctrl+e to explain")
            || (s.has("do you want to proceed?") && s.has("esc to cancel"))
            || s.has("review your answers")
            || s.has("skip interview and plan immediately"))
    {
        return "blocked";
    }
    "idle"
}

/// `^\s*[⏸⏵].*esc to interrupt(?:\s|·|$)`.
fn claude_footer_interrupt(line: &str) -> bool {
    let t = line.trim_start();
    if !(t.starts_with('⏸') || t.starts_with('⏵')) {
        return false;
    }
    t.match_indices("esc to interrupt").any(|(at, m)| {
        let rest = &t[at + m.len()..];
        rest.is_empty() || rest.starts_with(char::is_whitespace) || rest.starts_with('·')
    })
}

/// `^\s*[*·✢✶✻✽]\s+\S.*…(?:\s+\(\d+[smh](?:\s|·)|\s*$)`.
fn claude_activity(line: &str) -> bool {
    let t = line.trim_start();
    let mut chars = t.chars();
    if !chars
        .next()
        .is_some_and(|c| ['*', '·', '✢', '✶', '✻', '✽'].contains(&c))
    {
        return false;
    }
    let rest = chars.as_str();
    if !rest.starts_with(char::is_whitespace) {
        return false;
    }
    let rest = rest.trim_start();
    if rest.is_empty() {
        return false;
    }
    rest.match_indices('…')
        .skip_while(|(at, _)| *at == 0)
        .any(|(at, m)| {
            let tail = &rest[at + m.len()..];
            if tail.trim().is_empty() {
                return true;
            }
            let Some(clock) = tail.trim_start().strip_prefix('(') else {
                return false;
            };
            if !tail.starts_with(char::is_whitespace) {
                return false;
            }
            let digits = clock.chars().take_while(char::is_ascii_digit).count();
            let after = &clock[digits..];
            digits > 0
                && after.starts_with(['s', 'm', 'h'])
                && after[1..].starts_with(|c: char| c.is_whitespace() || c == '·')
        })
}

/// Background work Claude Code shows in its footer: shells, agents, MCP tasks.
fn claude_background(line: &str) -> bool {
    let counted = |after: &str, what: &str| {
        line.match_indices(after).any(|(at, m)| {
            let rest = &line[at + m.len()..];
            let digits = rest.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && rest[digits..].starts_with(what)
        })
    };
    let t = line.trim_start();
    ((t.starts_with('⏸') || t.starts_with('⏵')) && counted("· ", " shell"))
        || counted("waiting for ", " background agent")
        || (counted("· ", " mcp task") && line.contains("still running"))
}

fn codex(title: Option<&str>, s: &Screen) -> &'static str {
    const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    // 1100 osc_title_blocked.
    if title.is_some_and(|t| t.to_lowercase().contains("action required")) {
        return "blocked";
    }
    // 1050 osc_title_working: a spinner glyph standing alone.
    if title.is_some_and(|t| {
        t.split(' ')
            .any(|w| w.chars().count() == 1 && w.chars().all(|c| SPINNER.contains(&c)))
    }) {
        return "working";
    }
    // 950 trust_directory.
    let top: Vec<&str> = s
        .raw
        .iter()
        .filter(|l| !l.trim().is_empty())
        .take(20)
        .map(String::as_str)
        .collect();
    if top
        .first()
        .is_some_and(|l| l.trim_start().starts_with("> You are in "))
        && top
            .iter()
            .any(|l| l.contains("Do you trust the contents of this directory?"))
    {
        return "blocked";
    }
    // 900 live_strong_blocker.
    let live = s.after_last_marker();
    if [
        "press enter to confirm or esc to cancel",
        "enter to submit answer",
        "enter to submit all",
        "allow command?",
    ]
    .iter()
    .any(|n| has(live, n))
    {
        return "blocked";
    }
    // 600 weak_blocker.
    let asks = |q: &str| s.has(q) && (s.has("yes") || s.has("❯"));
    if s.has("[y/n]") || s.has("yes (y)") || asks("do you want to") || asks("would you like to") {
        return "blocked";
    }
    // 500 screen_working_fallback (case-sensitive): `• Working (4s • esc to interrupt)`.
    let interrupted = s
        .raw
        .iter()
        .any(|l| l.contains("■ Conversation interrupted"));
    let bottom: Vec<&String> = s
        .raw
        .iter()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect();
    if !interrupted && bottom.iter().any(|l| codex_working(l)) {
        return "working";
    }
    "idle"
}

/// `^[•◦]\s+Working \([^)]*esc to interrupt\)(?: · .*)?$`.
fn codex_working(line: &str) -> bool {
    let Some(rest) = line.strip_prefix('•').or_else(|| line.strip_prefix('◦')) else {
        return false;
    };
    if !rest.starts_with(char::is_whitespace) {
        return false;
    }
    let Some(inner) = rest.trim_start().strip_prefix("Working (") else {
        return false;
    };
    let Some(close) = inner.find(')') else {
        return false;
    };
    let tail = &inner[close + 1..];
    inner[..close].ends_with("esc to interrupt") && (tail.is_empty() || tail.starts_with(" · "))
}

/// The agent kind in the foreground of the pane whose session leader is `shell_pid`.
pub(crate) fn identify(shell_pid: u32) -> Option<String> {
    let shell = Process::new(i32::try_from(shell_pid).ok()?).ok()?;
    let group = shell.stat().ok()?.tpgid;
    let leader = Process::new(group).ok()?;
    if let Some(kind) = hint(&leader).or_else(|| named(&leader).map(|(kind, _)| kind)) {
        return Some(kind);
    }
    let mut members: Vec<Process> = procfs::process::all_processes()
        .ok()?
        .flatten()
        .filter(|p| p.pid != group && p.stat().is_ok_and(|s| s.pgrp == group))
        .collect();
    members.sort_by_key(|p| p.pid);
    if let Some(kind) = members.iter().find_map(hint) {
        return Some(kind);
    }
    let mut best: Option<(String, u8)> = None;
    for (kind, score) in members.iter().filter_map(named) {
        if best.as_ref().is_none_or(|(_, s)| score > *s) {
            best = Some((kind, score));
        }
    }
    best.map(|(kind, _)| kind)
}

/// The `HERDR_AGENT` hint in a process's environment.
fn hint(process: &Process) -> Option<String> {
    let environ = process.environ().ok()?;
    let kind = environ
        .get(std::ffi::OsStr::new("HERDR_AGENT"))?
        .to_string_lossy();
    KNOWN_AGENTS
        .contains(&kind.as_ref())
        .then(|| kind.into_owned())
}

/// The agent a process's name says, with herdr's score: 3 through a runtime's script, 2 by
/// its own name or argv[0].
fn named(process: &Process) -> Option<(String, u8)> {
    let comm = normalize(&process.stat().ok()?.comm);
    let argv = process.cmdline().unwrap_or_default();
    if let Some(script) = runtime_script(&comm, &argv) {
        return alias(&normalize(basename(script))).map(|k| (k, 3));
    }
    if is_runtime(&comm) {
        return None;
    }
    alias(&comm)
        .or_else(|| alias(&normalize(basename(argv.first()?))))
        .map(|k| (k, 2))
}

fn is_runtime(name: &str) -> bool {
    matches!(
        name,
        "sh" | "bash" | "zsh" | "fish" | "tmux" | "node" | "bun" | "cmd" | "powershell" | "pwsh"
    ) || name
        .strip_prefix("python")
        .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The script a runtime runs: its first argument that is no option. `None` for no runtime, or
/// one told to run code inline.
fn runtime_script<'a>(name: &str, argv: &'a [String]) -> Option<&'a str> {
    if !is_runtime(name) {
        return None;
    }
    let (inline, takes_value): (&[&str], &[&str]) = match name {
        "node" | "bun" => (
            &["-e", "--eval", "-p", "--print"],
            &[
                "-r",
                "--require",
                "--loader",
                "--import",
                "--experimental-loader",
                "--inspect-port",
                "-W",
                "-X",
                "-S",
                "-L",
                "-o",
            ],
        ),
        n if n.starts_with("python") => (&["-c", "-m"], &[]),
        _ => (&["-c"], &[]),
    };
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        if inline.contains(&arg.as_str()) {
            return None;
        }
        if arg == "--" {
            return args.next().map(String::as_str);
        }
        if takes_value.contains(&arg.as_str()) {
            args.next();
            continue;
        }
        if !arg.starts_with('-') {
            return Some(arg);
        }
    }
    None
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Lowercased, with one of herdr's suffixes stripped.
fn normalize(name: &str) -> String {
    let lower = name.trim().to_lowercase();
    for suffix in [".exe", ".cmd", ".bat", ".ps1", ".js"] {
        if let Some(stem) = lower.strip_suffix(suffix) {
            return stem.to_owned();
        }
    }
    lower
}

/// herdr's alias table, for the kinds fake-herdr knows.
fn alias(name: &str) -> Option<String> {
    let kind = if name == "claude-code" {
        "claude"
    } else {
        name
    };
    KNOWN_AGENTS.contains(&kind).then(|| kind.to_owned())
}

#[cfg(test)]
mod tests {
    use super::{classify, runtime_script};

    /// Claude Code 2.1.332 mid-turn: its title stays `✳ Claude Code`; the activity line and the
    /// footer say it works.
    #[test]
    fn claude_code_screens_classify_like_herdrs_manifest() {
        let title = Some("✳ Claude Code");
        let working = "❯ fix the flaky test\n✽ Beboppin'…\n────\n❯\u{a0}\n────\n  ⏵⏵ bypass permissions on (shift+tab to cycle) · esc to interrupt";
        let clock = "✻ Cultivating… (1s · ↓ 5 tokens)\n────\n❯\u{a0}\n────\n  ? for shortcuts";
        let done = "❯ fix the flaky test\n● OK\n✻ Cogitated for 0s\n────\n❯\u{a0}\n────\n  ⏵⏵ bypass permissions on (shift+tab to cycle)";
        let typed = "────\n❯ please press esc to interrupt the build…\n────\n  ? for shortcuts";
        let task = "────\n❯\u{a0}\n────\n  ⏵⏵ bypass permissions on · 1 MCP task still running · ↓ to manage";
        let dialog = "Bash command\n  rm -rf build\nDo you want to proceed?\n❯ 1. Yes\n  2. No\n\nEsc to cancel · Tab to amend";
        let form = "────\nAllow?\nEnter to confirm · Esc to cancel";
        check(
            "claude",
            &[
                (title, working, "working"),
                (title, clock, "working"),
                (title, done, "idle"),
                // Typed words are not a turn.
                (title, typed, "idle"),
                (title, task, "working"),
                (Some("⠂ Claude Code"), "", "working"),
                // A spinner needs a space.
                (Some("⠋"), "", "idle"),
                (title, dialog, "blocked"),
                (None, form, "blocked"),
                // A question alone, no options, no way out: herdr shows no blocker.
                (None, "Do you want to proceed?\n", "idle"),
            ],
        );
    }

    #[test]
    fn codex_screens_classify_like_herdrs_manifest() {
        let working = "› fix it\n\n• Working (4s • esc to interrupt)\n› Ask Codex to do anything\n  gpt-5 · 100% left";
        let approval = "Would you like to run the following command?\n\n  $ touch x\n\n› 1. Yes, proceed (y)\n  2. No (esc)\n\n  Press enter to confirm or esc to cancel";
        let interrupted = "■ Conversation interrupted\n• Working (4s • esc to interrupt)";
        check(
            "codex",
            &[
                (Some("work"), working, "working"),
                (Some("⠋ work"), "", "working"),
                (Some("Action Required"), "", "blocked"),
                (None, approval, "blocked"),
                (None, interrupted, "idle"),
                (None, "› Ask Codex to do anything", "idle"),
            ],
        );
    }

    /// Each case of `agent`'s: its pane's title and screen, and the status herdr's manifest
    /// gives them.
    fn check(agent: &str, cases: &[(Option<&str>, &str, &str)]) {
        for (title, screen, status) in cases {
            assert_eq!(
                classify(agent, *title, screen),
                *status,
                "{agent} titled {title:?} showing {screen:?}"
            );
        }
    }

    #[test]
    fn a_runtime_is_looked_through_to_its_script() {
        let argv = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            runtime_script("node", &argv(&["node", "/x/.bin/codex", "--yolo"])),
            Some("/x/.bin/codex")
        );
        assert_eq!(
            runtime_script("node", &argv(&["node", "-r", "hook.js", "codex.js"])),
            Some("codex.js")
        );
        assert_eq!(runtime_script("node", &argv(&["node", "-e", "x"])), None);
        assert_eq!(
            runtime_script("sh", &argv(&["sh", "-c", "claude; exit"])),
            None
        );
        assert_eq!(runtime_script("claude", &argv(&["claude"])), None);
    }
}

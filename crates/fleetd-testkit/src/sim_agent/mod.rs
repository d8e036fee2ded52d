//! sim-agent: a scripted stand-in for a coding agent, run in a pane as lead or member. It shows
//! a prompt (`❯ `), reads a submitted line, shows "working" like Claude Code does (a braille-spinner
//! terminal title plus a status line) and then acts per its script: call fleetd's MCP tools over
//! HTTP (`fleet_reply`, `fleet_ask`), end its turn silently, hang, block on an approval UI, or exit.
//! A test double: it must not be used by the daemon.
//!
//! Knobs (argument, else environment variable):
//! - `--script a,b,..` / `SIM_AGENT_SCRIPT`: one action per turn — `reply`, `ask`, `silent`,
//!   `hang`, `block`, `dialog` (a dialog straight away, never working), `permission` (a
//!   numbered permission prompt answered by one key, as Claude Code's), `exit`, `call` (the task is `TOOL {json}`: call it, reply with the result),
//!   `shell` (run the task with `sh -c` in the agent's own session, as an agent's shell tool does,
//!   and reply with its exit status and output), `print` (run it the same way, show its output
//!   in the pane and end the turn without replying), `delegate` (hand the task to a member of
//!   its own: `fleet_spawn` one from `SIM_AGENT_DELEGATE_PROFILE` named
//!   `SIM_AGENT_DELEGATE_NAME` unless it exists, `fleet_send` it the task without waiting, end
//!   the turn unanswered), `collect` (the prompt is a nudge: read every `fleet_poll(target="X")`
//!   it names, acknowledge what it read, and reply `collected: ...` with the texts), `answer`
//!   (the prompt is a nudge: answer every `fleet_answer(questionId="X", ...)` it names with
//!   `SIM_AGENT_ANSWER`, default `yes`, and end the turn unanswered); the last one repeats
//!   (default `reply`);
//! - `--work-ms N` / `SIM_AGENT_WORK_MS`: how long a turn shows working (default 1500; 0 shows no
//!   spinner at all, a turn too quick for a screen detection to see);
//! - `--reply T` / `SIM_AGENT_REPLY`: reply text, `{prompt}` replaced (default `sim-agent did: {prompt}`);
//! - `--question Q` / `SIM_AGENT_QUESTION`: the `fleet_ask` question (default `sim-agent asks about: {prompt}`);
//! - `--swallow N` / `SIM_AGENT_SWALLOW`: the first N Enters do not submit: the text stays in the
//!   composer as a draft (as when a TUI swallows the Enter glued to a paste), and each swallowed
//!   Enter is logged (`swallowed`), so a test can count them; the next Enter submits the draft;
//! - `--dialog-after-ms N` / `SIM_AGENT_DIALOG_AFTER_MS`: the permission prompt is drawn N ms
//!   after the title reads idle (default 0: at once), as an agent whose title and screen are
//!   written apart;
//! - `--log PATH` / `SIM_AGENT_LOG`: append one JSON line per event (ready, turn, tool call,
//!   turn done);
//! - `--connect ADDR` / `SIM_AGENT_CONNECT`: open a TCP connection to ADDR at start and hold it
//!   (writes `hello <pid> <tag>\n`, the tag from `--connect-tag` / `SIM_AGENT_CONNECT_TAG`);
//!   `--connect-depth N` / `SIM_AGENT_CONNECT_DEPTH`: make a descendant N
//!   levels down hold it instead (2 = a grandchild);
//! - `FLEETD_URL` (e.g. `http://127.0.0.1:7797`, path `/mcp` by default): fleetd's MCP endpoint; when
//!   set, sim-agent initializes an MCP session at start-up, as Claude Code does.

use std::time::Duration;

use anyhow::Context as _;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::http::mcp::McpClient;

/// The events a sim-agent's log (`--log` / `SIM_AGENT_LOG`) holds so far, one JSON object a
/// line; none while it is not there.
pub fn log_events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// How many events named `event` a sim-agent's log holds so far.
pub fn logged(path: &std::path::Path, event: &str) -> usize {
    log_events(path)
        .iter()
        .filter(|e| e["event"] == event)
        .count()
}

/// The prompts of the turns a sim-agent's log shows it took, in order.
pub fn log_turns(path: &std::path::Path) -> Vec<String> {
    log_events(path)
        .iter()
        .filter(|e| e["event"] == "turn")
        .map(|e| e["prompt"].as_str().unwrap_or_default().to_owned())
        .collect()
}

mod config;

pub use config::{Action, Config};

/// The braille spinner frames Claude Code puts in its terminal title while working.
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// Spinner frame period.
const FRAME: Duration = Duration::from_millis(100);

/// Entry point of the `sim-agent` binary.
pub async fn main(args: Vec<String>) -> anyhow::Result<()> {
    if let Some(i) = args.iter().position(|a| a == "--connect-chain") {
        let depth: u32 = args
            .get(i + 1)
            .context("--connect-chain needs a depth")?
            .parse()?;
        let addr = args
            .get(i + 2)
            .context("--connect-chain needs an address")?;
        let tag = args.get(i + 3).map_or("-", String::as_str);
        return connect_chain(depth, addr, tag).await;
    }
    let config = Config::from_args_and_env(&args)?;
    Agent::new(config).run().await
}

/// Holds a connection `depth` levels down: each level spawns the next and waits for it.
async fn connect_chain(depth: u32, addr: &str, tag: &str) -> anyhow::Result<()> {
    if depth > 0 {
        let exe = std::env::current_exe()?;
        let mut child = tokio::process::Command::new(exe)
            .args(["--connect-chain", &(depth - 1).to_string(), addr, tag])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()?;
        child.wait().await?;
        return Ok(());
    }
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("hello {} {tag}\n", std::process::id()).as_bytes())
        .await?;
    // Hold the connection until the other side closes it.
    let mut sink = [0u8; 256];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

struct Agent {
    config: Config,
    turn: usize,
    mcp: Option<McpClient>,
    /// Whether `initialize` succeeded; a failed start-up attempt is retried before a tool call.
    mcp_ready: bool,
    out: tokio::io::Stdout,
}

impl Agent {
    fn new(config: Config) -> Self {
        Self {
            config,
            turn: 0,
            mcp: None,
            mcp_ready: false,
            out: tokio::io::stdout(),
        }
    }

    async fn say(&mut self, text: &str) {
        let _ = self.out.write_all(text.as_bytes()).await;
        let _ = self.out.flush().await;
    }

    async fn title(&mut self, title: &str) {
        self.say(&format!("\x1b]0;{title}\x07")).await;
    }

    /// Claude Code's permission prompt, drawn the same way (question, numbered choices, an Esc
    /// footer), answered by one key without Enter (the terminal out of canonical mode, as a
    /// TUI's is): the key, logged as `dialog_answered`. The prompt is erased once answered.
    async fn permission(
        &mut self,
        lines: &mut tokio::io::Lines<BufReader<tokio::io::Stdin>>,
    ) -> anyhow::Result<String> {
        let stty = |args: &[&str]| {
            std::process::Command::new("stty")
                .args(args)
                .stdin(std::process::Stdio::inherit())
                .status()
        };
        // Out of canonical mode before the prompt shows: no key can be held for a line.
        stty(&["-icanon", "-echo", "min", "1"])?;
        self.title("sim-agent").await;
        if !self.config.dialog_after.is_zero() {
            tokio::time::sleep(self.config.dialog_after).await;
        }
        self.say(" Do you want to proceed?\r\n ❯ 1. Yes\r\n   2. No\r\n\r\n Esc to cancel\r\n")
            .await;
        let key = lines.get_mut().read_u8().await;
        stty(&["icanon", "echo"])?;
        let answer = char::from(key?).to_string();
        // Working again before the dialog is erased: no moment shows an idle agent.
        self.title(&format!("{} sim-agent working", SPINNER[0]))
            .await;
        self.say("\x1b[5A\x1b[J").await;
        self.log(&json!({ "event": "dialog_answered", "answer": answer }));
        Ok(answer)
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "a test double stamps its log with the wall clock, as its readers expect"
    )]
    fn log(&self, event: &Value) {
        let Some(path) = &self.config.log else { return };
        // Every line carries when it happened (µs since the epoch), for latency measurements.
        let mut event = event.clone();
        if let Some(map) = event.as_object_mut() {
            map.insert(
                "at_us".to_owned(),
                json!(jiff::Timestamp::now().as_microsecond()),
            );
            // Which member wrote it, when several share one log.
            if let Ok(who) = std::env::var("FLEETD_TARGET") {
                map.insert("who".to_owned(), json!(who));
            }
        }
        let mut line = event.to_string();
        line.push('\n');
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = written {
            eprintln!("sim-agent: cannot write log {}: {e}", path.display());
        }
    }

    async fn run(mut self) -> anyhow::Result<()> {
        if let Some(addr) = self.config.connect.clone() {
            let depth = self.config.connect_depth;
            let tag = self.config.connect_tag.clone();
            if depth == 0 {
                tokio::spawn(async move { connect_chain(0, &addr, &tag).await });
            } else {
                let exe = std::env::current_exe()?;
                tokio::process::Command::new(exe)
                    .args(["--connect-chain", &(depth - 1).to_string(), &addr, &tag])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()?;
            }
        }
        if let Some(url) = self.config.fleetd_url.clone() {
            let client = McpClient::new(&url)?.named("sim-agent");
            self.mcp = Some(if self.config.keep_alive {
                client.kept_alive()
            } else {
                client
            });
            self.ensure_mcp().await;
        }
        self.title("sim-agent").await;
        self.say(&format!("sim-agent ready (pid {})\r\n", std::process::id()))
            .await;
        self.log(&json!({ "event": "ready", "pid": std::process::id() }));
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        let mut draft = String::new();
        let mut swallow = self.config.swallow;
        loop {
            self.say("❯ ").await;
            let Some(line) = lines.next_line().await? else {
                return Ok(());
            };
            let mut prompt = strip_controls(&line);
            if prompt.trim().is_empty() {
                if draft.is_empty() {
                    continue;
                }
                prompt = std::mem::take(&mut draft);
            }
            if swallow > 0 {
                swallow -= 1;
                self.log(&json!({ "event": "swallowed", "prompt": prompt }));
                draft = prompt;
                continue;
            }
            // `@busy=MS ...`: a turn that only works for MS (a lead kept busy on cue, so a
            // benchmark can make it go idle at a moment it knows). Not a script step.
            if let Some(ms) = busy_prefix(&prompt) {
                self.log(&json!({ "event": "turn", "prompt": prompt, "action": "Busy" }));
                let scripted = std::mem::replace(&mut self.config.work, ms);
                self.work(false).await;
                self.config.work = scripted;
                self.title("sim-agent").await;
                self.log(&json!({ "event": "turn_done" }));
                self.say("sim-agent: turn done\r\n").await;
                continue;
            }
            let action = self.next_action();
            self.log(
                &json!({ "event": "turn", "prompt": prompt, "action": format!("{action:?}") }),
            );
            if action != Action::Dialog {
                self.work(action == Action::Hang).await;
            }
            match action {
                Action::Reply => {
                    let text = self.config.reply.replace("{prompt}", &prompt);
                    self.tool("fleet_reply", json!({ "text": text })).await;
                }
                Action::Ask => {
                    let question = self.config.question.replace("{prompt}", &prompt);
                    let answer = self
                        .tool("fleet_ask", json!({ "question": question }))
                        .await;
                    let text = format!("answer was: {}", answer.unwrap_or(Value::Null));
                    self.tool("fleet_reply", json!({ "text": text })).await;
                }
                Action::Call => {
                    let (name, args) = prompt.split_once(' ').unwrap_or((prompt.as_str(), "{}"));
                    let args: Value = serde_json::from_str(args).unwrap_or(Value::Null);
                    let result = self.tool(name, args).await;
                    let text =
                        serde_json::to_string(&result.unwrap_or(Value::Null)).unwrap_or_default();
                    self.tool("fleet_reply", json!({ "text": text })).await;
                }
                Action::Shell => {
                    let text = match tokio::process::Command::new("sh")
                        .args(["-c", &prompt])
                        .stdin(std::process::Stdio::null())
                        .output()
                        .await
                    {
                        Ok(out) => format!(
                            "exit {}\n{}{}",
                            out.status.code().unwrap_or(-1),
                            String::from_utf8_lossy(&out.stdout),
                            String::from_utf8_lossy(&out.stderr)
                        ),
                        Err(e) => format!("sim-agent could not run sh: {e}"),
                    };
                    self.tool("fleet_reply", json!({ "text": text })).await;
                }
                Action::Print => {
                    if let Ok(out) = tokio::process::Command::new("sh")
                        .args(["-c", &prompt])
                        .stdin(std::process::Stdio::null())
                        .output()
                        .await
                    {
                        let text = String::from_utf8_lossy(&out.stdout).replace('\n', "\r\n");
                        self.say(&text).await;
                    }
                }
                Action::Delegate => self.delegate(&prompt).await,
                Action::Collect => self.collect(&prompt).await,
                Action::Answer => self.answer(&prompt).await,
                Action::Silent | Action::Hang => {}
                Action::Block | Action::Dialog => {
                    // Waiting on the person, not working: the title's spinner stops (herdr's
                    // detection ranks a title spinner above any dialog, claude.toml p1100).
                    self.title("sim-agent").await;
                    self.say(
                        "Allow sim-agent to continue?\r\n  Enter to confirm · Esc to cancel\r\n",
                    )
                    .await;
                    let answer = lines.next_line().await?;
                    // A TUI erases its dialog once answered (the dialog's two lines and the
                    // echoed answer), as Claude Code's does: what stays on screen is not a dialog.
                    self.say("\x1b[3A\x1b[J").await;
                    self.log(&json!({ "event": "dialog_answered", "answer": answer }));
                }
                Action::Permission => {
                    let answer = self.permission(&mut lines).await?;
                    // Answered, the agent goes back to work (as Claude Code runs the command it
                    // was allowed): working again, never idle between the dialog and the reply.
                    self.work(false).await;
                    let text = if answer == "1" {
                        self.config.reply.replace("{prompt}", &prompt)
                    } else {
                        format!("denied: {prompt}")
                    };
                    self.tool("fleet_reply", json!({ "text": text })).await;
                }
                Action::Exit => {
                    self.say("sim-agent: exiting\r\n").await;
                    self.log(&json!({ "event": "exit" }));
                    return Ok(());
                }
            }
            self.title("sim-agent").await;
            self.log(&json!({ "event": "turn_done" }));
            self.say("sim-agent: turn done\r\n").await;
        }
    }

    fn next_action(&mut self) -> Action {
        let script = &self.config.script;
        let action = script
            .get(self.turn)
            .or(script.last())
            .copied()
            .unwrap_or(Action::Reply);
        self.turn += 1;
        action
    }

    /// Shows working for the configured time (forever when `hang`).
    async fn work(&mut self, hang: bool) {
        self.say("✻ Working… (esc to interrupt)\r\n").await;
        // 0 ms is a turn too quick for any screen detection to see working (no spinner frame).
        let frames = if hang {
            u128::MAX
        } else if self.config.work.is_zero() {
            0
        } else {
            (self.config.work.as_millis() / FRAME.as_millis()).max(1)
        };
        let mut i = 0u128;
        while i < frames {
            let frame = SPINNER[usize::try_from(i % 10).unwrap_or(0)];
            self.title(&format!("{frame} sim-agent working")).await;
            tokio::time::sleep(FRAME).await;
            i += 1;
        }
    }

    /// `delegate`: its own member (spawned unless `fleet_list` has it) gets the task, and the
    /// turn ends unanswered: fleetd nudges this agent when the member replies.
    async fn delegate(&mut self, prompt: &str) {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let profile = env("SIM_AGENT_DELEGATE_PROFILE").unwrap_or_else(|| "sim".to_owned());
        let name = env("SIM_AGENT_DELEGATE_NAME").unwrap_or_else(|| "sub".to_owned());
        let listed = self.tool("fleet_list", json!({})).await;
        let exists = listed
            .as_ref()
            .and_then(|l| l["structuredContent"]["members"].as_array())
            .is_some_and(|m| m.iter().any(|m| m["target"] == name.as_str()));
        if !exists {
            self.tool("fleet_spawn", json!({ "profile": profile, "name": name }))
                .await;
        }
        self.tool(
            "fleet_send",
            json!({ "target": name, "task": prompt, "wait": false }),
        )
        .await;
    }

    /// `collect`: the replies of every member the nudge names, read, acknowledged and passed
    /// on in one reply (to the task still open: the one it delegated).
    async fn collect(&mut self, prompt: &str) {
        let mut texts = Vec::new();
        for target in prompt.split("fleet_poll(target=\"").skip(1) {
            let Some((target, _)) = target.split_once('"') else {
                continue;
            };
            let polled = self.tool("fleet_poll", json!({ "target": target })).await;
            let replies = polled
                .as_ref()
                .and_then(|p| p["structuredContent"]["replies"].as_array().cloned())
                .unwrap_or_default();
            let ids: Vec<Value> = replies.iter().map(|r| r["msgId"].clone()).collect();
            texts.extend(
                replies
                    .iter()
                    .filter_map(|r| r["text"].as_str().map(str::to_owned)),
            );
            if !ids.is_empty() {
                self.tool("fleet_ack", json!({ "target": target, "msgIds": ids }))
                    .await;
            }
        }
        let text = format!("collected: {}", texts.join(" | "));
        self.tool("fleet_reply", json!({ "text": text })).await;
    }

    /// `answer`: every question the nudge names answered with `SIM_AGENT_ANSWER`; the turn
    /// ends unanswered (its own task waits on its members).
    async fn answer(&mut self, prompt: &str) {
        let text = std::env::var("SIM_AGENT_ANSWER")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "yes".to_owned());
        for id in prompt.split("fleet_answer(questionId=\"").skip(1) {
            if let Some((id, _)) = id.split_once('"') {
                let args = json!({ "questionId": id, "answer": text });
                self.tool("fleet_answer", args).await;
            }
        }
    }

    /// Calls a tool; logs and shows the outcome. `None` without fleetd or on failure.
    /// Initializes the MCP session unless that already succeeded.
    async fn ensure_mcp(&mut self) {
        let Some(client) = self.mcp.as_mut() else {
            return;
        };
        if self.mcp_ready {
            return;
        }
        match client.initialize().await {
            Ok(_) => {
                self.mcp_ready = true;
                self.log(&json!({ "event": "mcp_initialized" }));
            }
            Err(e) => self.log(&json!({ "event": "mcp_error", "error": e.to_string() })),
        }
    }

    async fn tool(&mut self, name: &str, arguments: Value) -> Option<Value> {
        self.ensure_mcp().await;
        self.log(&json!({ "event": "tool_start", "name": name }));
        let Some(client) = self.mcp.as_mut() else {
            self.log(
                &json!({ "event": "tool_skipped", "name": name, "reason": "FLEETD_URL not set" }),
            );
            return None;
        };
        // Working while the tool runs, as an agent's spinner keeps turning during a tool call
        // (a long one, like a fleet_spawn, would otherwise read as the turn's end).
        let outcome = {
            let call = client.call_tool(name, arguments.clone());
            tokio::pin!(call);
            let mut spinner = tokio::io::stdout();
            let mut frame = 0usize;
            loop {
                tokio::select! {
                    outcome = &mut call => break outcome,
                    () = tokio::time::sleep(FRAME) => {
                        frame += 1;
                        let title = format!("\x1b]0;{} sim-agent working\x07", SPINNER[frame % SPINNER.len()]);
                        let _ = spinner.write_all(title.as_bytes()).await;
                        let _ = spinner.flush().await;
                    }
                }
            }
        };
        match outcome {
            Ok(result) => {
                self.log(&json!({ "event": "tool", "name": name, "arguments": arguments, "result": result }));
                self.say(&format!("sim-agent: {name} ok\r\n")).await;
                Some(result)
            }
            Err(e) => {
                self.log(&json!({ "event": "tool_error", "name": name, "error": e.to_string() }));
                self.say(&format!("sim-agent: {name} failed: {e}\r\n"))
                    .await;
                None
            }
        }
    }
}

/// Drops escape sequences and control characters from a submitted line (bracketed-paste
/// markers included), keeping the text.
fn strip_controls(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ params final-byte
            if chars.peek() == Some(&'[') {
                chars.next();
                for n in chars.by_ref() {
                    if ('\x40'..='\x7e').contains(&n) {
                        break;
                    }
                }
            }
            continue;
        }
        if !c.is_control() {
            out.push(c);
        }
    }
    out
}

/// The work time of a `@busy=MS ...` prompt.
fn busy_prefix(prompt: &str) -> Option<Duration> {
    let rest = prompt.trim_start().strip_prefix("@busy=")?;
    let ms = rest.split_whitespace().next()?;
    ms.parse().ok().map(Duration::from_millis)
}

#[cfg(test)]
mod tests;

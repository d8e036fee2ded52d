//! Where the rig's user runs agents: a private tmux server, or `fake-herdr` (real PTYs behind
//! herdr's socket API and agent detection). Either is started with the user's environment, so
//! an agent opened in it has the user's HOME and PATH, as on a user's machine.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::fake_herdr::process::FakeHerdrProcess;
use crate::tmux::TmuxServer;

/// Which multiplexer a rig runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mux {
    /// A private tmux server.
    Tmux,
    /// `fake-herdr`.
    Herdr,
}

/// The user's multiplexer.
#[derive(Debug)]
pub enum Panes {
    /// tmux; targets are `session:window` or `%pane`.
    Tmux(TmuxServer),
    /// herdr; targets are pane ids.
    Herdr(FakeHerdrProcess),
}

impl Panes {
    /// Starts `mux` with `env` in `home`.
    pub fn start(mux: Mux, home: &Path, env: &[(String, String)]) -> Self {
        match mux {
            Mux::Tmux => Self::Tmux(TmuxServer::start_with_env(env).expect("private tmux server")),
            Mux::Herdr => Self::Herdr(
                FakeHerdrProcess::start_with_env(
                    &crate::bin_path("fake-herdr"),
                    &home.join("herdr.sock"),
                    env,
                )
                .expect("fake-herdr starts"),
            ),
        }
    }

    /// fleetd's configuration lines for this multiplexer.
    pub fn config(&self) -> String {
        match self {
            Self::Tmux(tmux) => format!(
                "multiplexer: tmux\ntmuxSocket: {}\n",
                tmux.socket().display()
            ),
            Self::Herdr(herdr) => format!(
                "multiplexer: herdr\nherdrSocket: {}\n",
                herdr.socket().display()
            ),
        }
    }

    /// The tmux server, for a test that drives tmux itself.
    pub fn tmux(&self) -> &TmuxServer {
        match self {
            Self::Tmux(tmux) => tmux,
            Self::Herdr(_) => panic!("this rig runs on herdr"),
        }
    }

    fn herdr(&self, method: &str, params: &Value) -> Value {
        let Self::Herdr(herdr) = self else {
            unreachable!("herdr call on tmux")
        };
        let reply = herdr.call(method, params).expect("fake-herdr answers");
        match reply.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {reply}"),
        }
    }

    fn tmux_out(&self, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.tmux().run_ok(args).stdout).into_owned()
    }

    /// Opens a window (tmux) or a tab in workspace `main` (herdr) named `name`, in `cwd`,
    /// running `argv` with `env` added; `user_env` is the user's environment (tmux gives a
    /// window opened from outside any session the client's PATH). On herdr the command is
    /// typed into the tab's shell, as a user starts an agent there. Returns its target.
    pub fn open(
        &self,
        name: &str,
        cwd: &Path,
        user_env: &[(String, String)],
        env: &[(&str, &str)],
        argv: &[&str],
    ) -> String {
        match self {
            Self::Tmux(tmux) => {
                let mut args: Vec<String> = ["new-window", "-d", "-t", "base", "-n", name, "-c"]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                args.push(cwd.display().to_string());
                for (k, v) in env {
                    args.push("-e".into());
                    args.push(format!("{k}={v}"));
                }
                args.extend(argv.iter().map(|a| (*a).to_owned()));
                crate::run_ok(
                    tmux.command()
                        .envs(user_env.iter().map(|(k, v)| (k, v)))
                        .args(&args),
                    "tmux new-window",
                );
                format!("base:{name}")
            }
            Self::Herdr(herdr) => {
                let root = herdr.open_tab(name).expect("a tab opens");
                let pane = root["pane_id"].as_str().expect("root pane id").to_owned();
                let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
                let mut line = format!("cd {} && exec env", quote(&cwd.display().to_string()));
                for (k, v) in env {
                    line.push(' ');
                    line.push_str(&quote(&format!("{k}={v}")));
                }
                for a in argv {
                    line.push(' ');
                    line.push_str(&quote(a));
                }
                self.herdr(
                    "pane.send_input",
                    &json!({ "pane_id": pane, "text": line, "keys": ["Enter"] }),
                );
                pane
            }
        }
    }

    /// Types `text` into `target` (no Enter).
    pub fn type_text(&self, target: &str, text: &str) {
        match self {
            Self::Tmux(_) => {
                self.tmux_out(&["send-keys", "-t", target, "-l", "--", text]);
            }
            Self::Herdr(_) => {
                self.herdr(
                    "pane.send_text",
                    &json!({ "pane_id": target, "text": text }),
                );
            }
        }
    }

    /// Presses Enter in `target`.
    pub fn enter(&self, target: &str) {
        match self {
            Self::Tmux(_) => {
                self.tmux_out(&["send-keys", "-t", target, "Enter"]);
            }
            Self::Herdr(_) => {
                self.herdr(
                    "pane.send_keys",
                    &json!({ "pane_id": target, "keys": ["Enter"] }),
                );
            }
        }
    }

    /// What `target` shows now.
    pub fn screen(&self, target: &str) -> String {
        match self {
            Self::Tmux(_) => self.tmux_out(&["capture-pane", "-p", "-t", target]),
            Self::Herdr(_) => self.read(target, "visible"),
        }
    }

    /// Everything `target` showed, its scrollback included.
    pub fn history(&self, target: &str) -> String {
        match self {
            Self::Tmux(_) => self.tmux_out(&["capture-pane", "-p", "-S", "-", "-t", target]),
            Self::Herdr(_) => self.read(target, "recent"),
        }
    }

    fn read(&self, pane: &str, source: &str) -> String {
        self.herdr(
            "pane.read",
            &json!({ "pane_id": pane, "source": source, "lines": 5000 }),
        )["read"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The pid of the process `target` started with (its shell or agent).
    pub fn pid(&self, target: &str) -> u32 {
        let pid = match self {
            Self::Tmux(_) => self.tmux_out(&["display-message", "-p", "-t", target, "#{pane_pid}"]),
            Self::Herdr(_) => self.herdr("pane.process_info", &json!({ "pane_id": target }))
                ["process_info"]["shell_pid"]
                .to_string(),
        };
        pid.trim().parse().expect("a pane pid")
    }

    /// Every pane: its target and a line saying what it is.
    pub fn list(&self) -> Vec<(String, String)> {
        match self {
            Self::Tmux(_) => self
                .tmux_out(&[
                    "list-panes",
                    "-a",
                    "-F",
                    "#{pane_id} #{session_name}:#{window_index} #{pane_current_command} #{pane_title}",
                ])
                .lines()
                .map(|l| {
                    let target = l.split_whitespace().next().unwrap_or_default().to_owned();
                    (target, l.to_owned())
                })
                .collect(),
            Self::Herdr(_) => self.herdr("pane.list", &json!({}))["panes"]
                .as_array()
                .map(|panes| {
                    panes
                        .iter()
                        .map(|p| {
                            let id = p["pane_id"].as_str().unwrap_or_default().to_owned();
                            let what = format!(
                                "{id} {} agent={} status={}",
                                p["label"], p["agent"], p["agent_status"]
                            );
                            (id, what)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The names of the user's windows (tmux) or tabs (herdr).
    pub fn names(&self) -> Vec<String> {
        match self {
            Self::Tmux(_) => self
                .tmux_out(&["list-windows", "-a", "-F", "#{window_name}"])
                .lines()
                .map(str::to_owned)
                .collect(),
            Self::Herdr(_) => self.herdr("tab.list", &json!({}))["tabs"]
                .as_array()
                .map(|tabs| {
                    tabs.iter()
                        .filter_map(|t| t["label"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// How long herdr's own `agent.prompt` waits between a prompt's text and its Enter
/// (v0.8.2 src/app/api/agents.rs:13); a person at a keyboard is slower still.
pub const KEYS_THEN_ENTER: Duration = Duration::from_millis(400);

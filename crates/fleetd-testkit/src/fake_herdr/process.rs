//! Test-side handle on a `fake-herdr` child process: starts the built binary on a socket in a
//! tempdir with `TMUX`, `TMUX_PANE` and `HERDR_*` stripped, waits until it answers, injects faults
//! over its control socket, and stops it (panes included) on drop. Never touches a user's herdr.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

/// Removes the variables that would tie a child to the developer's own multiplexers.
pub fn strip_mux_env(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text == "TMUX" || key_text == "TMUX_PANE" || key_text.starts_with("HERDR_") {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// A running `fake-herdr` process.
#[derive(Debug)]
pub struct FakeHerdrProcess {
    child: Child,
    socket: PathBuf,
    control: PathBuf,
}

impl FakeHerdrProcess {
    /// Starts `binary` (normally `bin_path("fake-herdr")`) listening on `socket`.
    pub fn start(binary: &Path, socket: &Path) -> anyhow::Result<Self> {
        Self::start_with_args(binary, socket, &[])
    }

    /// Like [`FakeHerdrProcess::start`] with extra arguments (`--protocol 19`, `--shell ...`).
    pub fn start_with_args(binary: &Path, socket: &Path, args: &[&str]) -> anyhow::Result<Self> {
        Self::spawn(binary, socket, args, &[])
    }

    /// Like [`FakeHerdrProcess::start_with_args`], behaving as herdr `herdr` (0.8.2 or 0.9,
    /// set with `FAKE_HERDR_VERSION`, whatever the test's own environment says).
    pub fn start_as(
        binary: &Path,
        socket: &Path,
        herdr: super::HerdrVersion,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let env = [(super::version::ENV.to_owned(), herdr.arg().to_owned())];
        Self::spawn(binary, socket, args, &env)
    }

    /// Like [`FakeHerdrProcess::start`] with `env` added: every pane's shell inherits it (a
    /// user's herdr runs with the user's HOME and PATH).
    pub fn start_with_env(
        binary: &Path,
        socket: &Path,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        Self::spawn(binary, socket, &[], env)
    }

    fn spawn(
        binary: &Path,
        socket: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut cmd = Command::new(binary);
        strip_mux_env(&mut cmd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .arg("--socket")
            .arg(socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn()?;
        let mut control = socket.as_os_str().to_owned();
        control.push(".ctl");
        let me = Self {
            child,
            socket: socket.to_owned(),
            control: PathBuf::from(control),
        };
        crate::wait_until("fake-herdr to answer ping", Duration::from_secs(20), || {
            me.call("ping", &json!({})).is_ok()
        });
        Ok(me)
    }

    /// The API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The process id of the server.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// One raw API call (a fresh connection), returning the response object.
    pub fn call(&self, method: &str, params: &Value) -> anyhow::Result<Value> {
        let line = json!({ "id": "test", "method": method, "params": params });
        send_line(&self.socket, &line)
    }

    /// Opens a tab labelled `label` in workspace `main` (a new workspace `main`, with its first
    /// tab, when there is none), as a user opens one; returns its root pane (`pane_id`,
    /// `tab_id`, …).
    pub fn open_tab(&self, label: &str) -> anyhow::Result<Value> {
        let result = |method: &str, params: &Value| -> anyhow::Result<Value> {
            let reply = self.call(method, params)?;
            reply
                .get("result")
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("{method} failed: {reply}"))
        };
        let workspaces = result("workspace.list", &json!({}))?;
        let main = workspaces["workspaces"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["label"] == "main"))
            .and_then(|w| w["workspace_id"].as_str())
            .map(str::to_owned);
        let created = match main {
            Some(ws) => result("tab.create", &json!({ "workspace_id": ws, "label": label }))?,
            None => result("workspace.create", &json!({ "label": "main" }))?,
        };
        Ok(created["root_pane"].clone())
    }

    /// Sends a control command such as `{"fault":"drop","count":2}`.
    pub fn fault(&self, command: &Value) -> anyhow::Result<()> {
        let reply = send_line(&self.control, command)?;
        anyhow::ensure!(reply["ok"] == true, "fault refused: {reply}");
        Ok(())
    }
}

fn send_line(path: &Path, line: &Value) -> anyhow::Result<Value> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    anyhow::ensure!(!reply.is_empty(), "connection closed without a reply");
    Ok(serde_json::from_str(&reply)?)
}

impl Drop for FakeHerdrProcess {
    fn drop(&mut self) {
        // server.stop kills every pane's session, then the process exits by itself.
        if self.call("server.stop", &json!({})).is_ok() {
            let _ = self.child.wait();
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

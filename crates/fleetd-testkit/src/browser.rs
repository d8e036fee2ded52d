//! A real headless Chromium, driven over WebDriver by Debian's `chromedriver`, for the
//! dashboard's tests, its benchmark and its docs screenshot. A few WebDriver commands over the
//! test kit's own HTTP client ([`crate::http`]) are all the tests need: open a page, run a
//! script in it, take a screenshot.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::http::request_with;
use crate::{Service, require, wait_until};

/// Where Debian puts the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Requires Chromium and chromedriver (Debian's `chromium` and `chromium-driver`).
pub fn require_chromium() -> Service {
    let found = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    require(
        "headless Chromium (chromium and chromedriver)",
        found,
        "Install them with `apt-get install -y chromium chromium-driver` (.ci/run does this).",
    )
}

/// A browser session: one chromedriver process and one headless Chromium window.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a `width`×`height` window and a fresh
    /// profile (no cookies from anywhere else).
    pub fn start(width: u32, height: u32) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("failed to start chromedriver")?;
        let profile = tempfile::tempdir()?;
        let mut browser = Self {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
        };
        wait_until("chromedriver to listen", Duration::from_secs(30), || {
            request_with(addr, "GET", "/status", &[], None).is_ok_and(|r| r.status == 200)
        });
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--no-first-run",
                    "--hide-scrollbars",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", browser._profile.path().display()),
                ],
            },
        }}});
        let created = browser.command("POST", "/session", Some(&caps))?;
        browser.session = created["sessionId"]
            .as_str()
            .context("chromedriver gave no session id")?
            .to_owned();
        Ok(browser)
    }

    /// One WebDriver command; the answer's `value`.
    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        let body = body.map(Value::to_string);
        let response = request_with(self.addr, method, path, &[], body.as_deref())
            .with_context(|| format!("WebDriver {method} {path}"))?;
        let answer: Value = serde_json::from_str(&response.body)
            .with_context(|| format!("WebDriver {method} {path}: {}", response.body))?;
        if response.status != 200 {
            bail!(
                "WebDriver {method} {path}: HTTP {}: {}",
                response.status,
                answer["value"]["message"]
            );
        }
        Ok(answer["value"].clone())
    }

    fn in_session(&self, method: &str, what: &str, body: Option<&Value>) -> anyhow::Result<Value> {
        self.command(method, &format!("/session/{}{what}", self.session), body)
    }

    /// Opens `url` and waits for it to load.
    pub fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.in_session("POST", "/url", Some(&json!({ "url": url })))
            .map(drop)
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page and returns what it
    /// returns.
    pub fn eval(&self, script: &str, args: &[Value]) -> anyhow::Result<Value> {
        self.in_session(
            "POST",
            "/execute/sync",
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Runs an async `script` (it calls `arguments[arguments.length - 1]` with its result).
    pub fn eval_async(&self, script: &str, args: &[Value]) -> anyhow::Result<Value> {
        self.in_session(
            "POST",
            "/execute/async",
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Polls `script` until it returns something truthy (not null, false, 0 or ""); that value.
    /// Panics naming `what` after `timeout`, with what the script last returned.
    pub fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let mut last = Value::Null;
        let mut found = None;
        let truthy = |v: &Value| match v {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Number(n) => n.as_f64() != Some(0.0),
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(what, timeout, || match self.eval(script, &[]) {
                Ok(v) if truthy(&v) => {
                    found = Some(v);
                    true
                }
                Ok(v) => {
                    last = v;
                    false
                }
                Err(e) => {
                    last = Value::String(e.to_string());
                    false
                }
            });
        }));
        if let Err(panic) = waited {
            eprintln!("{what}: the page's script last returned {last}");
            std::panic::resume_unwind(panic);
        }
        found.unwrap_or_default()
    }

    /// Resizes the window to `width`×`height` CSS pixels.
    pub fn resize(&self, width: u32, height: u32) -> anyhow::Result<()> {
        self.in_session(
            "POST",
            "/window/rect",
            Some(&json!({ "width": width, "height": height })),
        )
        .map(drop)
    }

    /// Saves a PNG of the window at `path` (creating its directory).
    pub fn screenshot(&self, path: &Path) -> anyhow::Result<()> {
        let data = self.in_session("GET", "/screenshot", None)?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().context("the screenshot is not a string")?)
            .context("the screenshot is not base64")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, png).with_context(|| format!("write {}", path.display()))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.in_session("DELETE", "", None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where a test's screenshots go: `target/test-artifacts/<name>` under the workspace (CI keeps
/// `target/`), created when missing.
pub fn artifact(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/test-artifacts")
        .components()
        .collect::<std::path::PathBuf>();
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

//! MCP mailbox round trip (issue 9): a member sends a message, the lead fetches its inbox and
//! acknowledges the message — fleetd's `fleet_reply` (from a member pane) / `fleet_poll` /
//! `fleet_ack` (from the lead pane), against `mcp-agent-mail` (PyPI) doing `send_message` /
//! `fetch_inbox` / `acknowledge_message` over its streamable-HTTP MCP server on this machine.
//! Both sides use the same keep-alive HTTP client and time only the three exchanges.
//!
//! mcp-agent-mail is installed with `python3 -m venv` + pip into a temporary directory that is
//! removed afterwards (`FLEETD_BENCH_AGENT_MAIL_VENV=DIR` reuses an existing venv instead). When
//! it does not install or start, its cell says why; no number is made up.
//!
//! `fleetd-bench mailbox [--rounds N]`.

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use super::pane_client::HerdrFleet;
use super::{Row, Summary, arg_number, progress};
use crate::http::mcp::{McpConn, structured};

const DEFAULT_ROUNDS: usize = 100;
/// Rounds run first and not counted (connections, caches, SQLite pages warm up).
const WARMUP: usize = 5;
/// How long mcp-agent-mail may take to answer its liveness probe after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(180);
/// A typical short reply, the same size as the inbox benchmark's.
const TEXT: &str = "benchmark reply: the task is done, see the diff in the branch; nothing else changed. \
                    This sentence pads the reply to about two hundred bytes like a short real answer.";

/// The three steps of one round, and their sum.
struct Rounds {
    total: Summary,
    steps: [Summary; 3],
}

fn rounds_of(samples: &[[Duration; 3]]) -> Rounds {
    let step = |i: usize| Summary::of(samples.iter().map(|s| s[i]).collect());
    Rounds {
        total: Summary::of(samples.iter().map(|s| s.iter().sum()).collect()),
        steps: [step(0), step(1), step(2)],
    }
}

/// Runs the benchmark, prints its table and returns its row.
pub fn run(args: &[String]) -> anyhow::Result<Vec<Row>> {
    let rounds = arg_number(args, "--rounds", DEFAULT_ROUNDS)?;
    progress("mailbox round trip: fleetd on fake-herdr…");
    let fleetd = on_fleetd(rounds)?;
    progress("mailbox round trip: mcp-agent-mail (venv + pip install, may take minutes)…");
    let agent_mail = on_agent_mail(rounds);
    println!(
        "\nMCP mailbox round trip ({rounds} rounds, keep-alive HTTP, times of the three MCP calls)\n"
    );
    println!("| system | send | fetch inbox | ack | round trip p50 | p99 |");
    println!("|---|---|---|---|---|---|");
    let line = |name: &str, r: &Rounds| {
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            super::ms(r.steps[0].p50),
            super::ms(r.steps[1].p50),
            super::ms(r.steps[2].p50),
            super::ms(r.total.p50),
            super::ms(r.total.p99),
        );
    };
    line("fleetd (fleet_reply / fleet_poll / fleet_ack)", &fleetd);
    let alternative = match &agent_mail {
        Ok((version, r)) => {
            line(
                &format!(
                    "mcp-agent-mail {version} (send_message / fetch_inbox / acknowledge_message)"
                ),
                r,
            );
            format!("mcp-agent-mail {version}: {}", r.total.cell())
        }
        Err(e) => {
            let reason = format!("{e:#}").replace('|', "/").replace('\n', " ");
            println!("| mcp-agent-mail | not measured: {reason} | | | | |");
            format!("mcp-agent-mail: not measured — {reason}")
        }
    };
    Ok(vec![
        Row::new(
            "mailbox (MCP)",
            "send → fetch inbox → ack round trip (3 MCP calls)",
            fleetd.total.cell(),
        )
        .alternatives(alternative),
    ])
}

fn on_fleetd(rounds: usize) -> anyhow::Result<Rounds> {
    Ok(rounds_of(&fleetd_samples(rounds)?))
}

/// fleetd's three calls per round, `[fleet_reply, fleet_poll, fleet_ack]`, timed as this
/// benchmark times them (also the fleetd side of `fleetd-bench peers`, so both compare the same
/// work measured the same way).
pub(super) fn fleetd_samples(rounds: usize) -> anyhow::Result<Vec<[Duration; 3]>> {
    let mut fleet = HerdrFleet::start("")?;
    fleet.spawn("ctl", "nia", 1, 1)?;
    let mut member = fleet.control.accept()?;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..WARMUP + rounds {
        let sent = member.call("fleet_reply", json!({ "text": TEXT }))?;
        let msg_id = structured("fleet_reply", &sent.result)?["msgId"]
            .as_str()
            .context("fleet_reply names no msgId")?
            .to_owned();
        let polled = fleet.lead.call("fleet_poll", json!({ "target": "nia0" }))?;
        let replies = structured("fleet_poll", &polled.result)?;
        anyhow::ensure!(
            replies["replies"]
                .as_array()
                .is_some_and(|r| r.iter().any(|m| m["msgId"] == msg_id.as_str())),
            "fleet_poll did not show {msg_id}: {replies}"
        );
        let acked = fleet
            .lead
            .call("fleet_ack", json!({ "target": "nia0", "msgId": msg_id }))?;
        structured("fleet_ack", &acked.result)?;
        if round >= WARMUP {
            samples.push([sent.took, polled.took, acked.took]);
        }
    }
    Ok(samples)
}

fn on_agent_mail(rounds: usize) -> anyhow::Result<(String, Rounds)> {
    let scratch = tempfile::Builder::new()
        .prefix("fleetd-bench-agent-mail-")
        .tempdir()?;
    let venv = match std::env::var_os("FLEETD_BENCH_AGENT_MAIL_VENV") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let venv = scratch.path().join("venv");
            venv_install(&venv, "mcp-agent-mail")?;
            venv
        }
    };
    let version = version(&venv)?;
    let mut server = AgentMail::start(&venv, scratch.path())?;
    let measured = measure_agent_mail(server.addr, scratch.path(), rounds);
    server.stop();
    measured
        .map(|r| (version, r))
        .map_err(|e| e.context(format!("server log: {}", server.log_tail())))
}

/// A fresh `python3 -m venv` at `venv` with `package` pip-installed into it from PyPI.
pub(super) fn venv_install(venv: &Path, package: &str) -> anyhow::Result<()> {
    let out = Command::new("python3")
        .args(["-m", "venv"])
        .arg(venv)
        .output()
        .context("python3 -m venv could not run")?;
    if !out.status.success() {
        bail!("python3 -m venv failed: {}", tail(&out.stderr));
    }
    let out = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", package])
        .output()
        .context("pip could not run")?;
    if !out.status.success() {
        bail!("pip install {package} failed: {}", tail(&out.stderr));
    }
    Ok(())
}

fn version(venv: &Path) -> anyhow::Result<String> {
    let out = Command::new(venv.join("bin/pip"))
        .args(["show", "mcp-agent-mail"])
        .output()
        .context("pip show could not run")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("Version: ").map(str::to_owned))
        .context("mcp-agent-mail is not installed in the venv")
}

/// The last few lines of a command's output, for an error message.
pub(super) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

/// A running mcp-agent-mail HTTP server.
struct AgentMail {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl AgentMail {
    /// `serve-http` on a free loopback port, state in `dir`, no LLM and no network look-ups;
    /// `MCP_TOOLS_MODE=extended` exposes `acknowledge_message` as a tool of its own.
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark waits for a real server on the wall clock"
    )]
    fn start(venv: &Path, dir: &Path) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let log = dir.join("server.log");
        let log_file = std::fs::File::create(&log)?;
        let child = Command::new(venv.join("bin/python"))
            .args([
                "-c",
                "import sys; from mcp_agent_mail.cli import app; app(sys.argv[1:])",
                "serve-http",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
            ])
            .current_dir(dir)
            .env("HOME", dir)
            .env("STORAGE_ROOT", dir.join("archive"))
            .env(
                "DATABASE_URL",
                format!("sqlite+aiosqlite:///{}", dir.join("mail.sqlite3").display()),
            )
            .env("MCP_TOOLS_MODE", "extended")
            .env("LLM_ENABLED", "false")
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LOG_RICH_ENABLED", "false")
            .env("TOOLS_LOG_ENABLED", "false")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("the venv's python could not start")?;
        let mut server = Self { child, addr, log };
        let start = std::time::Instant::now();
        loop {
            if crate::http::get(addr, "/health/liveness").is_ok_and(|r| r.status == 200) {
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!(
                    "the server exited ({status}) before answering: {}",
                    server.log_tail()
                );
            }
            if start.elapsed() > START_TIMEOUT {
                server.stop();
                bail!(
                    "the server did not answer /health/liveness within {} s: {}",
                    START_TIMEOUT.as_secs(),
                    server.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_tail(&self) -> String {
        tail(&std::fs::read(&self.log).unwrap_or_default())
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn measure_agent_mail(addr: SocketAddr, dir: &Path, rounds: usize) -> anyhow::Result<Rounds> {
    let project = dir.join("project").display().to_string();
    let mut lead = McpConn::connect(addr, "/mcp/")?;
    let mut member = McpConn::connect(addr, "/mcp/")?;
    lead.initialize()?;
    member.initialize()?;
    for (conn, name) in [(&mut lead, "BenchLead"), (&mut member, "BenchMember")] {
        let registered = conn.call_tool(
            "register_agent",
            &json!({ "project_key": project, "program": "fleetd-bench", "model": "none", "name": name }),
        )?;
        structured("register_agent", &registered)?;
    }
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..WARMUP + rounds {
        let (sent_took, sent) = timed(|| {
            member.call_tool(
                "send_message",
                &json!({ "project_key": project, "sender_name": "BenchMember", "to": ["BenchLead"],
                         "subject": format!("reply {round}"), "body_md": TEXT }),
            )
        })?;
        let id = structured("send_message", &sent)?["deliveries"][0]["payload"]["id"]
            .as_i64()
            .context("send_message names no message id")?;
        let (fetch_took, fetched) = timed(|| {
            lead.call_tool(
                "fetch_inbox",
                &json!({ "project_key": project, "agent_name": "BenchLead", "limit": 20 }),
            )
        })?;
        let inbox = structured("fetch_inbox", &fetched)?;
        anyhow::ensure!(
            inbox["result"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["id"] == id)),
            "fetch_inbox did not show message {id}: {inbox}"
        );
        let (ack_took, acked) = timed(|| {
            lead.call_tool(
                "acknowledge_message",
                &json!({ "project_key": project, "agent_name": "BenchLead", "message_id": id }),
            )
        })?;
        structured("acknowledge_message", &acked)?;
        if round >= WARMUP {
            samples.push([sent_took, fetch_took, ack_took]);
        }
    }
    Ok(rounds_of(&samples))
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times a call on the wall clock"
)]
fn timed(f: impl FnOnce() -> anyhow::Result<Value>) -> anyhow::Result<(Duration, Value)> {
    let start = std::time::Instant::now();
    let value = f()?;
    Ok((start.elapsed(), value))
}

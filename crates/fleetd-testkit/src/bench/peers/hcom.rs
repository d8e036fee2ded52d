//! hcom (PyPI `hcom`, a Rust binary in a wheel): agents message each other through one SQLite
//! database, each hcom command a short process. Two agents join with `hcom start --as NAME` (its
//! way for any tool without hooks), then per round the member runs `hcom send @lead` and the lead
//! reads with `hcom listen 1` (returns at once with what is unread) — and, second series, the
//! lead is already blocked in `hcom listen` when the member sends (hcom wakes it through a
//! loopback TCP notify port). State lives in `HCOM_DIR` and `HOME` inside the scratch dir.
//!
//! Not measured: hcom's wake-up of an idle agent at its prompt, which exists only inside an AI
//! CLI hcom launched itself (`hcom claude`, `hcom codex`, ...: that tool's hooks report it idle,
//! then hcom's PTY wrapper types the message once the tool's own ready pattern shows, or
//! Claude's mod submits it); none of those CLIs can run here (each needs its vendor's service).

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{Peer, Series, TEXT, WARMUP, installed, mark_installed};
use crate::bench::Summary;
use crate::bench::mailbox::{tail, venv_install};

/// How long the lead waits in `hcom listen` before the member sends, so it is blocked (its
/// start-up is ~10 ms here).
const LISTENER_SETTLE: Duration = Duration::from_millis(150);

/// Installs hcom into `dir` (a venv) and measures it.
pub(super) fn measure(dir: &Path, rounds: usize) -> anyhow::Result<Peer> {
    let venv = dir.join("venv");
    if !installed(dir) {
        venv_install(&venv, "hcom")?;
        mark_installed(dir)?;
    }
    let hcom = Hcom::new(&venv, dir)?;
    let version = hcom.version()?;
    hcom.run(&["start", "--as", "lead"])?;
    hcom.run(&["start", "--as", "memb"])?;
    let fetched = hcom.send_then_fetch(rounds);
    let blocked = hcom.send_to_blocked_listener(rounds);
    Ok(Peer {
        name: format!("hcom {version}"),
        readable: vec![
            Series::new("`hcom send` + `hcom listen 1` (2 processes)", fetched),
            Series::new("`hcom send` → a receiver blocked in `hcom listen`", blocked),
        ],
        durable: "yes: `hcom send` commits to SQLite in WAL mode and fsyncs the WAL before it prints its receipt and exits (seen with strace)".to_owned(),
        wake: Series::not_measured(
            "wake-up",
            "only inside an AI CLI hcom launched (its hooks report idle, hcom's PTY wrapper types \
             once that CLI's ready pattern shows); none can run here without its vendor's service, \
             and a plain command gets manual delivery (`hcom listen`) only",
        ),
    })
}

/// The installed `hcom` binary with its state confined to the scratch dir.
struct Hcom {
    bin: std::path::PathBuf,
    home: std::path::PathBuf,
    state: std::path::PathBuf,
}

impl Hcom {
    fn new(venv: &Path, dir: &Path) -> anyhow::Result<Self> {
        // A fresh database every run, also when the install is kept for the next one.
        let run = dir.join("state");
        if run.exists() {
            std::fs::remove_dir_all(&run)?;
        }
        let (home, state) = (run.join("home"), run.join("hcom"));
        std::fs::create_dir_all(&home)?;
        Ok(Self {
            bin: venv.join("bin/hcom"),
            home,
            state,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .env("HOME", &self.home)
            .env("HCOM_DIR", &self.state)
            .current_dir(&self.home)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs one hcom command to its end; its stdout, or why it failed.
    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .command(args)
            .output()
            .with_context(|| format!("hcom {} could not run", args[0]))?;
        if !out.status.success() {
            bail!(
                "hcom {} failed ({}): {}",
                args[0],
                out.status,
                tail(&[out.stdout, out.stderr].concat())
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn version(&self) -> anyhow::Result<String> {
        let out = self.run(&["--version"])?;
        parse_version(&out).with_context(|| format!("hcom --version printed {out:?}"))
    }

    fn send(&self, round: usize) -> anyhow::Result<()> {
        let text = format!("{TEXT} round={round}.");
        let receipt = self.run(&["send", "@lead", "--name", "memb", "--json", "--", &text])?;
        let receipt: Value = serde_json::from_str(receipt.trim())
            .with_context(|| format!("hcom send printed {receipt:?}"))?;
        anyhow::ensure!(
            receipt["delivered_to"]
                .as_array()
                .is_some_and(|to| to.iter().any(|n| n == "lead")),
            "hcom send did not deliver to lead: {receipt}"
        );
        Ok(())
    }

    /// Per round: the member sends, then the lead reads what is unread; both times summed.
    fn send_then_fetch(&self, rounds: usize) -> anyhow::Result<Summary> {
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..WARMUP + rounds {
            let (sent, ()) = timed(|| self.send(round))?;
            let (read, out) = timed(|| self.run(&["listen", "1", "--name", "lead", "--json"]))?;
            anyhow::ensure!(
                has_round(&out, round),
                "hcom listen did not show round {round}: {out:?}"
            );
            if round >= WARMUP {
                samples.push(sent + read);
            }
        }
        Ok(Summary::of(samples))
    }

    /// Per round: the lead is blocked in `hcom listen`; from the member's send until the lead's
    /// listener prints the message.
    #[expect(
        clippy::disallowed_methods,
        reason = "a benchmark times real processes on the wall clock"
    )]
    fn send_to_blocked_listener(&self, rounds: usize) -> anyhow::Result<Summary> {
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..WARMUP + rounds {
            let mut listener = self
                .command(&["listen", "10", "--name", "lead", "--json"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("hcom listen could not start")?;
            let stdout = listener.stdout.take().context("no stdout")?;
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((std::time::Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
            std::thread::sleep(LISTENER_SETTLE);
            let start = std::time::Instant::now();
            let sent = self.send(round);
            let got = rx.recv_timeout(Duration::from_secs(10));
            // It exits by itself once it has printed (and marked read) what arrived; killing it
            // earlier could leave the message unread for the next round.
            let exit_by = std::time::Instant::now() + Duration::from_secs(5);
            while listener.try_wait()?.is_none() && std::time::Instant::now() < exit_by {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = listener.kill();
            let _ = listener.wait();
            sent?;
            let (at, line) =
                got.with_context(|| format!("no message in the listener, round {round}"))?;
            anyhow::ensure!(
                has_round(&line, round),
                "the listener printed something else in round {round}: {line:?}"
            );
            if round >= WARMUP {
                samples.push(at - start);
            }
        }
        Ok(Summary::of(samples))
    }
}

/// `hcom 0.7.31` → `0.7.31`.
fn parse_version(out: &str) -> Option<String> {
    let version = out.trim().strip_prefix("hcom ")?.trim();
    (!version.is_empty()).then(|| version.to_owned())
}

/// Whether `hcom listen --json` output holds the message of `round`.
fn has_round(out: &str, round: usize) -> bool {
    let marker = format!("round={round}.");
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|m| m["from"] == "memb" && m["text"].as_str().is_some_and(|t| t.ends_with(&marker)))
}

#[expect(
    clippy::disallowed_methods,
    reason = "a benchmark times real processes on the wall clock"
)]
fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(Duration, T)> {
    let start = std::time::Instant::now();
    let value = f()?;
    Ok((start.elapsed(), value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_comes_from_hcoms_own_line() {
        assert_eq!(parse_version("hcom 0.7.31\n").as_deref(), Some("0.7.31"));
        assert_eq!(parse_version("0.7.31"), None);
        assert_eq!(parse_version("hcom \n"), None);
    }

    #[test]
    fn a_round_is_found_only_in_its_own_message() {
        let out = r#"{"event_id":6,"from":"memb","intent":null,"text":"hi round=1.","thread":null}
{"event_id":7,"from":"memb","intent":null,"text":"hi round=12.","thread":null}"#;
        assert!(has_round(out, 1));
        assert!(has_round(out, 12));
        assert!(!has_round(out, 2));
        assert!(!has_round(r#"{"from":"lead","text":"hi round=1."}"#, 1));
        assert!(!has_round("not json round=1.", 1));
    }
}

//! Benchmarks that print tables (never assert timings). Each submodule measures one area, prints
//! its own table, and returns [`Row`]s; `fleetd-bench all` runs every one and prints the rows as
//! one side-by-side table ([`render`]) with the target of the issue that introduced each row.

pub mod agents;
pub mod bridge;
pub mod dashboard;
pub mod footprint;
pub mod gateway;
pub mod inbox;
mod inbox_amqp;
pub mod locate;
pub mod mailbox;
pub mod model;
pub mod model_load;
pub mod nudge;
pub mod pane_client;
pub mod pane_output;
pub mod peers;
mod profile;
mod rabbit;
pub mod sandbox;
pub mod scale;
pub mod tmux_events;
pub mod wake;

use std::fmt::Write as _;
use std::time::Duration;

/// Percentiles of one series of latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Slowest sample.
    pub max: Duration,
}

impl Summary {
    /// Summarises `samples` (at least one).
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort_unstable();
        let at = |pct: usize| {
            samples
                .get((samples.len() * pct / 100).min(samples.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Self {
            p50: at(50),
            p99: at(99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }

    /// `p50 X / p99 Y` in milliseconds, for a table cell.
    pub fn cell(&self) -> String {
        format!("p50 {} / p99 {}", ms(self.p50), ms(self.p99))
    }
}

/// Milliseconds with three decimals, for tables.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

/// Whether a row met the target of the issue that introduced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Met {
    /// Measured, and within the target.
    Yes,
    /// Measured, and outside the target.
    No,
    /// No target exists for this row, or nothing was measured.
    NotApplicable,
}

impl Met {
    /// `Yes` when `ok`, else `No`.
    pub fn from_bool(ok: bool) -> Self {
        if ok { Self::Yes } else { Self::No }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Yes => "yes",
            Self::No => "**no**",
            Self::NotApplicable => "—",
        }
    }
}

/// One line of the combined table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The area measured (`inbox`, `locate`, ...).
    pub area: String,
    /// What was measured.
    pub measurement: String,
    /// fleetd's number.
    pub fleetd: String,
    /// The alternatives' numbers in the same run, or `—`.
    pub alternatives: String,
    /// The target and the issue that set it, or `—`.
    pub target: String,
    /// Whether fleetd's number met the target.
    pub met: Met,
}

impl Row {
    /// A row without alternatives or target.
    pub fn new(area: &str, measurement: impl Into<String>, fleetd: impl Into<String>) -> Self {
        Self {
            area: area.to_owned(),
            measurement: measurement.into(),
            fleetd: fleetd.into(),
            alternatives: "—".to_owned(),
            target: "—".to_owned(),
            met: Met::NotApplicable,
        }
    }

    /// Sets the alternatives cell.
    pub fn alternatives(mut self, text: impl Into<String>) -> Self {
        self.alternatives = text.into();
        self
    }

    /// Sets the target cell and whether it was met.
    pub fn target(mut self, text: impl Into<String>, met: Met) -> Self {
        self.target = text.into();
        self.met = met;
        self
    }

    /// A row saying a whole benchmark could not run, and why.
    pub fn failed(area: &str, error: &anyhow::Error) -> Self {
        let reason = format!("{error:#}").replace('|', "/").replace('\n', " ");
        Self::new(area, "(benchmark did not run)", format!("failed: {reason}"))
    }
}

/// The rows as one Markdown table.
pub fn render(rows: &[Row]) -> String {
    let header = [
        "area",
        "measurement",
        "fleetd",
        "alternative(s), same run",
        "target (issue)",
        "met",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.area.clone(),
                r.measurement.clone(),
                r.fleetd.clone(),
                r.alternatives.clone(),
                r.target.clone(),
                r.met.as_str().to_owned(),
            ]
        })
        .collect();
    markdown_table(&header, &cells)
}

/// A Markdown table of six columns, each padded to its widest cell.
pub(crate) fn markdown_table(header: &[&str; 6], rows: &[[String; 6]]) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 6]| {
        let mut out = String::from("|");
        for (cell, w) in cells.iter().zip(widths) {
            let pad = w - cell.chars().count();
            let _ = write!(out, " {cell}{} |", " ".repeat(pad));
        }
        out.push('\n');
        out
    };
    let mut out = line(*header);
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    out.push_str(&line([
        &rule[0], &rule[1], &rule[2], &rule[3], &rule[4], &rule[5],
    ]));
    for row in rows {
        out.push_str(&line([
            &row[0], &row[1], &row[2], &row[3], &row[4], &row[5],
        ]));
    }
    out
}

/// A parallel build's load on the machine while it lives: one job more than the machine has
/// cores (`make -j$(nproc+1)`), each compiling a generated C file with `gcc -O2` over and over
/// (CPU, process starts, file writes, as a build does), or a busy shell loop where there is no
/// `gcc`. Stopped (every job's process group killed) on drop.
pub struct BuildLoad {
    jobs: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
    /// What it runs, for a table's row.
    pub what: String,
}

impl BuildLoad {
    /// Starts the jobs.
    pub fn start() -> anyhow::Result<Self> {
        use std::os::unix::process::CommandExt as _;
        let dir = tempfile::tempdir()?;
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let gcc = std::process::Command::new("gcc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let mut source = String::new();
        for f in 0..400 {
            let _ = writeln!(
                source,
                "double f{f}(double x) {{ double s = 0; for (int i = 0; i < 100; i++) s += x * i / (i + {f}.5); return s; }}"
            );
        }
        std::fs::write(dir.path().join("load.c"), source)?;
        let mut jobs = Vec::new();
        for job in 0..=cores {
            let script = if gcc {
                format!("while :; do gcc -O2 -c load.c -o load{job}.o; done")
            } else {
                "while :; do :; done".to_owned()
            };
            jobs.push(
                std::process::Command::new("/bin/sh")
                    .args(["-c", &script])
                    .current_dir(dir.path())
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .process_group(0)
                    .spawn()?,
            );
        }
        let what = if gcc {
            format!("{} jobs of gcc -O2 on {cores} cores", cores + 1)
        } else {
            format!("{} busy shell loops on {cores} cores", cores + 1)
        };
        Ok(Self {
            jobs,
            _dir: dir,
            what,
        })
    }
}

impl Drop for BuildLoad {
    fn drop(&mut self) {
        for job in &mut self.jobs {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", job.id())])
                .status();
            let _ = job.wait();
        }
    }
}

/// Writes one progress line to stderr (tables go to stdout).
pub fn progress(line: &str) {
    use std::io::Write as _;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// utime + stime of `pid` in clock ticks (`USER_HZ`: 100 a second on Linux).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    use anyhow::Context as _;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rsplit_once(')')
        .map_or(stat.as_str(), |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .context("short /proc stat")?
            .parse()
            .context("a stat field")
    };
    // After the command: state is 0, utime 11, stime 12.
    Ok(field(11)? + field(12)?)
}

/// Parses `--NAME N` from `args`, else `default`.
pub fn arg_number(args: &[String], name: &str, default: usize) -> anyhow::Result<usize> {
    use anyhow::Context as _;
    match args.iter().position(|a| a == name) {
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name} needs a number"))?
            .parse()
            .with_context(|| format!("{name} takes a number")),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_as_one_aligned_markdown_table() {
        let rows = vec![
            Row::new("inbox", "publish p50", "0.2 ms")
                .alternatives("raw 0.1 ms")
                .target("≤ 1.5× raw (#3)", Met::No),
            Row::new("idle", "RSS", "12 MiB"),
        ];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[2].contains("**no**"));
        assert!(lines[3].ends_with("| —      |"), "{}", lines[3]);
        let widths: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{table}");
    }

    #[test]
    fn a_failed_benchmark_keeps_the_table_intact() {
        let row = Row::failed("mailbox", &anyhow::anyhow!("a | b\nc"));
        assert_eq!(row.fleetd, "failed: a / b c");
    }
}

//! Benchmarks that print tables (never assert timings). Each submodule measures one area and prints
//! its rows side by side with the baseline the issue that introduced it names.

pub mod bridge;
pub mod inbox;
pub mod locate;
pub mod nudge;

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
}

/// Milliseconds with three decimals, for tables.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

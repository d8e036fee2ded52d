//! Caller-locator benchmark: locate one caller among many panes.

/// Runs the benchmark and prints its table.
pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("the locate benchmark is not built yet")
}

//! Inbox benchmark: raw fdatasync baseline vs the embedded and AMQP stores.

/// Runs the benchmark and prints its table.
pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("the inbox benchmark is not built yet")
}

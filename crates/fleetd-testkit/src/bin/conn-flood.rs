//! `conn-flood ADDR IDLE SLOW HOLD_MS`: opens IDLE connections that send nothing and SLOW ones
//! that never finish their request head to fleetd at ADDR, holds them HOLD_MS after the last
//! connect, and prints one JSON line saying what the server did with each
//! (`fleetd_testkit::malformed::flood::Report`). A test double, run by the connection-limit tests (as
//! another user too); never used by the daemon.

use std::time::Duration;

use anyhow::Context as _;
use fleetd_testkit::malformed::flood::{Plan, run};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, idle, slow, hold_ms] = args.as_slice() else {
        anyhow::bail!("usage: conn-flood ADDR IDLE SLOW HOLD_MS");
    };
    let plan = Plan {
        addr: addr.parse().context("ADDR is host:port")?,
        idle: idle.parse().context("IDLE is a count")?,
        slow: slow.parse().context("SLOW is a count")?,
        hold: Duration::from_millis(hold_ms.parse().context("HOLD_MS is a number")?),
    };
    let report = run(plan);
    let line = serde_json::to_string(&report)?;
    std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes())?;
    Ok(())
}

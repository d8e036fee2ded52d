//! `sim-agent [--script reply,silent,...] [--work-ms N] ...`: the scripted stand-in for a coding
//! agent (see `fleetd_testkit::sim_agent` for every knob). Runs in a pane; a test double only.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fleetd_testkit::sim_agent::main(args))
}

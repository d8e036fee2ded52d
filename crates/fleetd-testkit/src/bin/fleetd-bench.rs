//! `fleetd-bench [inbox|locate|bridge|nudge|all] [args...]`: the benchmark suite's one command. Prints tables; the
//! numbers are reported, never asserted.

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "all".to_owned());
    let rest: Vec<String> = args.collect();
    match which.as_str() {
        "inbox" => fleetd_testkit::bench::inbox::run(&rest),
        "nudge" => fleetd_testkit::bench::nudge::run(&rest),
        "locate" => fleetd_testkit::bench::locate::run(&rest),
        "bridge" => fleetd_testkit::bench::bridge::run(&rest),
        "all" => {
            fleetd_testkit::bench::inbox::run(&rest)?;
            fleetd_testkit::bench::locate::run(&rest)?;
            fleetd_testkit::bench::bridge::run(&rest)?;
            fleetd_testkit::bench::nudge::run(&rest)
        }
        other => {
            anyhow::bail!("unknown benchmark {other:?}: use inbox, locate, bridge, nudge or all")
        }
    }
}

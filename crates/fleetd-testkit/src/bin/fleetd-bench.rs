//! `fleetd-bench [inbox|mailbox|locate|bridge|nudge|wake|tmux-events|agents|footprint|dashboard|gateway|scale|model|sandbox|peers|all] [args...]`: the
//! benchmark suite's one command. Each benchmark prints its own table; `all` runs every one (on
//! its defaults) and ends with one combined table, side by side with the alternatives and the target
//! of the issue that introduced each row. The numbers are reported, never asserted.

use fleetd_testkit::bench::{self, Row};

type Bench = fn(&[String]) -> anyhow::Result<Vec<Row>>;

/// Every benchmark, in the order `all` runs them, with the area its failure is reported under.
const SUITE: [(&str, &str, Bench); 15] = [
    ("inbox", "inbox", bench::inbox::run),
    ("mailbox", "mailbox (MCP)", bench::mailbox::run),
    ("nudge", "push", bench::nudge::run),
    ("wake", "wake-up", bench::wake::run),
    ("tmux-events", "wake-up", bench::tmux_events::run),
    ("agents", "real agents", bench::agents::run),
    ("locate", "identity", bench::locate::run),
    ("bridge", "bridge", bench::bridge::run),
    ("footprint", "footprint", bench::footprint::run),
    ("dashboard", "dashboard", bench::dashboard::run),
    ("gateway", "gateway", bench::gateway::run),
    ("scale", "scale", bench::scale::run),
    ("model", "model gateway", bench::model::run),
    ("sandbox", "sandbox", bench::sandbox::run),
    // Last: it installs the peers (minutes), and its wake-up row takes fleetd's push numbers.
    ("peers", "peers", bench::peers::run),
];

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "all".to_owned());
    let rest: Vec<String> = args.collect();
    if which == "pane-client" {
        return bench::pane_client::serve(&rest);
    }
    if which == "model-load" {
        return bench::model_load::serve(&rest);
    }
    if which == "all" {
        anyhow::ensure!(
            rest.is_empty(),
            "`all` takes no arguments (each benchmark runs on its defaults)"
        );
        let mut rows = Vec::new();
        for (name, area, run) in SUITE {
            bench::progress(&format!("== {name} =="));
            // One benchmark that cannot run (no broker, no tmux, ...) must not hide the others.
            match std::panic::catch_unwind(|| run(&[])) {
                Ok(Ok(more)) => rows.extend(more),
                Ok(Err(e)) => rows.push(Row::failed(area, &e)),
                Err(_) => rows.push(Row::failed(area, &anyhow::anyhow!("panicked (see above)"))),
            }
        }
        bench::peers::fill_fleetd_wakeup(&mut rows);
        println!("\n## fleetd benchmark suite: all rows\n");
        print!("{}", bench::render(&rows));
        return Ok(());
    }
    let Some((_, _, run)) = SUITE.iter().find(|(name, _, _)| *name == which) else {
        anyhow::bail!(
            "unknown benchmark {which:?}: use inbox, mailbox, nudge, wake, tmux-events, agents, locate, bridge, footprint, dashboard, gateway, scale, model, sandbox, peers or all"
        );
    };
    run(&rest).map(drop)
}

//! `fleetd-demo [--no-pause] [--fleetd PATH]`: the scripted session `fleetd demo` runs (see
//! `fleetd_testkit::demo`). `fleetd demo` execs this binary, found next to itself.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    fleetd_testkit::demo::main(&args)
}

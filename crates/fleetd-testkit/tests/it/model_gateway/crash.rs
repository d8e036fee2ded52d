//! fleetd killed (SIGKILL) in the middle of a member's streamed answer: the member's request
//! fails at once as a broken stream (it does not hang), the backend sees its answer cut, and
//! nothing is counted for it; after the restart the member's next request goes through and is
//! counted once, so every total equals exactly what the backend served whole.

use std::time::Duration;

use fleetd_testkit::model_call::Ended;
use fleetd_testkit::wait_until;

use super::{assert_served, start};

/// The fake's pause between two events of a stream: the kill lands between them.
const GAP_MS: &str = "300";

#[test]
fn e2e_model_gateway_a_stream_cut_by_kill_9_counts_nothing_and_the_next_request_counts_once() {
    let Some(mut gw) = start(&["--stream-gap-ms", GAP_MS], "") else {
        return;
    };
    gw.member("ann");
    let out = gw.next_out();
    let progress = out.with_extension("progress");
    gw.start_in(
        "fleet:ann",
        &format!(
            "--timeout-secs 30 --progress {} --out {}",
            progress.display(),
            out.display()
        ),
    );
    // Two events in (the stream's start), several still to come: kill fleetd now.
    wait_until(
        "the first events of ann's answer",
        Duration::from_secs(30),
        || std::fs::read_to_string(&progress).is_ok_and(|p| p.lines().count() >= 2),
    );
    gw.rig.kill_daemon();
    let cut = gw.outcome(&out, "fleet:ann");
    assert_eq!(cut.status, 200, "{cut:?}");
    assert!(
        cut.ended == Ended::Broken && !cut.finished && cut.events >= 2,
        "ann's request broke off as a stream, not a hang: {cut:?}"
    );
    wait_until(
        "the backend to see its answer cut",
        Duration::from_secs(10),
        || gw.fake.served().iter().any(|l| l["cut"] == true),
    );

    gw.rig.restart_daemon();
    assert_served(&gw.call_as("ann", ""), "ann's request after the restart");
    let served = gw.fake.served();
    assert_eq!(
        (
            served.iter().filter(|l| l["served"] == true).count(),
            served.iter().filter(|l| l["cut"] == true).count(),
        ),
        (1, 1),
        "one answer cut, one served: {served:?}"
    );
    // Counted: exactly the answer served whole, once; the cut one by neither side.
    gw.assert_counted("ann", gw.served());
}

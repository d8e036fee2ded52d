//! The crash-recovery suite (issue 14): a scripted session on real tmux, killed with SIGKILL at a
//! random moment of every round and restarted on the same state, checked against the agents'
//! logs (see `fleetd_testkit::recovery`). A short run here; `FLEETD_RECOVERY_KILLS=200` is the
//! long mode.

use fleetd_testkit::{Service, require_tmux};

#[test]
fn e2e_recovery_kill_9_at_random_points_loses_and_repeats_nothing() {
    if require_tmux() == Service::Skip {
        return;
    }
    let kills = std::env::var("FLEETD_RECOVERY_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let counts = fleetd_testkit::recovery::run(kills).unwrap_or_else(|e| panic!("{e:#}"));
    println!("crash recovery: {counts:#?}");
    assert_eq!(counts.kills, kills);
    assert!(counts.tickets > 0 && counts.replies > 0, "{counts:?}");
}

//! fleetd
fn main() {}

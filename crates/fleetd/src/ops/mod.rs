//! The daemon as an operating-system process, apart from what it does for the fleet: installing
//! it for an agent (`install`), its log subscriber (`logging`), its readiness to a service
//! manager (`readiness`) and its metrics exporter (`telemetry`). The service units themselves are
//! in `deploy/`.

pub mod install;
pub mod logging;
pub mod readiness;
pub mod telemetry;

//! Several hosts, one fleet (SPEC §12; `shared/design/multihost.md`): each host's fleetd is a
//! gateway, and gateways share one AMQP broker. This module is the gateway's side of that:
//! `provision`, the broker topology and permissions an administrator loads once; `service`, the
//! running link and consumer; `forward`, the ordered publisher of the outbox; `backlog`, how far behind each other gateway
//! is; `presence`. The protocol's
//! pure parts (names, routing keys, the envelope and its first check) are
//! `fleetd_core::gateway`; the broker client is `store::amqp`'s.

mod backlog;
mod forward;
pub mod presence;
pub mod provision;
pub mod service;

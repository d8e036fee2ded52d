//! What no HTTP client would send, on purpose: the one place in the kit that writes raw bytes
//! to fleetd's HTTP listener (everything else goes through [`crate::http`]). A flood of
//! connections that never finish a request head is how a hostile local user ties up a server.

pub mod flood;

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// What the server sends a connection that asks nothing, up to its close: a server refusing
/// connections at accept answers before any request (which an HTTP client, having not yet
/// written its request, takes for a protocol error), so this is how a test reads the refusal.
pub fn answer_unasked(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

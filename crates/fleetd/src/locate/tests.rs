//! Tests of the locator.

use super::*;

#[test]
fn only_loopback_peers_are_traced() {
    let addr = |s: &str| s.parse::<SocketAddr>().expect("addr");
    assert!(is_loopback(&addr("127.0.0.1:4000")));
    assert!(is_loopback(&addr("[::1]:4000")));
    assert!(
        is_loopback(&addr("[::ffff:127.0.0.1]:4000")),
        "IPv4-mapped loopback"
    );
    assert!(!is_loopback(&addr("192.0.2.1:4000")));
    assert!(!is_loopback(&addr("[::ffff:192.0.2.1]:4000")));
}

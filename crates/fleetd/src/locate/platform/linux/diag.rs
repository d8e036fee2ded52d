//! Exact TCP socket lookup through netlink `sock_diag` (`SOCK_DIAG_BY_FAMILY` with a full 4-tuple,
//! not a dump): the kernel finds the one socket by hash, where reading `/proc/net/tcp` walks the
//! whole established-hash table and costs milliseconds on a large machine. Owns only the message
//! encoding; callers fall back to `/proc/net/tcp{,6}` when netlink is unavailable.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType};

use crate::locate::platform::SocketOwner;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// `NLM_F_REQUEST`.
const NLM_F_REQUEST: u16 = 1;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
/// Byte offset of `idiag_uid` in a reply: nlmsghdr (16) + family/state/timer/retrans (4) +
/// sockid (48) + expires/rqueue/wqueue (12).
const UID_OFFSET: usize = 80;
/// Byte offset of `idiag_inode`, right after the uid.
const INODE_OFFSET: usize = 84;
/// How long to wait for the kernel's answer.
const REPLY_TIMEOUT: Duration = Duration::from_millis(500);

/// Encodes an exact-lookup request for the socket whose local address is `src` and whose remote
/// address is `dst`, as `family`.
fn request(family: u8, src: SocketAddr, dst: SocketAddr, seq: u32) -> Vec<u8> {
    let addr = |a: &SocketAddr| -> [u8; 16] {
        match (family, a.ip()) {
            (AF_INET, IpAddr::V4(v4)) => {
                let mut out = [0u8; 16];
                out[..4].copy_from_slice(&v4.octets());
                out
            }
            (_, IpAddr::V4(v4)) => v4.to_ipv6_mapped().octets(),
            (_, IpAddr::V6(v6)) => v6.octets(),
        }
    };
    let mut msg = Vec::with_capacity(72);
    msg.extend_from_slice(&72u32.to_ne_bytes());
    msg.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // inet_diag_req_v2
    msg.extend_from_slice(&[family, IPPROTO_TCP, 0, 0]);
    msg.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    msg.extend_from_slice(&src.port().to_be_bytes());
    msg.extend_from_slice(&dst.port().to_be_bytes());
    msg.extend_from_slice(&addr(&src));
    msg.extend_from_slice(&addr(&dst));
    msg.extend_from_slice(&0u32.to_ne_bytes()); // interface
    msg.extend_from_slice(&u32::MAX.to_ne_bytes()); // no cookie
    msg.extend_from_slice(&u32::MAX.to_ne_bytes());
    msg
}

/// The `N` bytes of a reply at offset `at`, or the error for a reply too short to hold them.
fn bytes_at<const N: usize>(reply: &[u8], at: usize) -> io::Result<[u8; N]> {
    reply
        .get(at..at + N)
        .and_then(|field| field.try_into().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "short sock_diag reply"))
}

/// Decodes a reply: the socket's inode and owner, `None` for "no such socket".
fn parse_reply(reply: &[u8]) -> io::Result<Option<SocketOwner>> {
    let kind = u16::from_ne_bytes(bytes_at(reply, 4)?);
    if kind == NLMSG_ERROR {
        let errno = i32::from_ne_bytes(bytes_at(reply, 16)?);
        return match -errno {
            0 | 2 => Ok(None), // ENOENT: no such socket
            e => Err(io::Error::from_raw_os_error(e)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected netlink message type {kind}"),
        ));
    }
    let inode = u32::from_ne_bytes(bytes_at(reply, INODE_OFFSET)?);
    let uid = u32::from_ne_bytes(bytes_at(reply, UID_OFFSET)?);
    Ok((inode != 0).then_some(SocketOwner {
        inode: u64::from(inode),
        uid,
    }))
}

/// The TCP socket whose local address is `src` and remote address is `dst` (for a connection we
/// accepted: `src` = the peer, `dst` = our listening address): its inode and owner. Tries IPv4
/// and, for IPv4 addresses, the IPv4-mapped IPv6 form a dual-stack client socket uses.
pub(super) fn tcp_socket(src: SocketAddr, dst: SocketAddr) -> io::Result<Option<SocketOwner>> {
    let fd = rustix::net::socket(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        Some(netlink::SOCK_DIAG),
    )?;
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(REPLY_TIMEOUT),
    )?;
    let kernel = SocketAddrNetlink::new(0, 0);
    let families: &[u8] = match (src.ip().to_canonical(), dst.ip().to_canonical()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => &[AF_INET, AF_INET6],
        _ => &[AF_INET6],
    };
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (src, dst) = (canon(src), canon(dst));
    let mut buf = vec![0u8; 8192];
    for (seq, &family) in (1u32..).zip(families) {
        let msg = request(family, src, dst, seq);
        rustix::net::sendto(&fd, &msg, SendFlags::empty(), &kernel)?;
        let (len, _) = rustix::net::recv(&fd, &mut buf[..], RecvFlags::empty())?;
        if let Some(owner) = parse_reply(&buf[..len.min(buf.len())])? {
            return Ok(Some(owner));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    #[test]
    fn requests_have_the_kernel_layout() {
        let src: SocketAddr = "127.0.0.1:40000".parse().expect("addr");
        let dst: SocketAddr = "127.0.0.1:7797".parse().expect("addr");
        let msg = request(AF_INET, src, dst, 7);
        assert_eq!(msg.len(), 72);
        // nlmsghdr (16), family/protocol/ext/pad (4), states (4), then the socket id.
        assert_eq!(&msg[24..26], &40000u16.to_be_bytes());
        assert_eq!(&msg[26..28], &7797u16.to_be_bytes());
        assert_eq!(&msg[28..32], &[127, 0, 0, 1]);
        let mapped = request(AF_INET6, src, dst, 8);
        assert_eq!(
            &mapped[28..44],
            &"::ffff:127.0.0.1".parse::<Ipv6Addr>().expect("v6").octets()
        );
    }

    #[test]
    fn a_live_connection_is_found_and_a_dead_one_is_not() {
        let conn = crate::test_support::loopback();
        let (peer, local) = (conn.peer, conn.local);
        let via_netlink = tcp_socket(peer, local).expect("netlink answers");
        let via_proc = super::super::proc::client_socket(peer, local).expect("proc");
        assert!(via_netlink.is_some());
        assert_eq!(
            via_netlink, via_proc,
            "inode and owner agree with /proc/net/tcp"
        );
        drop(conn);
        // A documentation-range address no socket can have.
        let nowhere = SocketAddr::new(
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            1,
        );
        assert_eq!(tcp_socket(nowhere, local).expect("answers"), None);
    }
}

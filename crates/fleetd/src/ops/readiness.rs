//! Service-manager readiness (systemd's `sd_notify` protocol): `READY=1` once the daemon serves,
//! `STOPPING=1` when it begins to shut down, as datagrams to `$NOTIFY_SOCKET` (a path, or an
//! abstract name written `@name`). Owns that wire format only; a notification that cannot be
//! sent is logged, never fatal — fleetd runs the same with or without a service manager.
//!
//! This module is readiness notification's one platform seam, and it is Linux's: the abstract
//! `@name` sockets systemd may hand out exist only there (`std::os::linux`). Any other target
//! fails to compile here, naming what a port must decide.

#[cfg(not(target_os = "linux"))]
compile_error!(
    "fleetd: readiness notification (notify) is implemented for Linux only: systemd's \
     sd_notify on $NOTIFY_SOCKET, whose abstract @name sockets need std::os::linux. \
     A macOS port must supply its launchd counterpart, and launchd has no readiness \
     protocol: Notifier becomes a documented no-op there (launchd only knows the process \
     started), without the abstract-socket variant."
);

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

/// Where notifications go, read once from `NOTIFY_SOCKET` in `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notifier {
    /// Not started by a service manager that listens: notifications are no-ops.
    Off,
    /// A socket in the file system.
    Path(PathBuf),
    /// A Linux abstract socket (`@name` in `NOTIFY_SOCKET`), without the `@`.
    Abstract(Vec<u8>),
}

impl Notifier {
    /// The notifier for a `NOTIFY_SOCKET` value (`None` or empty: off).
    pub fn from_socket_var(value: Option<&std::ffi::OsStr>) -> Self {
        use std::os::unix::ffi::OsStrExt;
        match value.map(OsStrExt::as_bytes) {
            None | Some([]) => Self::Off,
            Some([b'@', name @ ..]) => Self::Abstract(name.to_vec()),
            Some(_) => Self::Path(PathBuf::from(value.unwrap_or_default())),
        }
    }

    /// Tells the manager the daemon is ready: its store is open and its listener accepts.
    pub fn ready(&self) {
        self.send_logged("READY=1");
    }

    /// Tells the manager the daemon is shutting down.
    pub fn stopping(&self) {
        self.send_logged("STOPPING=1");
    }

    fn send_logged(&self, state: &str) {
        match self.send(state) {
            Ok(true) => tracing::debug!(state, "notified the service manager"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(state, error = %e, "failed to notify the service manager (NOTIFY_SOCKET)");
            }
        }
    }

    /// Sends one `state` datagram; `Ok(false)` when notifications are off.
    pub fn send(&self, state: &str) -> io::Result<bool> {
        match self {
            Self::Off => return Ok(false),
            Self::Path(path) => {
                UnixDatagram::unbound()?.send_to(state.as_bytes(), path)?;
            }
            Self::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn the_variable_picks_path_abstract_or_off() {
        assert_eq!(Notifier::from_socket_var(None), Notifier::Off);
        assert_eq!(
            Notifier::from_socket_var(Some(OsStr::new(""))),
            Notifier::Off
        );
        assert_eq!(
            Notifier::from_socket_var(Some(OsStr::new("/run/user/1000/systemd/notify"))),
            Notifier::Path("/run/user/1000/systemd/notify".into())
        );
        assert_eq!(
            Notifier::from_socket_var(Some(OsStr::new("@/org/freedesktop/systemd1/notify"))),
            Notifier::Abstract(b"/org/freedesktop/systemd1/notify".to_vec())
        );
    }

    /// Sends `state` through `notifier` and asserts that `receiver` gets it as one datagram.
    fn assert_delivered(notifier: &Notifier, receiver: &UnixDatagram, state: &str) {
        assert!(notifier.send(state).expect("sent"));
        let mut buf = [0u8; 64];
        let n = receiver.recv(&mut buf).expect("received");
        assert_eq!(&buf[..n], state.as_bytes());
    }

    #[test]
    fn states_arrive_as_datagrams_on_a_path_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify.sock");
        let receiver = UnixDatagram::bind(&path).expect("bind");
        assert_delivered(&Notifier::Path(path), &receiver, "READY=1");
    }

    #[test]
    fn states_arrive_on_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("fleetd-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("abstract address");
        let receiver = UnixDatagram::bind_addr(&addr).expect("bind");
        let notifier = Notifier::from_socket_var(Some(OsStr::new(&format!("@{name}"))));
        assert_delivered(&notifier, &receiver, "STOPPING=1");
    }

    #[test]
    fn off_sends_nothing() {
        assert!(!Notifier::Off.send("READY=1").expect("no-op"));
    }
}

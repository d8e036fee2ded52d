//! A small TCP proxy for fault tests (issue 20): put between a gateway and the broker, it can
//! cut the link (every connection through it closed at once, new ones refused) and restore it,
//! or stall it (bytes held, both ways, while the connections stay open: a black hole the AMQP
//! heartbeat has to find).

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const OPEN: u8 = 0;
const CUT: u8 = 1;
const STALLED: u8 = 2;

/// The proxy; stops forwarding when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    state: Arc<AtomicU8>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Forwards connections to `upstream`.
    pub fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let state = Arc::new(AtomicU8::new(OPEN));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, l, st) = (Arc::clone(&state), Arc::clone(&live), Arc::clone(&stop));
        std::thread::spawn(move || accept(&listener, upstream, &s, &l, &st));
        Ok(Self {
            addr,
            state,
            live,
            stop,
        })
    }

    /// Closes every connection through the proxy and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.state.store(CUT, Ordering::SeqCst);
        for stream in lock(&self.live).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Holds every byte (both ways) until [`Proxy::restore`]; connections stay open.
    pub fn stall(&self) {
        self.state.store(STALLED, Ordering::SeqCst);
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.state.store(OPEN, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.cut();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[expect(
    clippy::disallowed_methods,
    reason = "a test helper's accept loop polls on the wall clock"
)]
fn accept(
    listener: &TcpListener,
    upstream: SocketAddr,
    state: &Arc<AtomicU8>,
    live: &Mutex<Vec<TcpStream>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if state.load(Ordering::SeqCst) == CUT {
            drop(client);
            continue;
        }
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        let pairs = [
            (client.try_clone(), server.try_clone()),
            (server.try_clone(), client.try_clone()),
        ];
        {
            let mut held = lock(live);
            held.extend(client.try_clone());
            held.extend(server.try_clone());
        }
        for pair in pairs {
            if let (Ok(from), Ok(to)) = pair {
                let state = Arc::clone(state);
                std::thread::spawn(move || pump(from, to, &state));
            }
        }
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "a test helper holds bytes on the wall clock while stalled"
)]
fn pump(mut from: TcpStream, mut to: TcpStream, state: &AtomicU8) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        loop {
            match state.load(Ordering::SeqCst) {
                STALLED => std::thread::sleep(Duration::from_millis(10)),
                CUT => {
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
                _ => break,
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

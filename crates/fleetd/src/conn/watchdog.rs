//! One connection's timers: how long it may sit with no request in flight and nothing received
//! (`connections.idleTimeoutMs`), and how long it may take to send a request head once its first
//! byte came (`connections.headerReadTimeoutMs`). While a request is in flight neither runs (a
//! waiting `fleet_send` or a streamed answer may be quiet for long, and the tools bound their own
//! waits). Knows no protocol: a door tells it when a request starts and ends, and [`Tracked`]
//! tells it when bytes arrive. Time is tokio's, so tests pause it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The two timeouts, as a connection starts with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `connections.headerReadTimeoutMs`.
    pub header_read: Duration,
    /// `connections.idleTimeoutMs`.
    pub idle: Duration,
}

impl Timeouts {
    /// The timeouts of a `connections:` section.
    pub fn of(c: &crate::config::Connections) -> Self {
        Self {
            header_read: Duration::from_millis(c.header_read_timeout_ms),
            idle: Duration::from_millis(c.idle_timeout_ms),
        }
    }
}

/// Which timer closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// Nothing was received and no request was in flight for the idle timeout.
    Idle,
    /// A request head was begun and not finished within the header timeout.
    Header,
}

impl Expired {
    /// A label for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle_timeout",
            Self::Header => "header_timeout",
        }
    }
}

#[derive(Debug)]
struct Phase {
    active: usize,
    idle_since: Instant,
    first_byte: Option<Instant>,
}

/// What a connection is doing, as its door and its socket report it.
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
    /// Set by the first byte after the connection fell idle (a cheap check on every read).
    heard: AtomicBool,
    changed: Notify,
}

impl Activity {
    /// A connection that has just opened: idle, nothing received.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            phase: Mutex::new(Phase {
                active: 0,
                idle_since: Instant::now(),
                first_byte: None,
            }),
            heard: AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        crate::sync::lock(&self.phase)
    }

    /// Bytes arrived on the socket.
    pub fn bytes_read(&self) {
        if self.heard.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut phase = self.phase();
        if phase.active == 0 && phase.first_byte.is_none() {
            phase.first_byte = Some(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A request's head was read and the request is being served.
    pub fn request_started(&self) {
        self.phase().active += 1;
        self.changed.notify_one();
    }

    /// A request ended: its response was written, or it was abandoned.
    pub fn request_finished(&self) {
        let mut phase = self.phase();
        phase.active = phase.active.saturating_sub(1);
        if phase.active == 0 {
            phase.idle_since = Instant::now();
            phase.first_byte = None;
            self.heard.store(false, Ordering::Release);
        }
        drop(phase);
        self.changed.notify_one();
    }

    /// Completes when one of the timers runs out; never while a request is in flight.
    pub async fn expired(&self, timeouts: Timeouts) -> Expired {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let deadline = {
                let phase = self.phase();
                match (phase.active, phase.first_byte) {
                    (0, None) => Some((phase.idle_since + timeouts.idle, Expired::Idle)),
                    (0, Some(first)) => Some((first + timeouts.header_read, Expired::Header)),
                    _ => None,
                }
            };
            match deadline {
                Some((at, why)) => tokio::select! {
                    () = tokio::time::sleep_until(at) => return why,
                    () = &mut changed => {}
                },
                None => changed.await,
            }
        }
    }
}

/// A socket that tells its connection's [`Activity`] when bytes arrive.
#[derive(Debug)]
pub struct Tracked<IO> {
    io: IO,
    activity: Arc<Activity>,
}

impl<IO> Tracked<IO> {
    /// Wraps `io`.
    pub fn new(io: IO, activity: Arc<Activity>) -> Self {
        Self { io, activity }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header_read: Duration::from_secs(2),
        idle: Duration::from_secs(10),
    };

    /// When `activity` expires, measured from now on tokio's paused clock.
    async fn expires_after(activity: &Activity) -> (Duration, Expired) {
        let start = Instant::now();
        let why = activity.expired(T).await;
        (start.elapsed(), why)
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_after_the_idle_timeout() {
        let activity = Activity::new();
        assert_eq!(
            expires_after(&activity).await,
            (Duration::from_secs(10), Expired::Idle)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_begun_request_head_has_the_header_timeout_from_its_first_byte() {
        let activity = Activity::new();
        let a = Arc::clone(&activity);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            a.bytes_read();
            // More bytes do not extend it: a slow sender gets no more time.
            tokio::time::sleep(Duration::from_secs(1)).await;
            a.bytes_read();
        });
        assert_eq!(
            expires_after(&activity).await,
            (Duration::from_secs(5), Expired::Header)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_timer_runs_while_a_request_is_in_flight_and_idle_restarts_after() {
        let activity = Activity::new();
        let a = Arc::clone(&activity);
        tokio::spawn(async move {
            a.bytes_read();
            tokio::time::sleep(Duration::from_secs(1)).await;
            a.request_started();
            // A long wait (fleet_send with wait, a streamed answer): no timer.
            tokio::time::sleep(Duration::from_secs(100)).await;
            a.request_finished();
        });
        assert_eq!(
            expires_after(&activity).await,
            (Duration::from_secs(111), Expired::Idle)
        );
    }
}

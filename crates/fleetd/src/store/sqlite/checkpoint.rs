//! The embedded inbox's checkpointer: copies the WAL back into the database file on a thread and
//! a connection of its own, so no publish waits for a checkpoint (SQLite's automatic checkpoint
//! runs inside the commit that crosses its threshold, adding two fsyncs and a page copy to that
//! publish). Never writes rows; never answers a caller.
//!
//! A checkpoint runs in `PASSIVE` mode with `synchronous=FULL` on its connection: the WAL is
//! synced before its frames are copied and the database file after, before SQLite lets the
//! writer restart the WAL. Under a steady stream of commits a passive checkpoint may never catch
//! up with the writer, so the WAL would only grow: past [`WRITER_CHECKPOINT_FRAMES`] the writer
//! checkpoints itself between two transactions (see `writer`), which always completes.

use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

use rusqlite::Connection;

use crate::store::StoreError;

/// WAL frames (pages) after which the checkpointer is woken: SQLite's own default threshold.
pub(crate) const CHECKPOINT_FRAMES: i64 = 1000;

/// WAL frames after which the writer checkpoints itself, between transactions: the background
/// checkpoints did not keep up (about 16 MiB of WAL with the inbox's 1 KiB pages).
pub(crate) const WRITER_CHECKPOINT_FRAMES: i64 = 16 * CHECKPOINT_FRAMES;

/// How the writer's WAL hook wakes the checkpointer.
#[derive(Debug, Clone)]
pub(crate) struct Signal {
    wake: SyncSender<()>,
}

impl Signal {
    /// Called after each commit with the WAL's size in frames: wakes the checkpointer when a
    /// checkpoint is due. Never blocks: a wake-up already pending covers this one.
    pub(crate) fn committed(&self, frames: i64) {
        if frames >= CHECKPOINT_FRAMES {
            let _pending_or_gone = self.wake.try_send(());
        }
    }
}

/// The checkpointer thread. It ends when every [`Signal`] is dropped (the writer's connection is
/// closed), after finishing the checkpoint in progress.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread on `conn` (a connection of its own to the inbox file).
    pub(crate) fn start(conn: Connection) -> Result<(Self, Signal), StoreError> {
        let (wake, woken) = std::sync::mpsc::sync_channel(1);
        let signal = Signal { wake };
        let thread = std::thread::Builder::new()
            .name("fleetd-inbox-checkpoint".to_owned())
            .spawn(move || run(&conn, &woken))
            .map_err(|err| StoreError::backend("start the inbox checkpoint thread", err))?;
        Ok((Self { thread }, signal))
    }

    /// Waits for the thread to end (once every [`Signal`] is dropped: the writer's WAL hook
    /// removed or its connection closed). The writer's last checkpoint waits for this: SQLite
    /// answers a checkpoint while another runs with SQLITE_BUSY at once, whatever the busy
    /// timeout, and the WAL would stay behind after a clean close.
    pub(crate) fn join(self) {
        if self.thread.join().is_err() {
            tracing::error!("the inbox checkpoint thread panicked");
        }
    }
}

fn run(conn: &Connection, woken: &Receiver<()>) {
    while woken.recv().is_ok() {
        if let Err(err) = checkpoint(conn) {
            // The next commit past the threshold tries again; the writer's own checkpoint
            // bounds the WAL meanwhile.
            tracing::warn!(error = %err, "a checkpoint of the embedded inbox failed");
        }
    }
}

/// One passive checkpoint on `conn`; returns the WAL's frames and how many of them are now in
/// the database file.
pub(crate) fn checkpoint(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}

//! The embedded inbox: a SQLite file in WAL mode with `synchronous=FULL`, owned by one process
//! (the state lock), written by one thread that group-commits, read through a second connection.
//! Knows SQLite; must not know who publishes or why.

mod checkpoint;
mod schema;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use fleetd_core::{Message, MessageLimits, MsgId, Target, Ticket};

use super::lock::StateLock;
use super::{
    InboxStore, Page, PageRequest, PublishOutcome, StateOp, StateRecord, StateStore, StoreError,
    StoreFuture, StoreOptions,
};
use crate::sync::lock;
use writer::Op;

/// The embedded inbox store. See the module docs for its guarantees.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    limits: MessageLimits,
    writer: Mutex<Option<Writer>>,
    reader: Arc<Mutex<Option<Connection>>>,
    lock: Mutex<Option<StateLock>>,
    stats: Arc<writer::Stats>,
}

#[derive(Debug)]
struct Writer {
    ops: mpsc::Sender<Op>,
    /// The writer thread; it owns the checkpointer and joins it before its last checkpoint.
    thread: JoinHandle<()>,
}

impl Writer {
    /// Lets the writer finish every queued write, wait for the checkpointer's last checkpoint
    /// and close its connection. Blocks for the commit in flight.
    fn stop(self) {
        drop(self.ops);
        if self.thread.join().is_err() {
            tracing::error!("the inbox writer thread panicked");
        }
    }
}

impl SqliteStore {
    /// The schema version this build writes; a file with a newer one is refused.
    pub const SCHEMA_VERSION: i64 = schema::SCHEMA_VERSION;

    /// Opens (or creates) the inbox at `path`: takes the lock beside it, checks and migrates the
    /// file, and starts the writer thread. Fails with [`StoreError::Locked`],
    /// [`StoreError::Corrupt`] or [`StoreError::NewerSchema`] without modifying the file.
    pub async fn open(path: PathBuf, options: StoreOptions) -> Result<Self, StoreError> {
        tokio::task::spawn_blocking(move || Self::open_blocking(path, options))
            .await
            .map_err(|err| StoreError::backend("open the embedded inbox", err))?
    }

    fn open_blocking(path: PathBuf, options: StoreOptions) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|err| StoreError::backend("create the inbox directory", err))?;
        }
        let lock = StateLock::acquire(&path)?;
        // Created owner-only before SQLite opens it: SQLite gives its -wal and -shm files the
        // database file's mode, so every reply body stays the owner's alone.
        crate::state_dir::open_private(&path)
            .map_err(|err| StoreError::backend("create the inbox file", err))?;
        let mut conn = schema::open_writer(&path)?;
        let reader = schema::open_reader(&path)?;
        let stats = Arc::new(writer::Stats {
            depths: Mutex::new(writer::count_pending(&conn)?),
            ..writer::Stats::default()
        });
        // Checkpoints run beside the writer, not inside a commit: the hook replaces SQLite's
        // automatic checkpoint (itself a WAL hook).
        let (checkpointer, signal) =
            checkpoint::Checkpointer::start(schema::open_checkpointer(&path)?)?;
        let hook_stats = Arc::clone(&stats);
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, frames: i32| {
            let frames = i64::from(frames);
            hook_stats
                .wal_frames
                .store(frames, std::sync::atomic::Ordering::Relaxed);
            signal.committed(frames);
            Ok(())
        }))
        .map_err(|err| StoreError::backend("configure the embedded inbox", err))?;
        let (ops, rx) = mpsc::channel(writer::WRITE_QUEUE_CAPACITY);
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("fleetd-inbox-writer".to_owned())
            .spawn(move || writer::run(conn, rx, &thread_stats, Some(checkpointer)))
            .map_err(|err| StoreError::backend("start the inbox writer thread", err))?;
        tracing::info!(path = %path.display(), schema = Self::SCHEMA_VERSION, "embedded inbox open");
        Ok(Self {
            path,
            limits: options.limits,
            writer: Mutex::new(Some(Writer { ops, thread })),
            reader: Arc::new(Mutex::new(Some(reader))),
            lock: Mutex::new(Some(lock)),
            stats,
        })
    }

    /// How many transactions the writer has committed, and how many operations they carried.
    /// Their ratio is the group-commit factor (the benchmark prints it).
    pub fn commit_stats(&self) -> (u64, u64) {
        (
            self.stats
                .commits
                .load(std::sync::atomic::Ordering::Relaxed),
            self.stats.ops.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Publishes `messages` in one go: each is queued to the writer in order before any answer is
    /// awaited, so they commit in this order and share commits (one fsync for the lot). One
    /// answer per message, in order; a message that breaks the limits is refused alone.
    pub(crate) async fn publish_all(
        &self,
        messages: Vec<Message>,
    ) -> Vec<Result<PublishOutcome, StoreError>> {
        let ops = lock(&self.writer).as_ref().map(|writer| writer.ops.clone());
        let mut answers = Vec::with_capacity(messages.len());
        for message in messages {
            let Some(ops) = ops.as_ref() else {
                answers.push(Err(StoreError::Closed));
                continue;
            };
            if let Err(err) = message.check(&self.limits) {
                answers.push(Err(err.into()));
                continue;
            }
            let (reply, answer) = oneshot::channel();
            answers.push(match ops.send(Op::Publish { message, reply }).await {
                Ok(()) => Ok(answer),
                Err(_) => Err(StoreError::Closed),
            });
        }
        let mut outcomes = Vec::with_capacity(answers.len());
        for answer in answers {
            outcomes.push(match answer {
                Ok(answer) => answer.await.unwrap_or(Err(StoreError::Closed)),
                Err(err) => Err(err),
            });
        }
        outcomes
    }

    /// Removes `msg_id` from `target`'s inbox without remembering its id: the AMQP backend
    /// committed it alongside a broker publish that then failed, and the publisher was told so
    /// (a retry with the same id must be stored again). True when it was there.
    pub(crate) async fn retract(&self, target: &Target, msg_id: MsgId) -> Result<bool, StoreError> {
        let target = target.clone();
        self.write(move |reply| Op::Ack {
            target,
            msg_id,
            retract: true,
            reply,
        })
        .await
    }

    /// The error of the last write that failed, until a write succeeds again (the disk is full,
    /// say): the AMQP backend pulls nothing from the broker that it could not commit.
    pub(crate) fn write_failure(&self) -> Option<StoreError> {
        crate::sync::lock(&self.stats.last_failure).clone()
    }

    /// Sends one write to the writer thread and waits for its committed result.
    async fn write<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, StoreError>>) -> Op,
    ) -> Result<T, StoreError> {
        let ops = lock(&self.writer)
            .as_ref()
            .map(|writer| writer.ops.clone())
            .ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        ops.send(make(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `query` on the read connection on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        query: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            let conn = lock(&reader);
            let conn = conn.as_ref().ok_or(StoreError::Closed)?;
            query(conn)
        })
        .await
        .map_err(|err| StoreError::backend("read the embedded inbox", err))?
    }

    /// [`StoreError::Closed`] once the store was closed, as every read answers then.
    fn open_or_closed(&self) -> Result<(), StoreError> {
        match lock(&self.writer).as_ref() {
            Some(_) => Ok(()),
            None => Err(StoreError::Closed),
        }
    }

    /// Stops the writer after it finished every queued write, then closes the reader and releases
    /// the lock, in that order, so the next owner never sees a half-closed file.
    fn shut_down(&self) {
        if let Some(writer) = lock(&self.writer).take() {
            writer.stop();
        }
        drop(lock(&self.reader).take());
        drop(lock(&self.lock).take());
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        // Joining blocks for at most the commit in flight; it makes the release of the lock
        // deterministic, so a store opened right after this one was dropped does not see it locked.
        self.shut_down();
    }
}

impl SqliteStore {
    /// `ops` committed; with `synced`, fsynced before it resolves (see `Op::State`).
    fn commit_state_synced(&self, ops: Vec<StateOp>, synced: bool) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            if ops.is_empty() {
                return Ok(());
            }
            self.write(|reply| Op::State { ops, synced, reply }).await
        })
    }
}

impl StateStore for SqliteStore {
    fn load_state(&self) -> StoreFuture<'_, Vec<StateRecord>> {
        Box::pin(self.read(|conn| {
            let fail = |err| StoreError::backend("read the fleet state", err);
            let mut stmt = conn
                .prepare_cached("SELECT kind, key, value FROM fleet_state")
                .map_err(fail)?;
            let rows = stmt
                .query_map([], |row| {
                    Ok(StateRecord {
                        kind: row.get(0)?,
                        key: row.get(1)?,
                        value: row.get(2)?,
                    })
                })
                .map_err(fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(fail)
        }))
    }

    fn commit_state(&self, ops: Vec<StateOp>) -> StoreFuture<'_, ()> {
        self.commit_state_synced(ops, true)
    }

    fn commit_state_unsynced(&self, ops: Vec<StateOp>) -> StoreFuture<'_, ()> {
        self.commit_state_synced(ops, false)
    }
}

impl InboxStore for SqliteStore {
    fn publish(&self, message: Message) -> StoreFuture<'_, PublishOutcome> {
        Box::pin(async move {
            message.check(&self.limits)?;
            self.write(|reply| Op::Publish { message, reply }).await
        })
    }

    fn page<'a>(&'a self, target: &'a Target, request: PageRequest) -> StoreFuture<'a, Page> {
        let target = target.clone();
        Box::pin(self.read(move |conn| select_page(conn, &target, &request)))
    }

    fn ack<'a>(&'a self, target: &'a Target, msg_id: MsgId) -> StoreFuture<'a, bool> {
        let target = target.clone();
        Box::pin(self.write(move |reply| Op::Ack {
            target,
            msg_id,
            retract: false,
            reply,
        }))
    }

    fn drain<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, Vec<Message>> {
        let target = target.clone();
        Box::pin(self.write(move |reply| Op::Drain { target, reply }))
    }

    fn depth<'a>(&'a self, target: &'a Target) -> StoreFuture<'a, u64> {
        // The writer's count, as of its last commit (no query, no blocking-pool hop).
        Box::pin(async move {
            self.open_or_closed()?;
            Ok(self
                .stats
                .depths()
                .get(target.as_str())
                .copied()
                .unwrap_or(0))
        })
    }

    fn targets(&self) -> StoreFuture<'_, Vec<Target>> {
        Box::pin(async move {
            self.open_or_closed()?;
            let mut names: Vec<String> = self.stats.depths().keys().cloned().collect();
            names.sort_unstable();
            names
                .into_iter()
                .map(|name| {
                    Target::new(name).map_err(|err| StoreError::Decode {
                        what: "target".to_owned(),
                        detail: err.to_string(),
                    })
                })
                .collect()
        })
    }

    fn health(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let failed = || crate::sync::lock(&self.stats.last_failure).clone();
            // After a failed write, only a write as large as a real one proves recovery.
            let heavy = failed().is_some();
            self.write(|reply| Op::Probe { heavy, reply }).await?;
            match failed() {
                Some(err) => Err(err),
                None => Ok(()),
            }
        })
    }

    fn close(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let writer = lock(&self.writer).take();
            if let Some(writer) = writer {
                // The joins wait for the writer's last commit: do them off the async threads.
                if tokio::task::spawn_blocking(move || writer.stop())
                    .await
                    .is_err()
                {
                    tracing::error!("stopping the inbox writer failed");
                }
            }
            self.shut_down();
            Ok(())
        })
    }

    fn kind(&self) -> &'static str {
        "embedded"
    }
}

/// The oldest `limit` pending messages of `target`. Shared by reads and the writer's drain.
fn select_pending(
    conn: &Connection,
    target: &Target,
    limit: i64,
) -> Result<Vec<Message>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT msg_id, target, ticket, kind, sender, created_at, body
             FROM messages WHERE target = ?1 ORDER BY seq LIMIT ?2",
        )
        .map_err(|err| StoreError::backend("read the embedded inbox", err))?;
    let mut rows = stmt
        .query(params![target.as_str(), limit])
        .map_err(|err| StoreError::backend("read the embedded inbox", err))?;
    let mut messages = Vec::new();
    while let Some(row) = rows
        .next()
        .map_err(|err| StoreError::backend("read the embedded inbox", err))?
    {
        messages.push(decode_row(row)?);
    }
    Ok(messages)
}

/// One page of `target`'s pending messages (see [`PageRequest`]). Reads in one transaction:
/// first the positions and sizes of the candidates (`octet_length` reads a body's size from its
/// record header, not the body), then the bodies of exactly those that fit — so a page costs its
/// own bodies in memory, never the inbox's.
fn select_page(
    conn: &Connection,
    target: &Target,
    request: &PageRequest,
) -> Result<Page, StoreError> {
    let fail = |err| StoreError::backend("read a page of the embedded inbox", err);
    let tx = conn.unchecked_transaction().map_err(fail)?;
    let after_seq: Option<i64> = match request.after {
        None => None,
        Some(id) => tx
            .prepare_cached("SELECT seq FROM messages WHERE msg_id = ?1 AND target = ?2")
            .and_then(|mut stmt| {
                stmt.query_row(params![id.to_string(), target.as_str()], |row| row.get(0))
                    .optional()
            })
            .map_err(fail)?,
    };
    let mut page = Page {
        after_not_pending: request.after.is_some() && after_seq.is_none(),
        ..Page::default()
    };
    // One candidate more than the limit says whether more follow.
    let candidates = i64::try_from(request.limit.saturating_add(1)).unwrap_or(i64::MAX);
    let sizes: Vec<(i64, usize)> = tx
        .prepare_cached(
            "SELECT seq, octet_length(body) FROM messages
             WHERE target = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![target.as_str(), after_seq.unwrap_or(i64::MIN), candidates],
                |row| Ok((row.get(0)?, row.get::<_, i64>(1)?)),
            )?
            .map(|row| row.map(|(seq, len)| (seq, usize::try_from(len).unwrap_or(usize::MAX))))
            .collect()
        })
        .map_err(fail)?;
    let mut bytes = 0usize;
    let mut last = None;
    for (taken, (seq, len)) in sizes.iter().enumerate() {
        if !request.fits(taken, bytes, *len) {
            page.more = true;
            break;
        }
        bytes = bytes.saturating_add(*len);
        last = Some(*seq);
    }
    let Some(last) = last else {
        return Ok(page);
    };
    let mut stmt = tx
        .prepare_cached(
            "SELECT msg_id, target, ticket, kind, sender, created_at, body
             FROM messages WHERE target = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq",
        )
        .map_err(fail)?;
    let mut rows = stmt
        .query(params![
            target.as_str(),
            after_seq.unwrap_or(i64::MIN),
            last
        ])
        .map_err(fail)?;
    while let Some(row) = rows.next().map_err(fail)? {
        page.messages.push(decode_row(row)?);
    }
    Ok(page)
}

/// Rebuilds a message from its row, validating every field as its type demands.
fn decode_row(row: &rusqlite::Row<'_>) -> Result<Message, StoreError> {
    let text = |index: usize| -> Result<String, StoreError> {
        row.get::<_, String>(index)
            .map_err(|err| StoreError::backend("read a stored message", err))
    };
    let msg_id = text(0)?;
    let bad = |field: &str, detail: String| StoreError::Decode {
        what: format!("{msg_id} field {field}"),
        detail,
    };
    let ticket: Option<String> = row
        .get(2)
        .map_err(|err| StoreError::backend("read a stored message", err))?;
    Ok(Message {
        msg_id: MsgId::parse(&msg_id).map_err(|err| bad("msg_id", err.to_string()))?,
        target: Target::new(text(1)?).map_err(|err| bad("target", err.to_string()))?,
        ticket: ticket
            .map(|t| Ticket::parse(&t))
            .transpose()
            .map_err(|err| bad("ticket", err.to_string()))?,
        kind: text(3)?
            .parse()
            .map_err(|err: fleetd_core::MessageError| bad("kind", err.to_string()))?,
        from: text(4)?,
        created_at: text(5)?
            .parse()
            .map_err(|err: jiff::Error| bad("created_at", err.to_string()))?,
        text: text(6)?,
    })
}

#[cfg(test)]
mod tests;

//! The embedded inbox's single writer thread and its group commit: every write queued while a
//! commit is in flight goes into the next transaction, so N concurrent publishers cost one fsync.
//! Owns the read-write connection; never answers a caller before its transaction has committed.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use rusqlite::{Connection, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use fleetd_core::{Message, MsgId, Target};

use crate::store::{DEDUP_WINDOW, PublishOutcome, StateOp, StoreError};

/// Capacity of the queue into the writer. Bounded so a flood of publishes waits for the disk
/// instead of growing memory; large enough that hundreds of concurrent publishers never wait on the
/// queue itself, only on their commit.
pub(crate) const WRITE_QUEUE_CAPACITY: usize = 4096;

/// Most operations folded into one transaction. Bounds the latency a single commit adds to the
/// first publisher in it; at ~10 µs per row a full batch is ~10 ms of work plus one fsync.
const MAX_BATCH: usize = 1024;

/// One write, with the channel its result goes back on.
#[derive(Debug)]
pub(crate) enum Op {
    /// Store a message unless its id is known.
    Publish {
        message: Message,
        reply: oneshot::Sender<Result<PublishOutcome, StoreError>>,
    },
    /// Remove one pending message of a target: acknowledged (its id remembered, so a
    /// redelivery is a duplicate), or, with `retract`, withdrawn by a publish that failed after
    /// committing it (its id forgotten, so a retry stores it again).
    Ack {
        target: Target,
        msg_id: MsgId,
        retract: bool,
        reply: oneshot::Sender<Result<bool, StoreError>>,
    },
    /// Remove and return every pending message of a target, atomically.
    Drain {
        target: Target,
        reply: oneshot::Sender<Result<Vec<Message>, StoreError>>,
    },
    /// Write one record: proves the writer is alive and the file takes a write now (an empty
    /// transaction commits even on a full disk). `heavy` writes [`HEAVY_PROBE_BYTES`], as
    /// much as a sizeable reply: after a write failed, only that proves writes work again (a
    /// small one may fit the files' free pages while real writes still fail).
    Probe {
        heavy: bool,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Apply changes to the fleet state, in order; `synced: false` lets the commit end without
    /// an fsync when nothing else in its transaction needs one (`commit_state_unsynced`).
    State {
        ops: Vec<StateOp>,
        synced: bool,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// What one operation produced inside a transaction, sent only after the commit.
enum Outcome {
    Published(PublishOutcome),
    Acked(bool),
    Drained(Vec<Message>),
    Probed,
    StateApplied,
}

/// The size of a heavy probe's record.
pub(crate) const HEAVY_PROBE_BYTES: i64 = 256 * 1024;

/// Counters the writer keeps, readable from any thread (for metrics and tests).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    /// The error of the last batch of real writes (not probes) that failed, until a batch of
    /// real writes or a heavy probe commits: `/healthz` reports it.
    pub(crate) last_failure: std::sync::Mutex<Option<StoreError>>,
    /// Transactions committed.
    pub(crate) commits: AtomicU64,
    /// Operations carried by those transactions.
    pub(crate) ops: AtomicU64,
    /// Frames in the WAL after the last commit (set by the writer connection's WAL hook).
    pub(crate) wal_frames: AtomicI64,
    /// Pending messages per target as committed: counted once at open, then moved by the
    /// writer after each commit and before it answers, so `depth` needs no query (a reader
    /// hop on the path from a reply to its nudge) and never shows a write before its commit.
    pub(crate) depths: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl Stats {
    /// The committed depth of every target with pending messages.
    pub(crate) fn depths(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, u64>> {
        crate::sync::lock(&self.depths)
    }
}

/// The writer thread's body: runs until every sender is dropped, then closes the connection.
pub(crate) fn run(
    mut conn: Connection,
    mut ops: mpsc::Receiver<Op>,
    stats: &Stats,
    mut checkpointer: Option<super::checkpoint::Checkpointer>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut syncing = true;
    while let Some(first) = ops.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // WAL with `synchronous=NORMAL` commits without an fsync (the next synced commit or
        // checkpoint makes it durable); only a batch of unsynced state changes alone may.
        let sync = batch
            .iter()
            .any(|op| !matches!(op, Op::State { synced: false, .. }));
        if sync != syncing {
            let level = if sync { "FULL" } else { "NORMAL" };
            match conn.pragma_update(None, "synchronous", level) {
                Ok(()) => syncing = sync,
                // Never a synced write committed without its fsync: refused instead.
                Err(err) if sync => {
                    let err =
                        StoreError::backend("set synchronous=FULL on the embedded inbox", err);
                    for op in batch.drain(..) {
                        reply(op, Err(err.clone()));
                    }
                    continue;
                }
                Err(err) => tracing::debug!(error = %err, "the inbox stays synchronous=FULL"),
            }
        }
        commit_batch(&mut conn, &mut batch, stats);
        if stats.wal_frames.load(Ordering::Relaxed) >= super::checkpoint::WRITER_CHECKPOINT_FRAMES {
            // The background checkpoints fell behind: between two transactions a passive
            // checkpoint always completes, and the next transaction starts the WAL over.
            match super::checkpoint::checkpoint(&conn) {
                Ok((frames, _)) => tracing::debug!(frames, "the inbox writer checkpointed the WAL"),
                Err(err) => {
                    tracing::warn!(error = %err, "a checkpoint of the embedded inbox failed")
                }
            }
            stats.wal_frames.store(0, Ordering::Relaxed);
        }
    }
    // Dropping the WAL hook lets the checkpointer end (it waits for the hook's wake-ups); the
    // last checkpoint waits for it, or a passive one still running would refuse it.
    match conn.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, i32) -> rusqlite::Result<()>>) {
        Ok(()) => {
            if let Some(checkpointer) = checkpointer.take() {
                checkpointer.join();
            }
        }
        Err(err) => tracing::warn!(error = %err, "removing the embedded inbox's WAL hook failed"),
    }
    // Leave the WAL empty: the connection that closes last only checkpoints if it had the WAL
    // open, and the reader may never have read. A WAL left with frames would be replayed into
    // the database file by whatever opens it next, even an open that refuses the file.
    match conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
        row.get::<_, i64>(0)
    }) {
        Ok(0) => {}
        Ok(_busy) => {
            tracing::warn!("the embedded inbox's last checkpoint was blocked; its WAL stays")
        }
        Err(err) => tracing::warn!(error = %err, "the embedded inbox's last checkpoint failed"),
    }
    if let Err((_, err)) = conn.close() {
        tracing::warn!(error = %err, "closing the embedded inbox failed");
    }
    // Its hook could not be removed: the close dropped it, and the checkpointer ends now.
    if let Some(checkpointer) = checkpointer {
        checkpointer.join();
    }
}

fn commit_batch(conn: &mut Connection, batch: &mut Vec<Op>, stats: &Stats) {
    let result = apply(conn, batch);
    // Probes alone say little about real writes; a heavy one or a real write says enough.
    let telling = batch
        .iter()
        .any(|op| !matches!(op, Op::Probe { heavy: false, .. }));
    if telling {
        let mut last = crate::sync::lock(&stats.last_failure);
        let real = |op: &Op| !matches!(op, Op::Probe { .. });
        match &result {
            // A write that committed says the file takes writes; failures of single
            // operations among them are theirs alone (answered to their callers).
            Ok(outcomes)
                if batch
                    .iter()
                    .zip(outcomes)
                    .any(|(op, o)| o.is_ok() && !matches!(op, Op::Probe { heavy: false, .. })) =>
            {
                *last = None;
            }
            Ok(outcomes) => {
                if let Some(Err(err)) = batch
                    .iter()
                    .zip(outcomes)
                    .find(|(op, o)| real(op) && o.is_err())
                    .map(|(_, o)| o)
                {
                    *last = Some(err.clone());
                }
            }
            Err(err) if batch.iter().any(real) => {
                *last = Some(err.clone());
            }
            Err(_) => {}
        }
    }
    match result {
        Ok(outcomes) => {
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
            count_depths(stats, batch, &outcomes);
            for (op, outcome) in batch.drain(..).zip(outcomes) {
                if let Err(err) = &outcome {
                    tracing::error!(error = %err, "an inbox write failed; the rest of its batch committed");
                }
                reply(op, outcome);
            }
        }
        Err(err) => {
            tracing::error!(error = %err, ops = batch.len(), "an inbox write batch failed");
            for op in batch.drain(..) {
                reply(op, Err(err.clone()));
            }
        }
    }
}

/// Moves the committed depths by what a committed batch stored and removed.
fn count_depths(stats: &Stats, batch: &[Op], outcomes: &[Result<Outcome, StoreError>]) {
    let mut depths = stats.depths();
    for (op, outcome) in batch.iter().zip(outcomes) {
        let (target, added, removed) = match (op, outcome) {
            (Op::Publish { message, .. }, Ok(Outcome::Published(PublishOutcome::Stored))) => {
                (&message.target, 1, 0)
            }
            (Op::Ack { target, .. }, Ok(Outcome::Acked(true))) => (target, 0, 1),
            (Op::Drain { target, .. }, Ok(Outcome::Drained(messages))) if !messages.is_empty() => {
                (target, 0, messages.len() as u64)
            }
            _ => continue,
        };
        let depth = depths.entry(target.as_str().to_owned()).or_insert(0);
        *depth = (*depth + added).saturating_sub(removed);
        if *depth == 0 {
            depths.remove(target.as_str());
        }
    }
}

/// Counts every target's pending messages (once, at open, before the writer starts).
pub(crate) fn count_pending(
    conn: &Connection,
) -> Result<std::collections::HashMap<String, u64>, StoreError> {
    let fail = |err| StoreError::backend("count the embedded inbox", err);
    let mut stmt = conn
        .prepare("SELECT target, count(*) FROM messages GROUP BY target")
        .map_err(fail)?;
    let rows = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .map_err(fail)?;
    rows.map(|row| {
        row.map(|(target, n)| (target, u64::try_from(n).unwrap_or(0)))
            .map_err(fail)
    })
    .collect()
}

/// Runs the whole batch in one IMMEDIATE transaction and commits it (one fsync in WAL mode).
/// Each operation runs in a savepoint of its own: one that fails (a body past
/// SQLite's length limit, say) is rolled back and answered with its error alone, and its
/// neighbours commit. Only a failure that ends the transaction itself (SQLite rolls it back on
/// some I/O and full-disk errors) or a failed commit fails the whole batch.
fn apply(
    conn: &mut Connection,
    batch: &[Op],
) -> Result<Vec<Result<Outcome, StoreError>>, StoreError> {
    let fail = |err| StoreError::backend("write to the embedded inbox", err);
    let mut tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut acked_any = false;
    for op in batch {
        let savepoint = tx.savepoint().map_err(fail)?;
        let outcome = apply_one(&savepoint, op);
        match &outcome {
            Ok(_) => savepoint.commit().map_err(fail)?,
            Err(err) => {
                drop(savepoint); // rolled back
                if tx.is_autocommit() {
                    // SQLite ended the transaction itself: nothing of the batch holds.
                    return Err(err.clone());
                }
            }
        }
        acked_any |= match &outcome {
            Ok(Outcome::Acked(acked)) => *acked,
            Ok(Outcome::Drained(drained)) => !drained.is_empty(),
            _ => false,
        };
        outcomes.push(outcome);
    }
    if acked_any {
        prune_acked(&tx).map_err(fail)?;
    }
    tx.commit()
        .map_err(|err| StoreError::backend("commit to the embedded inbox", err))?;
    Ok(outcomes)
}

/// One operation of a batch, inside its savepoint.
fn apply_one(conn: &Connection, op: &Op) -> Result<Outcome, StoreError> {
    let fail = |err| StoreError::backend("write to the embedded inbox", err);
    Ok(match op {
        Op::Publish { message, .. } => Outcome::Published(insert(conn, message).map_err(fail)?),
        Op::Ack {
            target,
            msg_id,
            retract,
            ..
        } => Outcome::Acked(remove(conn, target, *msg_id, !*retract).map_err(fail)?),
        Op::Drain { target, .. } => Outcome::Drained(drain(conn, target)?),
        Op::Probe { heavy, .. } => {
            let size = if *heavy { HEAVY_PROBE_BYTES } else { 1 };
            conn.execute(
                // Text, like every fleet_state value (the engine skips this kind).
                "INSERT INTO fleet_state (kind, key, value)
                 VALUES ('health', 'probe', substr(hex(zeroblob(?1)), 1, ?1))
                 ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
                [size],
            )
            .map_err(fail)?;
            Outcome::Probed
        }
        Op::State { ops, .. } => {
            apply_state(conn, ops).map_err(fail)?;
            Outcome::StateApplied
        }
    })
}

fn insert(tx: &Connection, message: &Message) -> rusqlite::Result<PublishOutcome> {
    // One statement: skip ids acknowledged recently, and ids already pending (the UNIQUE key).
    let inserted = tx
        .prepare_cached(
            "INSERT INTO messages (msg_id, target, ticket, kind, sender, created_at, body)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
             WHERE NOT EXISTS (SELECT 1 FROM acked WHERE msg_id = ?1)
             ON CONFLICT (msg_id) DO NOTHING",
        )?
        .execute(params![
            message.msg_id.to_string(),
            message.target.as_str(),
            message.ticket.map(|t| t.to_string()),
            message.kind.as_str(),
            message.from,
            message.created_at.to_string(),
            message.text,
        ])?;
    Ok(if inserted == 1 {
        PublishOutcome::Stored
    } else {
        PublishOutcome::Duplicate
    })
}

fn remove(
    tx: &Connection,
    target: &Target,
    msg_id: MsgId,
    remember: bool,
) -> rusqlite::Result<bool> {
    let id = msg_id.to_string();
    let deleted = tx
        .prepare_cached("DELETE FROM messages WHERE msg_id = ?1 AND target = ?2")?
        .execute(params![id, target.as_str()])?;
    if deleted == 0 || !remember {
        return Ok(deleted > 0);
    }
    tx.prepare_cached("INSERT OR IGNORE INTO acked (msg_id) VALUES (?1)")?
        .execute([id])?;
    Ok(true)
}

fn drain(tx: &Connection, target: &Target) -> Result<Vec<Message>, StoreError> {
    let fail = |err| StoreError::backend("drain the embedded inbox", err);
    let messages = super::select_pending(tx, target, i64::MAX)?;
    for message in &messages {
        remove(tx, target, message.msg_id, true).map_err(fail)?;
    }
    Ok(messages)
}

fn apply_state(tx: &Connection, ops: &[StateOp]) -> rusqlite::Result<()> {
    for op in ops {
        match op {
            StateOp::Put(r) => {
                tx.prepare_cached(
                    "INSERT INTO fleet_state (kind, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value",
                )?
                .execute(params![r.kind, r.key, r.value])?;
            }
            StateOp::Delete { kind, key } => {
                tx.prepare_cached("DELETE FROM fleet_state WHERE kind = ?1 AND key = ?2")?
                    .execute(params![kind, key])?;
            }
        }
    }
    Ok(())
}

/// Keeps the newest [`DEDUP_WINDOW`] acknowledged ids; older ones may be forgotten.
fn prune_acked(tx: &Connection) -> rusqlite::Result<()> {
    let window = i64::try_from(DEDUP_WINDOW).unwrap_or(i64::MAX);
    tx.prepare_cached("DELETE FROM acked WHERE seq <= (SELECT max(seq) FROM acked) - ?1")?
        .execute([window])?;
    Ok(())
}

fn reply(op: Op, result: Result<Outcome, StoreError>) {
    // A caller that gave up (its future was dropped) no longer listens; its write still happened.
    match (op, result) {
        (Op::Publish { reply, .. }, Ok(Outcome::Published(outcome))) => {
            let _ = reply.send(Ok(outcome));
        }
        (Op::Ack { reply, .. }, Ok(Outcome::Acked(acked))) => {
            let _ = reply.send(Ok(acked));
        }
        (Op::Drain { reply, .. }, Ok(Outcome::Drained(messages))) => {
            let _ = reply.send(Ok(messages));
        }
        (Op::Probe { reply, .. }, Ok(Outcome::Probed))
        | (Op::State { reply, .. }, Ok(Outcome::StateApplied)) => {
            let _ = reply.send(Ok(()));
        }
        // `apply` yields exactly one outcome per op, in op order, so this arm cannot match; if it
        // ever did, dropping the reply makes the caller see `Closed` rather than a wrong answer.
        (_, Ok(_)) => tracing::error!("bug: an inbox write outcome did not match its operation"),
        (Op::Publish { reply, .. }, Err(err)) => {
            let _ = reply.send(Err(err));
        }
        (Op::Ack { reply, .. }, Err(err)) => {
            let _ = reply.send(Err(err));
        }
        (Op::Drain { reply, .. }, Err(err)) => {
            let _ = reply.send(Err(err));
        }
        (Op::Probe { reply, .. } | Op::State { reply, .. }, Err(err)) => {
            let _ = reply.send(Err(err));
        }
    }
}

//! Tests of the embedded inbox against a real file.

use super::*;
use crate::store::LockHolder;
use fleetd_core::MessageKind;

fn message(target: &str, n: u64) -> Message {
    Message {
        msg_id: MsgId::from_parts(1_700_000_000_000 + n, [n as u8; 10]),
        target: Target::new(target).expect("valid target"),
        ticket: None,
        kind: MessageKind::Reply,
        text: format!("message {n}"),
        from: "alice".to_owned(),
        created_at: jiff::Timestamp::from_second(1_700_000_000).expect("valid"),
    }
}

async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(path.to_owned(), StoreOptions::default()).await
}

#[tokio::test]
async fn a_second_open_is_refused_naming_the_holder_until_the_first_closes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state/inbox.db");
    let first = open(&path)
        .await
        .expect("first open creates the directory and file");
    let err = open(&path).await.expect_err("second open must fail");
    assert!(
        matches!(err, StoreError::Locked { holder: LockHolder::Pid(pid), .. } if pid == std::process::id()),
        "{err:?}"
    );
    first.close().await.expect("close");
    let again = open(&path).await.expect("the lock is free after close");
    drop(again);
    let third = open(&path).await.expect("the lock is free after drop");
    drop(third);
}

#[tokio::test]
async fn acknowledged_ids_stay_duplicates_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let m = message("bob", 1);
    let store = open(&path).await.expect("open");
    assert_eq!(
        store.publish(m.clone()).await.expect("publish"),
        PublishOutcome::Stored
    );
    assert!(store.ack(&m.target, m.msg_id).await.expect("ack"));
    store.close().await.expect("close");
    let store = open(&path).await.expect("reopen");
    assert_eq!(
        store.publish(m.clone()).await.expect("publish"),
        PublishOutcome::Duplicate
    );
    assert_eq!(store.depth(&m.target).await.expect("depth"), 0);
    store.health().await.expect("healthy");
    store.close().await.expect("close");
    assert!(matches!(store.publish(m).await, Err(StoreError::Closed)));
}

#[tokio::test]
async fn garbage_is_refused_as_corrupt_and_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&path, &garbage).expect("write garbage");
    let err = open(&path).await.expect_err("garbage must be refused");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("left untouched"), "{err}");
    assert_eq!(std::fs::read(&path).expect("read back"), garbage);
}

#[tokio::test]
async fn damaged_pages_are_refused_as_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = open(&path).await.expect("open");
    for n in 0..400 {
        store.publish(message("carol", n)).await.expect("publish");
    }
    store.close().await.expect("close");
    // A clean close leaves no WAL frames for the next open to replay into the file.
    let wal = std::fs::metadata(path.with_extension("db-wal")).map_or(0, |meta| meta.len());
    assert_eq!(wal, 0, "the WAL is empty after close");
    let mut bytes = std::fs::read(&path).expect("read");
    // Smash every page after the first: the header stays valid, every b-tree page is garbage.
    let page_size = usize::from(u16::from_be_bytes([bytes[16], bytes[17]]));
    assert!(bytes.len() > 8 * page_size, "the file spans many pages");
    for byte in &mut bytes[page_size..] {
        *byte = 0xA5;
    }
    std::fs::write(&path, &bytes).expect("write damaged");
    let err = open(&path).await.expect_err("damaged file must be refused");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert_eq!(std::fs::read(&path).expect("read back"), bytes);
}

#[tokio::test]
async fn a_foreign_sqlite_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let conn = Connection::open(&path).expect("create foreign db");
    conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
        .expect("foreign schema");
    drop(conn);
    let err = open(&path).await.expect_err("foreign file must be refused");
    assert!(err.to_string().contains("not a fleetd inbox"), "{err}");
    let conn = Connection::open(&path).expect("reopen foreign db");
    let body: String = conn
        .query_row("SELECT body FROM notes", [], |row| row.get(0))
        .expect("the foreign data is still there");
    assert_eq!(body, "mine");
}

#[tokio::test]
async fn a_newer_schema_is_refused_with_both_versions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = open(&path).await.expect("open");
    store.publish(message("dave", 1)).await.expect("publish");
    store.close().await.expect("close");
    let conn = Connection::open(&path).expect("open raw");
    conn.execute("UPDATE schema_version SET version = 99", [])
        .expect("bump version");
    drop(conn);
    let before = std::fs::read(&path).expect("read");
    let err = open(&path).await.expect_err("newer schema must be refused");
    assert!(
        matches!(err, StoreError::NewerSchema { found: 99, supported, .. } if supported == SqliteStore::SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade fleetd"), "{err}");
    assert_eq!(std::fs::read(&path).expect("read back"), before);
}

#[test]
fn queued_writes_share_one_commit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let conn = schema::open_writer(&path).expect("open writer");
    let (ops, rx) = mpsc::channel(writer::WRITE_QUEUE_CAPACITY);
    // Queue 64 publishes, a duplicate and an ack before the writer runs: it must fold them all
    // into one transaction and still answer each one as if it ran alone, in order.
    let mut answers = Vec::new();
    for n in 0..64 {
        let (reply, answer) = oneshot::channel();
        ops.try_send(Op::Publish {
            message: message("erin", n),
            reply,
        })
        .expect("queue has room");
        answers.push(answer);
    }
    let (reply, duplicate) = oneshot::channel();
    ops.try_send(Op::Publish {
        message: message("erin", 0),
        reply,
    })
    .expect("queue has room");
    let (reply, acked) = oneshot::channel();
    let erin = Target::new("erin").expect("valid");
    ops.try_send(Op::Ack {
        target: erin,
        msg_id: message("erin", 5).msg_id,
        retract: false,
        reply,
    })
    .expect("queue has room");
    drop(ops);
    let stats = writer::Stats::default();
    writer::run(conn, rx, &stats, None);
    assert_eq!(stats.commits.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(stats.ops.load(std::sync::atomic::Ordering::Relaxed), 66);
    for answer in answers {
        assert!(matches!(
            answer.blocking_recv().expect("answered"),
            Ok(PublishOutcome::Stored)
        ));
    }
    assert!(matches!(
        duplicate.blocking_recv().expect("answered"),
        Ok(PublishOutcome::Duplicate)
    ));
    assert!(matches!(acked.blocking_recv().expect("answered"), Ok(true)));
    let reader = schema::open_reader(&path).expect("open reader");
    let count: i64 = reader
        .query_row("SELECT count(*) FROM messages", [], |row| row.get(0))
        .expect("count");
    assert_eq!(count, 63);
}

#[test]
fn one_failing_write_fails_alone_and_its_batch_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let conn = schema::open_writer(&path).expect("open writer");
    // A statement SQLite refuses on its own (as it would a body past its length limit).
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON messages WHEN NEW.body = 'poison'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
    )
    .expect("trigger");
    let (ops, rx) = mpsc::channel(writer::WRITE_QUEUE_CAPACITY);
    let mut answers = Vec::new();
    for n in 0..3 {
        let mut m = message("fran", n);
        if n == 1 {
            m.text = "poison".to_owned();
        }
        let (reply, answer) = oneshot::channel();
        ops.try_send(Op::Publish { message: m, reply })
            .expect("queue has room");
        answers.push(answer);
    }
    drop(ops);
    let stats = writer::Stats::default();
    writer::run(conn, rx, &stats, None);
    // Review L9: one transaction, and only the refused write is refused.
    assert_eq!(stats.commits.load(std::sync::atomic::Ordering::Relaxed), 1);
    let answers: Vec<_> = answers
        .into_iter()
        .map(|a| a.blocking_recv().expect("answered"))
        .collect();
    assert!(
        matches!(answers[0], Ok(PublishOutcome::Stored)),
        "{answers:?}"
    );
    assert!(answers[1].is_err(), "{answers:?}");
    assert!(
        matches!(answers[2], Ok(PublishOutcome::Stored)),
        "{answers:?}"
    );
    assert!(stats.last_failure.lock().expect("lock").is_none());
    assert_eq!(stats.depths().get("fran"), Some(&2));
    let reader = schema::open_reader(&path).expect("open reader");
    let bodies: Vec<String> = reader
        .prepare("SELECT body FROM messages ORDER BY seq")
        .expect("prepare")
        .query_map([], |row| row.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(!bodies.contains(&"poison".to_owned()), "{bodies:?}");
    assert_eq!(bodies.len(), 2);
}

#[tokio::test]
async fn the_wal_is_checkpointed_beside_the_writer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = open(&path).await.expect("open");
    let size = || std::fs::metadata(&path).expect("the database file").len();
    let before = size();
    // One commit each, a few WAL frames each: past the checkpointer's threshold, far from
    // the one at which the writer checkpoints itself.
    for n in 0..600 {
        store.publish(message("frank", n)).await.expect("publish");
    }
    assert!(
        store
            .stats
            .wal_frames
            .load(std::sync::atomic::Ordering::Relaxed)
            < checkpoint::WRITER_CHECKPOINT_FRAMES
    );
    // Only a checkpoint writes pages into the database file itself.
    let mut polls = 0;
    while size() < before + 32 * 1024 {
        polls += 1;
        assert!(
            polls < 3000,
            "no checkpoint copied the WAL into the database file within 30 s ({} bytes)",
            size()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    store.close().await.expect("close");
    let again = open(&path).await.expect("reopen");
    assert_eq!(
        again
            .depth(&Target::new("frank").expect("valid"))
            .await
            .expect("depth"),
        600
    );
}

fn record(kind: &str, key: &str, value: &str) -> StateRecord {
    StateRecord {
        kind: kind.to_owned(),
        key: key.to_owned(),
        value: value.to_owned(),
    }
}

#[tokio::test]
async fn fleet_state_is_kept_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = open(&path).await.expect("open");
    store
        .commit_state(vec![
            StateOp::Put(record("ticket", "t1", "{\"a\":1}")),
            StateOp::Put(record("ticket", "t2", "{\"a\":2}")),
            StateOp::Put(record("member", "ann", "{}")),
        ])
        .await
        .expect("commit");
    store
        .commit_state(vec![
            StateOp::Put(record("ticket", "t1", "{\"a\":3}")),
            StateOp::Delete {
                kind: "ticket".to_owned(),
                key: "t2".to_owned(),
            },
        ])
        .await
        .expect("commit");
    store.close().await.expect("close");
    drop(store);
    let again = open(&path).await.expect("reopen");
    let mut kept = again.load_state().await.expect("load");
    kept.sort_by(|a, b| (&a.kind, &a.key).cmp(&(&b.kind, &b.key)));
    assert_eq!(
        kept,
        [
            record("member", "ann", "{}"),
            record("ticket", "t1", "{\"a\":3}")
        ]
    );
}

#[tokio::test]
async fn unsynced_state_commits_are_kept_beside_synced_ones_and_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    let store = open(&path).await.expect("open");
    let usage = |n: &str| vec![StateOp::Put(record("account", n, "{}"))];
    // Alone, mixed into one writer batch with synced writes, and after them.
    store
        .commit_state_unsynced(usage("1"))
        .await
        .expect("unsynced");
    let (a, b, c) = tokio::join!(
        store.commit_state_unsynced(usage("2")),
        store.commit_state(vec![StateOp::Put(record("ticket", "t", "{}"))]),
        store.publish(message("alice", 1)),
    );
    a.expect("unsynced");
    b.expect("synced");
    assert_eq!(c.expect("publish"), PublishOutcome::Stored);
    store
        .commit_state_unsynced(usage("3"))
        .await
        .expect("unsynced");
    store.close().await.expect("close");
    drop(store);
    let again = open(&path).await.expect("reopen");
    let mut kept: Vec<String> = (again.load_state().await.expect("load"))
        .into_iter()
        .map(|r| format!("{}/{}", r.kind, r.key))
        .collect();
    kept.sort();
    assert_eq!(kept, ["account/1", "account/2", "account/3", "ticket/t"]);
    assert_eq!(
        again
            .depth(&Target::new("alice").expect("target"))
            .await
            .expect("depth"),
        1
    );
}

#[tokio::test]
async fn a_version_1_inbox_is_migrated_with_its_messages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inbox.db");
    {
        // What fleetd wrote before the fleet state existed: schema v1 with one message.
        let conn = rusqlite::Connection::open(&path).expect("sqlite");
        conn.execute_batch(schema::MIGRATIONS[0]).expect("v1");
        conn.execute("UPDATE schema_version SET version = 1", [])
            .expect("v1");
        conn.pragma_update(None, "application_id", schema::APPLICATION_ID)
            .expect("app id");
        conn.execute(
            "INSERT INTO messages (msg_id, target, ticket, kind, sender, created_at, body)
             VALUES (?1, 'alice', NULL, 'reply', 'alice', '2026-01-01T00:00:00Z', 'kept')",
            [message("alice", 1).msg_id.to_string()],
        )
        .expect("insert");
    }
    let store = open(&path).await.expect("migrates");
    let alice = Target::new("alice").expect("target");
    let pending = store.peek(&alice, 10).await.expect("peek");
    assert_eq!(pending.len(), 1);
    // Counted at open: the depth is the writer's count, not a query.
    assert_eq!(store.depth(&alice).await.expect("depth"), 1);
    assert_eq!(store.targets().await.expect("targets"), vec![alice.clone()]);
    assert_eq!(pending[0].text, "kept");
    assert!(store.load_state().await.expect("load").is_empty());
    store
        .commit_state(vec![StateOp::Put(record("member", "ann", "{}"))])
        .await
        .expect("the new table is there");
}

//! Opening the embedded inbox file: identify it, check it, migrate its schema. Refuses damaged,
//! foreign or newer files with a clear error and never recreates or rewrites them.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::store::StoreError;

/// The schema version this build writes. Bump it together with a new entry in [`MIGRATIONS`].
pub(crate) const SCHEMA_VERSION: i64 = 2;

/// `PRAGMA application_id` of a fleetd inbox ("fltd"), so a foreign SQLite file is recognised as
/// such before anything is written to it.
pub(crate) const APPLICATION_ID: i64 = 0x666c_7464;

/// How long a connection waits for SQLite's own file locks. Only this process uses the file (the
/// state lock guarantees it), so waits are short; the timeout only guards against surprises.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page size of a new inbox file, in bytes. See [`open_writer`].
const PAGE_SIZE: i64 = 1024;

/// `MIGRATIONS[n]` takes the schema from version `n` to `n + 1`, inside one transaction.
pub(crate) const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [
    // v1: pending messages in arrival order, plus the ids acknowledged recently (for dedup).
    // `seq` is the rowid: a new row gets max(rowid) + 1, so it sorts after every pending message.
    // (A rowid freed by acking the newest row may be reused, which cannot reorder pending rows;
    // AUTOINCREMENT would prevent that at the cost of a sqlite_sequence page in every commit.)
    "CREATE TABLE schema_version (version INTEGER NOT NULL);
     INSERT INTO schema_version (version) VALUES (0);
     CREATE TABLE messages (
         seq        INTEGER PRIMARY KEY,
         msg_id     TEXT    NOT NULL UNIQUE,
         target     TEXT    NOT NULL,
         ticket     TEXT,
         kind       TEXT    NOT NULL,
         sender     TEXT    NOT NULL,
         created_at TEXT    NOT NULL,
         body       TEXT    NOT NULL
     );
     CREATE INDEX messages_by_target ON messages (target, seq);
     CREATE TABLE acked (
         seq    INTEGER PRIMARY KEY,
         msg_id TEXT    NOT NULL UNIQUE
     );",
    // v2: the engine's durable state (SPEC §15) as keyed JSON records: tickets, task texts,
    // questions, leads, members. The engine owns the records' shapes.
    "CREATE TABLE fleet_state (
         kind  TEXT NOT NULL,
         key   TEXT NOT NULL,
         value TEXT NOT NULL,
         PRIMARY KEY (kind, key)
     ) WITHOUT ROWID;",
];

/// Opens the read-write connection the writer thread owns: identifies and checks the file, sets
/// WAL with `synchronous=FULL`, and migrates an older schema.
pub(crate) fn open_writer(path: &Path) -> Result<Connection, StoreError> {
    let mut conn = open_with(path, OpenFlags::SQLITE_OPEN_CREATE)?;
    let version = identify(&conn, path)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version == 0 {
        // Small pages: a one-message commit appends a few KiB to the WAL instead of 16 KiB. Only
        // possible before the first table exists and before WAL mode is on.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(|err| classify(path, "set the page size of the embedded inbox", err))?;
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|err| classify(path, "switch the embedded inbox to WAL", err))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("journal_mode stayed {mode:?} instead of WAL"),
        });
    }
    // FULL: in WAL mode every commit is fsynced, so a publish acknowledged is a publish on disk.
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|err| classify(path, "set synchronous=FULL on the embedded inbox", err))?;
    migrate(&mut conn, path, version)?;
    Ok(conn)
}

/// Opens the embedded inbox at `path` read-write, with `more` flags, one connection a thread
/// (no mutex), waiting up to `BUSY_TIMEOUT` for a lock.
fn open_with(path: &Path, more: OpenFlags) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | more;
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|err| classify(path, "open the embedded inbox", err))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|err| classify(path, "configure the embedded inbox", err))?;
    Ok(conn)
}

/// Opens the checkpointer's connection (see `checkpoint`): `synchronous=FULL`, so a checkpoint
/// syncs the WAL before it copies frames and the database file before the WAL is reused.
pub(crate) fn open_checkpointer(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_with(path, OpenFlags::empty())?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|err| classify(path, "set synchronous=FULL on the inbox checkpointer", err))?;
    Ok(conn)
}

/// Opens a connection used only for reads (peek, depth, targets). WAL lets it read committed data
/// while the writer commits.
pub(crate) fn open_reader(path: &Path) -> Result<Connection, StoreError> {
    let conn = open_with(path, OpenFlags::empty())?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|err| classify(path, "make the inbox reader read-only", err))?;
    Ok(conn)
}

/// Returns the file's schema version: 0 for a brand-new empty file. Reads only, so a foreign or
/// damaged file is left exactly as it was.
fn identify(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let app_id: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(|err| classify(path, "read the embedded inbox header", err))?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))
        .map_err(|err| classify(path, "read the embedded inbox schema", err))?;
    if app_id == 0 && objects == 0 {
        return Ok(0);
    }
    if app_id != APPLICATION_ID {
        return Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!(
                "SQLite file with application_id {app_id:#x} and {objects} schema objects, not a fleetd inbox"
            ),
        });
    }
    quick_check(conn, path)?;
    conn.query_row("SELECT version FROM schema_version", [], |row| row.get(0))
        .map_err(|err| StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("cannot read schema_version: {err}"),
        })
}

fn quick_check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let mut stmt = conn
        .prepare("PRAGMA quick_check")
        .map_err(|err| classify(path, "check the embedded inbox", err))?;
    let findings: Vec<String> = stmt
        .query_map([], |row| row.get(0))
        .and_then(Iterator::collect)
        .map_err(|err| classify(path, "check the embedded inbox", err))?;
    if findings.len() == 1 && findings[0] == "ok" {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        path: path.to_owned(),
        detail: format!("quick_check: {}", findings.join("; ")),
    })
}

fn migrate(conn: &mut Connection, path: &Path, from: i64) -> Result<(), StoreError> {
    for version in from..SCHEMA_VERSION {
        let step = usize::try_from(version).expect("versions here are small and non-negative");
        let tx = conn
            .transaction()
            .map_err(|err| classify(path, "begin an inbox schema migration", err))?;
        tx.execute_batch(MIGRATIONS[step])
            .and_then(|()| tx.execute("UPDATE schema_version SET version = ?1", [version + 1]))
            .and_then(|_| tx.pragma_update(None, "application_id", APPLICATION_ID))
            .and_then(|()| tx.commit())
            .map_err(|err| classify(path, "migrate the inbox schema", err))?;
    }
    Ok(())
}

/// Maps an open-time SQLite error: damage and "not a database" become [`StoreError::Corrupt`] (the
/// operator must act), anything else stays a backend error.
fn classify(path: &Path, op: &'static str, err: rusqlite::Error) -> StoreError {
    match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("{op}: {err}"),
        },
        _ => StoreError::backend(op, err),
    }
}

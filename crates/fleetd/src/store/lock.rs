//! The embedded store's single-owner lock: an exclusive `flock` on `<db>.lock` holding the owner's
//! pid. Knows nothing about SQLite; it only guards a path for the lifetime of one store.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{LockHolder, StoreError};

/// An exclusive lock on a database path, released when dropped (the kernel also releases it when
/// the process dies, so a `kill -9` never leaves a stale lock behind).
#[derive(Debug)]
pub(crate) struct StateLock {
    // Held only for its lock; the kernel ties the flock to this open file description.
    _file: File,
}

impl StateLock {
    /// The lock file that guards `db`: the same name with `.lock` appended.
    pub(crate) fn path_for(db: &Path) -> PathBuf {
        let mut name = db.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock for `db` without waiting, then writes this process's pid into the lock file.
    /// Fails with [`StoreError::Locked`] naming the holder's pid when another owner has it.
    pub(crate) fn acquire(db: &Path) -> Result<Self, StoreError> {
        let path = Self::path_for(db);
        // Never truncate on open: the file may name the current holder, which we report.
        let mut file = crate::state_dir::open_private(&path)
            .map_err(|err| StoreError::backend("create the inbox lock file", err))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::Locked {
                    path: db.to_owned(),
                    holder: read_holder(&mut file),
                });
            }
            Err(TryLockError::Error(err)) => {
                return Err(StoreError::backend("lock the inbox lock file", err));
            }
        }
        let pid = std::process::id();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| writeln!(file, "{pid}"))
            .and_then(|()| file.flush())
            .map_err(|err| StoreError::backend("write the pid into the inbox lock file", err))?;
        Ok(Self { _file: file })
    }
}

fn read_holder(file: &mut File) -> LockHolder {
    let mut text = String::new();
    // A holder that has locked but not yet written its pid leaves the file empty.
    if file.read_to_string(&mut text).is_err() {
        return LockHolder::Unknown;
    }
    text.trim()
        .parse::<u32>()
        .map_or(LockHolder::Unknown, LockHolder::Pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_in_the_same_process_is_refused_with_our_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("inbox.db");
        let first = StateLock::acquire(&db).expect("first lock");
        assert_eq!(StateLock::path_for(&db), dir.path().join("inbox.db.lock"));
        let written = std::fs::read_to_string(StateLock::path_for(&db)).expect("lock file");
        assert_eq!(written.trim(), std::process::id().to_string());
        let err = StateLock::acquire(&db).expect_err("second lock must fail");
        match &err {
            StoreError::Locked { path, holder } => {
                assert_eq!(path, &db);
                assert_eq!(*holder, LockHolder::Pid(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains(&format!("pid {}", std::process::id()))
        );
        drop(first);
        let again = StateLock::acquire(&db).expect("lock is free after drop");
        drop(again);
    }
}

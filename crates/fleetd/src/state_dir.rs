//! Owner-only state: the state directory (inbox, member registry, sockets, launch files) is
//! readable by the daemon's user alone — the directory 0700, every file in it 0600 — because it
//! holds every reply body and, briefly, members' credentials. Owns the umask the daemon runs
//! with and the check at start that tightens (and warns about) anything looser it finds. Knows
//! nothing about what the files hold.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the state directory and any directory fleetd makes in it.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file (and socket) fleetd makes in the state directory.
pub const FILE_MODE: u32 = 0o600;
/// The umask `fleetd serve` runs with: nothing it creates is readable by group or others.
pub const UMASK: u32 = 0o077;

/// The umask the process had before [`restrict_umask`].
static USER_UMASK: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Sets the process umask to [`UMASK`] (`fleetd serve` does, first thing) and remembers the one
/// it had, so a process fleetd starts for the user (a tmux server) can be given it back.
pub fn restrict_umask() {
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(UMASK)).as_raw_mode();
    let _ = USER_UMASK.set(old);
}

/// The user's umask from before [`restrict_umask`], when it was called.
pub fn user_umask() -> Option<u32> {
    USER_UMASK.get().copied()
}

/// Creates `dir` (its parents with their usual modes, `dir` itself 0700) or, when it exists,
/// tightens it and the files directly in it (see [`tighten_tree`]).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(DIR_MODE).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => tighten_tree(dir),
        Err(e) => Err(e),
    }
}

/// Opens `path` to read and write, creating it owner-only ([`FILE_MODE`]) when it is not there
/// and never truncating it: what it holds already (a lock's holder, a database) stays.
pub fn open_private(path: &Path) -> io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)
}

/// Makes `dir` 0700 and every entry directly in it 0600 (directories 0700, one level down too),
/// warning once per path whose mode was looser. Entries owned by another user are only warned
/// about: fleetd does not change what is not its user's.
pub fn tighten_tree(dir: &Path) -> io::Result<()> {
    tighten(dir, DIR_MODE)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            tighten(&path, DIR_MODE)?;
            for inner in std::fs::read_dir(&path)? {
                let inner = inner?.path();
                if std::fs::symlink_metadata(&inner).is_ok_and(|m| !m.file_type().is_symlink()) {
                    tighten(&inner, FILE_MODE)?;
                }
            }
        } else {
            tighten(&path, FILE_MODE)?;
        }
    }
    Ok(())
}

/// Makes `path` no looser than `mode`; returns the old mode when it changed it.
pub fn tighten(path: &Path, mode: u32) -> io::Result<Option<u32>> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let old = meta.permissions().mode() & 0o777;
    if old & !mode == 0 {
        return Ok(None);
    }
    if meta.uid() != rustix::process::geteuid().as_raw() {
        tracing::warn!(path = %path.display(), mode = format!("{old:o}"), "a file in fleetd's state is another user's and readable beyond its owner; fleetd leaves it as it is");
        return Ok(None);
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(old & mode))?;
    tracing::warn!(
        path = %path.display(),
        was = format!("{old:o}"),
        now = format!("{:o}", old & mode),
        "fleetd's state was readable beyond its owner; made it owner-only"
    );
    Ok(Some(old))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn a_new_state_dir_is_owner_only() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("a/b/fleetd");
        private_dir(&dir).expect("created");
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn a_loose_existing_state_is_tightened() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("fleetd");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let db = dir.join("inbox.db");
        std::fs::write(&db, b"x").expect("write");
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let sub = dir.join("launch");
        std::fs::create_dir(&sub).expect("mkdir");
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let inner = sub.join("env");
        std::fs::write(&inner, b"x").expect("write");
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        private_dir(&dir).expect("tightened");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&db), 0o600);
        assert_eq!(mode(&sub), 0o700);
        assert_eq!(mode(&inner), 0o600);
        // Tight already: nothing changes, nothing is reported.
        assert_eq!(tighten(&db, FILE_MODE).expect("checked"), None);
        // Tighter than required stays as it is.
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        assert_eq!(tighten(&db, FILE_MODE).expect("checked"), None);
        assert_eq!(mode(&db), 0o400);
    }
}

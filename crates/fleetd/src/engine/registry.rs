//! The member registry on disk (`<state dir>/members.json`): who was a member, in which pane
//! incarnation, so a restarted daemon re-adopts the members still running instead of refusing
//! their replies as strangers. One writer task writes the latest list atomically (temp file,
//! fsync, rename), so a crash leaves the old file or the new one, never half of one.

use std::path::{Path, PathBuf};

use tokio::sync::watch;

use super::NewMember;

/// Reads the registry; a missing file is an empty one, an unreadable one is logged and ignored
/// (the members in it are then unknown, as they were before the registry existed).
pub(super) fn load(path: &Path) -> Vec<NewMember> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the member registry; members from before the restart are not re-adopted");
            Vec::new()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the member registry");
            Vec::new()
        }
    }
}

/// Starts the writer; each value sent is written (the latest wins when several queue up).
pub(super) fn writer(path: PathBuf, initial: Vec<NewMember>) -> watch::Sender<Vec<NewMember>> {
    let (tx, mut rx) = watch::channel(initial);
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let members = rx.borrow_and_update().clone();
            let path = path.clone();
            let written = tokio::task::spawn_blocking(move || write(&path, &members)).await;
            match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot write the member registry"),
                Err(e) => tracing::warn!(error = %e, "the member registry writer failed"),
            }
        }
    });
    tx
}

fn write(path: &Path, members: &[NewMember]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    let mut file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::state::FILE_MODE)
            .open(&tmp)?
    };
    file.write_all(&serde_json::to_vec_pretty(members).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename is durable only once the directory entry is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> NewMember {
        NewMember {
            target: fleetd_core::Target::new(name).expect("target"),
            profile: "p".to_owned(),
            agent: "claude".to_owned(),
            pane: fleetd_core::QualifiedPaneId::parse("lead:w1:p2").expect("pane"),
            terminal: fleetd_core::TerminalId::new("term_1").expect("terminal"),
            allow_delegation: false,
            idle_timeout_secs: Some(60),
            backend: Some("lab".to_owned()),
            lead: None,
        }
    }

    #[test]
    fn a_written_registry_reads_back_and_a_missing_or_broken_one_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("members.json");
        assert!(load(&path).is_empty());
        write(&path, &[member("ann"), member("bo")]).expect("write");
        let back = load(&path);
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].target.as_str(), "bo");
        assert_eq!(back[0].pane.to_string(), "lead:w1:p2");
        std::fs::write(&path, "{not json").expect("corrupt");
        assert!(load(&path).is_empty());
    }
}

//! The legacy member registry, `<state dir>/members.json` (members now live in
//! the durable fleet state): read once at start so its members are re-adopted and written to
//! the store. Only reads.

use std::path::Path;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str) -> NewMember {
        NewMember {
            user: None,
            target: fleetd_core::Target::new(name).expect("target"),
            profile: "p".to_owned(),
            agent: "claude".to_owned(),
            pane: fleetd_core::QualifiedPaneId::parse("lead:w1:p2").expect("pane"),
            terminal: fleetd_core::TerminalId::new("term_1").expect("terminal"),
            allow_delegation: false,
            idle_timeout_secs: Some(60),
            backend: Some("lab".to_owned()),
            lead: None,
            worktree: None,
            model: None,
        }
    }

    #[test]
    fn an_old_registry_reads_back_and_a_missing_or_broken_one_is_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("members.json");
        assert!(load(&path).is_empty());
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&[member("ann"), member("bo")]).expect("json"),
        )
        .expect("write");
        let back = load(&path);
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].target.as_str(), "bo");
        assert_eq!(back[0].pane.to_string(), "lead:w1:p2");
        std::fs::write(&path, "{not json").expect("corrupt");
        assert!(load(&path).is_empty());
    }
}

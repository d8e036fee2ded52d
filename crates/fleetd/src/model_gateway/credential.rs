//! The backends' real credentials as the gateway adds them to requests: read from their
//! secret (a file, or fleetd's environment) at most once a second for each, not on every
//! request — a file read is a blocking call on a runtime thread, on the path of every first
//! byte — so a rotated file still takes effect within a second, without a reload.

use std::time::Duration;

use crate::config::{Config, SecretSource};
use crate::secrets::{SecretError, SecretValue, Secrets};

/// How long a value read is used before its secret is read again.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// A value read: its secret's name and source, the value and when it was read.
type Known = (String, SecretSource, SecretValue, tokio::time::Instant);

static KNOWN: std::sync::Mutex<Vec<Known>> = std::sync::Mutex::new(Vec::new());

/// Secret `name`'s value under `config`: the one read less than [`FRESH_FOR`] ago from the same
/// source, else read now.
pub(super) fn current(config: &Config, name: &str) -> Result<SecretValue, SecretError> {
    let source = config.secrets.get(name);
    let now = tokio::time::Instant::now();
    {
        let known = crate::sync::lock(&KNOWN);
        let fresh = known.iter().find(|(n, s, _, at)| {
            n == name && Some(s) == source && now.duration_since(*at) < FRESH_FOR
        });
        if let Some((_, _, value, _)) = fresh {
            return Ok(value.clone());
        }
    }
    let value = Secrets::new(&config.secrets, &crate::secrets::process_env).resolve(name)?;
    if let Some(source) = source {
        let mut known = crate::sync::lock(&KNOWN);
        known.retain(|(n, _, _, _)| n != name);
        known.push((name.to_owned(), source.clone(), value.clone(), now));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_token_in(path: &std::path::Path) -> Config {
        crate::test_support::config(&format!(
            "secrets:\n  lab-token:\n    file: {}\n",
            path.display()
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_credential_is_read_once_a_second_and_a_rotated_file_takes_effect() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        let write = |v: &str| {
            std::fs::write(&path, v).expect("write");
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
        };
        write("sk-first");
        let config = with_token_in(&path);
        assert_eq!(
            current(&config, "lab-token").expect("read").expose(),
            "sk-first"
        );
        write("sk-second");
        assert_eq!(
            current(&config, "lab-token").expect("kept").expose(),
            "sk-first",
            "read less than a second ago"
        );
        tokio::time::advance(FRESH_FOR).await;
        assert_eq!(
            current(&config, "lab-token").expect("read").expose(),
            "sk-second"
        );
        // Another source under the same name (a reload) is read at once.
        let other = dir.path().join("other");
        std::fs::write(&other, "sk-other").expect("write");
        std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        assert_eq!(
            current(&with_token_in(&other), "lab-token")
                .expect("read")
                .expose(),
            "sk-other"
        );
        assert!(
            current(&crate::test_support::config(""), "lab-token").is_err(),
            "no such secret"
        );
    }
}

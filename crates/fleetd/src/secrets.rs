//! Secret values: resolved on demand from the sources the config names (an environment variable
//! of the daemon, or a file that is not world-readable). Owns reading them; must never log a
//! value, and nothing here is ever serialized into a tool result or an HTTP body.

use std::collections::BTreeMap;
use std::fmt;

use crate::config::SecretSource;

/// A secret's value. `Debug` and `Display` print a placeholder so it cannot leak through logs.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// The value, for the one place that must use it (an env var of a member, a broker URL).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(***)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Why a secret did not resolve. Messages name the secret and its source, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// No such secret in the config.
    #[error("secret {0:?} is not defined under `secrets:`")]
    Undefined(String),
    /// The environment variable is unset or empty.
    #[error("secret {name:?}: environment variable {var} is not set in fleetd's environment")]
    EnvMissing {
        /// The secret.
        name: String,
        /// The variable.
        var: String,
    },
    /// The file could not be read.
    #[error("secret {name:?}: cannot read {path}: {reason}")]
    File {
        /// The secret.
        name: String,
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is readable by every user.
    #[error(
        "secret {name:?}: {path} is world-readable (mode {mode:o}); run `chmod o-rwx {path}` so only its owner can read it"
    )]
    WorldReadable {
        /// The secret.
        name: String,
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The file or variable is empty.
    #[error("secret {0:?} is empty")]
    Empty(String),
}

/// Resolves secret names against the configured sources and an environment lookup.
pub struct Secrets<'a> {
    sources: &'a BTreeMap<String, SecretSource>,
    env: &'a (dyn Fn(&str) -> Option<String> + Sync),
}

impl<'a> Secrets<'a> {
    /// Resolver over `sources`; `env` looks a variable up (`|k| std::env::var(k).ok()` in the
    /// daemon, a map in tests).
    pub fn new(
        sources: &'a BTreeMap<String, SecretSource>,
        env: &'a (dyn Fn(&str) -> Option<String> + Sync),
    ) -> Self {
        Self { sources, env }
    }

    /// The value of secret `name`.
    pub fn resolve(&self, name: &str) -> Result<SecretValue, SecretError> {
        let source = self
            .sources
            .get(name)
            .ok_or_else(|| SecretError::Undefined(name.to_owned()))?;
        let value = match source {
            SecretSource::Env(var) => (self.env)(var).ok_or_else(|| SecretError::EnvMissing {
                name: name.to_owned(),
                var: var.clone(),
            })?,
            SecretSource::File(path) => read_file(name, path)?,
        };
        let value = value.trim_end_matches(['\n', '\r']).to_owned();
        if value.is_empty() {
            return Err(SecretError::Empty(name.to_owned()));
        }
        Ok(SecretValue(value))
    }
}

fn read_file(name: &str, path: &std::path::Path) -> Result<String, SecretError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |reason: String| SecretError::File {
        name: name.to_owned(),
        path: path.display().to_string(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o004 != 0 {
        return Err(SecretError::WorldReadable {
            name: name.to_owned(),
            path: path.display().to_string(),
            mode,
        });
    }
    std::fs::read_to_string(path).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn env(key: &str) -> Option<String> {
        (key == "TOKEN_VAR").then(|| "s3cret-env".to_owned())
    }

    #[test]
    fn resolves_env_and_private_files_and_refuses_world_readable_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let private = dir.path().join("private");
        std::fs::write(&private, "s3cret-file\n").expect("write");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let public = dir.path().join("public");
        std::fs::write(&public, "leaky").expect("write");
        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let sources: BTreeMap<String, SecretSource> = [
            ("a".to_owned(), SecretSource::Env("TOKEN_VAR".to_owned())),
            ("b".to_owned(), SecretSource::File(private)),
            ("c".to_owned(), SecretSource::File(public)),
            ("d".to_owned(), SecretSource::Env("UNSET_VAR".to_owned())),
            (
                "e".to_owned(),
                SecretSource::File(PathBuf::from("/nonexistent/x")),
            ),
        ]
        .into_iter()
        .collect();
        let secrets = Secrets::new(&sources, &env);
        assert_eq!(secrets.resolve("a").expect("env").expose(), "s3cret-env");
        assert_eq!(secrets.resolve("b").expect("file").expose(), "s3cret-file");
        assert!(matches!(
            secrets.resolve("c"),
            Err(SecretError::WorldReadable { .. })
        ));
        assert!(matches!(
            secrets.resolve("d"),
            Err(SecretError::EnvMissing { .. })
        ));
        assert!(matches!(
            secrets.resolve("e"),
            Err(SecretError::File { .. })
        ));
        assert!(matches!(
            secrets.resolve("zz"),
            Err(SecretError::Undefined(_))
        ));
        // Errors and debug output never carry values.
        let all = format!("{:?} {:?}", secrets.resolve("a"), secrets.resolve("c"));
        assert!(!all.contains("s3cret") && !all.contains("leaky"), "{all}");
    }
}

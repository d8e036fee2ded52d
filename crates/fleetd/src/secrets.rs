//! Secret values: resolved on demand from the sources the config names (an environment variable
//! of the daemon, or a file that is not world-readable), and redacted from every text that
//! reaches a lead ([`Redactor`]). Owns reading them; must never log a value, and nothing here is
//! ever serialized into a tool result or an HTTP body.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::config::{Config, Live, SecretSource};

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

/// Values shorter than this are never redacted: they would match ordinary words, and a value
/// that short is no credential worth the name.
pub const MIN_REDACTED_LEN: usize = 8;

/// How many values handed to members (beyond the configuration's current ones) are kept for
/// redaction; the oldest go first.
const GIVEN_LIMIT: usize = 256;

/// Takes every secret value fleetd knows out of a text before it reaches a lead: member replies
/// and questions, turn-done fallback tails (raw pane text), incident texts. It knows the values
/// of every secret the running configuration defines (re-resolved when a reload swaps it) and
/// every value handed to a member since start, so a secret rotated by a reload stays redacted
/// while members still hold the old one. Cheap to clone; `Debug` shows no value.
#[derive(Clone)]
pub struct Redactor {
    inner: Arc<RedactorInner>,
}

/// Secret values by name.
type Values = Vec<(String, SecretValue)>;

struct RedactorInner {
    config: Live,
    env: fn(&str) -> Option<String>,
    /// The configuration the cached values were resolved from, and those values.
    resolved: Mutex<Option<(Arc<Config>, Arc<Values>)>>,
    /// Values handed to members, newest last.
    given: Mutex<Vec<(String, SecretValue)>>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Redactor(***)")
    }
}

/// A non-empty variable of the daemon's own environment: where `env` secrets resolve from. The one
/// place a secret value is read from the environment.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

impl Redactor {
    /// A redactor over the running configuration, resolving env secrets from the daemon's own
    /// environment.
    pub fn new(config: Live) -> Self {
        Self::with_env(config, process_env)
    }

    /// A redactor that knows no configured secret, only values later [`Redactor::remember`]ed
    /// (an engine or bench without a configuration's secrets).
    pub fn empty() -> Self {
        let config = Config::parse("", "<empty>", &crate::config::Environment::default())
            .expect("an empty configuration is valid");
        Self::new(Live::fixed(config))
    }

    /// A redactor whose env secrets resolve through `env` (tests).
    pub fn with_env(config: Live, env: fn(&str) -> Option<String>) -> Self {
        Self {
            inner: Arc::new(RedactorInner {
                config,
                env,
                resolved: Mutex::new(None),
                given: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Remembers `value` (secret `name`) as handed to a member: it stays redacted even after a
    /// reload changes or removes the secret.
    pub fn remember(&self, name: &str, value: &SecretValue) {
        let mut given = crate::sync::lock(&self.inner.given);
        if given.iter().any(|(_, v)| v == value) {
            return;
        }
        if given.len() >= GIVEN_LIMIT {
            given.remove(0);
        }
        given.push((name.to_owned(), value.clone()));
    }

    /// The values to redact, longest first (so a value that contains another goes whole).
    fn values(&self) -> Vec<(String, SecretValue)> {
        let config = self.inner.config.current();
        let current = {
            let mut cache = crate::sync::lock(&self.inner.resolved);
            match &*cache {
                Some((at, values)) if Arc::ptr_eq(at, &config) => Arc::clone(values),
                _ => {
                    let secrets = Secrets::new(&config.secrets, &self.inner.env);
                    let values: Arc<Vec<_>> = Arc::new(
                        config
                            .secrets
                            .keys()
                            .filter_map(|name| {
                                secrets.resolve(name).ok().map(|v| (name.clone(), v))
                            })
                            .collect(),
                    );
                    *cache = Some((Arc::clone(&config), Arc::clone(&values)));
                    values
                }
            }
        };
        let mut all: Vec<(String, SecretValue)> = current.iter().cloned().collect();
        all.extend(crate::sync::lock(&self.inner.given).iter().cloned());
        all.retain(|(_, v)| v.0.len() >= MIN_REDACTED_LEN);
        all.sort_by_key(|(_, v)| std::cmp::Reverse(v.0.len()));
        all
    }

    /// `text` with every known secret value replaced by `[redacted: NAME]`.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (name, value) in self.values() {
            if out.contains(value.expose()) {
                out = Cow::Owned(out.replace(value.expose(), &format!("[redacted: {name}]")));
            }
        }
        out
    }
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

    fn redactor_env(key: &str) -> Option<String> {
        match key {
            "LONG" => Some("sk-live-0123456789abcdef".to_owned()),
            "PREFIX" => Some("sk-live-0123".to_owned()),
            "SHORT" => Some("abc".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn every_known_value_is_redacted_and_nothing_else() {
        let yaml =
            "secrets:\n  long: {env: LONG}\n  prefix: {env: PREFIX}\n  short: {env: SHORT}\n";
        let config =
            crate::config::Config::parse(yaml, "<test>", &crate::config::Environment::default())
                .expect("config");
        let (publisher, _) = crate::config::channel(config);
        let redactor = Redactor::with_env(publisher.live(), redactor_env);
        let text = "token sk-live-0123456789abcdef and sk-live-0123 and abc";
        assert_eq!(
            redactor.redact(text),
            "token [redacted: long] and [redacted: prefix] and abc",
            "the longer value goes whole; a value under {MIN_REDACTED_LEN} characters stays"
        );
        assert!(matches!(redactor.redact("nothing here"), Cow::Borrowed(_)));
        // A value handed to a member stays redacted after a reload drops its secret.
        redactor.remember("rotated", &SecretValue("old-token-value-42".to_owned()));
        let empty =
            crate::config::Config::parse("", "<test>", &crate::config::Environment::default())
                .expect("config");
        publisher.publish(empty);
        assert_eq!(
            redactor.redact("was old-token-value-42, is sk-live-0123456789abcdef"),
            "was [redacted: rotated], is sk-live-0123456789abcdef"
        );
        assert_eq!(format!("{redactor:?}"), "Redactor(***)");
    }
}

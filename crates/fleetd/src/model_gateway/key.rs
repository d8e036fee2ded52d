//! A member's model key: 256 random bits from the OS, handed to the member in place of its
//! backend's credential. fleetd keeps only its SHA-256, so the state directory holds nothing a
//! member could use, and the key is worth nothing outside fleetd: fleetd accepts it only from
//! its member's own pane, and only while the member lives.

use sha2::Digest as _;

/// What a key starts with, so one found in a log or a file is recognisable for what it is.
const PREFIX: &str = "fleetd-mk-";

/// A freshly minted key.
pub(crate) struct MemberKey {
    /// The key itself: goes into the member's environment only.
    pub(crate) secret: String,
    /// Its SHA-256 (hex): what fleetd keeps.
    pub(crate) hash: String,
}

impl std::fmt::Debug for MemberKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemberKey")
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

/// A new key, or the OS's error when it gives no randomness.
pub(crate) fn mint() -> Result<MemberKey, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let secret = format!("{PREFIX}{}", hex(&bytes));
    let hash = hash(&secret);
    Ok(MemberKey { secret, hash })
}

/// The SHA-256 of `key`, hex.
pub(crate) fn hash(key: &str) -> String {
    hex(&sha2::Sha256::digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_and_hash_to_what_is_kept() {
        let a = mint().expect("randomness");
        let b = mint().expect("randomness");
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with(PREFIX) && a.secret.len() == PREFIX.len() + 64);
        assert_eq!(hash(&a.secret), a.hash);
        assert_ne!(a.hash, a.secret);
        assert!(!format!("{a:?}").contains(&a.secret));
    }
}

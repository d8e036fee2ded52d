//! A member's environment (profile env, backend URL and token, its name, fleetd's URL) and which
//! profile secrets resolve. Secret values go into the member's environment and the redactor only:
//! this module never logs or returns one, and puts nothing on a lead.

use fleetd_core::refusal::Code;
use std::collections::BTreeMap;

use fleetd_core::Target;
use fleetd_core::access::Refusal;

use crate::config::{Config, Profile};
use crate::secrets::{Redactor, Secrets};

/// The first secret `profile` needs that does not resolve, if any (names only).
pub(crate) fn missing_secret(config: &Config, profile: &Profile) -> Option<String> {
    let backend = config.backends.get(profile.backend.as_deref()?)?;
    let name = backend.auth_token_secret.as_deref()?;
    let secrets = Secrets::new(&config.secrets, &crate::secrets::process_env);
    secrets.resolve(name).err().map(|e| e.to_string())
}

/// Logs, per profile, which secret names it needs and whether each resolved — names only, never
/// a value (SPEC §7). Run at start and after each applied reload.
pub(crate) fn log_secret_names(config: &Config) {
    let secrets = Secrets::new(&config.secrets, &crate::secrets::process_env);
    for (name, profile) in &config.profiles {
        let needed = profile
            .backend
            .as_deref()
            .and_then(|b| config.backends.get(b))
            .and_then(|b| b.auth_token_secret.as_deref());
        match needed {
            Some(secret) => match secrets.resolve(secret) {
                Ok(_) => tracing::info!(profile = %name, secret, "profile secret resolved"),
                Err(e) => {
                    tracing::warn!(profile = %name, secret, reason = %e, "profile secret does not resolve: fleet_spawn of this profile will be refused");
                }
            },
            None => tracing::info!(profile = %name, "profile needs no secret"),
        }
    }
}

/// What a member's environment is made from.
pub(super) struct MemberEnv<'a> {
    /// The configuration snapshot the spawn started with, so a profile added by a reload
    /// resolves its backend and secrets from the same reload.
    pub(super) config: &'a Config,
    /// The member's profile.
    pub(super) profile: &'a Profile,
    /// Its name.
    pub(super) target: &'a Target,
    /// Learns the backend token, to take it out of whatever the member sends towards a lead.
    pub(super) redactor: &'a Redactor,
    /// fleetd's URL as members reach it.
    pub(super) url: &'a str,
}

/// What a member's environment holds beyond its variables: the hash of the model key it was
/// given, when its backend is served through fleetd.
pub(super) struct Built {
    pub(super) env: BTreeMap<String, String>,
    pub(super) key_hash: Option<String>,
}

impl MemberEnv<'_> {
    /// The member's environment: profile env, backend URL and token (members only), its name
    /// and fleetd's URL.
    pub(super) fn build(&self) -> Result<Built, Refusal> {
        let profile = self.profile;
        let mut env = profile.env.clone();
        let mut key_hash = None;
        if let Some(name) = &profile.backend {
            let backend = self.config.backends.get(name).ok_or_else(|| {
                Refusal::new(
                    Code::UnknownBackend,
                    format!("the profile names backend {name}, which is not configured"),
                )
            })?;
            let (url_var, token_var) = super::kinds::backend_vars(&profile.agent);
            let url = crate::model_gateway::member_url(self.config, name, self.url)
                .unwrap_or_else(|| backend.base_url.clone());
            env.insert(url_var.to_owned(), url);
            if backend.through_fleetd {
                // The member gets a key of its own, worth nothing outside fleetd; the backend's
                // credential stays here (it must still resolve: fleetd adds it to each request).
                if let Some(secret) = &backend.auth_token_secret {
                    let value = Secrets::new(&self.config.secrets, &crate::secrets::process_env)
                        .resolve(secret)
                        .map_err(|e| Refusal::new(Code::ProfileNotReady, e.to_string()))?;
                    self.redactor.remember(secret, &value);
                }
                let key = crate::model_gateway::key::mint().map_err(|e| {
                    Refusal::new(
                        Code::NoRandomness,
                        format!("the OS gave no randomness for the member's model key: {e}"),
                    )
                })?;
                env.insert(token_var.to_owned(), key.secret);
                key_hash = Some(key.hash);
            } else if let Some(secret) = &backend.auth_token_secret {
                let value = Secrets::new(&self.config.secrets, &crate::secrets::process_env)
                    .resolve(secret)
                    .map_err(|e| Refusal::new(Code::ProfileNotReady, e.to_string()))?;
                // Redacted from whatever this member sends towards a lead, even after a reload.
                self.redactor.remember(secret, &value);
                env.insert(token_var.to_owned(), value.expose().to_owned());
            }
        }
        if let Some(model) = &profile.model {
            env.insert("FLEETD_MODEL".to_owned(), model.clone());
            if profile.agent == "claude" {
                env.insert("ANTHROPIC_MODEL".to_owned(), model.clone());
            }
        }
        env.insert("FLEETD_TARGET".to_owned(), self.target.to_string());
        env.insert("FLEETD_URL".to_owned(), self.url.to_owned());
        Ok(Built { env, key_hash })
    }
}

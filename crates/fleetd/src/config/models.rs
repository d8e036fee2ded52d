//! Stage two for what the model gateway reads (SPEC §18): a backend's `throughFleetd` and
//! `prices`, a profile's `budget` and `treeBudget`. Money is kept in whole micro-dollars, so
//! sums are exact and a configuration compares equal to itself.

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::raw::At;
use super::validate::Judge;

/// The warning fraction of a budget when the profile gives none.
pub(super) const DEFAULT_WARN_AT: f64 = 0.8;

/// A backend's prices in micro-dollars per million tokens, by kind (`prices:` gives dollars).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    /// Uncached input.
    pub input: u64,
    /// Output.
    pub output: u64,
    /// Input read from the prompt cache.
    pub cache_read: u64,
    /// Input written to the prompt cache.
    pub cache_write: u64,
}

impl Prices {
    /// What `tokens` cost, in micro-dollars, rounded to the nearest.
    pub fn cost_micros(&self, tokens: &fleetd_core::usage::Tokens) -> u64 {
        let parts = [
            (tokens.input, self.input),
            (tokens.output, self.output),
            (tokens.cache_read, self.cache_read),
            (tokens.cache_write, self.cache_write),
        ];
        let sum: u128 = parts
            .iter()
            .map(|&(n, price)| u128::from(n) * u128::from(price))
            .sum();
        u64::try_from((sum + 500_000) / 1_000_000).unwrap_or(u64::MAX)
    }
}

/// A budget as configured: a limit on tokens (all kinds together) and/or on cost, and the
/// fraction of it at which the lead is warned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpec {
    /// Tokens of every kind, together.
    pub tokens: Option<u64>,
    /// Cost, in micro-dollars.
    pub cost_micros: Option<u64>,
    /// Warn at this many thousandths of a limit.
    pub warn_permille: u16,
}

impl BudgetSpec {
    /// The warning fraction (0 to 1).
    pub fn warn_at(&self) -> f64 {
        f64::from(self.warn_permille) / 1000.0
    }
}

/// `prices:` of a backend, dollars per million tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawPrices {
    input: Option<f64>,
    output: Option<f64>,
    cache_read: Option<f64>,
    cache_write: Option<f64>,
}

/// A `budget:` or `treeBudget:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RawBudget {
    tokens: Option<u64>,
    cost_usd: Option<f64>,
    warn_at: Option<f64>,
}

/// `dollars` as whole micro-dollars, when it is a finite amount from 0 to a billion.
pub fn micros(dollars: f64) -> Option<u64> {
    if !dollars.is_finite() || !(0.0..=1e9).contains(&dollars) {
        return None;
    }
    let micros = (dollars * 1e6).round();
    // In range by the check above: at most 1e15, exactly representable, so the cast is exact.
    Some(micros as u64)
}

pub(super) fn prices(
    judge: &Judge<'_>,
    key: &str,
    raw: Option<&At<RawPrices>>,
) -> Result<Prices, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Prices::default());
    };
    let field = |name: &str, value: Option<f64>| -> Result<u64, ConfigError> {
        value.map_or(Ok(0), |v| {
            micros(v).ok_or_else(|| {
                judge.at(
                    &format!("{key}.prices.{name}"),
                    raw,
                    format!("{v} is not a price: give dollars per million tokens, from 0 to 1e9"),
                )
            })
        })
    };
    let p = &raw.value;
    Ok(Prices {
        input: field("input", p.input)?,
        output: field("output", p.output)?,
        cache_read: field("cacheRead", p.cache_read)?,
        cache_write: field("cacheWrite", p.cache_write)?,
    })
}

pub(super) fn budget(
    judge: &Judge<'_>,
    key: &str,
    raw: Option<&At<RawBudget>>,
) -> Result<Option<BudgetSpec>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let b = &raw.value;
    match budget_from(b.tokens, b.cost_usd, b.warn_at) {
        Ok(Some(spec)) => Ok(Some(spec)),
        Ok(None) => Err(judge.at(
            key,
            raw,
            "sets no limit: give `tokens:` (all kinds together) and/or `costUsd:`",
        )),
        Err(e) => Err(judge.at(&format!("{key}.{}", e.field), raw, e.message)),
    }
}

/// Which part of a budget was refused, and why (a sentence saying what to give instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {message}")]
pub struct BudgetError {
    /// The field, as the configuration, the REST body and `fleet_spawn` spell it
    /// (`costUsd`, `warnAt`).
    pub field: &'static str,
    /// Why, and what to give.
    pub message: String,
}

/// A budget from its parts as people give them (a token count, dollars, a warning fraction:
/// `0.8` warns at 80%, the default) — the one check behind the configuration's `budget:`, the
/// operator's `POST /sessions/{target}/budget` and `fleet_spawn`'s `budget`. `None` when it
/// sets neither limit (each caller says what that means: an error in a profile, lifting the
/// budget for the operator).
pub fn budget_from(
    tokens: Option<u64>,
    cost_usd: Option<f64>,
    warn_at: Option<f64>,
) -> Result<Option<BudgetSpec>, BudgetError> {
    let cost_micros = match cost_usd {
        None => None,
        Some(v) => Some(micros(v).ok_or_else(|| BudgetError {
            field: "costUsd",
            message: format!("{v} is not an amount: give dollars, from 0 to 1e9"),
        })?),
    };
    let warn_at = warn_at.unwrap_or(DEFAULT_WARN_AT);
    if !(0.0..=1.0).contains(&warn_at) {
        return Err(BudgetError {
            field: "warnAt",
            message: format!(
                "{warn_at} is not a fraction: give one from 0 to 1 (0.8 warns at 80%)"
            ),
        });
    }
    if tokens.is_none() && cost_micros.is_none() {
        return Ok(None);
    }
    // Within 0..=1 by the check above, so 0..=1000: the cast is exact.
    let warn_permille = (warn_at * 1000.0).round() as u16;
    Ok(Some(BudgetSpec {
        tokens,
        cost_micros,
        warn_permille,
    }))
}

impl BudgetSpec {
    /// This budget held under `cap` (a profile's): each limit the lower of the two, a limit
    /// only one of them sets kept, this budget's warning fraction. So a budget an agent gives
    /// at spawn can tighten the operator's, never loosen it.
    #[must_use]
    pub fn within(self, cap: Option<Self>) -> Self {
        let Some(cap) = cap else {
            return self;
        };
        let lower = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Self {
            tokens: lower(self.tokens, cap.tokens),
            cost_micros: lower(self.cost_micros, cap.cost_micros),
            warn_permille: self.warn_permille,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_names_the_field_it_refuses() {
        let e = budget_from(Some(5), Some(-1.0), None).expect_err("negative dollars");
        assert_eq!(e.field, "costUsd");
        let e = budget_from(Some(5), None, Some(1.5)).expect_err("not a fraction");
        assert_eq!(e.field, "warnAt");
        assert_eq!(budget_from(None, None, Some(0.5)), Ok(None));
        assert_eq!(
            budget_from(Some(7), Some(0.25), None),
            Ok(Some(BudgetSpec {
                tokens: Some(7),
                cost_micros: Some(250_000),
                warn_permille: 800,
            }))
        );
    }

    #[test]
    fn a_budget_within_a_cap_only_tightens_it() {
        let cap = BudgetSpec {
            tokens: Some(100),
            cost_micros: None,
            warn_permille: 800,
        };
        let asked = BudgetSpec {
            tokens: Some(1_000),
            cost_micros: Some(5),
            warn_permille: 500,
        };
        assert_eq!(
            asked.within(Some(cap)),
            BudgetSpec {
                tokens: Some(100),
                cost_micros: Some(5),
                warn_permille: 500,
            }
        );
        assert_eq!(asked.within(None), asked);
    }
}

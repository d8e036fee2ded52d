//! Where spending stands against a budget. Money is counted in whole micro-dollars (millionths
//! of a US dollar): integer sums are exact, and a stored total reads back the same on every
//! machine. (What tokens cost is `config::Prices::cost_micros`, in integer micro-dollars per
//! million tokens.)

use serde::{Deserialize, Serialize};

use super::Tokens;

/// `count` as a float: exact below 2^53 (nine quadrillion tokens), nearest above.
fn to_f64(count: u64) -> f64 {
    // Widening to float rounds but never truncates; there is no lossless `From` for it.
    count as f64
}

/// A limit on tokens (total) and/or cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget {
    /// The most tokens of all kinds together, when limited.
    pub tokens: Option<u64>,
    /// The most micro-dollars, when limited.
    pub cost_micros: Option<u64>,
}

impl Budget {
    /// Whether either limit is set.
    pub fn is_limited(&self) -> bool {
        self.tokens.is_some() || self.cost_micros.is_some()
    }
}

/// What was spent against a budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spent {
    /// Tokens by kind.
    pub tokens: Tokens,
    /// Micro-dollars.
    pub cost_micros: u64,
}

impl Spent {
    /// Adds one response's tokens and cost, saturating.
    pub fn add(&mut self, tokens: &Tokens, cost_micros: u64) {
        self.tokens.add(tokens);
        self.cost_micros = self.cost_micros.saturating_add(cost_micros);
    }
}

/// Where spending stands against a budget. Ordered by severity, so the worst of several
/// standings is their `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Standing {
    /// Below every warning point.
    Under,
    /// At or past the warning point of a limit, below every limit.
    Warn,
    /// A limit is reached.
    Over,
}

/// Over when any set limit is reached (spent >= limit), Warn when any is at or past `warn_at`
/// (a fraction 0..=1) of its limit, else Under. An unset budget is always Under; a limit of zero
/// is reached at once. `warn_at` outside 0..=1 is clamped into it, and NaN warns never (as 1).
pub fn standing(spent: &Spent, budget: &Budget, warn_at: f64) -> Standing {
    let warn_at = if warn_at.is_nan() {
        1.0
    } else {
        warn_at.clamp(0.0, 1.0)
    };
    let pairs = [
        (spent.tokens.total(), budget.tokens),
        (spent.cost_micros, budget.cost_micros),
    ];
    pairs
        .iter()
        .filter_map(|&(used, limit)| limit.map(|limit| (used, limit)))
        .map(|(used, limit)| {
            if used >= limit {
                Standing::Over
            } else if to_f64(used) >= warn_at * to_f64(limit) {
                Standing::Warn
            } else {
                Standing::Under
            }
        })
        .max()
        .unwrap_or(Standing::Under)
}

/// Human words for a budget and what was spent, for messages the agent shows its user: each set
/// limit as "120,000 of 100,000 tokens" or "$1.23 of $1.00", joined by ", "; with no limit set,
/// what was spent, as "120,000 tokens, $1.23, no limit".
pub fn describe(spent: &Spent, budget: &Budget) -> String {
    let tokens = grouped(spent.tokens.total());
    let cost = dollars(spent.cost_micros);
    let mut parts = Vec::new();
    if let Some(limit) = budget.tokens {
        parts.push(format!("{tokens} of {} tokens", grouped(limit)));
    }
    if let Some(limit) = budget.cost_micros {
        parts.push(format!("{cost} of {}", dollars(limit)));
    }
    if parts.is_empty() {
        return format!("{tokens} tokens, {cost}, no limit");
    }
    parts.join(", ")
}

/// Micro-dollars as dollars for people. From one cent up: dollars and cents with thousands
/// grouped ("$1,234.56"), rounded down to the cent, so spending just under a limit never reads
/// as reaching it. Below a cent, every micro-dollar without trailing zeros ("$0.000123",
/// "$0.005"), so a small cost does not read as nothing. Zero is "$0.00".
pub fn dollars(micros: u64) -> String {
    const PER_CENT: u64 = 10_000;
    const PER_DOLLAR: u64 = 1_000_000;
    if micros == 0 {
        return "$0.00".to_owned();
    }
    if micros < PER_CENT {
        let fraction = format!("{micros:06}");
        return format!("$0.{}", fraction.trim_end_matches('0'));
    }
    let whole = micros / PER_DOLLAR;
    let cents = micros % PER_DOLLAR / PER_CENT;
    format!("${}.{cents:02}", grouped(whole))
}

/// `n` with its thousands separated by commas: "120,000".
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len().saturating_add(digits.len() / 3));
    for (at, digit) in digits.chars().enumerate() {
        if at > 0 && digits.len().saturating_sub(at) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Tokens {
        Tokens {
            input,
            output,
            cache_read,
            cache_write,
        }
    }

    fn spent(total: u64, cost_micros: u64) -> Spent {
        Spent {
            tokens: tokens(total, 0, 0, 0),
            cost_micros,
        }
    }

    #[test]
    fn standing_at_the_thresholds() {
        let budget = Budget {
            tokens: Some(100),
            cost_micros: None,
        };
        assert_eq!(standing(&spent(0, 0), &budget, 0.8), Standing::Under);
        assert_eq!(standing(&spent(79, 0), &budget, 0.8), Standing::Under);
        assert_eq!(standing(&spent(80, 0), &budget, 0.8), Standing::Warn);
        assert_eq!(standing(&spent(99, 0), &budget, 0.8), Standing::Warn);
        assert_eq!(standing(&spent(100, 0), &budget, 0.8), Standing::Over);
        assert_eq!(standing(&spent(u64::MAX, 0), &budget, 0.8), Standing::Over);

        let money = Budget {
            tokens: None,
            cost_micros: Some(1_000_000),
        };
        assert_eq!(standing(&spent(0, 899_999), &money, 0.9), Standing::Under);
        assert_eq!(standing(&spent(0, 900_000), &money, 0.9), Standing::Warn);
        assert_eq!(standing(&spent(0, 1_000_000), &money, 0.9), Standing::Over);
    }

    #[test]
    fn standing_is_the_worst_of_the_set_limits() {
        let both = Budget {
            tokens: Some(100),
            cost_micros: Some(1_000),
        };
        assert_eq!(standing(&spent(10, 1_000), &both, 0.8), Standing::Over);
        assert_eq!(standing(&spent(100, 10), &both, 0.8), Standing::Over);
        assert_eq!(standing(&spent(85, 10), &both, 0.8), Standing::Warn);
        assert_eq!(standing(&spent(10, 850), &both, 0.8), Standing::Warn);
        assert_eq!(standing(&spent(10, 10), &both, 0.8), Standing::Under);
        // Tokens count every kind.
        let kinds = Spent {
            tokens: tokens(40, 40, 10, 10),
            cost_micros: 0,
        };
        assert_eq!(standing(&kinds, &both, 0.8), Standing::Over);
        assert!(Standing::Under < Standing::Warn && Standing::Warn < Standing::Over);
    }

    #[test]
    fn standing_edges() {
        let unset = Budget::default();
        assert!(!unset.is_limited());
        assert_eq!(
            standing(&spent(u64::MAX, u64::MAX), &unset, 0.0),
            Standing::Under
        );
        let zero = Budget {
            tokens: Some(0),
            cost_micros: None,
        };
        assert!(zero.is_limited());
        assert_eq!(standing(&spent(0, 0), &zero, 0.8), Standing::Over);
        let budget = Budget {
            tokens: Some(100),
            cost_micros: None,
        };
        assert_eq!(standing(&spent(0, 0), &budget, 0.0), Standing::Warn);
        assert_eq!(standing(&spent(0, 0), &budget, -1.0), Standing::Warn);
        assert_eq!(standing(&spent(99, 0), &budget, 1.0), Standing::Under);
        assert_eq!(standing(&spent(99, 0), &budget, 7.0), Standing::Under);
        assert_eq!(standing(&spent(99, 0), &budget, f64::NAN), Standing::Under);
        assert_eq!(standing(&spent(100, 0), &budget, f64::NAN), Standing::Over);
    }

    #[test]
    fn spent_adds_saturating() {
        let mut total = Spent::default();
        total.add(&tokens(1, 2, 3, 4), 5);
        total.add(&tokens(1, 2, 3, 4), 5);
        assert_eq!(
            total,
            Spent {
                tokens: tokens(2, 4, 6, 8),
                cost_micros: 10
            }
        );
        total.add(&Tokens::default(), u64::MAX);
        assert_eq!(total.cost_micros, u64::MAX);
        let json = serde_json::to_string(&total).expect("serializes");
        assert!(
            json.contains(r#""costMicros":18446744073709551615"#),
            "{json}"
        );
        let budget = Budget {
            tokens: Some(5),
            cost_micros: None,
        };
        let json = serde_json::to_string(&budget).expect("serializes");
        assert_eq!(json, r#"{"tokens":5,"costMicros":null}"#);
        assert_eq!(
            serde_json::from_str::<Budget>(&json).expect("reads back"),
            budget
        );
    }

    #[test]
    fn dollars_for_people() {
        let cases = [
            (0, "$0.00"),
            (1, "$0.000001"),
            (123, "$0.000123"),
            (5_000, "$0.005"),
            (9_999, "$0.009999"),
            (10_000, "$0.01"),
            (999_999, "$0.99"),
            (1_000_000, "$1.00"),
            (1_230_000, "$1.23"),
            (1_239_999, "$1.23"),
            (1_234_567_890_000, "$1,234,567.89"),
            (u64::MAX, "$18,446,744,073,709.55"),
        ];
        for (micros, text) in cases {
            assert_eq!(dollars(micros), text, "{micros}");
        }
    }

    #[test]
    fn describe_in_words() {
        let used = Spent {
            tokens: tokens(100_000, 20_000, 0, 0),
            cost_micros: 1_230_000,
        };
        let tokens_only = Budget {
            tokens: Some(100_000),
            cost_micros: None,
        };
        assert_eq!(describe(&used, &tokens_only), "120,000 of 100,000 tokens");
        let money_only = Budget {
            tokens: None,
            cost_micros: Some(1_000_000),
        };
        assert_eq!(describe(&used, &money_only), "$1.23 of $1.00");
        let both = Budget {
            tokens: Some(1_000_000),
            cost_micros: Some(5_000_000),
        };
        assert_eq!(
            describe(&used, &both),
            "120,000 of 1,000,000 tokens, $1.23 of $5.00"
        );
        assert_eq!(
            describe(&used, &Budget::default()),
            "120,000 tokens, $1.23, no limit"
        );
        assert_eq!(describe(&Spent::default(), &money_only), "$0.00 of $1.00");
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1_000), "1,000");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
    }
}

//! `fleetd budget TARGET ...`: the operator sets, replaces or lifts a member's model budget (or
//! the budget of the delegation tree it heads) through `POST /sessions/{target}/budget`, and
//! sees what was set and what was spent so far. Owns the command's request and output; the
//! daemon checks the values (and says which one it refused).

use std::io::Write;

use fleetd_core::Target;
use serde_json::{Value, json};

use super::{ClientError, Connection, QUICK_TIMEOUT, accepted, wire};

/// What to set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Budget {
    /// The member.
    pub target: String,
    /// A limit on tokens of every kind together.
    pub tokens: Option<u64>,
    /// A limit on cost, in US dollars.
    pub cost_usd: Option<f64>,
    /// The fraction of a limit at which the lead is warned.
    pub warn_at: Option<f64>,
    /// The budget of the tree the member heads, rather than its own.
    pub tree: bool,
}

impl Budget {
    /// The request's body: both limits absent lifts the budget.
    fn body(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "costUsd": self.cost_usd,
            "warnAt": self.warn_at,
            "tree": self.tree,
        })
    }
}

/// Sets the budget and writes what was set and spent to `out` (the daemon's JSON when `json`).
pub async fn run(
    conn: &Connection,
    budget: &Budget,
    json: bool,
    out: &mut dyn Write,
) -> Result<bool, ClientError> {
    let target = Target::new(&budget.target)
        .map_err(|e| ClientError::Argument(format!("{:?}: {e}", budget.target)))?;
    let answer = wire::call(
        conn,
        http::Method::POST,
        &format!("/sessions/{target}/budget"),
        Some(&budget.body()),
        QUICK_TIMEOUT,
    )
    .await?;
    let answer = accepted(answer, json, out)?;
    if json {
        writeln!(out, "{}", answer.body)?;
    } else {
        render(&target, budget.tree, &answer.body, out)?;
    }
    Ok(true)
}

/// The answer for a person: what the budget is now, and what was spent.
fn render(target: &Target, tree: bool, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let whose = if tree {
        format!("the model budget of the delegation tree {target} heads")
    } else {
        format!("{target}'s model budget")
    };
    match body["budget"].as_str() {
        Some(words) => writeln!(out, "set {whose}: {words}")?,
        None => writeln!(out, "lifted {whose}: no limit")?,
    }
    let tokens = &body["tokens"];
    let n = |key: &str| tokens[key].as_u64().unwrap_or(0);
    writeln!(
        out,
        "spent so far: {} tokens (input {}, output {}, cache read {}, cache write {}), ${:.2}",
        body["totalTokens"].as_u64().unwrap_or(0),
        n("input"),
        n("output"),
        n("cacheRead"),
        n("cacheWrite"),
        body["costUsd"].as_f64().unwrap_or(0.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(tree: bool, body: &Value) -> String {
        let mut out = Vec::new();
        let target = Target::new("ann").expect("a name");
        render(&target, tree, body, &mut out).expect("writes");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn it_says_what_was_set_and_spent() {
        let body = json!({
            "tokens": {"input": 10, "output": 20, "cacheRead": 1000, "cacheWrite": 200},
            "totalTokens": 1230, "costUsd": 0.0123, "budget": "1,230 of 5,000 tokens",
        });
        assert_eq!(
            rendered(false, &body),
            "set ann's model budget: 1,230 of 5,000 tokens\n\
             spent so far: 1230 tokens (input 10, output 20, cache read 1000, cache write 200), $0.01\n"
        );
        let lifted = json!({"tokens": {}, "totalTokens": 0, "costUsd": 0.0, "budget": null});
        assert!(
            rendered(true, &lifted).starts_with(
                "lifted the model budget of the delegation tree ann heads: no limit\n"
            )
        );
    }

    #[test]
    fn no_limit_asks_to_lift() {
        let lift = Budget {
            target: "ann".to_owned(),
            ..Budget::default()
        };
        assert_eq!(
            lift.body(),
            json!({"tokens": null, "costUsd": null, "warnAt": null, "tree": false})
        );
    }
}

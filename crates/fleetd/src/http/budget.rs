//! `POST /sessions/{target}/budget` (`fleetd budget TARGET ...`): the operator sets, replaces or
//! lifts a member's model budget, or the budget of the delegation tree it heads (`tree`). The
//! operator's only: a budget is the operator's limit on what an agent spends, so no agent —
//! lead or member — may raise its own. The body is read by hand rather than by serde, so each
//! refusal names the field it is about; the values are checked by `config::budget_from`, the
//! same check a profile's `budget:` gets.

use axum::Json;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fleetd_core::Target;
use serde_json::{Map, Value};

use super::requester::Requester;
use super::{ApiError, App};
use crate::config::BudgetSpec;

/// What the body may hold.
const FIELDS: &[&str] = &["tokens", "costUsd", "warnAt", "tree"];

/// What a body must look like, for the refusals.
const SHAPE: &str = r#"JSON {"tokens": N|null, "costUsd": X|null, "warnAt": 0.8, "tree": false} (both limits null lifts the budget)"#;

/// The body, read.
#[derive(Debug, PartialEq)]
struct Asked {
    budget: Option<BudgetSpec>,
    tree: bool,
}

/// `POST /sessions/{target}/budget`: the operator's only.
pub(super) async fn set(requester: Requester, Path(name): Path<String>, body: Bytes) -> Response {
    if let Err(refused) = requester.operator_only("setting a model budget is",
        "run `fleetd budget TARGET ...` as fleetd's user (its unix socket), or present the API token",
    )
    .await
    {
        return refused;
    }
    match set_budget(&requester.app, &name, &body).await {
        Ok(answer) => Json(answer).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn set_budget(app: &App, name: &str, body: &[u8]) -> Result<Value, ApiError> {
    let target = Target::new(name).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            format!("{name:?}: {e}"),
        )
    })?;
    let asked = read(body)?;
    let view = app
        .fleet
        .engine
        .set_budget(target.clone(), asked.tree, asked.budget)
        .await
        .map_err(|_| ApiError::engine_gone())?
        .map_err(ApiError::tool)?;
    tracing::info!(%target, tree = asked.tree, lifted = asked.budget.is_none(), "the operator set a model budget");
    let mut answer = serde_json::to_value(view).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding",
            format!("fleetd failed to encode the usage: {e}"),
        )
    })?;
    if let Some(object) = answer.as_object_mut() {
        object.insert("target".to_owned(), Value::from(target.to_string()));
        object.insert("tree".to_owned(), Value::from(asked.tree));
    }
    Ok(answer)
}

/// A refusal of the body, naming `field`.
fn bad(field: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_budget",
        format!("`{field}`: {why}; send {SHAPE}"),
    )
}

fn read(body: &[u8]) -> Result<Asked, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("the body is not JSON ({e}): send {SHAPE}"),
        )
    })?;
    let Value::Object(fields) = value else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("the body is not a JSON object: send {SHAPE}"),
        ));
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(unknown, "is not a budget field"));
    }
    let tokens = field(
        &fields,
        "tokens",
        Value::as_u64,
        "give a whole number of tokens",
    )?;
    let cost_usd = field(&fields, "costUsd", Value::as_f64, "give dollars")?;
    let warn_at = field(
        &fields,
        "warnAt",
        Value::as_f64,
        "give a fraction from 0 to 1",
    )?;
    let tree = field(&fields, "tree", Value::as_bool, "give true or false")?.unwrap_or(false);
    let budget = crate::config::budget_from(tokens, cost_usd, warn_at)
        .map_err(|e| bad(e.field, e.message))?;
    Ok(Asked { budget, tree })
}

/// Field `name` of `fields` read by `as_`; `None` when absent or null.
fn field<T>(
    fields: &Map<String, Value>,
    name: &str,
    as_: fn(&Value) -> Option<T>,
    what: &str,
) -> Result<Option<T>, ApiError> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => as_(v)
            .map(Some)
            .ok_or_else(|| bad(name, format!("{v} is not valid: {what}, or null"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(body: &str) -> String {
        let e = read(body.as_bytes()).expect_err(body);
        assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
        e.message
    }

    #[test]
    fn a_body_sets_lifts_or_is_refused_naming_its_field() {
        assert_eq!(
            read(br#"{"tokens": 5000, "warnAt": 0.5, "tree": true}"#).ok(),
            Some(Asked {
                budget: Some(BudgetSpec {
                    tokens: Some(5000),
                    cost_micros: None,
                    warn_permille: 500,
                }),
                tree: true,
            })
        );
        assert_eq!(
            read(br#"{"tokens": null, "costUsd": null}"#).ok(),
            Some(Asked {
                budget: None,
                tree: false,
            }),
            "both limits null lifts it"
        );
        for (body, field) in [
            (r#"{"tokens": -3}"#, "`tokens`"),
            (r#"{"tokens": 1.5}"#, "`tokens`"),
            (r#"{"costUsd": "ten"}"#, "`costUsd`"),
            (r#"{"costUsd": -1}"#, "`costUsd`"),
            (r#"{"tokens": 5, "warnAt": 2}"#, "`warnAt`"),
            (r#"{"tokens": 5, "tree": "yes"}"#, "`tree`"),
            (r#"{"token": 5}"#, "`token`"),
        ] {
            let message = refused_field(body);
            assert!(message.starts_with(field), "{body}: {message}");
        }
        assert!(refused_field("[1]").contains("not a JSON object"));
        assert!(refused_field("{").contains("not JSON"));
    }
}

//! What `fleetd watch` shows of what waits on a person — members blocked on a dialog (`GET
//! /blocked`) and open questions (`GET /questions`) — and the lines a person types into it to
//! answer: `approve NAME CHOICE` types a choice into NAME's dialog (only while that same dialog
//! is on screen: its fingerprint goes with the request), `answer NAME|QUESTION TEXT` answers a
//! member's open question (a member with one, or a question id or its first characters).

use serde_json::{Value, json};

use super::super::{Connection, wire};

/// How to answer, as the watcher says it.
pub(super) const HELP: &str =
    "type `approve NAME CHOICE` or `answer NAME TEXT` and Enter to answer from here";

/// What waits on a person: `(blocked, questions)` as the daemon listed them.
#[derive(Debug, Default, Clone)]
pub(super) struct Waiting {
    pub(super) blocked: Value,
    pub(super) questions: Value,
}

impl Waiting {
    /// Lines for the screen: one per blocked member and per open question.
    pub(super) fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for b in self.blocked["blocked"].as_array().into_iter().flatten() {
            let s = |k: &str| b[k].as_str().unwrap_or_default();
            let choices = super::summary::choices(&b["choices"]);
            let how = if choices.is_empty() {
                "answer it in its pane".to_owned()
            } else {
                format!("{} → approve {} N", choices.join(" · "), s("target"))
            };
            lines.push(format!(
                "BLOCKED   {}: {} [{how}]",
                s("target"),
                s("question")
            ));
        }
        for q in self.questions["questions"].as_array().into_iter().flatten() {
            let s = |k: &str| q[k].as_str().unwrap_or_default();
            lines.push(format!(
                "QUESTION  {} ({}): {} [→ answer {} TEXT]",
                s("target"),
                s("questionId").get(..8).unwrap_or_default(),
                s("question"),
                s("target"),
            ));
        }
        lines
    }
}

/// Reads what waits now.
pub(super) async fn read(conn: &Connection) -> Waiting {
    let get = |path: &'static str| async move {
        wire::call(
            conn,
            http::Method::GET,
            path,
            None,
            super::super::QUICK_TIMEOUT,
        )
        .await
        .ok()
        .filter(|a| (200..300).contains(&a.status))
        .map_or(Value::Null, |a| a.body)
    };
    Waiting {
        blocked: get("/blocked").await,
        questions: get("/questions").await,
    }
}

/// Runs one typed line against what waits; what happened, in a line.
pub(super) async fn run(conn: &Connection, waiting: &Waiting, line: &str) -> String {
    let mut words = line.split_whitespace();
    match (words.next(), words.next()) {
        (Some("approve"), Some(target)) => {
            let Some(choice) = words.next() else {
                return format!("approve {target} what? give the choice's number");
            };
            let dialog = waiting.blocked["blocked"]
                .as_array()
                .and_then(|all| all.iter().find(|b| b["target"] == target))
                .and_then(|b| b["dialog"].as_str())
                .map(str::to_owned);
            let Some(dialog) = dialog else {
                return format!("{target} is not waiting on a dialog");
            };
            let body = json!({ "choice": choice, "dialog": dialog });
            let path = format!("/sessions/{target}/approve");
            outcome(conn, &path, &body, |b| {
                format!(
                    "typed {} ({}) into {target}'s dialog: {}",
                    b["choice"].as_str().unwrap_or(choice),
                    b["label"].as_str().unwrap_or_default(),
                    if b["outcome"] == "answered" {
                        "it went"
                    } else {
                        "it is still on screen"
                    }
                )
            })
            .await
        }
        (Some("answer"), Some(who)) => {
            let text = words.collect::<Vec<_>>().join(" ");
            if text.is_empty() {
                return format!("answer {who} with what? type the answer after it");
            }
            let open = waiting.questions["questions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mine: Vec<&Value> = open
                .iter()
                .filter(|q| {
                    q["target"] == who
                        || q["questionId"]
                            .as_str()
                            .is_some_and(|id| id.starts_with(who))
                })
                .collect();
            let [question] = mine.as_slice() else {
                return match mine.len() {
                    0 => format!("no open question of or named {who}"),
                    n => format!("{who} has {n} open questions: name one by its id"),
                };
            };
            let id = question["questionId"].as_str().unwrap_or_default();
            let path = format!("/questions/{id}/answer");
            outcome(conn, &path, &json!({ "answer": text }), |_| {
                format!(
                    "answered {}'s question",
                    question["target"].as_str().unwrap_or(who)
                )
            })
            .await
        }
        _ => HELP.to_owned(),
    }
}

async fn outcome(
    conn: &Connection,
    path: &str,
    body: &Value,
    said: impl FnOnce(&Value) -> String,
) -> String {
    match wire::call(
        conn,
        http::Method::POST,
        path,
        Some(body),
        std::time::Duration::from_secs(15),
    )
    .await
    {
        Ok(a) if (200..300).contains(&a.status) => said(&a.body),
        Ok(a) => format!(
            "refused: {} ({})",
            a.body["message"].as_str().unwrap_or("no reason given"),
            a.body["error"].as_str().unwrap_or("?")
        ),
        Err(e) => format!("could not reach fleetd: {e}"),
    }
}

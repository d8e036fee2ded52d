//! `fleetd approve TARGET [CHOICE]`: a member's dialog, and the answer to it (SPEC §20). Without
//! a choice it shows the dialog member TARGET waits on (`GET /blocked`) with the choices fleetd
//! can type; with one it types that choice (`POST /sessions/{target}/approve`), which the daemon
//! does only while that dialog is still on screen, and says what happened.

use std::io::Write;

use fleetd_core::Target;
use serde_json::{Value, json};

use super::{ClientError, Connection, QUICK_TIMEOUT, accepted, wire};

/// How long an approval may take: the daemon reads the screen, types, and watches the dialog go.
const APPROVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Shows `target`'s dialog, or answers it with `choice` (only if it is still the dialog named
/// `dialog`, when given); writes what happened to `out` (the daemon's JSON when `json`).
pub async fn run(
    conn: &Connection,
    target: &str,
    choice: Option<&str>,
    dialog: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> Result<bool, ClientError> {
    let target =
        Target::new(target).map_err(|e| ClientError::Argument(format!("{target:?}: {e}")))?;
    let Some(choice) = choice else {
        return show(conn, &target, json, out).await;
    };
    let answer = wire::call(
        conn,
        http::Method::POST,
        &format!("/sessions/{target}/approve"),
        Some(&json!({ "choice": choice, "dialog": dialog })),
        APPROVE_TIMEOUT,
    )
    .await?;
    let answer = accepted(answer, json, out)?;
    if json {
        writeln!(out, "{}", answer.body)?;
        return Ok(true);
    }
    let body = &answer.body;
    let what = format!(
        "typed {} ({}) into {target}'s dialog",
        body["choice"].as_str().unwrap_or(choice),
        body["label"].as_str().unwrap_or_default()
    );
    match body["outcome"].as_str() {
        Some("answered") => writeln!(out, "{what}: the dialog went")?,
        _ => writeln!(
            out,
            "{what}, but the dialog was still on screen a moment later: look at its pane"
        )?,
    }
    Ok(true)
}

/// Writes the dialog `target` waits on, with its choices.
async fn show(
    conn: &Connection,
    target: &Target,
    json: bool,
    out: &mut dyn Write,
) -> Result<bool, ClientError> {
    let answer = wire::call(conn, http::Method::GET, "/blocked", None, QUICK_TIMEOUT).await?;
    let answer = accepted(answer, json, out)?;
    let episode = answer.body["blocked"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["target"] == target.as_str()))
        .cloned();
    let Some(episode) = episode else {
        if json {
            writeln!(out, "null")?;
        } else {
            writeln!(out, "{target} is not waiting on a dialog")?;
        }
        return Ok(false);
    };
    if json {
        writeln!(out, "{episode}")?;
        return Ok(true);
    }
    render(target, &episode, out)?;
    Ok(true)
}

fn render(target: &Target, episode: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{target} waits on a dialog since {}:",
        episode["since"].as_str().unwrap_or("?")
    )?;
    for line in episode["lines"].as_array().into_iter().flatten() {
        writeln!(out, "  │ {}", line.as_str().unwrap_or_default())?;
    }
    let choices = episode["choices"].as_array().cloned().unwrap_or_default();
    if choices.is_empty() {
        writeln!(
            out,
            "fleetd recognises no choices in it: answer it in its pane"
        )?;
        return Ok(());
    }
    writeln!(out, "answer with one of:")?;
    let dialog = episode["dialog"].as_str().unwrap_or_default();
    for c in &choices {
        writeln!(
            out,
            "  fleetd approve {target} {} --dialog {dialog}    # {}",
            c["key"].as_str().unwrap_or_default(),
            c["label"].as_str().unwrap_or_default()
        )?;
    }
    Ok(())
}

//! The human CLI's client commands (`fleetd status`, `inbox`, `ack`, `send`; `budget` in
//! `client::budget`, `watch` in `client::watch`, the status table in `client::status`): find the
//! running daemon, ask its REST API, and print the answer for a person or, with `--json`, the
//! daemon's JSON as it came. Owns the commands' output and exit status; never decides anything
//! about the fleet itself (the daemon does), and speaks HTTP only through `wire`.

pub mod approve;
pub mod budget;
mod status;
pub mod watch;
pub(crate) mod wire;

use std::io::Write;
use std::time::Duration;

use fleetd_core::{MsgId, Target};
use serde_json::{Value, json};

use crate::config::{Config, ConfigError};

pub use wire::{Connection, DaemonUrl, WireError};

/// How long a command that does not wait for a member may take. The daemon answers these
/// from memory or one store read.
const QUICK_TIMEOUT: Duration = Duration::from_secs(30);

/// Slack on top of `send --wait`'s own timeout: the daemon answers when its window closes, and
/// the answer needs a moment to arrive.
const WAIT_SLACK: Duration = Duration::from_secs(30);

/// What to ask the daemon.
#[derive(Debug, Clone)]
pub enum Request {
    /// Every member.
    Status,
    /// A page of a member's pending replies.
    Inbox {
        /// The member.
        target: String,
        /// Start after this reply.
        after: Option<String>,
        /// Most replies on the page.
        limit: Option<u32>,
    },
    /// Remove one reply.
    Ack {
        /// The member.
        target: String,
        /// The reply.
        msg_id: String,
    },
    /// Answer an open question.
    Answer {
        /// The question.
        question_id: String,
        /// The answer.
        text: String,
    },
    /// Stop a member.
    Stop {
        /// The member.
        target: String,
        /// Why.
        cause: Option<String>,
    },
    /// The recent tickets, of one member or all.
    Tickets {
        /// Only this member's.
        target: Option<String>,
    },
    /// A one-time dashboard sign-in link.
    Dashboard,
    /// Admit a pane as a lead.
    Admit {
        /// The pane, as `echo $TMUX_PANE` or `$HERDR_PANE_ID` in it prints (or daemon-qualified).
        pane: String,
    },
    /// Hand a task to a member.
    Send {
        /// The member.
        target: String,
        /// The task.
        task: String,
        /// Wait for the ticket to settle.
        wait: bool,
        /// How long to wait, in seconds.
        timeout_secs: u64,
    },
}

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An argument is not what fleetd accepts.
    #[error("{0}")]
    Argument(String),
    /// No usable answer.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The daemon answered with an error.
    #[error("the daemon refused: {message} ({code}, HTTP {status})")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The daemon's stable error code.
        code: String,
        /// What to do.
        message: String,
    },
    /// Writing the output failed (e.g. a closed pipe).
    #[error("failed to write the output")]
    Output(#[from] std::io::Error),
}

/// Finds the daemon and the token to present. `daemon` is `--daemon` or `FLEETD_URL` (clap
/// folds the two); without it the daemon's unix socket in the config's state directory is used
/// (where the daemon knows the caller as its own user: the operator), so a config that does not
/// load is an error only then. Over TCP the token is `token` (`--token`/`FLEETD_TOKEN`), else
/// the config's `apiToken` secret when it resolves in this environment (`env` looks variables
/// up); on the unix socket none is sent.
pub fn connect(
    daemon: Option<&str>,
    token: Option<String>,
    config: Result<Config, ConfigError>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Connection, ClientError> {
    let url = match (daemon, &config) {
        (Some(given), _) => DaemonUrl::parse(given)?,
        (None, Ok(config)) => {
            DaemonUrl::unix(crate::serve::operator_socket_path(&config.state_dir))
        }
        (None, Err(e)) => {
            return Err(ClientError::Argument(format!(
                "failed to find the daemon's address in the config ({e}); pass --daemon URL or set FLEETD_URL"
            )));
        }
    };
    if !url.is_tcp() {
        return Ok(Connection { url, token: None });
    }
    let token = token.filter(|t| !t.is_empty()).or_else(|| {
        let config = config.ok()?;
        let name = config.api_token.as_ref()?;
        crate::secrets::Secrets::new(&config.secrets, env)
            .resolve(name)
            .ok()
            .map(|v| v.expose().to_owned())
    });
    Ok(Connection { url, token })
}

/// Asks the daemon and writes the answer to `out` (JSON when `json`). Returns whether the
/// command achieved what was asked: false for `send --wait` when no reply came back.
pub async fn run(
    conn: &Connection,
    request: &Request,
    json: bool,
    out: &mut dyn Write,
) -> Result<bool, ClientError> {
    let (method, path, body, timeout) = route(request)?;
    let answer = wire::call(conn, method, &path, body.as_ref(), timeout).await?;
    let answer = accepted(answer, json, out)?;
    if json {
        writeln!(out, "{}", answer.body)?;
        return Ok(settled_ok(request, &answer.body));
    }
    match request {
        Request::Status => status::render(&answer.body, out)?,
        Request::Inbox { target, .. } => render_inbox(target, &answer.body, out)?,
        Request::Ack { target, .. } => render_ack(target, &answer.body, out)?,
        Request::Send { target, .. } => render_send(target, &answer.body, out)?,
        Request::Answer { question_id, .. } => render_answer(question_id, &answer.body, out)?,
        Request::Stop { target, .. } => render_stop(target, &answer.body, out)?,
        Request::Tickets { target } => {
            render_tickets(target.as_deref(), &answer.body, now(), out)?;
        }
        Request::Dashboard => render_dashboard(&answer.body, out)?,
        Request::Admit { .. } => writeln!(
            out,
            "pane {} is a lead now{}",
            text(&answer.body, "pane"),
            if answer.body["already"].as_bool() == Some(true) {
                " (it was one already)"
            } else {
                ""
            }
        )?,
    }
    Ok(settled_ok(request, &answer.body))
}

/// `answer` when the daemon did what was asked (a 2xx status); else the daemon's refusal in it
/// (written to `out` as it came when `json`).
fn accepted(
    answer: wire::Answer,
    json: bool,
    out: &mut dyn Write,
) -> Result<wire::Answer, ClientError> {
    if (200..300).contains(&answer.status) {
        return Ok(answer);
    }
    Err(refused(&answer, json, out))
}

/// The daemon's refusal in `answer` (written to `out` as it came when `json`).
fn refused(answer: &wire::Answer, json: bool, out: &mut dyn Write) -> ClientError {
    if json && let Err(e) = writeln!(out, "{}", answer.body) {
        return e.into();
    }
    let said =
        |key: &str, otherwise: &str| answer.body[key].as_str().unwrap_or(otherwise).to_owned();
    ClientError::Refused {
        status: answer.status,
        code: said("error", "unknown"),
        message: said("message", "no reason given"),
    }
}

fn route(
    request: &Request,
) -> Result<(http::Method, String, Option<Value>, Duration), ClientError> {
    let target =
        |name: &str| Target::new(name).map_err(|e| ClientError::Argument(format!("{name:?}: {e}")));
    Ok(match request {
        Request::Status => (http::Method::GET, "/sessions".into(), None, QUICK_TIMEOUT),
        Request::Inbox {
            target: name,
            after,
            limit,
        } => {
            let t = target(name)?;
            let mut query = Vec::new();
            if let Some(after) = after {
                let id = MsgId::parse(after)
                    .map_err(|e| ClientError::Argument(format!("--after {after:?}: {e}")))?;
                query.push(format!("after={id}"));
            }
            if let Some(limit) = limit {
                query.push(format!("limit={limit}"));
            }
            let mut path = format!("/sessions/{t}/replies");
            if !query.is_empty() {
                path = format!("{path}?{}", query.join("&"));
            }
            (http::Method::GET, path, None, QUICK_TIMEOUT)
        }
        Request::Ack {
            target: name,
            msg_id,
        } => {
            let t = target(name)?;
            let id = MsgId::parse(msg_id)
                .map_err(|e| ClientError::Argument(format!("{msg_id:?}: {e}")))?;
            let path = format!("/sessions/{t}/replies/{id}/ack");
            (http::Method::POST, path, None, QUICK_TIMEOUT)
        }
        Request::Answer { question_id, text } => {
            if question_id.is_empty()
                || !question_id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ClientError::Argument(format!(
                    "{question_id:?} is not a question id: `fleetd watch` or the dashboard shows them (letters, digits and dashes)"
                )));
            }
            (
                http::Method::POST,
                format!("/questions/{question_id}/answer"),
                Some(json!({ "answer": text })),
                QUICK_TIMEOUT,
            )
        }
        Request::Stop {
            target: name,
            cause,
        } => {
            let t = target(name)?;
            let body = cause.as_ref().map(|c| json!({ "cause": c }));
            (
                http::Method::POST,
                format!("/sessions/{t}/stop"),
                body,
                QUICK_TIMEOUT,
            )
        }
        Request::Tickets { target: name } => {
            let path = match name {
                Some(name) => format!("/tickets?target={}", target(name)?),
                None => "/tickets".to_owned(),
            };
            (http::Method::GET, path, None, QUICK_TIMEOUT)
        }
        Request::Dashboard => (
            http::Method::POST,
            "/dashboard/keys".to_owned(),
            None,
            QUICK_TIMEOUT,
        ),
        Request::Admit { pane } => (
            http::Method::POST,
            "/leads/admit".to_owned(),
            Some(json!({ "pane": pane })),
            QUICK_TIMEOUT,
        ),
        Request::Send {
            target: name,
            task,
            wait,
            timeout_secs,
        } => {
            let t = target(name)?;
            let body = json!({ "task": task, "wait": wait, "timeoutSecs": timeout_secs });
            let timeout = if *wait {
                Duration::from_secs(*timeout_secs) + WAIT_SLACK
            } else {
                QUICK_TIMEOUT
            };
            (
                http::Method::POST,
                format!("/sessions/{t}/tasks"),
                Some(body),
                timeout,
            )
        }
    })
}

/// `send --wait` succeeded only when a reply (or the turn-end fallback) came back.
fn settled_ok(request: &Request, body: &Value) -> bool {
    match request {
        Request::Send { wait: true, .. } => body.get("reply").is_some(),
        _ => true,
    }
}

pub(super) fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("-")
}

fn render_inbox(target: &str, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let replies = body["replies"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if replies.is_empty() {
        return writeln!(out, "{target}: no replies waiting");
    }
    let s = if replies.len() == 1 { "y" } else { "ies" };
    let more = body["more"] == true;
    let shown = if more { "on this page" } else { "waiting" };
    writeln!(
        out,
        "{target}: {} repl{s} {shown} (`fleetd ack {target} MSGID` removes one)",
        replies.len()
    )?;
    for r in replies {
        writeln!(
            out,
            "\n{}  {}  ticket {}  {}",
            text(r, "msgId"),
            text(r, "kind"),
            text(r, "ticket"),
            text(r, "createdAt"),
        )?;
        for l in text(r, "text").lines() {
            writeln!(out, "    {l}")?;
        }
    }
    if let Some(last) = replies.last().filter(|_| more) {
        writeln!(
            out,
            "\nmore replies wait: `fleetd inbox {target} --after {}`",
            text(last, "msgId")
        )?;
    }
    Ok(())
}

fn render_ack(target: &str, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let id = text(body, "msgId");
    if body["acked"] == true {
        writeln!(out, "acknowledged {id} ({target}'s inbox)")
    } else {
        writeln!(
            out,
            "{id} was not in {target}'s inbox (already acknowledged?); nothing changed"
        )
    }
}

fn render_send(target: &str, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    let ticket = text(body, "ticket");
    let status = text(body, "status");
    match body.get("reply").and_then(Value::as_str) {
        Some(reply) if status == "ended_without_reply" => writeln!(
            out,
            "{target}'s turn ended without fleet_reply (ticket {ticket}); the end of its pane:\n{reply}"
        ),
        Some(reply) => writeln!(out, "{reply}"),
        None if status == "queued" || status == "working" || status == "delivered" => writeln!(
            out,
            "ticket {ticket} {status} for {target}; the reply lands in its inbox (`fleetd inbox {target}`)"
        ),
        None => writeln!(
            out,
            "ticket {ticket} {status}: {target} did not take the task; `fleetd status` shows the member"
        ),
    }
}

fn render_answer(question_id: &str, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    match body["deliveredTo"].as_str() {
        Some("waiter") => writeln!(
            out,
            "answered question {question_id}: the member was waiting and has it now"
        ),
        Some("gateway") => writeln!(
            out,
            "answered question {question_id}: the answer is on its way to the member's gateway"
        ),
        Some(_) => writeln!(
            out,
            "answered question {question_id}: the member had stopped waiting, so the answer goes to it as a task"
        ),
        None => writeln!(out, "answered question {question_id}"),
    }
}

fn render_stop(target: &str, body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "stopped {target} ({}); its open tickets are cancelled, the replies it sent stay in its inbox (`fleetd inbox {target}`)",
        text(body, "cause")
    )?;
    if body["paneClosed"] == false {
        writeln!(
            out,
            "its pane {} did not close: close it by hand",
            text(body, "paneId")
        )?;
    }
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "a display: ticket ages are read against this machine's clock"
)]
fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

fn render_tickets(
    target: Option<&str>,
    body: &Value,
    now: jiff::Timestamp,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let tickets = body["tickets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if tickets.is_empty() {
        return match target {
            Some(t) => writeln!(out, "{t}: no tickets yet (`fleetd send {t} ...` opens one)"),
            None => writeln!(out, "no tickets yet"),
        };
    }
    let age = |key: &str, t: &Value| {
        t[key]
            .as_str()
            .and_then(|at| at.parse::<jiff::Timestamp>().ok())
            .and_then(|at| u64::try_from(now.as_millisecond() - at.as_millisecond()).ok())
            .map_or_else(
                || "-".to_owned(),
                |ms| watch::summary::human(Duration::from_millis(ms)),
            )
    };
    let header = ["TICKET", "TARGET", "STATE", "AGE", "FINISHED", "CAUSE"];
    let rows: Vec<[String; 6]> = tickets
        .iter()
        .map(|t| {
            [
                text(t, "ticket").to_owned(),
                text(t, "target").to_owned(),
                text(t, "state").to_owned(),
                age("createdAt", t),
                t["finishedAt"].as_str().map_or_else(
                    || "-".to_owned(),
                    |_| format!("{} ago", age("finishedAt", t)),
                ),
                text(t, "cause").to_owned(),
            ]
        })
        .collect();
    table(&header, &rows, out)
}

fn render_dashboard(body: &Value, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "open this link in a browser on this machine within {} s (it works once):\n{}",
        body["expiresInSeconds"].as_u64().unwrap_or(120),
        text(body, "url")
    )
}

/// Writes `rows` under `header` as aligned columns.
pub(super) fn table<const N: usize>(
    header: &[&str; N],
    rows: &[[String; N]],
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    writeln!(out, "{}", line(header))?;
    for row in rows {
        writeln!(out, "{}", line(&row.each_ref().map(String::as_str)))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

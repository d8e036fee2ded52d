//! `fleetd watch`: follows the daemon's event stream (`GET /events`) in the terminal. On a
//! terminal it keeps a live member table (status, inbox depth, open tickets with their ages,
//! delegating lead) above the most recent events, redrawn as events come, with colours; piped,
//! it prints the table once per (re)connection and then one plain line per event, so a script
//! or a test can follow it. `--json` prints each event's JSON on a line of its own. It
//! reconnects by itself (resuming after the last event it saw) and re-reads the table when the
//! stream says it missed something. The table is `GET /sessions` (what `fleetd status` shows),
//! re-read at most every [`REFRESH`] while events arrive: events say what changed, the daemon
//! says what is.

use std::collections::VecDeque;
use std::io::Write;
use std::time::Duration;

use http_body_util::BodyExt as _;
use serde_json::Value;

use super::wire::{self, WireError};
use super::{ClientError, Connection};
use summary::{SseEvent, colour, human, parse_block, short, summary, ticket_age};

mod answer;
pub(super) mod summary;

/// Events kept under the table on a terminal.
const LOG_LINES: usize = 15;
/// The table is re-read at most this often while events arrive.
const REFRESH: Duration = Duration::from_millis(500);
/// The longest wait between reconnection attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How `watch` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A redrawn screen with colours (stdout is a terminal).
    Screen,
    /// Plain lines (piped).
    Lines,
    /// Each event's JSON on a line.
    Json,
}

/// What the watcher shows.
struct View {
    style: Style,
    members: Value,
    waiting: answer::Waiting,
    log: VecDeque<String>,
}

/// Lines typed into the watcher (its stdin), read on a thread of their own: stdin is blocking.
fn typed_lines() -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Follows the daemon until the stream is refused (an error) or writing fails (the reader
/// went away: not an error).
pub async fn watch(
    conn: &Connection,
    style: Style,
    out: &mut dyn Write,
) -> Result<(), ClientError> {
    let mut view = View {
        style,
        members: Value::Null,
        waiting: answer::Waiting::default(),
        log: VecDeque::new(),
    };
    let mut typed = typed_lines();
    let mut last_id: Option<String> = None;
    let mut backoff = Duration::from_millis(250);
    loop {
        match follow(conn, &mut view, &mut last_id, &mut typed, out).await {
            Ok(()) => backoff = Duration::from_millis(250),
            Err(Followed::Refused(e)) => return Err(e),
            Err(Followed::Closed) => return Ok(()),
            Err(Followed::Lost(why)) => {
                view.note(&format!("(not connected: {why}; retrying)"), out)?;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Why following stopped.
enum Followed {
    /// The daemon refused (wrong role, bad token): retrying would not help.
    Refused(ClientError),
    /// Writing failed: whoever read the output is gone.
    Closed,
    /// The connection failed or ended: reconnect.
    Lost(String),
}

impl From<std::io::Error> for Followed {
    fn from(_: std::io::Error) -> Self {
        Self::Closed
    }
}

impl From<WireError> for Followed {
    fn from(e: WireError) -> Self {
        Self::Lost(e.to_string())
    }
}

/// One connection: the table, then the stream until it ends.
async fn follow(
    conn: &Connection,
    view: &mut View,
    last_id: &mut Option<String>,
    typed: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    out: &mut dyn Write,
) -> Result<(), Followed> {
    let mut headers = vec![("accept", "text/event-stream")];
    let resume = last_id.clone();
    if let Some(id) = &resume {
        headers.push(("last-event-id", id.as_str()));
    }
    let response = wire::open(conn, http::Method::GET, "/events", None, &headers).await?;
    let status = response.status().as_u16();
    if status != 200 {
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        return Err(Followed::Refused(ClientError::Refused {
            status,
            code: body["error"].as_str().unwrap_or("unknown").to_owned(),
            message: body["message"]
                .as_str()
                .unwrap_or("no reason given")
                .to_owned(),
        }));
    }
    view.refresh(conn).await?;
    view.draw(out, true)?;
    let mut body = response.into_body();
    let mut pending = String::new();
    let mut last_refresh = tokio::time::Instant::now();
    let mut stale = false;
    loop {
        // While the table is stale, wake up to re-read it even if no event comes.
        let wait = if stale {
            REFRESH.saturating_sub(last_refresh.elapsed())
        } else {
            Duration::from_secs(3600)
        };
        let frame = tokio::select! {
            frame = tokio::time::timeout(wait, body.frame()) => frame.ok(),
            Some(line) = typed.recv() => {
                if !line.trim().is_empty() {
                    let said = answer::run(conn, &view.waiting, &line).await;
                    view.note(&format!("> {}: {said}", line.trim()), out)
                        .map_err(|_| Followed::Closed)?;
                    stale = true;
                }
                None
            }
        };
        match frame {
            None => {}
            Some(None) => return Err(Followed::Lost("the daemon ended the stream".into())),
            Some(Some(Err(e))) => return Err(Followed::Lost(e.to_string())),
            Some(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                pending.push_str(&String::from_utf8_lossy(&data));
                while let Some(end) = pending.find("\n\n") {
                    let block: String = pending.drain(..end + 2).collect();
                    if let Some(event) = parse_block(&block) {
                        if let Some(id) = &event.id {
                            *last_id = Some(id.clone());
                        }
                        // Anything but a nudge may change the table (a gap: what was missed is
                        // gone); it is re-read below.
                        stale |= event.kind != "nudge";
                        view.event(&event, out)?;
                    }
                }
            }
        }
        if stale && last_refresh.elapsed() >= REFRESH {
            view.refresh(conn).await?;
            last_refresh = tokio::time::Instant::now();
            stale = false;
            view.draw(out, false)?;
        }
    }
}

impl View {
    async fn refresh(&mut self, conn: &Connection) -> Result<(), Followed> {
        let answer = wire::call(
            conn,
            http::Method::GET,
            "/sessions",
            None,
            super::QUICK_TIMEOUT,
        )
        .await?;
        if (200..300).contains(&answer.status) {
            self.members = answer.body;
        }
        self.waiting = answer::read(conn).await;
        Ok(())
    }

    /// The member table's lines.
    #[expect(
        clippy::disallowed_methods,
        reason = "a display: ticket ages are read against this machine's clock"
    )]
    fn table(&self) -> Vec<String> {
        let members = self.members["members"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if members.is_empty() {
            return vec!["no members".to_owned()];
        }
        let now_ms = jiff::Timestamp::now().as_millisecond();
        let header = [
            "TARGET",
            "STATUS",
            "PROFILE",
            "INBOX",
            "OPEN TICKETS (AGE)",
            "LEAD",
            "MODEL",
        ];
        let rows: Vec<[String; 7]> = members
            .iter()
            .map(|m| {
                let text = |k: &str| m[k].as_str().unwrap_or("-").to_owned();
                let open: Vec<String> = m["openTickets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(|t| match ticket_age(t, now_ms) {
                        Some(age) => format!("{} ({})", short(t), human(age)),
                        None => short(t).to_owned(),
                    })
                    .collect();
                [
                    text("target"),
                    text("status"),
                    text("profile"),
                    m["inboxDepth"]
                        .as_u64()
                        .map_or_else(|| "?".to_owned(), |d| d.to_string()),
                    if open.is_empty() {
                        "-".to_owned()
                    } else {
                        open.join(", ")
                    },
                    text("lead"),
                    super::status::model(m),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let screen = self.style == Style::Screen;
        let line = |cells: &[&str], status: Option<&str>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(i, (c, w))| {
                    let cell = format!("{c:<w$}");
                    match status {
                        Some(s) if screen && i == 1 => format!("{}{cell}\x1b[0m", colour(s)),
                        _ => cell,
                    }
                })
                .collect();
            padded.join("  ").trim_end().to_owned()
        };
        let mut lines = vec![line(&header, None)];
        for row in &rows {
            lines.push(line(&row.each_ref().map(String::as_str), Some(&row[1])));
        }
        lines
    }

    /// Shows the table: the whole screen on a terminal; piped, only on (re)connecting.
    fn draw(&self, out: &mut dyn Write, connected: bool) -> std::io::Result<()> {
        match self.style {
            Style::Screen => {
                let mut screen = String::from("\x1b[H\x1b[2J");
                screen.push_str("\x1b[1mfleetd watch\x1b[0m  (Ctrl-C to stop)\n\n");
                for line in self.table() {
                    screen.push_str(&line);
                    screen.push('\n');
                }
                let waiting = self.waiting.lines();
                if !waiting.is_empty() {
                    screen.push_str("\n\x1b[1;31mwaiting on you\x1b[0m\n");
                    for line in waiting {
                        screen.push_str(&line);
                        screen.push('\n');
                    }
                    screen.push_str(&format!("\x1b[2m({})\x1b[0m\n", answer::HELP));
                }
                screen.push_str("\n\x1b[1mevents\x1b[0m\n");
                for line in &self.log {
                    screen.push_str(line);
                    screen.push('\n');
                }
                out.write_all(screen.as_bytes())?;
            }
            Style::Lines if connected => {
                for line in self.table() {
                    writeln!(out, "{line}")?;
                }
                for line in self.waiting.lines() {
                    writeln!(out, "{line}")?;
                }
            }
            Style::Lines | Style::Json => {}
        }
        out.flush()
    }

    fn event(&mut self, event: &SseEvent, out: &mut dyn Write) -> std::io::Result<()> {
        match self.style {
            Style::Json => {
                writeln!(out, "{}", event.data)?;
                out.flush()
            }
            Style::Lines => {
                writeln!(out, "{}", summary(event))?;
                out.flush()
            }
            Style::Screen => {
                self.remember(summary(event));
                self.draw(out, false)
            }
        }
    }

    /// A line of the watcher's own (not connected, retrying).
    fn note(&mut self, line: &str, out: &mut dyn Write) -> Result<(), ClientError> {
        let written = match self.style {
            Style::Screen => {
                self.remember(line.to_owned());
                self.draw(out, false)
            }
            Style::Lines | Style::Json => writeln!(out, "{line}").and_then(|()| out.flush()),
        };
        // The reader went away: stop quietly.
        written.map_err(ClientError::from)
    }

    fn remember(&mut self, line: String) {
        if self.log.len() >= LOG_LINES {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }
}

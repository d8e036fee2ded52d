//! A test-side reader of fleetd's `GET /events` (server-sent events over HTTP/1.1 with chunked
//! transfer encoding), on the operator's unix socket or TCP. Blocking, with a read timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// One event as the stream framed it.
#[derive(Debug, Clone)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The `id:` field (empty when the event has none).
    pub id: String,
    /// The `data:` field, parsed as JSON.
    pub data: Value,
}

/// An open event stream.
pub struct SseReader {
    reader: BufReader<Box<dyn Read + Send>>,
    /// The HTTP status of the answer.
    pub status: u16,
    /// The body of a refusal (empty for a stream).
    pub refusal: String,
    /// Every body byte read so far (to check what never appears in the stream).
    pub raw: String,
    pending: String,
}

impl SseReader {
    /// `GET /events` on the unix socket at `path`, resuming after `last_event_id`.
    pub fn unix(path: &Path, last_event_id: Option<&str>) -> std::io::Result<Self> {
        let stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut writer = stream.try_clone()?;
        Self::open(
            &mut writer,
            Box::new(stream),
            "localhost",
            &[],
            last_event_id,
        )
    }

    /// `GET /events` over TCP to `addr` with extra `headers`.
    pub fn tcp(
        addr: std::net::SocketAddr,
        headers: &[(&str, &str)],
        last_event_id: Option<&str>,
    ) -> std::io::Result<Self> {
        let stream = std::net::TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        let mut writer = stream.try_clone()?;
        Self::open(
            &mut writer,
            Box::new(stream),
            &addr.to_string(),
            headers,
            last_event_id,
        )
    }

    fn open(
        writer: &mut dyn Write,
        stream: Box<dyn Read + Send>,
        host: &str,
        headers: &[(&str, &str)],
        last_event_id: Option<&str>,
    ) -> std::io::Result<Self> {
        let mut head =
            format!("GET /events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            head.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        writer.write_all(head.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut status_line = String::new();
        reader.read_line(&mut status_line)?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut length = None;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse::<usize>().ok();
            }
        }
        let mut this = Self {
            reader,
            status,
            refusal: String::new(),
            raw: String::new(),
            pending: String::new(),
        };
        if status != 200 {
            let mut body = vec![0; length.unwrap_or(0)];
            this.reader.read_exact(&mut body)?;
            this.refusal = String::from_utf8_lossy(&body).into_owned();
        }
        Ok(this)
    }

    /// Reads one chunk of the body into `pending`; false at the end of the stream.
    fn read_chunk(&mut self) -> std::io::Result<bool> {
        let mut size = String::new();
        if self.reader.read_line(&mut size)? == 0 {
            return Ok(false);
        }
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            return Ok(false);
        }
        let mut chunk = vec![0; size + 2];
        self.reader.read_exact(&mut chunk)?;
        chunk.truncate(size);
        let text = String::from_utf8_lossy(&chunk).into_owned();
        self.raw.push_str(&text);
        self.pending.push_str(&text);
        Ok(true)
    }

    /// The next event (comments skipped); `None` when the stream ended or nothing came within
    /// the read timeout.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let block: String = self.pending.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if event.is_empty() && data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(SseEvent {
                    event,
                    id,
                    data: serde_json::from_str(&data).unwrap_or(Value::String(data)),
                });
            }
            match self.read_chunk() {
                Ok(true) => {}
                _ => return None,
            }
        }
    }

    /// Reads events until one matches `pred`; returns every event read, the match last.
    pub fn until(&mut self, what: &str, pred: impl Fn(&SseEvent) -> bool) -> Vec<SseEvent> {
        let mut seen = Vec::new();
        loop {
            let Some(event) = self.next_event() else {
                panic!("the event stream ended or went quiet before {what}; seen: {seen:#?}");
            };
            let done = pred(&event);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

//! A bounded decoder of server-sent events (the WHATWG `text/event-stream` format), fed bytes as
//! they pass. It hands on each event's data and nothing else: the usage readers trust the JSON
//! `type` inside the data rather than the `event:` name, and need neither `id:` nor `retry:`.

use super::append_bounded;

/// A buffer above this capacity is given back once used, so one large event does not pin its
/// memory for the rest of a long stream.
const KEEP_CAPACITY: usize = 64 * 1024;

/// Splits a byte stream into lines and lines into events, holding at most [`MAX_BUFFERED`](super::MAX_BUFFERED) bytes
/// of a pending line and as much of a pending event's data.
#[derive(Debug, Default)]
pub(super) struct SseDecoder {
    /// The current line so far, without its terminator.
    line: Vec<u8>,
    /// The current line outgrew the bound: the rest of it is skipped.
    line_dropped: bool,
    /// The last byte seen was a CR, so a LF right after it (perhaps in the next chunk) is the
    /// second half of one CRLF terminator, not an empty line.
    after_cr: bool,
    /// The current event's data lines, joined with LF.
    data: Vec<u8>,
    /// The current event has had a `data` line (its data may still be empty).
    has_data: bool,
    /// Part of the current event was lost to the bound: the event is not handed on.
    event_dropped: bool,
}

impl SseDecoder {
    /// Decodes `chunk`, calling `on_event` with the data of each event it completes. Chunks may
    /// split the stream anywhere: inside a line, a UTF-8 character or a CRLF.
    pub(super) fn feed(&mut self, chunk: &[u8], on_event: &mut impl FnMut(&[u8])) {
        // Lines end at LF, CR or CRLF (the format allows all three); each piece is one line's
        // bytes up to and including its terminator, or the unterminated tail of the chunk.
        for piece in chunk.split_inclusive(|b| matches!(b, b'\n' | b'\r')) {
            let (body, terminator) = match piece.split_last() {
                Some((&end @ (b'\n' | b'\r'), body)) => (body, Some(end)),
                _ => (piece, None),
            };
            if self.after_cr && body.is_empty() && terminator == Some(b'\n') {
                self.after_cr = false;
                continue;
            }
            self.after_cr = false;
            self.extend_line(body);
            if let Some(end) = terminator {
                self.after_cr = end == b'\r';
                self.end_line(on_event);
            }
        }
    }

    /// Bytes held for the pending line and event, for tests of the bound.
    #[cfg(test)]
    pub(super) fn buffered(&self) -> usize {
        self.line.capacity().saturating_add(self.data.capacity())
    }

    fn extend_line(&mut self, bytes: &[u8]) {
        if self.line_dropped || bytes.is_empty() {
            return;
        }
        if !append_bounded(&mut self.line, bytes) {
            self.line_dropped = true;
            self.line = Vec::new();
        }
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.line_dropped {
            // What was lost may have been one of the event's data lines: its data is not whole.
            self.line_dropped = false;
            self.event_dropped = true;
            self.data = Vec::new();
            return;
        }
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.dispatch(on_event);
        } else {
            self.field(&line);
        }
        self.line = recycle(line);
    }

    /// One non-empty line: a comment, or a field with an optional value.
    fn field(&mut self, line: &[u8]) {
        if line.starts_with(b":") {
            return;
        }
        // The name runs to the first colon; a line without one is a name with an empty value.
        let mut parts = line.splitn(2, |b| *b == b':');
        let name = parts.next().unwrap_or_default();
        let value = parts.next().unwrap_or_default();
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if name != b"data" || self.event_dropped {
            return;
        }
        let separator: &[u8] = if self.has_data { b"\n" } else { b"" };
        if !(append_bounded(&mut self.data, separator) && append_bounded(&mut self.data, value)) {
            self.event_dropped = true;
            self.data = Vec::new();
            return;
        }
        self.has_data = true;
    }

    /// The empty line: the event ends. An event without data lines is not dispatched.
    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data && !self.event_dropped {
            on_event(&self.data);
        }
        self.data = recycle(std::mem::take(&mut self.data));
        self.has_data = false;
        self.event_dropped = false;
    }
}

/// An emptied buffer to reuse, unless it grew large.
fn recycle(mut buffer: Vec<u8>) -> Vec<u8> {
    if buffer.capacity() > KEEP_CAPACITY {
        return Vec::new();
    }
    buffer.clear();
    buffer
}

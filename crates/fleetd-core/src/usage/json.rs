//! A bounded buffer for a response body that is one JSON document. It keeps the top-level
//! object's bytes and scans its structure as they pass, so the reader learns the moment the
//! object closes (and can parse it then, once) without trying to parse a partial body per chunk.

use super::append_bounded;

/// What a fed chunk did to the document.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Progress {
    /// The object is still open.
    More,
    /// The top-level object closed: its bytes, from `{` to `}`.
    Closed(Vec<u8>),
    /// The body is not a JSON object, or is larger than the bound: nothing more is kept.
    Abandoned,
}

/// The kept body and where the scan is in it.
#[derive(Debug, Default)]
pub(super) struct JsonDoc {
    /// The object's bytes so far (leading whitespace skipped).
    kept: Vec<u8>,
    /// The `{` opened the object; before it only whitespace may come.
    started: bool,
    /// Objects and arrays open, the top-level object included.
    depth: u64,
    /// Inside a string, where brackets are text.
    in_string: bool,
    /// The previous byte was a backslash inside a string, so this one is escaped.
    escaped: bool,
}

impl JsonDoc {
    /// Keeps and scans `chunk`. After `Closed` or `Abandoned` the document is done: feeding it
    /// again is the caller's mistake and scans nothing useful.
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Progress {
        let mut from = 0;
        for (at, &byte) in chunk.iter().enumerate() {
            if !self.started {
                match byte {
                    b' ' | b'\t' | b'\n' | b'\r' => from = at.saturating_add(1),
                    b'{' => {
                        self.started = true;
                        self.depth = 1;
                    }
                    _ => return self.abandon(),
                }
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if byte == b'\\' {
                    self.escaped = true;
                } else if byte == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match byte {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth = self.depth.saturating_add(1),
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        // Whatever follows the object (a final newline) is not part of it.
                        let last = chunk.get(from..=at).unwrap_or_default();
                        if !self.keep(last) {
                            return self.abandon();
                        }
                        return Progress::Closed(std::mem::take(&mut self.kept));
                    }
                }
                _ => {}
            }
        }
        if self.keep(chunk.get(from..).unwrap_or_default()) {
            Progress::More
        } else {
            self.abandon()
        }
    }

    /// At the body's end with the object still open: what was kept, for one last parse.
    pub(super) fn into_kept(self) -> Vec<u8> {
        self.kept
    }

    /// Bytes held, for tests of the bound.
    #[cfg(test)]
    pub(super) fn buffered(&self) -> usize {
        self.kept.capacity()
    }

    /// Appends `bytes` unless that would pass the bound ([`super::MAX_BUFFERED`]).
    fn keep(&mut self, bytes: &[u8]) -> bool {
        append_bounded(&mut self.kept, bytes)
    }

    fn abandon(&mut self) -> Progress {
        self.kept = Vec::new();
        Progress::Abandoned
    }
}

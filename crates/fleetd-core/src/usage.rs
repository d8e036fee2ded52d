//! Token usage of model traffic, and what it costs against a budget.
//!
//! fleetd proxies its members' model requests (Anthropic Messages, OpenAI Responses, OpenAI Chat
//! Completions) and counts their tokens from the responses as the bytes pass through to the
//! client, which must never wait on a buffered stream. This module is the pure part of that:
//! [`api_of`] names the API a request speaks, a [`UsageReader`] is fed the response body chunk by
//! chunk and says at its end what the response reported, and [`cost_micros`], [`standing`] and
//! [`describe`] turn tokens into money and budget decisions.
//!
//! The reader is fed the body as the client receives it, decoded: a proxy that lets a
//! `Content-Encoding` through must decompress for the reader (or ask upstream for `identity`).
//! Its memory is bounded by [`MAX_BUFFERED`] whatever the body; a response that does not report
//! a complete usage within that bound reads as unknown (`None`), never as a guess.

mod budget;
mod json;
mod sse;
mod wire;

use serde::{Deserialize, Serialize};

pub use budget::{Budget, Spent, Standing, describe, dollars, standing};
use json::{JsonDoc, Progress};
use sse::SseDecoder;
use wire::{AnthropicEvent, AnthropicMessage, ChatBody, ResponsesEvent, ResponsesResponse};

/// The most bytes a [`UsageReader`] holds of one pending stream line, of one pending stream
/// event's data, or of a whole JSON body (8 MiB). A line or event over it is skipped; a JSON body
/// over it is given up on. Usage events are a few hundred bytes, so only a whole JSON body or an
/// event carrying a huge output (the Responses API's `response.completed` repeats the whole
/// response) can reach it, and then the response's usage is unknown rather than memory
/// unbounded.
pub const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// Appends `bytes` to `buffer` unless that would take it past [`MAX_BUFFERED`]. It grows by
/// doubling as a `Vec` does, but its capacity stops at the bound too, not at twice it.
fn append_bounded(buffer: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let needed = buffer.len().saturating_add(bytes.len());
    if needed > MAX_BUFFERED {
        return false;
    }
    if needed > buffer.capacity() {
        let target = buffer
            .capacity()
            .saturating_mul(2)
            .max(needed)
            .min(MAX_BUFFERED);
        buffer.reserve_exact(target.saturating_sub(buffer.len()));
    }
    buffer.extend_from_slice(bytes);
    true
}

/// Tokens by kind. `input` is uncached input only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    /// Input tokens read neither from nor into the prompt cache.
    pub input: u64,
    /// Output tokens (reasoning included).
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
}

impl Tokens {
    /// All tokens of every kind, saturating at `u64::MAX`.
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    /// Adds `other` kind by kind, saturating at `u64::MAX`: a total that has overflowed stays
    /// at the top rather than wrapping to a small number that would pass a budget.
    pub fn add(&mut self, other: &Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
    }
}

/// Which API a request speaks, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// Anthropic's Messages API (`POST …/messages`).
    AnthropicMessages,
    /// OpenAI's Responses API (`POST …/responses`).
    OpenAiResponses,
    /// OpenAI's Chat Completions API (`POST …/chat/completions`).
    OpenAiChat,
    /// Anything else: no usage is read from it.
    Other,
}

/// The API of a request: a POST whose path (query excluded) ends in `/messages`,
/// `/responses` or `/chat/completions`. Anything else is [`Api::Other`], including
/// `/messages/count_tokens` (a free call that generates nothing) and every non-POST.
pub fn api_of(is_post: bool, path: &str) -> Api {
    if !is_post {
        return Api::Other;
    }
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    if path.ends_with("/messages") {
        Api::AnthropicMessages
    } else if path.ends_with("/responses") {
        Api::OpenAiResponses
    } else if path.ends_with("/chat/completions") {
        Api::OpenAiChat
    } else {
        Api::Other
    }
}

/// Reads usage out of a response body fed as it passes.
///
/// A usage is reported only when the response says it is whole: an Anthropic stream's
/// `message_stop` (after its `message_start`, without an `error`), a Responses stream's
/// `response.completed` (or `response.failed` / `response.incomplete`, which are billed too)
/// carrying a usage, a Chat Completions stream's `[DONE]` after a chunk with a usage, or a whole
/// JSON body of the API's kind. A cut stream reads as `None`.
#[derive(Debug)]
pub struct UsageReader {
    api: Api,
    body: Body,
}

/// Where the reader is in the body.
#[derive(Debug)]
enum Body {
    /// An event stream, and what its events have said.
    Stream { decoder: SseDecoder, tally: Tally },
    /// A JSON body whose object is still open.
    Document(JsonDoc),
    /// A JSON body that closed (or was given up on): its usage, read once.
    Read(Option<Tokens>),
    /// Nothing to read ([`Api::Other`]).
    Ignored,
}

/// What a stream's events have said so far, by API.
#[derive(Debug)]
enum Tally {
    Anthropic {
        /// `message_start` was seen: its usage is in `tokens`.
        started: bool,
        /// `message_stop` was seen.
        stopped: bool,
        /// An `error` event was seen: the message did not end well, whatever follows.
        failed: bool,
        tokens: Tokens,
    },
    Responses {
        /// The usage of the final `response.*` event, once one carried it.
        usage: Option<Tokens>,
    },
    Chat {
        /// `data: [DONE]` was seen.
        done: bool,
        /// The last usage a chunk carried (only the final chunk does, when the client asked for
        /// `stream_options.include_usage`).
        usage: Option<Tokens>,
    },
}

impl UsageReader {
    /// A reader for a response of `api`. `event_stream`: the response's content type is
    /// text/event-stream (else the body is one JSON document).
    pub fn new(api: Api, event_stream: bool) -> Self {
        let tally = match api {
            Api::AnthropicMessages => Tally::Anthropic {
                started: false,
                stopped: false,
                failed: false,
                tokens: Tokens::default(),
            },
            Api::OpenAiResponses => Tally::Responses { usage: None },
            Api::OpenAiChat => Tally::Chat {
                done: false,
                usage: None,
            },
            Api::Other => {
                return Self {
                    api,
                    body: Body::Ignored,
                };
            }
        };
        let body = if event_stream {
            Body::Stream {
                decoder: SseDecoder::default(),
                tally,
            }
        } else {
            Body::Document(JsonDoc::default())
        };
        Self { api, body }
    }

    /// The API this reader reads.
    pub fn api(&self) -> Api {
        self.api
    }

    /// Reads the next chunk of the body. Chunks may split it anywhere.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.body {
            Body::Stream { decoder, tally } => decoder.feed(chunk, &mut |data| tally.event(data)),
            Body::Document(doc) => match doc.feed(chunk) {
                Progress::More => {}
                Progress::Closed(object) => {
                    self.body = Body::Read(read_document(self.api, &object))
                }
                Progress::Abandoned => self.body = Body::Read(None),
            },
            Body::Read(_) | Body::Ignored => {}
        }
    }

    /// Whether the response has reported its end with a usage: what [`finish`](Self::finish)
    /// would return is `Some` (unless a stream then reports an error).
    pub fn complete(&self) -> bool {
        match &self.body {
            Body::Stream { tally, .. } => tally.usage().is_some(),
            Body::Read(usage) => usage.is_some(),
            Body::Document(_) | Body::Ignored => false,
        }
    }

    /// At the body's end: the usage when the response reported a complete one, else `None`.
    /// A stream's unterminated last event is not counted: the stream was cut inside it.
    pub fn finish(self) -> Option<Tokens> {
        match self.body {
            Body::Stream { tally, .. } => tally.usage(),
            Body::Read(usage) => usage,
            // The scan saw no close; parsing decides (an unfinished object fails to parse).
            Body::Document(doc) => read_document(self.api, &doc.into_kept()),
            Body::Ignored => None,
        }
    }
}

impl Tally {
    /// One event's data. Data that is not the JSON this API sends is skipped.
    fn event(&mut self, data: &[u8]) {
        match self {
            Tally::Anthropic {
                started,
                stopped,
                failed,
                tokens,
            } => {
                let Ok(event) = serde_json::from_slice::<AnthropicEvent>(data) else {
                    return;
                };
                match event.kind.as_deref() {
                    Some("message_start") => {
                        *started = true;
                        *tokens = event
                            .message
                            .and_then(|message| message.usage)
                            .map(|usage| usage.tokens())
                            .unwrap_or_default();
                    }
                    Some("message_delta") => {
                        if let Some(usage) = event.usage {
                            usage.update(tokens);
                        }
                    }
                    Some("message_stop") => *stopped = true,
                    Some("error") => *failed = true,
                    _ => {}
                }
            }
            Tally::Responses { usage } => {
                let Ok(event) = serde_json::from_slice::<ResponsesEvent>(data) else {
                    return;
                };
                let last = matches!(
                    event.kind.as_deref(),
                    Some("response.completed" | "response.failed" | "response.incomplete")
                );
                // A final event with a null usage ends the response without one: unknown.
                if let (true, Some(reported)) = (last, event.response.and_then(|r| r.usage)) {
                    *usage = Some(reported.tokens());
                }
            }
            Tally::Chat { done, usage } => {
                if data.trim_ascii() == b"[DONE]" {
                    *done = true;
                    return;
                }
                let Ok(chunk) = serde_json::from_slice::<ChatBody>(data) else {
                    return;
                };
                if let Some(reported) = chunk.usage {
                    *usage = Some(reported.tokens());
                }
            }
        }
    }

    /// The usage, once the stream has said it is complete.
    fn usage(&self) -> Option<Tokens> {
        match self {
            Tally::Anthropic {
                started: true,
                stopped: true,
                failed: false,
                tokens,
            } => Some(*tokens),
            Tally::Anthropic { .. } => None,
            Tally::Responses { usage } => *usage,
            Tally::Chat { done: true, usage } => *usage,
            Tally::Chat { done: false, .. } => None,
        }
    }
}

/// The usage in a whole JSON body of `api`, when it is that API's successful response.
fn read_document(api: Api, object: &[u8]) -> Option<Tokens> {
    match api {
        Api::AnthropicMessages => {
            let message = serde_json::from_slice::<AnthropicMessage>(object).ok()?;
            (message.kind.as_deref() == Some("message")).then(|| {
                message
                    .usage
                    .map(|usage| usage.tokens())
                    .unwrap_or_default()
            })
        }
        Api::OpenAiResponses => {
            let response = serde_json::from_slice::<ResponsesResponse>(object).ok()?;
            if response.object.as_deref() != Some("response") {
                return None;
            }
            response.usage.map(|usage| usage.tokens())
        }
        Api::OpenAiChat => {
            let completion = serde_json::from_slice::<ChatBody>(object).ok()?;
            if completion.object.as_deref() != Some("chat.completion") {
                return None;
            }
            completion.usage.map(|usage| usage.tokens())
        }
        Api::Other => None,
    }
}

#[cfg(test)]
mod tests;

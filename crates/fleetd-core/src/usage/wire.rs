//! The parts of the three APIs' bodies that carry usage, as serde reads them. Every other field
//! is skipped unread, so a large event costs one scan and no allocation for its content. A token
//! count that is missing or null reads as `None`; what that means (zero, or "unchanged") is the
//! caller's rule.

use serde::Deserialize;

use super::Tokens;

/// Anthropic's `usage` object, in a message, a `message_start`'s message or a `message_delta`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct AnthropicUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl AnthropicUsage {
    /// The counts, a missing one as zero (a `message_start` or a whole message).
    pub(super) fn tokens(&self) -> Tokens {
        let mut tokens = Tokens::default();
        self.update(&mut tokens);
        tokens
    }

    /// Replaces each count this usage reports. A `message_delta`'s counts are cumulative and
    /// optional (null when not reported), so an absent one keeps the earlier value.
    pub(super) fn update(&self, tokens: &mut Tokens) {
        let fields = [
            (self.input_tokens, &mut tokens.input),
            (self.output_tokens, &mut tokens.output),
            (self.cache_read_input_tokens, &mut tokens.cache_read),
            (self.cache_creation_input_tokens, &mut tokens.cache_write),
        ];
        for (reported, count) in fields {
            if let Some(reported) = reported {
                *count = reported;
            }
        }
    }
}

/// A Messages API stream event's data.
#[derive(Debug, Deserialize)]
pub(super) struct AnthropicEvent {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    /// A `message_start`'s message.
    pub(super) message: Option<AnthropicMessage>,
    /// A `message_delta`'s usage.
    pub(super) usage: Option<AnthropicUsage>,
}

/// A Messages API message: the whole non-streaming body, or a `message_start`'s message.
#[derive(Debug, Deserialize)]
pub(super) struct AnthropicMessage {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) usage: Option<AnthropicUsage>,
}

/// OpenAI's `cached_tokens` detail, of the Responses and the Chat Completions usage alike.
#[derive(Debug, Deserialize)]
struct Cached {
    cached_tokens: Option<u64>,
}

/// Input counted with its cached part, as OpenAI reports it: the uncached part is the rest.
fn split_cached(input: Option<u64>, cached: Option<&Cached>, output: Option<u64>) -> Tokens {
    let cached = cached.and_then(|c| c.cached_tokens).unwrap_or(0);
    Tokens {
        input: input.unwrap_or(0).saturating_sub(cached),
        output: output.unwrap_or(0),
        cache_read: cached,
        cache_write: 0,
    }
}

/// The Responses API's `usage` object.
#[derive(Debug, Deserialize)]
pub(super) struct ResponsesUsage {
    input_tokens: Option<u64>,
    input_tokens_details: Option<Cached>,
    output_tokens: Option<u64>,
}

impl ResponsesUsage {
    /// The counts; `input_tokens` includes the cached ones.
    pub(super) fn tokens(&self) -> Tokens {
        split_cached(
            self.input_tokens,
            self.input_tokens_details.as_ref(),
            self.output_tokens,
        )
    }
}

/// A Responses API stream event's data.
#[derive(Debug, Deserialize)]
pub(super) struct ResponsesEvent {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) response: Option<ResponsesResponse>,
}

/// A Responses API response object: the whole non-streaming body, or a stream event's response.
#[derive(Debug, Deserialize)]
pub(super) struct ResponsesResponse {
    pub(super) object: Option<String>,
    pub(super) usage: Option<ResponsesUsage>,
}

/// The Chat Completions API's `usage` object.
#[derive(Debug, Deserialize)]
pub(super) struct ChatUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<Cached>,
}

impl ChatUsage {
    /// The counts; `prompt_tokens` includes the cached ones.
    pub(super) fn tokens(&self) -> Tokens {
        split_cached(
            self.prompt_tokens,
            self.prompt_tokens_details.as_ref(),
            self.completion_tokens,
        )
    }
}

/// A Chat Completions body: a stream's chunk, or the whole non-streaming completion.
#[derive(Debug, Deserialize)]
pub(super) struct ChatBody {
    pub(super) object: Option<String>,
    pub(super) usage: Option<ChatUsage>,
}

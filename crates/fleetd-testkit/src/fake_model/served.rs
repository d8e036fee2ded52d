//! What the fake served, for a test to compare with what a gateway in front of it counted: the
//! token usage an answer reports (made up, but varied per request and with cache reads and
//! writes, so a miscount shows), read back from the very events or body handed to the client, and
//! the log line each answer ends with.
//!
//! Usage is normalised across the APIs: `input` is the uncached input (the Messages API's
//! `input_tokens`; the OpenAI APIs' input or prompt tokens less their `cached_tokens`), `output`
//! the output tokens (the Messages API's final, cumulative `message_delta` count), `cacheRead` the
//! input read from the prompt cache (`cache_read_input_tokens`; `cached_tokens`) and `cacheWrite`
//! the input written to it (`cache_creation_input_tokens`; OpenAI reports none).
//!
//! The line: `{"t","n","served":true,"key","api","usage":{"input","output","cacheRead",
//! "cacheWrite"}}` once a non-streamed answer is built or a stream's last event was taken by the
//! connection and the stream ended; `{"t","n","served":false,"cut":true,"key","api","usage"}` when
//! the client went away first (then `usage` is what the events handed over before the cut
//! carried). `usage` is `null` when the answer reported none (a Chat Completions stream without
//! `stream_options.include_usage`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Shared, unix_ms};

/// Token usage, normalised across the APIs (see the module's documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Uncached input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
}

impl Usage {
    /// The usage the answer to request `n` with `prompt` reports: deterministic, different from
    /// one request to the next, every part non-zero and each in a range of its own (uncached input
    /// 10–59, cache writes 200–699, cache reads 1000–5999, output 2–61), small enough that no
    /// client thinks its context is full. An OpenAI answer reports no cache writes.
    pub fn planned(n: u64, prompt: &str) -> Self {
        let p = u64::try_from(prompt.len()).unwrap_or(u64::MAX) % 10_000;
        Self {
            input: 10 + (3 * n + p) % 50,
            output: 2 + (13 * n + p) % 60,
            cache_read: 1000 + (97 * n + 2 * p) % 5000,
            cache_write: 200 + (11 * n + p) % 500,
        }
    }

    /// The sum of both.
    #[must_use]
    pub fn plus(self, other: Self) -> Self {
        Self {
            input: self.input + other.input,
            output: self.output + other.output,
            cache_read: self.cache_read + other.cache_read,
            cache_write: self.cache_write + other.cache_write,
        }
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Folds the usage one event (or one whole body) reports into `usage`: the Messages API's
/// `message_start` (and a non-streamed `message`) sets every part, its `message_delta` the
/// cumulative output (and any other count it carries); a Responses `response.completed` (or a
/// non-streamed `response`) and a Chat Completions chunk or completion with `usage` set every part.
pub fn observe(usage: &mut Option<Usage>, data: &Value) {
    let anthropic = |u: &Value| Usage {
        input: n(&u["input_tokens"]),
        output: n(&u["output_tokens"]),
        cache_read: n(&u["cache_read_input_tokens"]),
        cache_write: n(&u["cache_creation_input_tokens"]),
    };
    match data["type"].as_str() {
        Some("message_start") => *usage = Some(anthropic(&data["message"]["usage"])),
        Some("message") => *usage = Some(anthropic(&data["usage"])),
        Some("message_delta") => {
            let mut now = usage.unwrap_or_default();
            let u = &data["usage"];
            now.output = n(&u["output_tokens"]);
            for (key, part) in [
                ("input_tokens", &mut now.input),
                ("cache_read_input_tokens", &mut now.cache_read),
                ("cache_creation_input_tokens", &mut now.cache_write),
            ] {
                if let Some(v) = u[key].as_u64() {
                    *part = v;
                }
            }
            *usage = Some(now);
        }
        Some("response.completed") => observe_openai(usage, &data["response"]["usage"]),
        _ if data["object"] == "response" => observe_openai(usage, &data["usage"]),
        _ if data["object"]
            .as_str()
            .is_some_and(|o| o.starts_with("chat.completion")) =>
        {
            let u = &data["usage"];
            if u.is_object() {
                let cached = n(&u["prompt_tokens_details"]["cached_tokens"]);
                *usage = Some(Usage {
                    input: n(&u["prompt_tokens"]).saturating_sub(cached),
                    output: n(&u["completion_tokens"]),
                    cache_read: cached,
                    cache_write: 0,
                });
            }
        }
        _ => {}
    }
}

fn observe_openai(usage: &mut Option<Usage>, u: &Value) {
    if !u.is_object() {
        return;
    }
    let cached = n(&u["input_tokens_details"]["cached_tokens"]);
    *usage = Some(Usage {
        input: n(&u["input_tokens"]).saturating_sub(cached),
        output: n(&u["output_tokens"]),
        cache_read: cached,
        cache_write: 0,
    });
}

/// One answer on its way out: what it reported so far, logged as served when it is complete and
/// as cut when it is dropped before.
#[derive(Debug)]
pub(super) struct Ledger {
    shared: Arc<Shared>,
    n: u64,
    key: Option<String>,
    api: &'static str,
    usage: Option<Usage>,
    done: bool,
}

impl Ledger {
    pub(super) fn new(shared: Arc<Shared>, n: u64, key: Option<String>, api: &'static str) -> Self {
        Self {
            shared,
            n,
            key,
            api,
            usage: None,
            done: false,
        }
    }

    /// Notes what an event (or a whole body) handed to the client reported.
    pub(super) fn observe(&mut self, data: &Value) {
        observe(&mut self.usage, data);
    }

    /// The answer is complete: logs it served.
    pub(super) fn served(mut self) {
        self.done = true;
        self.record(true);
    }

    fn record(&self, served: bool) {
        let mut line = json!({
            "t": unix_ms(),
            "n": self.n,
            "served": served,
            "key": self.key,
            "api": self.api,
            "usage": self.usage,
        });
        if !served {
            line["cut"] = json!(true);
        }
        self.shared.record(&line);
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        if !self.done {
            self.record(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_usage_varies_and_its_parts_differ() {
        let a = Usage::planned(1, "@text hi");
        let b = Usage::planned(2, "@text hi");
        assert_ne!(a, b);
        for u in [a, b] {
            assert!(u.input > 0 && u.output > 1);
            assert!(u.input < u.cache_write && u.cache_write < u.cache_read);
        }
    }

    #[test]
    fn a_message_delta_sets_the_final_output() {
        let mut usage = None;
        observe(
            &mut usage,
            &json!({"type": "message_start", "message": {"usage": {"input_tokens": 5,
                "output_tokens": 1, "cache_read_input_tokens": 7, "cache_creation_input_tokens": 6}}}),
        );
        observe(
            &mut usage,
            &json!({"type": "message_delta", "usage": {"output_tokens": 9}}),
        );
        assert_eq!(
            usage,
            Some(Usage {
                input: 5,
                output: 9,
                cache_read: 7,
                cache_write: 6
            })
        );
    }
}

//! Usage reader tests: the three APIs' real response shapes, whole, streamed, cut, split at
//! every byte and with every line ending; the memory bound; and property tests that no chunking
//! changes what is read and no input panics.

use proptest::prelude::*;

use super::sse::SseDecoder;
use super::*;

/// An Anthropic Messages stream, as the API sends it (text with multi-byte characters, so byte
/// splits land inside them).
const ANTHROPIC_STREAM: &str = r#"event: message_start
data: {"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":472,"cache_creation_input_tokens":1024,"cache_read_input_tokens":2048,"output_tokens":2}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Héllo 🌍, {\"type\":\"message_stop\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}

"#;

const ANTHROPIC_TOKENS: Tokens = Tokens {
    input: 472,
    output: 15,
    cache_read: 2048,
    cache_write: 1024,
};

/// An OpenAI Responses stream.
const RESPONSES_STREAM: &str = r#"event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","output_index":0,"content_index":0,"delta":"Héllo 🌍"}

event: response.completed
data: {"type":"response.completed","sequence_number":8,"response":{"id":"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654","object":"response","created_at":1741290958,"status":"completed","model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Héllo 🌍","annotations":[]}]}],"usage":{"input_tokens":1337,"input_tokens_details":{"cached_tokens":1024},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1348}}}

"#;

const RESPONSES_TOKENS: Tokens = Tokens {
    input: 313,
    output: 11,
    cache_read: 1024,
    cache_write: 0,
};

/// An OpenAI Chat Completions stream with `stream_options.include_usage`.
const CHAT_STREAM: &str = r#"data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Héllo 🌍"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]

"#;

const CHAT_TOKENS: Tokens = Tokens {
    input: 86,
    output: 300,
    cache_read: 1920,
    cache_write: 0,
};

/// Each stream, its API and the usage it reports.
fn streams() -> [(Api, &'static str, Tokens); 3] {
    [
        (Api::AnthropicMessages, ANTHROPIC_STREAM, ANTHROPIC_TOKENS),
        (Api::OpenAiResponses, RESPONSES_STREAM, RESPONSES_TOKENS),
        (Api::OpenAiChat, CHAT_STREAM, CHAT_TOKENS),
    ]
}

/// Reads `chunks` of a body in order.
fn read<'a>(
    api: Api,
    event_stream: bool,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Tokens> {
    let mut reader = UsageReader::new(api, event_stream);
    for chunk in chunks {
        reader.feed(chunk);
    }
    reader.finish()
}

fn read_whole(api: Api, event_stream: bool, body: &str) -> Option<Tokens> {
    read(api, event_stream, [body.as_bytes()])
}

fn read_bytewise(api: Api, event_stream: bool, body: &str) -> Option<Tokens> {
    read(api, event_stream, body.as_bytes().chunks(1))
}

/// `body` with its LF line endings replaced by `ending`.
fn with_endings(body: &str, ending: &str) -> String {
    body.replace('\n', ending)
}

/// The data of each event `decoder` completes from `chunks`.
fn events(chunks: &[&[u8]]) -> Vec<String> {
    let mut decoder = SseDecoder::default();
    let mut out = Vec::new();
    for chunk in chunks {
        decoder.feed(chunk, &mut |data| {
            out.push(String::from_utf8_lossy(data).into_owned());
        });
    }
    out
}

/// Bytes the reader holds.
fn buffered(reader: &UsageReader) -> usize {
    match &reader.body {
        Body::Stream { decoder, .. } => decoder.buffered(),
        Body::Document(doc) => doc.buffered(),
        Body::Read(_) | Body::Ignored => 0,
    }
}

#[test]
fn each_stream_reads_its_usage() {
    for (api, stream, tokens) in streams() {
        assert_eq!(read_whole(api, true, stream), Some(tokens), "{api:?}");
    }
}

#[test]
fn a_stream_split_byte_by_byte_reads_the_same() {
    for (api, stream, tokens) in streams() {
        assert_eq!(read_bytewise(api, true, stream), Some(tokens), "{api:?}");
    }
}

#[test]
fn crlf_and_cr_line_endings_read_the_same_whole_and_byte_by_byte() {
    for (api, stream, tokens) in streams() {
        for ending in ["\r\n", "\r"] {
            let stream = with_endings(stream, ending);
            assert_eq!(
                read_whole(api, true, &stream),
                Some(tokens),
                "{api:?} {ending:?}"
            );
            assert_eq!(
                read_bytewise(api, true, &stream),
                Some(tokens),
                "{api:?} {ending:?}"
            );
        }
    }
}

#[test]
fn a_crlf_split_between_its_halves_is_one_line_end() {
    // Were the LF taken as a second line end, the first event would end after "a".
    assert_eq!(
        events(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]),
        ["a\nb"]
    );
}

#[test]
fn sse_fields_follow_the_format() {
    let stream = b": a comment\nevent: ignored\nid: 7\ndata:no space\ndata:  two spaces\ndata\n\n";
    assert_eq!(events(&[stream]), ["no space\n two spaces\n"]);
    // No data lines, no event; an unterminated last event is not dispatched.
    assert_eq!(events(&[b"event: ping\n\ndata: cut"]), Vec::<String>::new());
    // A field name must match exactly.
    assert_eq!(events(&[b"Data: x\ndata : y\n\n"]), Vec::<String>::new());
}

#[test]
fn message_delta_replaces_each_count_it_reports() {
    let stream = ANTHROPIC_STREAM.replace(
        r#""usage":{"output_tokens":15}"#,
        r#""usage":{"input_tokens":500,"cache_creation_input_tokens":null,"cache_read_input_tokens":3000,"output_tokens":40,"server_tool_use":{"web_search_requests":1}}"#,
    );
    assert_ne!(stream, ANTHROPIC_STREAM);
    let expected = Tokens {
        input: 500,
        output: 40,
        cache_read: 3000,
        // null in a delta is "not reported": message_start's count stands.
        cache_write: 1024,
    };
    assert_eq!(
        read_whole(Api::AnthropicMessages, true, &stream),
        Some(expected)
    );
}

#[test]
fn missing_or_null_counts_in_message_start_are_zero() {
    let stream = ANTHROPIC_STREAM.replace(
        r#""usage":{"input_tokens":472,"cache_creation_input_tokens":1024,"cache_read_input_tokens":2048,"output_tokens":2}"#,
        r#""usage":{"input_tokens":9,"cache_creation_input_tokens":null,"output_tokens":1}"#,
    );
    let expected = Tokens {
        input: 9,
        output: 15,
        ..Tokens::default()
    };
    assert_eq!(
        read_whole(Api::AnthropicMessages, true, &stream),
        Some(expected)
    );
}

#[test]
fn complete_turns_true_at_the_end_event() {
    for (api, stream, tokens) in streams() {
        let (head, tail) = stream.split_at(stream.len() - 40);
        let mut reader = UsageReader::new(api, true);
        reader.feed(head.as_bytes());
        assert!(!reader.complete(), "{api:?} before its last event");
        reader.feed(tail.as_bytes());
        assert!(reader.complete(), "{api:?}");
        assert_eq!(reader.api(), api);
        assert_eq!(reader.finish(), Some(tokens));
    }
}

#[test]
fn a_cut_stream_reads_as_unknown() {
    for (api, stream, _) in streams() {
        // Cut before the last event, and inside it (its closing empty line never came).
        let last_event = stream.trim_end().rfind("\n\n").expect("several events");
        let cuts = [&stream[..last_event], stream.trim_end()];
        for cut in cuts {
            let mut reader = UsageReader::new(api, true);
            reader.feed(cut.as_bytes());
            assert!(!reader.complete(), "{api:?}");
            assert_eq!(reader.finish(), None, "{api:?} cut to {} bytes", cut.len());
        }
    }
}

#[test]
fn an_anthropic_stream_needs_its_start_and_no_error() {
    let start_end = ANTHROPIC_STREAM.find("\n\n").expect("first event") + 2;
    let no_start = &ANTHROPIC_STREAM[start_end..];
    assert_eq!(read_whole(Api::AnthropicMessages, true, no_start), None);

    let error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let (head, tail) = ANTHROPIC_STREAM.split_at(start_end);
    let errored = format!("{head}{error}{tail}");
    assert_eq!(read_whole(Api::AnthropicMessages, true, &errored), None);
    let mut reader = UsageReader::new(Api::AnthropicMessages, true);
    reader.feed(format!("{head}{error}").as_bytes());
    assert!(!reader.complete());
}

#[test]
fn event_names_do_not_decide_the_data_does() {
    // An event named message_stop whose data is something else ends nothing.
    let stream = ANTHROPIC_STREAM.replace(
        "data: {\"type\":\"message_stop\"}",
        "data: {\"type\":\"ping\"}",
    );
    assert_eq!(read_whole(Api::AnthropicMessages, true, &stream), None);
}

#[test]
fn responses_failed_or_incomplete_count_when_they_carry_usage() {
    for end in ["response.failed", "response.incomplete"] {
        let stream = RESPONSES_STREAM.replace("response.completed", end);
        assert_eq!(
            read_whole(Api::OpenAiResponses, true, &stream),
            Some(RESPONSES_TOKENS),
            "{end}"
        );
        let no_usage = format!(
            "event: {end}\ndata: {{\"type\":\"{end}\",\"sequence_number\":3,\"response\":{{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"failed\",\"error\":{{\"code\":\"server_error\",\"message\":\"boom\"}},\"usage\":null}}}}\n\n"
        );
        assert_eq!(
            read_whole(Api::OpenAiResponses, true, &no_usage),
            None,
            "{end}"
        );
    }
    // Usage on an event that is not the last (response.created carries none, but trust the type).
    let early = RESPONSES_STREAM.replace(
        "\"usage\":null",
        "\"usage\":{\"input_tokens\":5,\"output_tokens\":0}",
    );
    let (before_end, _) = early.split_at(early.find("event: response.completed").expect("end"));
    assert_eq!(read_whole(Api::OpenAiResponses, true, before_end), None);
}

#[test]
fn chat_needs_done_and_a_usage() {
    let without_usage: String = CHAT_STREAM
        .split("\n\n")
        .filter(|event| !event.contains("\"prompt_tokens\""))
        .map(|event| format!("{event}\n\n"))
        .collect();
    assert!(without_usage.contains("[DONE]"));
    assert_eq!(read_whole(Api::OpenAiChat, true, &without_usage), None);

    let without_done = CHAT_STREAM.replace("data: [DONE]\n\n", "");
    let mut reader = UsageReader::new(Api::OpenAiChat, true);
    reader.feed(without_done.as_bytes());
    assert!(!reader.complete());
    assert_eq!(reader.finish(), None);
}

/// A non-streaming Messages response (its text has brackets and quotes that end the object
/// early for a scan that misreads escapes).
const ANTHROPIC_JSON: &str = r#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[{"type":"text","text":"Hi \"}]} {\"usage\":[ \\"}],"model":"claude-sonnet-4-5-20250929","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":503}}"#;

/// A non-streaming Responses response.
const RESPONSES_JSON: &str = r#"{"id":"resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41","object":"response","created_at":1741476777,"status":"completed","model":"gpt-4o-2024-08-06","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":128},"output_tokens":52,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":380}}"#;

/// A non-streaming Chat Completions response.
const CHAT_JSON: &str = r#"{"id":"chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG","object":"chat.completion","created":1741570283,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":1117,"completion_tokens":46,"total_tokens":1163,"prompt_tokens_details":{"cached_tokens":1024,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_fc9f1d7035"}"#;

fn documents() -> [(Api, &'static str, Tokens); 3] {
    [
        (
            Api::AnthropicMessages,
            ANTHROPIC_JSON,
            Tokens {
                input: 2095,
                output: 503,
                ..Tokens::default()
            },
        ),
        (
            Api::OpenAiResponses,
            RESPONSES_JSON,
            Tokens {
                input: 200,
                output: 52,
                cache_read: 128,
                cache_write: 0,
            },
        ),
        (
            Api::OpenAiChat,
            CHAT_JSON,
            Tokens {
                input: 93,
                output: 46,
                cache_read: 1024,
                cache_write: 0,
            },
        ),
    ]
}

#[test]
fn each_json_body_reads_its_usage_whole_or_byte_by_byte() {
    for (api, body, tokens) in documents() {
        assert_eq!(read_whole(api, false, body), Some(tokens), "{api:?}");
        assert_eq!(read_bytewise(api, false, body), Some(tokens), "{api:?}");
        let padded = format!("\n  {body}\n");
        assert_eq!(read_bytewise(api, false, &padded), Some(tokens), "{api:?}");
    }
}

#[test]
fn a_json_body_is_complete_when_its_object_closes() {
    for (api, body, tokens) in documents() {
        let mut reader = UsageReader::new(api, false);
        let (head, tail) = body.split_at(body.len() - 1);
        reader.feed(head.as_bytes());
        assert!(!reader.complete(), "{api:?}");
        reader.feed(tail.as_bytes());
        assert!(reader.complete(), "{api:?}");
        reader.feed(b"\n");
        assert_eq!(reader.finish(), Some(tokens), "{api:?}");
    }
}

#[test]
fn a_json_body_of_another_kind_or_cut_is_unknown() {
    for (api, body, _) in documents() {
        assert_eq!(
            read_whole(api, false, &body[..body.len() - 1]),
            None,
            "{api:?} cut"
        );
        assert_eq!(read_whole(api, false, ""), None, "{api:?} empty");
    }
    let error = r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    assert_eq!(read_whole(Api::AnthropicMessages, false, error), None);
    let openai_error = r#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    assert_eq!(read_whole(Api::OpenAiResponses, false, openai_error), None);
    assert_eq!(read_whole(Api::OpenAiChat, false, openai_error), None);
    assert_eq!(read_whole(Api::OpenAiChat, false, "[1, 2]"), None);
    // The right shape for the wrong API.
    assert_eq!(read_whole(Api::OpenAiChat, false, RESPONSES_JSON), None);
    // A stream read as a document, and a document read as a stream.
    assert_eq!(
        read_whole(Api::AnthropicMessages, false, ANTHROPIC_STREAM),
        None
    );
    assert_eq!(
        read_whole(Api::AnthropicMessages, true, ANTHROPIC_JSON),
        None
    );
}

#[test]
fn other_apis_read_nothing() {
    for event_stream in [true, false] {
        for (_, body, _) in streams().into_iter().chain(documents()) {
            let mut reader = UsageReader::new(Api::Other, event_stream);
            reader.feed(body.as_bytes());
            assert!(!reader.complete());
            assert_eq!(buffered(&reader), 0);
            assert_eq!(reader.finish(), None);
        }
    }
}

#[test]
fn api_of_reads_method_and_path() {
    let cases = [
        (true, "/v1/messages", Api::AnthropicMessages),
        (true, "/v1/messages?beta=true", Api::AnthropicMessages),
        (true, "/anthropic/v1/messages", Api::AnthropicMessages),
        (true, "/v1/messages/count_tokens", Api::Other),
        (true, "/v1/messages/batches", Api::Other),
        (true, "/v1/responses", Api::OpenAiResponses),
        (true, "/v1/responses?stream=true", Api::OpenAiResponses),
        (true, "/v1/responses/resp_123/cancel", Api::Other),
        (true, "/v1/chat/completions", Api::OpenAiChat),
        (
            true,
            "/openai/deployments/x/chat/completions?api-version=1",
            Api::OpenAiChat,
        ),
        (true, "/v1/completions", Api::Other),
        (true, "/v1/models", Api::Other),
        (true, "", Api::Other),
        (true, "?/messages", Api::Other),
        (false, "/v1/messages", Api::Other),
        (false, "/v1/responses", Api::Other),
        (false, "/v1/chat/completions", Api::Other),
    ];
    for (is_post, path, api) in cases {
        assert_eq!(api_of(is_post, path), api, "{is_post} {path}");
    }
}

#[test]
fn tokens_sum_and_add_saturating() {
    let mut tokens = ANTHROPIC_TOKENS;
    assert_eq!(tokens.total(), 472 + 15 + 2048 + 1024);
    tokens.add(&CHAT_TOKENS);
    assert_eq!(
        tokens,
        Tokens {
            input: 558,
            output: 315,
            cache_read: 3968,
            cache_write: 1024
        }
    );
    let full = Tokens {
        input: u64::MAX,
        output: 1,
        ..Tokens::default()
    };
    assert_eq!(full.total(), u64::MAX);
    tokens.add(&full);
    assert_eq!(tokens.input, u64::MAX);
    let json = serde_json::to_string(&ANTHROPIC_TOKENS).expect("serializes");
    assert_eq!(
        json,
        r#"{"input":472,"output":15,"cacheRead":2048,"cacheWrite":1024}"#
    );
    assert_eq!(
        serde_json::from_str::<Tokens>(&json).expect("reads back"),
        ANTHROPIC_TOKENS
    );
}

/// A body of `size` bytes of filler text inside a JSON string.
fn big_text(size: usize) -> String {
    "é".repeat(size / 2)
}

#[test]
fn an_oversized_line_is_skipped_and_memory_stays_bounded() {
    let huge = format!(
        "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n",
        big_text(MAX_BUFFERED + 1024)
    );
    let at = ANTHROPIC_STREAM
        .find("event: content_block_stop")
        .expect("event");
    let (head, tail) = ANTHROPIC_STREAM.split_at(at);
    let mut reader = UsageReader::new(Api::AnthropicMessages, true);
    reader.feed(head.as_bytes());
    for chunk in huge.as_bytes().chunks(64 * 1024) {
        reader.feed(chunk);
        assert!(buffered(&reader) <= 2 * MAX_BUFFERED);
    }
    assert!(
        buffered(&reader) < 1024 * 1024,
        "the big buffers were given back"
    );
    reader.feed(tail.as_bytes());
    assert_eq!(reader.finish(), Some(ANTHROPIC_TOKENS));
}

#[test]
fn an_oversized_event_of_short_lines_is_skipped() {
    let line = format!("data: {}\n", "x".repeat(1024 * 1024));
    let mut decoder = SseDecoder::default();
    let mut seen = Vec::new();
    for _ in 0..9 {
        decoder.feed(line.as_bytes(), &mut |data| seen.push(data.len()));
        assert!(decoder.buffered() <= 2 * MAX_BUFFERED);
    }
    decoder.feed(b"\ndata: next\n\n", &mut |data| seen.push(data.len()));
    assert_eq!(seen, [4]);
}

#[test]
fn an_oversized_final_event_leaves_the_usage_unknown() {
    let stream = RESPONSES_STREAM.replace(
        r#""text":"Héllo 🌍""#,
        &format!(r#""text":"{}""#, big_text(MAX_BUFFERED)),
    );
    assert_eq!(
        read(
            Api::OpenAiResponses,
            true,
            stream.as_bytes().chunks(1 << 16)
        ),
        None
    );
}

#[test]
fn an_oversized_json_body_is_given_up() {
    let body = CHAT_JSON.replace(
        r#""content":"Hi""#,
        &format!(r#""content":"{}""#, big_text(MAX_BUFFERED)),
    );
    let mut reader = UsageReader::new(Api::OpenAiChat, false);
    for chunk in body.as_bytes().chunks(1 << 16) {
        reader.feed(chunk);
        assert!(buffered(&reader) <= MAX_BUFFERED);
    }
    assert_eq!(reader.finish(), None);
    // Just under the bound still reads.
    let fits = CHAT_JSON.replace(
        r#""content":"Hi""#,
        &format!(r#""content":"{}""#, big_text(MAX_BUFFERED - 2048)),
    );
    assert!(read(Api::OpenAiChat, false, fits.as_bytes().chunks(1 << 16)).is_some());
}

/// Splits `body` into pieces of the given sizes in turn (each at least one byte).
fn chunked<'a>(body: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = body;
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (piece, tail) = rest.split_at((*size).clamp(1, rest.len()));
        out.push(piece);
        rest = tail;
    }
    out
}

proptest! {
    #[test]
    fn any_chunking_of_a_stream_reads_the_same(
        which in 0..3_usize,
        ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
        sizes in prop::collection::vec(1..300_usize, 1..12),
    ) {
        let (api, stream, tokens) = streams()[which];
        let stream = with_endings(stream, ending);
        prop_assert_eq!(read(api, true, chunked(stream.as_bytes(), &sizes)), Some(tokens));
    }

    #[test]
    fn any_chunking_of_a_json_body_reads_the_same(
        which in 0..3_usize,
        sizes in prop::collection::vec(1..100_usize, 1..12),
    ) {
        let (api, body, tokens) = documents()[which];
        prop_assert_eq!(read(api, false, chunked(body.as_bytes(), &sizes)), Some(tokens));
    }

    #[test]
    fn no_input_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        sizes in prop::collection::vec(1..64_usize, 1..8),
    ) {
        for api in [Api::AnthropicMessages, Api::OpenAiResponses, Api::OpenAiChat, Api::Other] {
            for event_stream in [true, false] {
                let _ = read(api, event_stream, chunked(&bytes, &sizes));
            }
        }
    }

    #[test]
    fn a_stream_cut_anywhere_before_its_end_is_unknown(which in 0..3_usize, cut in 0.0..1.0_f64) {
        let (api, stream, _) = streams()[which];
        // Anywhere before the last event's closing empty line.
        let end = stream.len() - 1;
        let at = ((end as f64) * cut) as usize;
        prop_assert_eq!(read(api, true, [&stream.as_bytes()[..at]]), None);
    }
}

//! fake-model's `served` lines, what a test compares a model gateway's token counts with: an
//! answer handed over whole logs exactly the usage its events carried (read here as a client
//! reads them), a stream the client walks away from logs a cut instead, Chat Completions streams
//! end with the usage chunk and `[DONE]`, and `--stream-gap-ms` slows every stream down.

use std::time::Duration;

use fleetd_testkit::fake_model::FakeModel;
use fleetd_testkit::fake_model::served::Usage;
use fleetd_testkit::http::events::parse_block;
use fleetd_testkit::http::{self, Conn, Endpoint, Request};
use fleetd_testkit::wait_until;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

/// `POST path` with `body`, presenting `key` as both APIs do; the whole answer.
fn post(fake: &FakeModel, path: &str, key: &str, body: &Value) -> http::Response {
    let bearer = format!("Bearer {key}");
    let header = if path.ends_with("/messages") {
        ("x-api-key", key)
    } else {
        ("authorization", bearer.as_str())
    };
    let response = http::request_with(fake.addr, "POST", path, &[header], Some(&body.to_string()))
        .expect("the fake answers");
    assert_eq!(response.status, 200, "{}", response.body);
    response
}

/// The events of a stream as a client reads them: `(event name, data)`, the data JSON where it
/// is JSON and a string otherwise (`[DONE]`).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter_map(parse_block)
        .map(|(name, _, data)| {
            let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
            (name, data)
        })
        .collect()
}

/// What a client counts from a Messages stream: the input parts of `message_start`, the output
/// of the last `message_delta` (cumulative), and `message_start`'s own output count.
fn anthropic_usage(events: &[(String, Value)]) -> (Usage, u64) {
    let start = &events
        .iter()
        .find(|(name, _)| name == "message_start")
        .expect("a message_start")
        .1["message"]["usage"];
    let delta = &events
        .iter()
        .rfind(|(name, _)| name == "message_delta")
        .expect("a message_delta")
        .1["usage"];
    let usage = Usage {
        input: start["input_tokens"].as_u64().expect("input_tokens"),
        output: delta["output_tokens"].as_u64().expect("output_tokens"),
        cache_read: start["cache_read_input_tokens"].as_u64().expect("read"),
        cache_write: start["cache_creation_input_tokens"]
            .as_u64()
            .expect("write"),
    };
    (
        usage,
        start["output_tokens"].as_u64().expect("start output"),
    )
}

/// The `served` line of request `n`.
fn served_line(fake: &FakeModel, n: u64) -> Value {
    let mut line = None;
    wait_until("the answer's served line", Duration::from_secs(10), || {
        line = fake.served().into_iter().find(|l| l["n"] == n);
        line.is_some()
    });
    line.expect("found")
}

fn usage_of(line: &Value) -> Usage {
    serde_json::from_value(line["usage"].clone()).expect("a usage object")
}

#[test]
fn a_completed_messages_stream_logs_the_usage_its_events_carried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start(dir.path(), "model", "yes");
    let ask = |prompt: &str, key: &str| {
        // A tool offered: an agent's turn, not a side request.
        let body = json!({"model": "claude-x", "stream": true, "max_tokens": 100,
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": prompt}]});
        events(&post(&fake, "/v1/messages", key, &body).body)
    };
    let first = ask("@text hello", "k-one");
    let second = ask("@text a longer prompt than the first", "k-two");
    let third = ask("@text again", "k-one");
    let mut sum = Usage::default();
    for (n, got) in [(1, &first), (2, &second), (3, &third)] {
        assert_eq!(got.last().map(|e| e.0.as_str()), Some("message_stop"));
        let (usage, start_output) = anthropic_usage(got);
        assert!(usage.input > 0 && usage.cache_read > 0 && usage.cache_write > 0);
        assert!(usage.input != usage.cache_read && usage.cache_read != usage.cache_write);
        assert_eq!(start_output, 1, "message_start counts the first token");
        assert!(usage.output > start_output, "message_delta counts them all");
        let line = served_line(&fake, n);
        assert_eq!(line["served"], true, "{line}");
        assert_eq!(line["api"], "anthropic");
        assert_eq!(usage_of(&line), usage, "request {n}");
        if n != 2 {
            sum = sum.plus(usage);
        }
    }
    assert_ne!(anthropic_usage(&first).0, anthropic_usage(&third).0);
    assert_eq!(fake.served_usage("k-one"), sum);
    assert_eq!(
        fake.served_usage("k-two"),
        anthropic_usage(&second).0,
        "a key's own answers only"
    );
    // The request readers see requests only.
    assert_eq!(fake.requests().len(), 3);
    assert_eq!(fake.turns().len(), 3);
    assert_eq!(fake.served().len(), 3);
}

#[test]
fn non_streamed_and_openai_answers_log_what_they_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start(dir.path(), "model", "yes");
    let message = post(
        &fake,
        "/v1/messages",
        "k",
        &json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .json();
    let u = &message["usage"];
    let line = served_line(&fake, 1);
    assert_eq!(line["served"], true);
    assert_eq!(
        usage_of(&line),
        Usage {
            input: u["input_tokens"].as_u64().expect("input"),
            output: u["output_tokens"].as_u64().expect("output"),
            cache_read: u["cache_read_input_tokens"].as_u64().expect("read"),
            cache_write: u["cache_creation_input_tokens"].as_u64().expect("write"),
        }
    );

    let body = json!({"model": "gpt-x", "stream": true, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
    let got = events(&post(&fake, "/v1/responses", "k-oa", &body).body);
    let completed = &got.last().expect("events").1;
    assert_eq!(completed["type"], "response.completed");
    let u = &completed["response"]["usage"];
    let cached = u["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert!(cached > 0);
    let line = served_line(&fake, 2);
    assert_eq!(
        (&line["served"], &line["api"]),
        (&json!(true), &json!("openai"))
    );
    assert_eq!(
        usage_of(&line),
        Usage {
            input: u["input_tokens"].as_u64().expect("input") - cached,
            output: u["output_tokens"].as_u64().expect("output"),
            cache_read: cached,
            cache_write: 0,
        }
    );
    assert_eq!(fake.served_usage("k-oa"), usage_of(&line));
}

#[test]
fn a_stream_the_client_walks_away_from_is_logged_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start_with(dir.path(), "model", "yes", &["--stream-gap-ms", "300"]);
    let body = json!({"model": "claude-x", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": "@text cut me off"}]})
    .to_string();
    let first = http::client::block(async {
        let mut conn = Conn::open(&Endpoint::Tcp(fake.addr)).await?;
        let response = conn
            .send(Request {
                method: "POST",
                path: "/v1/messages",
                headers: &[("x-api-key", "k-cut")],
                body: Some(&body),
            })
            .await?;
        let mut body = response.into_body();
        let frame = body.frame().await.expect("a first frame");
        let data = frame.map_err(std::io::Error::other)?.into_data();
        // Walk away: the body and the connection go.
        drop(body);
        drop(conn);
        std::io::Result::Ok(data.unwrap_or_default())
    })
    .expect("the stream starts");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    let line = served_line(&fake, 1);
    assert_eq!(line["served"], false, "{line}");
    assert_eq!(line["cut"], true);
    assert_eq!(line["key"], "k-cut");
    assert_eq!(fake.served_usage("k-cut"), Usage::default());
}

#[test]
fn a_chat_completions_stream_with_include_usage_ends_with_the_usage_then_done() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start(dir.path(), "model", "yes");
    let body = json!({"model": "gpt-x", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": "@text hello there world"}]});
    let got = events(&post(&fake, "/v1/chat/completions", "k-chat", &body).body);
    let data: Vec<&Value> = got.iter().map(|(_, d)| d).collect();
    assert!(
        got.iter().all(|(name, _)| name.is_empty()),
        "no event names"
    );
    assert_eq!(data.last(), Some(&&json!("[DONE]")));
    let last = data[data.len() - 2];
    assert_eq!(last["choices"], json!([]));
    let u = &last["usage"];
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    let (prompt, completion) = (
        u["prompt_tokens"].as_u64().expect("prompt"),
        u["completion_tokens"].as_u64().expect("completion"),
    );
    assert!(cached > 0 && prompt > cached);
    assert_eq!(u["total_tokens"].as_u64(), Some(prompt + completion));
    let chunks = &data[..data.len() - 2];
    assert!(chunks.iter().all(|c| c["usage"].is_null()));
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "hello there world");
    assert!(chunks.len() > 3, "the text comes in pieces");
    assert_eq!(
        chunks.last().expect("a finish")["choices"][0]["finish_reason"],
        "stop"
    );
    let line = served_line(&fake, 1);
    assert_eq!(
        (&line["served"], &line["api"]),
        (&json!(true), &json!("openai-chat"))
    );
    let served = Usage {
        input: prompt - cached,
        output: completion,
        cache_read: cached,
        cache_write: 0,
    };
    assert_eq!(usage_of(&line), served);

    // Without include_usage the stream reports none, and nothing is counted.
    let mut plain = body.clone();
    plain["stream_options"] = json!({"include_usage": false});
    let got = events(&post(&fake, "/v1/chat/completions", "k-chat", &plain).body);
    assert!(got.iter().all(|(_, d)| d.get("usage").is_none()));
    assert_eq!(got.last().map(|e| &e.1), Some(&json!("[DONE]")));
    assert!(served_line(&fake, 2)["usage"].is_null());

    // Not streamed: one completion with its usage.
    let mut whole = body;
    whole["stream"] = json!(false);
    let completion = post(&fake, "/v1/chat/completions", "k-chat", &whole).json();
    assert_eq!(completion["object"], "chat.completion");
    assert_eq!(
        completion["choices"][0]["message"]["content"],
        "hello there world"
    );
    let third = usage_of(&served_line(&fake, 3));
    assert_eq!(
        third.input + third.cache_read,
        completion["usage"]["prompt_tokens"]
            .as_u64()
            .expect("prompt")
    );
    assert_eq!(fake.served_usage("k-chat"), served.plus(third));
}

#[test]
fn the_stream_gap_spaces_every_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fake = FakeModel::start_with(dir.path(), "model", "yes", &["--stream-gap-ms", "100"]);
    let body = json!({"model": "gpt-x", "stream": true,
        "messages": [{"role": "user", "content": "@text slow"}]});
    let start = tokio::time::Instant::now();
    let got = events(&post(&fake, "/v1/chat/completions", "k", &body).body);
    let gaps = u32::try_from(got.len() - 1).expect("few events");
    assert!(
        start.elapsed() >= Duration::from_millis(100) * gaps,
        "{gaps} gaps took {:?}",
        start.elapsed()
    );
}

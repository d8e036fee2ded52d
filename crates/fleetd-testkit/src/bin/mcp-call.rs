//! `mcp-call`: MCP and REST calls to fleetd at `$FLEETD_URL`, made from whatever process this
//! runs as (so fleetd identifies the caller by that pane, process or user). The end-to-end tests
//! use it as a lead's tool call and, in the security suite, as an attacker would. A test double;
//! never used by the daemon.
//!
//! - `mcp-call TOOL ARGS_FILE OUT_FILE`: one tool call; writes `{"result": ...}` or
//!   `{"error": "..."}` to OUT_FILE atomically (a temp file renamed), so a test can wait for it.
//! - `mcp-call --print TOOL ARGS_JSON`: one tool call; prints that JSON on stdout.
//! - `mcp-call --http [--header K:V]... METHOD PATH [BODY]`: one REST request; prints
//!   `{"status": N, "body": ...}` on stdout.
//! - `mcp-call --keepalive GATE_FILE OUT_FILE TOOL1 ARGS1_JSON TOOL2 ARGS2_JSON`: two tool calls on
//!   one kept-alive connection, the second once GATE_FILE exists; writes `{"first", "second",
//!   "ports": [p1, p2]}` to OUT_FILE (after the first call too, without "second").
//! - `mcp-call --herdr JSON`: one request line to the herdr socket at `$HERDR_SOCKET_PATH`;
//!   prints the answer line.
//! - `mcp-call --rpc METHOD PARAMS_JSON`: one JSON-RPC request as an MCP 2026-07-28 client that
//!   takes MCP tasks sends it (no `initialize`; `_meta` names the protocol and declares the
//!   tasks extension, as Claude Code 2.1.332 does); prints `{"status", "result"|"error"}`.
//!   `--rpc-file METHOD PARAMS_FILE OUT_FILE` writes that to OUT_FILE atomically.

use std::io::{BufRead as _, Write as _};
use std::time::Duration;

use anyhow::Context as _;
use fleetd_testkit::http::mcp::{McpClient, McpConn};
use serde_json::{Value, json};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--print") => {
            let [_, tool, arguments] = args.as_slice() else {
                anyhow::bail!("usage: mcp-call --print TOOL ARGS_JSON");
            };
            println!("{}", call(tool, serde_json::from_str(arguments)?));
            Ok(())
        }
        Some("--http") => http(&args[1..]),
        Some("--keepalive") => keepalive(&args[1..]),
        Some("--herdr") => herdr(&args[1..]),
        Some("--rpc") => {
            let [_, method, params] = args.as_slice() else {
                anyhow::bail!("usage: mcp-call --rpc METHOD PARAMS_JSON");
            };
            println!("{}", rpc(method, serde_json::from_str(params)?)?);
            Ok(())
        }
        Some("--rpc-file") => {
            let [_, method, params_file, out_file] = args.as_slice() else {
                anyhow::bail!("usage: mcp-call --rpc-file METHOD PARAMS_FILE OUT_FILE");
            };
            let params = serde_json::from_str(&std::fs::read_to_string(params_file)?)?;
            write_atomically(out_file, &rpc(method, params)?)
        }
        _ => {
            let [tool, args_file, out_file] = args.as_slice() else {
                anyhow::bail!(
                    "usage: mcp-call TOOL ARGS_FILE OUT_FILE (FLEETD_URL names fleetd); see the source for the other modes"
                );
            };
            let arguments: Value = serde_json::from_str(
                &std::fs::read_to_string(args_file)
                    .with_context(|| format!("reading {args_file}"))?,
            )
            .context("ARGS_FILE is not JSON")?;
            write_atomically(out_file, &call(tool, arguments))
        }
    }
}

fn url() -> anyhow::Result<String> {
    std::env::var("FLEETD_URL").context("FLEETD_URL is not set")
}

/// fleetd's address from `FLEETD_URL` (`http://IP:PORT`).
fn addr() -> anyhow::Result<std::net::SocketAddr> {
    let url = url()?;
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("FLEETD_URL {url:?} is not http://IP:PORT"))
}

/// One tool call on a fresh connection: `{"result": ...}` or `{"error": "..."}`.
fn call(tool: &str, arguments: Value) -> Value {
    let outcome = (|| -> anyhow::Result<Value> {
        let url = url()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let mut client = McpClient::new(&url)?.named("mcp-call");
            client.initialize().await?;
            client.call_tool(tool, arguments).await
        })
    })();
    match outcome {
        Ok(result) => json!({ "result": result }),
        Err(e) => json!({ "error": format!("{e:#}") }),
    }
}

/// One JSON-RPC request to `$FLEETD_URL/mcp` as a 2026-07-28 client that takes MCP tasks.
fn rpc(method: &str, mut params: Value) -> anyhow::Result<Value> {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": { "name": "mcp-call", "version": "0" },
        "io.modelcontextprotocol/clientCapabilities": {
            "extensions": { "io.modelcontextprotocol/tasks": {} }
        },
    });
    // `Mcp-Name`: the tool of a `tools/call`, the task of a `tasks/*` (as Claude Code sends).
    let name = params["name"]
        .as_str()
        .or_else(|| params["taskId"].as_str())
        .unwrap_or_default()
        .to_owned();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    let addr = addr()?;
    let response = fleetd_testkit::http::request_with(
        addr,
        "POST",
        "/mcp",
        &[
            ("Accept", "application/json, text/event-stream"),
            ("Content-Type", "application/json"),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
            ("Mcp-Name", &name),
        ],
        Some(&body.to_string()),
    )?;
    let answer = serde_json::from_str::<Value>(&response.body).unwrap_or(json!(response.body));
    let mut out = json!({ "status": response.status });
    for key in ["result", "error"] {
        if let Some(v) = answer.get(key) {
            out[key] = v.clone();
        }
    }
    if out.get("result").is_none() && out.get("error").is_none() {
        out["body"] = answer;
    }
    Ok(out)
}

fn write_atomically(out_file: &str, body: &Value) -> anyhow::Result<()> {
    let tmp = format!("{out_file}.tmp");
    std::fs::write(&tmp, serde_json::to_vec(body)?)?;
    std::fs::rename(&tmp, out_file)?;
    Ok(())
}

fn http(args: &[String]) -> anyhow::Result<()> {
    let mut headers: Vec<(String, String)> = Vec::new();
    let mut rest = args;
    while let [flag, header, tail @ ..] = rest
        && flag == "--header"
    {
        let (k, v) = header.split_once(':').context("--header takes KEY:VALUE")?;
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
        rest = tail;
    }
    let (method, path, body) = match rest {
        [method, path] => (method, path, None),
        [method, path, body] => (method, path, Some(body.as_str())),
        _ => anyhow::bail!("usage: mcp-call --http [--header K:V]... METHOD PATH [BODY]"),
    };
    let addr = addr()?;
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let response = fleetd_testkit::http::request_with(addr, method, path, &pairs, body)?;
    let body = serde_json::from_str::<Value>(&response.body).unwrap_or(json!(response.body));
    println!("{}", json!({ "status": response.status, "body": body }));
    Ok(())
}

#[expect(
    clippy::disallowed_methods,
    reason = "a test double polling for its gate file on the wall clock"
)]
fn keepalive(args: &[String]) -> anyhow::Result<()> {
    let [gate, out_file, tool1, args1, tool2, args2] = args else {
        anyhow::bail!(
            "usage: mcp-call --keepalive GATE_FILE OUT_FILE TOOL1 ARGS1_JSON TOOL2 ARGS2_JSON"
        );
    };
    let mut conn = McpConn::connect_url(&url()?)?;
    conn.initialize()?;
    let outcome = |r: anyhow::Result<Value>| match r {
        Ok(result) => json!({ "result": result }),
        Err(e) => json!({ "error": format!("{e:#}") }),
    };
    let first = outcome(conn.call_tool(tool1, &serde_json::from_str(args1)?));
    let first_port = conn.local_port()?;
    write_atomically(
        &format!("{out_file}.first"),
        &json!({ "first": first, "ports": [first_port] }),
    )?;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while !std::path::Path::new(gate).exists() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "no gate file {gate}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = outcome(conn.call_tool(tool2, &serde_json::from_str(args2)?));
    let second_port = conn.local_port()?;
    write_atomically(
        out_file,
        &json!({ "first": first, "second": second, "ports": [first_port, second_port] }),
    )
}

fn herdr(args: &[String]) -> anyhow::Result<()> {
    let [line] = args else {
        anyhow::bail!("usage: mcp-call --herdr JSON (HERDR_SOCKET_PATH names herdr)");
    };
    let socket = std::env::var("HERDR_SOCKET_PATH").context("HERDR_SOCKET_PATH is not set")?;
    let mut stream = std::os::unix::net::UnixStream::connect(&socket)
        .with_context(|| format!("connect {socket}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(line.as_bytes())?;
    stream.write_all(b"\n")?;
    let mut answer = String::new();
    std::io::BufReader::new(stream).read_line(&mut answer)?;
    print!("{answer}");
    Ok(())
}

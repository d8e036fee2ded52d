//! The load generator of `fleetd-bench model`, run as a member's agent inside the member's own
//! pane, so fleetd identifies its requests as it identifies a real agent's (TCP peer → pid →
//! pane) and admits them with the member's key: `fleetd-bench model-load CONTROL_ADDR DIRECT_URL`,
//! with the member's `FLEETD_URL`, `FLEETD_BACKEND_URL` and `FLEETD_BACKEND_TOKEN` as fleetd set
//! them at spawn. It first opens its MCP session (with the pane at rest, what makes fleetd count
//! the member ready), then connects back to the benchmark's control socket (the pane client's
//! line protocol, [`super::pane_client`]) and waits for one `load` call that says when to start,
//! how many ticks and how far apart. Tick `k` starts at `start + k × period` (wall clock, so every
//! member's tick `k` starts at the same moment): even ticks go straight to the model
//! (`DIRECT_URL`), odd ones through fleetd, each over its own kept-alive connection, as an agent's
//! HTTP client keeps one. Each request is timed here, around the exchange: to the first byte of
//! the streamed body, and to its end. The answer holds every measured request's two times (µs),
//! by path.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use crate::http::mcp::McpConn;
use crate::http::{Conn, Endpoint, Request};

/// One path to the model: where it is, the credential it takes, its kept-alive connection.
struct Route {
    addr: SocketAddr,
    messages: String,
    bearer: String,
    conn: Option<Conn>,
    /// Connections opened after the first (the server closed one).
    reopened: usize,
    samples: Vec<(u64, u64)>,
}

impl Route {
    /// `base` is `http://host:port[/prefix]`.
    fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        let rest = base
            .strip_prefix("http://")
            .with_context(|| format!("{base:?} is not an http:// URL"))?;
        let (authority, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        Ok(Self {
            addr: authority
                .parse()
                .with_context(|| format!("{authority:?} is not host:port"))?,
            messages: format!("{}/v1/messages", prefix.trim_end_matches('/')),
            bearer: format!("Bearer {token}"),
            conn: None,
            reopened: 0,
            samples: Vec::new(),
        })
    }

    /// One streamed request: (to the first body byte, to the end) and the body's length.
    async fn exchange(&mut self, body: &str) -> anyhow::Result<(Duration, Duration, usize)> {
        if self.conn.as_ref().is_none_or(Conn::is_closed) {
            if self.conn.is_some() {
                self.reopened += 1;
            }
            self.conn = Some(Conn::open(&Endpoint::Tcp(self.addr)).await?);
        }
        let conn = self.conn.as_mut().context("a connection")?;
        let start = tokio::time::Instant::now();
        let response = conn
            .send(Request {
                method: "POST",
                path: &self.messages,
                headers: &[
                    ("authorization", &self.bearer),
                    ("anthropic-version", "2023-06-01"),
                ],
                body: Some(body),
            })
            .await?;
        let status = response.status();
        let mut body = response.into_body();
        let mut first = None;
        let mut seen = Vec::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            if !data.is_empty() && first.is_none() {
                first = Some(start.elapsed());
            }
            seen.extend_from_slice(&data);
        }
        let total = start.elapsed();
        let text = String::from_utf8_lossy(&seen);
        anyhow::ensure!(
            status.is_success() && text.contains("event: message_stop"),
            "POST {} answered {status}: {}",
            self.messages,
            text.chars().take(400).collect::<String>()
        );
        Ok((first.unwrap_or(total), total, seen.len()))
    }
}

/// Generator mode: `args` are what follows `model-load`.
pub fn serve(args: &[String]) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
    let control = args.first().context("model-load needs CONTROL_ADDR")?;
    let direct = args.get(1).context("model-load needs DIRECT_URL")?;
    // The MCP session an agent opens as it starts: with the pane at rest, the member is ready.
    let mut session = McpConn::connect_url(&env("FLEETD_URL")?)?;
    session.initialize()?;
    let mut paths = [
        Route::new(direct, "the-backends-own-credential")?,
        Route::new(&env("FLEETD_BACKEND_URL")?, &env("FLEETD_BACKEND_TOKEN")?)?,
    ];
    let stream = TcpStream::connect(control).with_context(|| format!("connect {control}"))?;
    let mut writer = stream.try_clone()?;
    writeln!(writer, "{}", json!({ "hello": std::process::id() }))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for line in BufReader::new(stream).lines() {
        let request: Value = serde_json::from_str(&line?)?;
        let answer = match runtime.block_on(run(&mut paths, &request["args"])) {
            Ok(result) => json!({ "id": request["id"], "us": 0, "result": result }),
            Err(e) => json!({ "id": request["id"], "error": format!("{e:#}") }),
        };
        writeln!(writer, "{answer}")?;
    }
    // The benchmark is done: stay the pane's agent until the pane closes.
    let mut sink = [0u8; 256];
    let mut stdin = std::io::stdin();
    while stdin.read(&mut sink).is_ok_and(|n| n > 0) {}
    drop(session);
    Ok(())
}

/// When, on this process's clock, the wall-clock moment `at_us` (µs since the epoch) is.
#[expect(
    clippy::disallowed_methods,
    reason = "the members' ticks are set on the wall clock, the one clock their processes share"
)]
fn local(at_us: i64) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    let ahead = at_us - jiff::Timestamp::now().as_microsecond();
    now + Duration::from_micros(u64::try_from(ahead).unwrap_or(0))
}

/// The ticks of one `load` call; the measured times by path.
async fn run(paths: &mut [Route; 2], args: &Value) -> anyhow::Result<Value> {
    let number = |k: &str| args[k].as_u64().with_context(|| format!("load needs {k}"));
    let start = local(args["start_us"].as_i64().context("load needs start_us")?);
    let (ticks, warmup) = (number("ticks")?, number("warmup")?);
    let period = Duration::from_micros(number("period_us")?);
    let body = args["body"].as_str().context("load needs body")?;
    let mut late = 0usize;
    let mut bytes = [0usize; 2];
    for path in paths.iter_mut() {
        path.samples.clear();
    }
    for k in 0..ticks {
        let at = start + period * u32::try_from(k)?;
        if tokio::time::Instant::now() > at + Duration::from_millis(1) {
            late += 1;
        }
        tokio::time::sleep_until(at).await;
        let which = usize::from(k % 2 == 1);
        let path = &mut paths[which];
        let (first, total, len) = path.exchange(body).await?;
        bytes[which] = len;
        if k >= warmup {
            let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
            path.samples.push((us(first), us(total)));
        }
    }
    let [direct, fleetd] = paths;
    Ok(json!({
        "direct": direct.samples,
        "fleetd": fleetd.samples,
        "bytes": bytes,
        "late": late,
        "reopened": [direct.reopened, fleetd.reopened],
    }))
}

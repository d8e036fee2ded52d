//! `fake-model [--listen ADDR] [--log FILE] [--answer TEXT] [--stream-gap-ms N]`: runs the test
//! kit's scripted model backend (see `fleetd_testkit::fake_model`): the Anthropic Messages API, the
//! OpenAI Responses API and Chat Completions on loopback HTTP. `--stream-gap-ms` waits N ms between
//! consecutive events of every stream (default 0), so a test can act mid-stream. Prints
//! `listening on ADDR` once it accepts. A test double only: it answers from a script, never from a
//! model.

use anyhow::Context as _;
use std::time::Duration;

use fleetd_testkit::fake_model::{Options, serve};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:0".to_owned();
    let mut opts = Options::default();
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--listen" => listen = value()?,
            "--log" => opts.log = Some(value()?.into()),
            "--answer" => opts.script.answer = value()?,
            "--stream-gap-ms" => {
                let ms = value()?;
                let ms: u64 = ms
                    .parse()
                    .with_context(|| format!("--stream-gap-ms takes milliseconds, not {ms:?}"))?;
                opts.stream_gap = Duration::from_millis(ms);
            }
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: fake-model [--listen ADDR] [--log FILE] [--answer TEXT] [--stream-gap-ms N]"
            ),
        }
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            println!("listening on {}", listener.local_addr()?);
            serve(listener, opts).await
        })
}

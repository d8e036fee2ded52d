//! `model-call`: one streamed model request from wherever it runs — typed into a member's pane,
//! it is that member's agent asking its backend (see `fleetd_testkit::model_call`). A test
//! double; never used by the daemon.
//!
//! `model-call [--url URL] [--key KEY] [--header x-api-key|bearer] [--api
//! anthropic|responses|chat] [--prompt TEXT] [--extra-header 'NAME: VALUE']... [--timeout-secs
//! N] [--progress FILE] [--out FILE]`: the URL and key default to `$FLEETD_BACKEND_URL` and
//! `$FLEETD_BACKEND_TOKEN` (what fleetd gives a member of a `custom` profile); the key goes in
//! `x-api-key` by default. Writes the outcome as JSON to FILE atomically (a temp file renamed,
//! so a test can wait for it), or to stdout without `--out`; `--progress` gets one line per
//! event as it arrives. Exit status 0 whenever an outcome was written, refusals included.

use std::time::Duration;

use anyhow::Context as _;
use fleetd_testkit::model_call::{self, Api, Call, KeyHeader};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut url = std::env::var("FLEETD_BACKEND_URL").ok();
    let mut key = std::env::var("FLEETD_BACKEND_TOKEN").ok();
    let mut call = Call::new("", "");
    let mut out = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--url" => url = Some(value()?),
            "--key" => key = Some(value()?),
            "--header" => {
                call.header = match value()?.as_str() {
                    "x-api-key" => KeyHeader::XApiKey,
                    "bearer" => KeyHeader::Bearer,
                    other => anyhow::bail!("--header takes x-api-key or bearer, not {other:?}"),
                };
            }
            "--api" => {
                let name = value()?;
                call.api = Api::parse(&name).with_context(|| {
                    format!("--api takes anthropic, responses or chat, not {name:?}")
                })?;
            }
            "--prompt" => call.prompt = value()?,
            "--extra-header" => {
                let given = value()?;
                let (name, v) = given.split_once(':').with_context(|| {
                    format!("--extra-header takes 'NAME: VALUE', not {given:?}")
                })?;
                call.extra_headers
                    .push((name.trim().to_owned(), v.trim().to_owned()));
            }
            "--timeout-secs" => {
                let secs = value()?;
                call.timeout = Duration::from_secs(
                    secs.parse()
                        .with_context(|| format!("--timeout-secs takes seconds, not {secs:?}"))?,
                );
            }
            "--progress" => call.progress = Some(value()?.into()),
            "--out" => out = Some(std::path::PathBuf::from(value()?)),
            other => anyhow::bail!("unknown argument {other:?}; see the source for the usage"),
        }
    }
    call.url = url.context("no URL: pass --url or set FLEETD_BACKEND_URL")?;
    call.key = key.context("no key: pass --key or set FLEETD_BACKEND_TOKEN")?;
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(model_call::run(&call));
    match out {
        Some(path) => model_call::write(&path, &outcome)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{}", serde_json::to_string(&outcome)?),
    }
    Ok(())
}

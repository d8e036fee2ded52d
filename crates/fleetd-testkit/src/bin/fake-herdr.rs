//! `fake-herdr --socket PATH [--control PATH] [--shell SH] [--rows N] [--protocol N] [--version V] [--status-log FILE]`: runs the
//! test kit's herdr protocol-20 server (see `fleetd_testkit::fake_herdr`). The socket defaults to
//! `HERDR_SOCKET_PATH`. A test double only: never point a real user session at it.

use anyhow::Context as _;
use fleetd_testkit::fake_herdr::{Options, serve};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut socket = std::env::var_os("HERDR_SOCKET_PATH").map(std::path::PathBuf::from);
    let mut opts = Options::new("");
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--socket" => socket = Some(value()?.into()),
            "--control" => opts.control = Some(value()?.into()),
            "--shell" => opts.shell = value()?,
            "--rows" => opts.rows = value()?.parse().context("--rows takes a number of rows")?,
            "--protocol" => {
                opts.protocol = value()?.parse().context("--protocol takes a number")?
            }
            "--version" => opts.version = value()?,
            "--status-log" => opts.status_log = Some(value()?.into()),
            other => anyhow::bail!(
                "unknown argument {other:?}; usage: fake-herdr --socket PATH [--control PATH] [--shell SH] [--rows N] [--protocol N] [--version V] [--status-log FILE]"
            ),
        }
    }
    opts.socket = socket.context("no socket: pass --socket PATH or set HERDR_SOCKET_PATH")?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(serve(opts))
}

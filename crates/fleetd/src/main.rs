//! The `fleetd` binary: parse the command line and hand off. Thin by design — every command's
//! work lives in the library so tests can drive it without a process.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use fleetd::cli::{Cli, ClientArgs, Command, ConfigCommand, SendArgs, ServeArgs};
use fleetd::client::Request;
use fleetd::config::{Config, Environment};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = Environment::from_process();
    let config = cli.config.as_deref();
    let result = match cli.command {
        Command::Serve(args) => serve(config, &env, &args).map(|()| true),
        Command::Config(ConfigCommand::Check { file }) => config_check(&file, &env).map(|()| true),
        Command::Mcp => mcp_shim(config, &env).map(|()| true),
        Command::Status(client) => ask(config, &env, &client, &Request::Status),
        Command::Inbox { target, client } => ask(config, &env, &client, &Request::Inbox { target }),
        Command::Ack {
            target,
            msg_id,
            client,
        } => ask(config, &env, &client, &Request::Ack { target, msg_id }),
        Command::Send(args) => send(config, &env, args),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fleetd: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn env_lookup(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// Runs one client command against the daemon; false when it did not achieve what was asked.
fn ask(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    client: &ClientArgs,
    request: &Request,
) -> anyhow::Result<bool> {
    let conn = fleetd::client::connect(
        client.daemon.as_deref(),
        client.token.clone(),
        Config::load(config_path, env),
        &env_lookup,
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let mut out = std::io::stdout().lock();
    Ok(runtime.block_on(fleetd::client::run(&conn, request, client.json, &mut out))?)
}

fn send(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: SendArgs,
) -> anyhow::Result<bool> {
    let task = if args.text == ["-"] {
        std::io::read_to_string(std::io::stdin()).context("failed to read the task from stdin")?
    } else {
        args.text.join(" ")
    };
    let request = Request::Send {
        target: args.target,
        task,
        wait: args.wait,
        timeout_secs: args.timeout,
    };
    ask(config_path, env, &args.client, &request)
}

fn config_check(file: &std::path::Path, env: &Environment) -> anyhow::Result<()> {
    let config = Config::load(Some(file), env)?;
    print!("{}", config.to_yaml());
    eprintln!("{}: configuration is valid", file.display());
    Ok(())
}

fn mcp_shim(config_path: Option<&std::path::Path>, env: &Environment) -> anyhow::Result<()> {
    let config = Config::load(config_path, env)?;
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    runtime.block_on(fleetd::shim::relay(&config.state_dir))
}

fn serve(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: &ServeArgs,
) -> anyhow::Result<()> {
    let mut config = Config::load(config_path, env)?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
    anyhow::ensure!(
        config.listen_is_loopback() || config.api_token.is_some(),
        "--listen {} is not loopback: set `apiToken` in the config to listen there",
        config.listen
    );
    fleetd::logging::init(config.log.format, &config.log.level);
    // Under systemd (Type=notify) READY=1 goes out once the store is open and the listener
    // bound, STOPPING=1 when a signal starts the shutdown.
    let notifier =
        fleetd::notify::Notifier::from_socket_var(std::env::var_os("NOTIFY_SOCKET").as_deref());
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    runtime.block_on(async move {
        let daemon = fleetd::serve::Daemon::open(config).await?;
        let addr = daemon.config().listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("failed to listen on {addr}"))?;
        tracing::info!(listen = %listener.local_addr()?, "fleetd listening");
        let stopping = notifier.clone();
        let shutdown = async move {
            fleetd::serve::shutdown_signal().await;
            stopping.stopping();
        };
        daemon
            .run_with_ready(listener, shutdown, move || notifier.ready())
            .await
    })
}

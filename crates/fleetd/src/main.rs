//! The `fleetd` binary: parse the command line and hand off. Thin by design — every command's
//! work lives in the library so tests can drive it without a process.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use fleetd::cli::{
    ApproveArgs, BudgetArgs, Cli, ClientArgs, Command, ConfigCommand, DemoArgs, GatewayCommand,
    InstallClaudeArgs, InstallCodexArgs, InstallCommand, InstallScope, SendArgs, ServeArgs,
};
use fleetd::client::Request;
use fleetd::config::{Config, Environment, Overrides};
use fleetd::ops::install::{ClaudePaths, McpServer, Outcome};
use fleetd::reload::ReloadSource;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env = Environment::from_process();
    let config = cli.config.as_deref();
    let result = match cli.command {
        Command::Serve(args) => serve(config, &env, &args).map(|()| true),
        Command::Config(ConfigCommand::Check { file }) => config_check(&file, &env).map(|()| true),
        Command::Mcp => mcp_shim(config, &env).map(|()| true),
        Command::BoxRelay {
            listen,
            socket,
            argv,
        } => box_relay(listen, socket, &argv),
        Command::Status(client) => ask(config, &env, &client, &Request::Status),
        Command::Inbox {
            target,
            after,
            limit,
            client,
        } => ask(
            config,
            &env,
            &client,
            &Request::Inbox {
                target,
                after,
                limit,
            },
        ),
        Command::Ack {
            target,
            msg_id,
            client,
        } => ask(config, &env, &client, &Request::Ack { target, msg_id }),
        Command::Send(args) => send(config, &env, args),
        Command::Answer {
            question_id,
            text,
            client,
        } => read_text(&text, "the answer").and_then(|text| {
            ask(
                config,
                &env,
                &client,
                &Request::Answer { question_id, text },
            )
        }),
        Command::Stop {
            target,
            cause,
            client,
        } => ask(config, &env, &client, &Request::Stop { target, cause }),
        Command::Tickets { target, client } => {
            ask(config, &env, &client, &Request::Tickets { target })
        }
        Command::Dashboard(client) => ask(config, &env, &client, &Request::Dashboard),
        Command::Admit { pane, client } => ask(config, &env, &client, &Request::Admit { pane }),
        Command::Budget(args) => budget(config, &env, args),
        Command::Approve(args) => approve(config, &env, &args),
        Command::Watch(client) => watch(config, &env, &client).map(|()| true),
        Command::Install(InstallCommand::Claude(args)) => {
            install_claude(config, &env, &args).map(|()| true)
        }
        Command::Install(InstallCommand::Codex(args)) => {
            install_codex(config, &env, &args).map(|()| true)
        }
        Command::Gateway(GatewayCommand::Provision(args)) => provision(&args).map(|()| true),
        Command::Demo(DemoArgs { no_pause }) => Err(fleetd::demo::exec(no_pause).into()),
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

/// Runs one client command against the daemon; false when it did not achieve what was asked.
fn ask(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    client: &ClientArgs,
    request: &Request,
) -> anyhow::Result<bool> {
    let (conn, runtime) = client_session(config_path, env, client)?;
    let mut out = std::io::stdout().lock();
    Ok(runtime.block_on(fleetd::client::run(&conn, request, client.json, &mut out))?)
}

/// The daemon a client command talks to, and the runtime it talks on.
fn client_session(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    client: &ClientArgs,
) -> anyhow::Result<(fleetd::client::Connection, tokio::runtime::Runtime)> {
    let conn = fleetd::client::connect(
        client.daemon.as_deref(),
        client.token.clone(),
        Config::load(config_path, env),
        &fleetd::secrets::process_env,
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    Ok((conn, runtime))
}

/// `fleetd budget`: sets the budget and prints what was set and spent.
fn budget(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: BudgetArgs,
) -> anyhow::Result<bool> {
    let (conn, runtime) = client_session(config_path, env, &args.client)?;
    let budget = fleetd::client::budget::Budget {
        target: args.target,
        tokens: args.tokens,
        cost_usd: args.cost_usd,
        warn_at: args.warn_at,
        tree: args.tree,
    };
    let mut out = std::io::stdout().lock();
    Ok(runtime.block_on(fleetd::client::budget::run(
        &conn,
        &budget,
        args.client.json,
        &mut out,
    ))?)
}

/// `fleetd approve`: shows a member's dialog, or types a choice into it.
fn approve(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: &ApproveArgs,
) -> anyhow::Result<bool> {
    let (conn, runtime) = client_session(config_path, env, &args.client)?;
    let mut out = std::io::stdout().lock();
    Ok(runtime.block_on(fleetd::client::approve::run(
        &conn,
        &args.target,
        args.choice.as_deref(),
        args.dialog.as_deref(),
        args.client.json,
        &mut out,
    ))?)
}

fn watch(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    client: &ClientArgs,
) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    let (conn, runtime) = client_session(config_path, env, client)?;
    let style = if client.json {
        fleetd::client::watch::Style::Json
    } else if std::io::stdout().is_terminal() {
        fleetd::client::watch::Style::Screen
    } else {
        fleetd::client::watch::Style::Lines
    };
    let mut out = std::io::stdout().lock();
    Ok(runtime.block_on(fleetd::client::watch::watch(&conn, style, &mut out))?)
}

fn send(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: SendArgs,
) -> anyhow::Result<bool> {
    let task = read_text(&args.text, "the task")?;
    let request = Request::Send {
        target: args.target,
        task,
        wait: args.wait,
        timeout_secs: args.timeout,
    };
    ask(config_path, env, &args.client, &request)
}

/// `fleetd gateway provision`: the definitions document on stdout.
fn provision(args: &fleetd::cli::ProvisionArgs) -> anyhow::Result<()> {
    let gateways = args
        .gateways
        .iter()
        .map(|g| fleetd_core::gateway::GatewayName::new(g.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let doc = fleetd::gateway::provision::definitions(
        &gateways,
        &args.vhost,
        args.broker,
        args.passwords_dir.as_deref(),
    )?;
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// Words given on the command line, joined with spaces; `-` alone reads stdin.
fn read_text(words: &[String], what: &str) -> anyhow::Result<String> {
    if words == ["-"] {
        std::io::read_to_string(std::io::stdin())
            .with_context(|| format!("failed to read {what} from stdin"))
    } else {
        Ok(words.join(" "))
    }
}

/// How an agent installed by `fleetd install` reaches this daemon: the stdio shim, or the HTTP
/// endpoint of the configured `listen`.
fn mcp_server(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    stdio: bool,
) -> anyhow::Result<McpServer> {
    if stdio {
        // The shim must find the same daemon: pass the config along when one was named.
        let mut shim_args = Vec::new();
        if let Some(path) = config_path {
            let path = std::path::absolute(path).context("failed to resolve --config")?;
            shim_args.extend(["--config".to_owned(), path.display().to_string()]);
        }
        shim_args.push("mcp".to_owned());
        let env = [
            ("XDG_STATE_HOME", &env.xdg_state_home),
            ("XDG_CONFIG_HOME", &env.xdg_config_home),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_owned(), v.as_ref()?.display().to_string())))
        .collect();
        return Ok(McpServer::Stdio {
            command: "fleetd".to_owned(),
            args: shim_args,
            env,
        });
    }
    let config = Config::load(config_path, env)?;
    Ok(McpServer::Http {
        url: format!(
            "{}/mcp",
            fleetd::client::DaemonUrl::from_listen(config.listen)
        ),
    })
}

fn install_codex(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: &InstallCodexArgs,
) -> anyhow::Result<()> {
    use fleetd::ops::install::codex::{CodexPaths, install_codex, merge_config};
    let server = mcp_server(config_path, env, args.stdio)?;
    let codex_home = match std::env::var_os("CODEX_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => env
            .home
            .as_deref()
            .context("failed to find Codex's home: neither CODEX_HOME nor HOME is set")?
            .join(".codex"),
    };
    let dir = std::env::current_dir().context("failed to read the current directory")?;
    let paths = CodexPaths::new(&codex_home, &dir);
    if args.print {
        let config = merge_config(&paths.config, None, &server, &paths.trust)?.unwrap_or_default();
        println!("# merge into {}:\n{config}", paths.config.display());
        print!(
            "# add to {}:\n{}",
            paths.memory.display(),
            fleetd::ops::install::CHARTER
        );
        return Ok(());
    }
    report(install_codex(&paths, &server)?);
    println!(
        "restart Codex to connect it to fleetd as `{}`",
        fleetd::ops::install::SERVER_NAME
    );
    Ok(())
}

fn report(outcomes: Vec<Outcome>) {
    for outcome in outcomes {
        match outcome {
            Outcome::Written(path) => println!("wrote {}", path.display()),
            Outcome::Unchanged(path) => println!("{} is up to date", path.display()),
        }
    }
}

fn install_claude(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: &InstallClaudeArgs,
) -> anyhow::Result<()> {
    let server = mcp_server(config_path, env, args.stdio)?;
    let paths =
        match args.scope {
            InstallScope::Project => ClaudePaths::project(
                &std::env::current_dir().context("failed to read the current directory")?,
            ),
            InstallScope::User => ClaudePaths::user(env.home.as_deref().context(
                "failed to find the home directory: HOME is not set (use --scope project)",
            )?),
        };
    if args.print {
        let entry = serde_json::json!({ "mcpServers": { fleetd::ops::install::SERVER_NAME: server.entry() } });
        println!(
            "# merge into {}:\n{}\n",
            paths.mcp_config.display(),
            serde_json::to_string_pretty(&entry).context("failed to render the entry")?
        );
        print!(
            "# add to {}:\n{}\n",
            paths.memory.display(),
            fleetd::ops::install::CHARTER
        );
        let settings = fleetd::ops::install::merge_settings(&paths.settings, None, paths.project)?
            .unwrap_or_default();
        print!("# merge into {}:\n{settings}", paths.settings.display());
        return Ok(());
    }
    report(fleetd::ops::install::install_claude(&paths, &server)?);
    println!(
        "restart Claude Code (or run /mcp) to connect it to fleetd as `{}`",
        fleetd::ops::install::SERVER_NAME
    );
    Ok(())
}

fn config_check(file: &std::path::Path, env: &Environment) -> anyhow::Result<()> {
    let config = Config::load(Some(file), env)?;
    print!("{}", config.to_yaml());
    eprintln!("{}: configuration is valid", file.display());
    Ok(())
}

/// `fleetd box-relay`: ends this process with the member's exit status.
fn box_relay(
    listen: std::net::SocketAddr,
    socket: std::path::PathBuf,
    argv: &[String],
) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    let code = runtime.block_on(fleetd::sandbox::relay::run(listen, socket, argv))?;
    std::process::exit(code)
}

fn mcp_shim(config_path: Option<&std::path::Path>, env: &Environment) -> anyhow::Result<()> {
    // Inside a member's sandbox the state directory is not there, only its door.
    let socket = match std::env::var_os(fleetd::sandbox::SHIM_SOCKET_VAR) {
        Some(socket) => std::path::PathBuf::from(socket),
        None => fleetd::shim::socket_path(&Config::load(config_path, env)?.state_dir),
    };
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    runtime.block_on(fleetd::shim_relay::run(&socket))
}

fn serve(
    config_path: Option<&std::path::Path>,
    env: &Environment,
    args: &ServeArgs,
) -> anyhow::Result<()> {
    // Nothing the daemon creates is readable by other users: inbox, member registry, sockets.
    fleetd::state_dir::restrict_umask();
    let overrides = Overrides {
        listen: args.listen,
        log_format: args.log_format,
    };
    let mut config = Config::load(config_path, env)?;
    overrides.apply(&mut config);
    anyhow::ensure!(
        config.listen_is_loopback() || config.api_token.is_some(),
        "--listen {} is not loopback: set `apiToken` in the config to listen there",
        config.listen
    );
    fleetd::ops::logging::init(config.log.format, &config.log.level);
    // Before any socket: a soft limit of 1024 would stop accepts long before connections.max.
    fleetd::conn::raise_open_file_limit();
    // Under systemd (Type=notify) READY=1 goes out once the store is open and the listener
    // bound, STOPPING=1 when a signal starts the shutdown.
    let notifier = fleetd::ops::readiness::Notifier::from_socket_var(
        std::env::var_os("NOTIFY_SOCKET").as_deref(),
    );
    let runtime = tokio::runtime::Runtime::new().context("failed to start the async runtime")?;
    runtime.block_on(async move {
        let mut daemon = fleetd::serve::Daemon::open(config).await?;
        if let Some(ms) = args.test_engine_panic_after_ms {
            daemon = daemon.with_engine_panic_after(std::time::Duration::from_millis(ms));
        }
        // Before the listener: once "listening" is logged, a SIGHUP must reload, not kill.
        let _reload = fleetd::reload::start(
            &daemon,
            ReloadSource {
                path: config_path.map_or_else(|| env.default_config_path(), ToOwned::to_owned),
                env: env.clone(),
                overrides,
            },
        )?;
        let addr = daemon.config().listen;
        let listener = fleetd::conn::listen_tcp(addr)
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

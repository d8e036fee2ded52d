//! `fleetd serve`: wires the configured parts together and runs the HTTP listener until shutdown.
//! Owns start-up order (store first, so a second daemon fails naming the first), the choice of
//! multiplexer, and graceful shutdown; takes its I/O (listener, shutdown signal) as arguments so
//! tests run it in-process on `127.0.0.1:0`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use fleetd_core::{MessageLimits, MuxDaemon};
use tokio::net::TcpListener;

use crate::config::{AmqpUrl, Config, Live, MultiplexerChoice, Publisher, Store};
use crate::mux::herdr::{Herdr, HerdrConfig};
use crate::mux::tmux::{Tmux, TmuxConfig, TmuxSocket};
use crate::mux::{Multiplexer, MuxRouter};
use crate::secrets::Secrets;
use crate::store::{InboxStore, StateStore, StoreOptions, StoreSpec};

/// The running daemon's shared handle, cheap to clone into handlers.
#[derive(Debug, Clone)]
pub struct Daemon {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The running configuration; `reload` publishes through it, everything else reads it.
    config: Arc<Publisher>,
    store: Arc<dyn InboxStore>,
    /// The fleet state (SPEC §15): the embedded file, also when the inbox is on AMQP.
    state: Arc<dyn StateStore>,
    mux: MuxRouter,
    /// What each daemon is reached through, for `/healthz` (socket path or tmux server).
    endpoints: Vec<(MuxDaemon, String)>,
    /// A test-only fault: make the engine panic this long after it starts.
    engine_panic_after: Option<std::time::Duration>,
}

impl Daemon {
    /// Opens everything the daemon owns for `config`: the inbox store (taking its lock) and the
    /// multiplexer client(s). A multiplexer that does not answer yet is not fatal — `/healthz`
    /// reports it — but a herdr that answers with a too-old protocol is.
    pub async fn open(config: Config) -> anyhow::Result<Self> {
        // The metrics recorder goes in first, so nothing recorded from here on is lost.
        crate::ops::telemetry::describe();
        // Owner-only before anything is written there (and tightened when fleetd's first releases
        // left it looser).
        crate::state_dir::private_dir(&config.state_dir).with_context(|| {
            format!(
                "failed to prepare the state directory {}",
                config.state_dir.display()
            )
        })?;
        if let Store::Embedded { path } = &config.store {
            for suffix in ["", "-wal", "-shm", ".lock"] {
                let mut name = path.as_os_str().to_owned();
                name.push(suffix);
                crate::state_dir::tighten(std::path::Path::new(&name), crate::state_dir::FILE_MODE)
                    .with_context(|| format!("failed to check {}", path.display()))?;
            }
        }
        let crate::store::Stores {
            inbox: store,
            state,
        } = open_store(&config).await?;
        let (mux, endpoints) = open_mux(&config).await?;
        tracing::info!(
            store = store.kind(),
            multiplexer = ?mux.daemon(MuxDaemon::Lead).map(|m| m.kind()).ok(),
            daemons = mux.daemons().len(),
            "fleetd opened its store and multiplexer"
        );
        crate::members::log_secret_names(&config);
        Ok(Self {
            inner: Arc::new(Inner {
                config: Arc::new(crate::config::channel(config).0),
                store,
                state,
                mux,
                endpoints,
                engine_panic_after: None,
            }),
        })
    }

    /// A test-only fault hook: the engine panics `after` it starts (`fleetd serve
    /// --test-engine-panic-after-ms`), to show the daemon then exits non-zero. Call before
    /// [`Daemon::run`].
    pub fn with_engine_panic_after(mut self, after: std::time::Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.engine_panic_after = Some(after);
        }
        self
    }

    /// The configuration the daemon runs on now.
    pub fn config(&self) -> Arc<Config> {
        self.inner.config.current()
    }

    /// A reader of the running configuration; [`Live::subscribe`] wakes on each applied reload.
    pub fn live_config(&self) -> Live {
        self.inner.config.live()
    }

    /// The configuration's one writer, for the reloader.
    pub(crate) fn publisher(&self) -> Arc<Publisher> {
        Arc::clone(&self.inner.config)
    }

    /// The inbox store.
    pub fn store(&self) -> &Arc<dyn InboxStore> {
        &self.inner.store
    }

    /// The multiplexer router.
    pub fn mux(&self) -> &MuxRouter {
        &self.inner.mux
    }

    /// What `/healthz` asks, for an engine.
    fn probe(
        &self,
        engine: crate::engine::EngineHandle,
        gateway: Option<(String, crate::store::gateway_link::Link)>,
    ) -> crate::health::Probe {
        crate::health::Probe {
            store: Arc::clone(&self.inner.store),
            mux: self.inner.mux.clone(),
            endpoints: self.inner.endpoints.clone(),
            engine,
            gateway,
        }
    }

    /// Serves HTTP (on `listener` and on the operator's unix socket) and the stdio shim's unix
    /// socket until `shutdown` completes, then finishes in-flight requests and closes the store.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        self.run_with_ready(listener, shutdown, || {}).await
    }

    /// [`Daemon::run`], calling `ready` once the daemon serves: the store is open (it was in
    /// [`Daemon::open`]), the listener is bound, the engine runs and the shim socket listens.
    /// It is called just before the first `accept`; a connection made from then on waits in the
    /// listener's backlog and is answered. `fleetd serve` sends `READY=1` to systemd here.
    pub async fn run_with_ready(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        ready: impl FnOnce() + Send,
    ) -> anyhow::Result<()> {
        let local = listener
            .local_addr()
            .context("the listener has no address")?;
        let (fleet, link) = self.fleet(local)?;
        let fleet = Arc::new(fleet);
        let config = self.config();
        let mcp = crate::mcp::http_service(Arc::clone(&fleet));
        // One gate for every door: the cap counts connections, whichever socket they came by.
        let gate = crate::conn::Gate::new(crate::conn::open_files_now().connection_ceiling());
        let shim = crate::shim::listen(&config.state_dir, Arc::clone(&fleet), Arc::clone(&gate))
            .await
            .context("failed to open the stdio shim's socket")?;
        let operator_path = operator_socket_path(&config.state_dir);
        let operator = crate::shim::bind_private(&operator_path)
            .context("failed to open the operator's socket")?;
        let boxed_path = crate::sandbox::http_door(&config.state_dir);
        crate::state_dir::private_dir(&crate::sandbox::door_dir(&config.state_dir))
            .context("failed to make the sandbox door's directory")?;
        let boxed = crate::shim::bind_private(&boxed_path)
            .context("failed to open the sandboxed members' HTTP door")?;
        let store = Arc::clone(&self.inner.store);
        let engine = fleet.engine.clone();
        let probe = self.probe(engine.clone(), link);
        let stop = tokio_util::sync::CancellationToken::new();
        let app = crate::http::router(probe, fleet, mcp, stop.clone(), local);
        let stopper = stop.clone();
        tokio::spawn(async move {
            shutdown.await;
            stopper.cancel();
        });
        if let Some(after) = self.inner.engine_panic_after {
            let engine = engine.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                tracing::warn!("test fault: making the engine panic");
                let _ = engine.inject_panic().await;
            });
        }
        // The engine is supervised: if it stops while the daemon serves (a panic), the listeners
        // close and the daemon exits non-zero so its service manager restarts it.
        let died = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let (engine, stop, died) = (engine.clone(), stop.clone(), Arc::clone(&died));
            tokio::spawn(async move {
                engine.stopped().await;
                if !stop.is_cancelled() {
                    tracing::error!(
                        "the fleet engine stopped while fleetd was serving; shutting down to be restarted"
                    );
                    died.store(true, std::sync::atomic::Ordering::Release);
                    stop.cancel();
                }
            });
        }
        ready();
        let parts = crate::http::listen::DoorParts {
            router: app,
            gate,
            config: self.live_config(),
        };
        tokio::join!(
            crate::http::listen::serve(
                crate::http::listen::Listener::Tcp(listener),
                parts.clone(),
                stop.clone(),
            ),
            crate::http::listen::serve(
                crate::http::listen::Listener::Operator(operator),
                parts.clone(),
                stop.clone(),
            ),
            crate::http::listen::serve(
                crate::http::listen::Listener::Boxed(boxed),
                parts,
                stop.clone(),
            ),
        );
        let _ = std::fs::remove_file(&operator_path);
        let _ = std::fs::remove_file(&boxed_path);
        shim.stop();
        let died = died.load(std::sync::atomic::Ordering::Acquire);
        // Members are released (cause `shutdown`) and their notices stored before the store
        // closes, so the lead learns after a restart which tickets did not finish.
        if !died && engine.shutdown().await.is_err() {
            tracing::warn!("the engine had already stopped; members were not released");
        }
        // Close the store even when serving failed, so every acknowledged write is flushed and
        // the lock is released before the process exits.
        let closed = store.close().await;
        closed.map_err(|e| anyhow::anyhow!("failed to {e}"))?;
        anyhow::ensure!(
            !died,
            "the fleet engine stopped unexpectedly (see the error above); exiting non-zero so the service manager restarts fleetd"
        );
        tracing::info!("fleetd stopped");
        Ok(())
    }

    /// The tools' view of the daemon with its engine started, and the gateway's broker link
    /// when it is one.
    fn fleet(
        &self,
        local: SocketAddr,
    ) -> anyhow::Result<(
        crate::mcp::Fleet,
        Option<(String, crate::store::gateway_link::Link)>,
    )> {
        let config = self.config();
        let api_token = match &config.api_token {
            Some(name) => Some(
                Secrets::new(&config.secrets, &crate::secrets::process_env)
                    .resolve(name)
                    .context("failed to resolve apiToken")?,
            ),
            None => None,
        };
        let clock: crate::clock::SharedClock = Arc::new(crate::clock::SystemClock);
        let redactor = crate::secrets::Redactor::new(self.live_config());
        let gateway = match &config.gateway {
            Some(gw) => {
                let password = match &gw.broker.password_secret {
                    Some(name) => Secrets::new(&config.secrets, &crate::secrets::process_env)
                        .resolve(name)
                        .context("failed to resolve gateway.broker.passwordSecret")?
                        .expose()
                        .to_owned(),
                    None => String::new(),
                };
                // Read once, at start: `gateway` is boot-only.
                let tls = match gw.broker.tls.as_ref().and_then(|t| t.ca_file.as_deref()) {
                    Some(path) => crate::store::gateway_link::LinkTls::from_ca_file(path)
                        .context("failed to load gateway.broker.tls.caFile")?,
                    None => crate::store::gateway_link::LinkTls::system(),
                };
                let (forward, outbox) = tokio::sync::mpsc::unbounded_channel();
                let link = crate::store::gateway_link::LinkConfig {
                    me: gw.name.clone(),
                    urls: gw.broker.urls.clone(),
                    user: gw.broker.user.clone(),
                    password,
                    heartbeat_secs: gw.broker.heartbeat_secs,
                    outbox_alarm: gw.outbox_alarm,
                    tls,
                };
                let parts = crate::engine::GatewayParts {
                    me: gw.name.clone(),
                    peers: gw.peers.clone(),
                    forward,
                    outbox_max: usize::try_from(gw.outbox_max).unwrap_or(usize::MAX),
                    peer_backlog_max: usize::try_from(gw.peer_backlog_max).unwrap_or(usize::MAX),
                };
                Some((parts, link, outbox))
            }
            None => None,
        };
        let (gateway_parts, gateway_link) = match gateway {
            Some((parts, link, outbox)) => (Some(parts), Some((link, outbox))),
            None => (None, None),
        };
        let engine = crate::engine::spawn(crate::engine::EngineParts {
            durable: Some(crate::engine::Durable {
                store: Arc::clone(&self.inner.state),
                legacy_members_file: Some(config.state_dir.join("members.json")),
            }),
            config: self.live_config(),
            clock: Arc::clone(&clock),
            store: Arc::clone(&self.inner.store),
            mux: self.inner.mux.clone(),
            redactor: redactor.clone(),
            gateway: gateway_parts,
        });
        crate::backends::spawn(self.live_config(), engine.downgrade());
        let locator = crate::locate::Locator::new(
            self.inner.mux.clone(),
            crate::locate::LocatorConfig::default(),
        );
        let host = if local.ip().is_unspecified() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            local.ip()
        };
        if !host.is_loopback() {
            // Members reach fleetd at this address, and a connection from a non-loopback
            // address is identified by the API token alone: no member can be told apart.
            tracing::warn!(
                listen = %local,
                "listening on one outside address only: members reach fleetd there, where callers are identified by the API token, not by their pane, so no member can work; listen on 0.0.0.0 (or [::]) to serve this address and loopback both"
            );
        }
        let inbox = crate::inbox::Inbox::new(Arc::clone(&self.inner.store), engine.clone());
        let url = format!("http://{}", SocketAddr::new(host, local.port()));
        crate::sandbox::tidy(engine.clone(), self.live_config());
        let spawner = crate::members::Spawner {
            engine: engine.clone(),
            mux: self.inner.mux.clone(),
            locator: locator.clone(),
            config: self.live_config(),
            redactor: redactor.clone(),
            url,
        };
        let peers = gateway_link
            .as_ref()
            .map(|(link, _)| crate::gateway::presence::Peers::new(link.me.clone()))
            .unwrap_or_default();
        let link = gateway_link.map(|(link, outbox)| {
            let name = link.me.to_string();
            // Runs for the daemon's life: the runtime ends it with the process.
            let link = crate::gateway::service::start(
                link,
                engine.clone(),
                Arc::clone(&self.inner.store),
                spawner.clone(),
                &peers,
                outbox,
                tokio_util::sync::CancellationToken::new(),
            );
            (name, link)
        });
        let human = crate::human::Human::new(
            engine.clone(),
            self.inner.mux.clone(),
            self.live_config(),
            redactor.clone(),
            Arc::clone(&clock),
            spawner.url.clone(),
        );
        human.start();
        Ok((
            crate::mcp::Fleet {
                engine,
                store: Arc::clone(&self.inner.store),
                mux: self.inner.mux.clone(),
                locator,
                config: self.live_config(),
                clock,
                api_token,
                redactor,
                inbox,
                spawner,
                peers,
                calls: crate::conn::MemberCalls::default(),
                human,
            },
            link,
        ))
    }
}

/// The directory (in the state directory) where a tmux member's environment waits for its
/// launcher, for at most a moment.
const LAUNCH_DIR: &str = "launch";

/// The operator's socket's file name inside the state directory: the human CLI's default way
/// in (HTTP over a unix socket; `SO_PEERCRED` with the daemon's own uid makes the operator).
pub const OPERATOR_SOCKET: &str = "api.sock";

/// The operator's socket for a state directory.
pub fn operator_socket_path(state_dir: &std::path::Path) -> std::path::PathBuf {
    state_dir.join(OPERATOR_SOCKET)
}

async fn open_store(config: &Config) -> anyhow::Result<crate::store::Stores> {
    // With the inbox on AMQP the embedded file holds the ingested inbox and the fleet state.
    let state_path = config.state_dir.join("inbox.db");
    let spec = match &config.store {
        Store::Embedded { path } => StoreSpec::Embedded { path: path.clone() },
        Store::Amqp {
            url: AmqpUrl::Literal(url),
        } => StoreSpec::Amqp {
            url: url.clone(),
            path: state_path,
        },
        Store::Amqp {
            url: AmqpUrl::Secret(name),
        } => {
            let secrets = Secrets::new(&config.secrets, &crate::secrets::process_env);
            let url = secrets
                .resolve(name)
                .context("failed to resolve store.url")?;
            StoreSpec::Amqp {
                url: url.expose().to_owned(),
                path: state_path,
            }
        }
    };
    let limits = MessageLimits {
        max_message_bytes: usize::try_from(config.inbox.max_message_bytes).unwrap_or(usize::MAX),
    };
    crate::store::open_stores(&spec, &StoreOptions { limits })
        .await
        .map_err(|e| anyhow::anyhow!("failed to {e}"))
}

/// Picks the multiplexer: herdr or tmux as configured; `auto` uses herdr when its socket answers
/// `ping`, else tmux.
async fn open_mux(config: &Config) -> anyhow::Result<(MuxRouter, Vec<(MuxDaemon, String)>)> {
    let herdr_socket = config.herdr_socket.clone();
    let use_herdr = match config.multiplexer {
        MultiplexerChoice::Herdr => true,
        MultiplexerChoice::Tmux => false,
        MultiplexerChoice::Auto => {
            herdr_socket.exists()
                && Herdr::new(HerdrConfig::new(&herdr_socket))
                    .ping()
                    .await
                    .is_ok()
        }
    };
    if !use_herdr {
        let socket = match &config.tmux_socket {
            Some(path) => TmuxSocket::Path(path.clone()),
            None => TmuxSocket::Default,
        };
        let endpoint = match &socket {
            TmuxSocket::Path(p) => p.display().to_string(),
            _ => "default tmux server".to_owned(),
        };
        // Launch files of a daemon that died before its panes read them go first.
        let launch_dir = config.state_dir.join(LAUNCH_DIR);
        let _ = std::fs::remove_dir_all(&launch_dir);
        let tmux: Arc<dyn Multiplexer> = Arc::new(Tmux::new(TmuxConfig {
            launch_dir: Some(launch_dir),
            server_umask: crate::state_dir::user_umask(),
            ..TmuxConfig::new(socket)
        }));
        return Ok((
            MuxRouter::new(tmux, None),
            vec![(MuxDaemon::Lead, endpoint)],
        ));
    }
    let mut endpoints = vec![(MuxDaemon::Lead, herdr_socket.display().to_string())];
    let lead: Arc<dyn Multiplexer> = Arc::new(checked_herdr(&herdr_socket).await?);
    let member = match &config.member_herdr_socket {
        Some(path) => {
            endpoints.push((MuxDaemon::Member, path.display().to_string()));
            Some(Arc::new(checked_herdr(path).await?) as Arc<dyn Multiplexer>)
        }
        None => None,
    };
    Ok((MuxRouter::new(lead, member), endpoints))
}

/// A herdr client whose protocol was checked when the daemon answers; one that does not answer
/// yet is kept (herdr may start after fleetd) and shows as degraded in `/healthz`.
async fn checked_herdr(socket: &std::path::Path) -> anyhow::Result<Herdr> {
    let herdr = Herdr::new(HerdrConfig::new(socket));
    match herdr.check_protocol().await {
        Ok(info) => {
            tracing::info!(socket = %socket.display(), version = %info.version, protocol = ?info.protocol, "herdr answered");
            Ok(herdr)
        }
        Err(e @ crate::mux::MuxError::Protocol(_)) => Err(anyhow::anyhow!(e)),
        Err(e) => {
            tracing::warn!(socket = %socket.display(), error = %e, "herdr does not answer yet; /healthz reports degraded until it does");
            Ok(herdr)
        }
    }
}

/// Opens the daemon for `config` and serves on `listener` until `shutdown`.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    Daemon::open(config).await?.run(listener, shutdown).await
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let ctrl_c = tokio::signal::ctrl_c();
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => tracing::info!("SIGINT received: shutting down"),
                _ = term.recv() => tracing::info!("SIGTERM received: shutting down"),
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only SIGINT stops fleetd");
            let _ = ctrl_c.await;
        }
    }
}

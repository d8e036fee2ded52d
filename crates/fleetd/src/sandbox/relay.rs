//! `fleetd box-relay`: the first process inside a sandbox without a network. It listens on
//! fleetd's own address in the box's network namespace (so `FLEETD_URL` and the model gateway's
//! URL work unchanged inside), forwards each connection to fleetd's boxed HTTP door
//! (`<state>/door/http.sock`), and runs the member's agent as its child, ending with it. fleetd
//! places each forwarded call by this process, a descendant of the member's pane, so the member
//! is the member through it and nobody else can be.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Relays `listen` to `socket` while `argv` runs; the agent's exit status.
pub async fn run(listen: SocketAddr, socket: PathBuf, argv: &[String]) -> anyhow::Result<i32> {
    let (program, args) = argv
        .split_first()
        .context("box-relay needs the member's command after --")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("box-relay cannot listen on {listen} in the sandbox"))?;
    let mut agent = tokio::process::Command::new(program)
        .args(args)
        .spawn()
        .with_context(|| format!("box-relay cannot start {program}"))?;
    // Ctrl-C typed into the pane is the agent's: the relay stays up for it.
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            status = agent.wait() => {
                return Ok(status.map_or(1, |s| s.code().unwrap_or(1)));
            }
            _ = interrupts.recv() => {}
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(forward(stream, socket.clone()));
                }
            }
        }
    }
}

async fn forward(mut stream: tokio::net::TcpStream, socket: PathBuf) {
    let _ = stream.set_nodelay(true);
    match tokio::net::UnixStream::connect(Path::new(&socket)).await {
        Ok(mut door) => {
            let _ = tokio::io::copy_bidirectional(&mut stream, &mut door).await;
        }
        Err(e) => tracing::debug!(error = %e, "box-relay cannot reach fleetd's door"),
    }
}

//! TLS for tests of `amqps://` gateways: throwaway certificate authorities made with the
//! `openssl` CLI in a temp dir at test time (no key is ever committed), and a TLS-terminating
//! proxy — rustls with the ring provider — in front of the plain broker, serving a certificate
//! such a CA signed. Never used by the daemon.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context as _, bail};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::compat::{FuturesAsyncReadCompatExt as _, TokioAsyncReadCompatExt as _};

use crate::Service;

/// Requires the `openssl` CLI (it makes the test certificates).
pub fn require_openssl() -> Service {
    let found = Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    crate::require(
        "the openssl CLI",
        found,
        "Install it with `apt-get install -y openssl`.",
    )
}

/// A throwaway certificate authority: its key and certificate in a temp dir of its own.
#[derive(Debug)]
pub struct TestCa {
    dir: tempfile::TempDir,
}

/// A certificate a [`TestCa`] signed, and its key (PEM files).
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA named `name` (an ECDSA P-256 key, valid for two days).
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        openssl(
            dir.path(),
            "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign -subj",
            Some(&format!("/CN={name}")),
        )?;
        Ok(Self { dir })
    }

    /// The CA's certificate (what a client is told to trust).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A server certificate for `localhost` and 127.0.0.1, signed by this CA.
    pub fn issue_localhost(&self) -> anyhow::Result<Issued> {
        let dir = self.dir.path();
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )?;
        openssl(
            dir,
            "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj",
            Some("/CN=localhost"),
        )?;
        openssl(
            dir,
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext",
            None,
        )?;
        Ok(Issued {
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        })
    }
}

/// Runs `openssl` in `dir` with `args` (split on spaces) and a last argument that may hold
/// spaces.
fn openssl(dir: &Path, args: &str, last: Option<&str>) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args.split(' '))
        .args(last)
        .current_dir(dir)
        .output()
        .context("run openssl")?;
    if !out.status.success() {
        bail!("openssl {args}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// A TLS-terminating proxy on 127.0.0.1: each connection's TLS is ended here (with the
/// certificate it was started with) and its bytes forwarded in plain TCP to the upstream.
/// Stops when dropped.
#[derive(Debug)]
pub struct TlsProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TlsProxy {
    /// Serves `identity` and forwards to `upstream`.
    pub fn start(upstream: SocketAddr, identity: &Issued) -> anyhow::Result<Self> {
        let certs = CertificateDer::pem_file_iter(&identity.cert)?
            .collect::<Result<Vec<_>, _>>()
            .context("read the certificate")?;
        let key = PrivateKeyDer::from_pem_file(&identity.key).context("read the key")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let acceptor = futures_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let counted = Arc::clone(&handshakes);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Its own runtime on its own thread: the tests that use it are synchronous. Dropping
        // the runtime when `stop` fires ends every connection.
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                tokio::select! {
                    _ = stopped => {}
                    () = serve(listener, acceptor, upstream, counted) => {}
                }
            });
        });
        Ok(Self {
            addr,
            handshakes,
            stop: Some(stop),
        })
    }

    /// TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    acceptor: futures_rustls::TlsAcceptor,
    upstream: SocketAddr,
    handshakes: Arc<AtomicUsize>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let handshakes = Arc::clone(&handshakes);
        tokio::spawn(async move {
            // A client that refuses the certificate ends here, with the handshake.
            let Ok(tls) = acceptor.accept(client.compat()).await else {
                return;
            };
            handshakes.fetch_add(1, Ordering::SeqCst);
            let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut tls.compat(), &mut server).await;
        });
    }
}

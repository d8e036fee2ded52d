//! TLS on the gateway's broker link (`amqps://`): which certificate authorities the link trusts
//! — exactly the PEM bundle `gateway.broker.tls.caFile` names, read once at start, or else the
//! system's roots — and the connection itself, on rustls with the ring provider (lapin's
//! `rustls--ring`; no OpenSSL, no aws-lc). A handshake that fails says what to check: the CA,
//! the host name in the URL, the port of the broker's TLS listener. Knows rustls as lapin
//! re-exports it; knows nothing of what the link carries.

use std::path::{Path, PathBuf};

use lapin::tcp::{AMQPUriTcpExt as _, RustlsConnector, RustlsConnectorConfig, TLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

/// Which certificate authorities an `amqps://` link trusts. Cheap to clone.
#[derive(Clone, Default)]
pub struct LinkTls {
    /// The certificates of `caFile`, and the file they came from; `None`: the system's roots.
    ca: Option<(PathBuf, Vec<CertificateDer<'static>>)>,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.ca {
            Some((path, certs)) => write!(
                f,
                "LinkTls({}, {} certificates)",
                path.display(),
                certs.len()
            ),
            None => f.write_str("LinkTls(system roots)"),
        }
    }
}

/// Why a CA file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not PEM, or holds no certificate.
    #[error("{} holds no usable certificate ({why}): give the CA's certificate in PEM (-----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        why: String,
    },
}

impl LinkTls {
    /// Trusts the system's roots (the OS store, or the bundle `SSL_CERT_FILE` names), loaded at
    /// each connection attempt.
    pub fn system() -> Self {
        Self::default()
    }

    /// Trusts exactly the certificates in the PEM file at `path`, read now, once.
    pub fn from_ca_file(path: &Path) -> Result<Self, TlsError> {
        let pem = std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?;
        let no_certificate = |why: String| TlsError::NoCertificate {
            path: path.to_owned(),
            why,
        };
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| no_certificate(e.to_string()))?;
        if certs.is_empty() {
            return Err(no_certificate("no CERTIFICATE block".to_owned()));
        }
        // Built once here so a certificate rustls cannot parse is refused at start, not
        // silently left out of the roots.
        for cert in &certs {
            RustlsConnectorConfig::default()
                .with_parsable_certificates(vec![cert.clone()])
                .connector_with_no_client_auth()
                .map_err(|e| no_certificate(e.to_string()))?;
        }
        Ok(Self {
            ca: Some((path.to_owned(), certs)),
        })
    }

    /// The rustls client for one connection attempt.
    fn connector(&self) -> Result<RustlsConnector, String> {
        match &self.ca {
            Some((_, certs)) => RustlsConnectorConfig::default()
                .with_parsable_certificates(certs.clone())
                .connector_with_no_client_auth()
                .map_err(|e| format!("cannot use {}: {e}", self.trusted())),
            None => RustlsConnectorConfig::new_with_native_certs()
                .and_then(RustlsConnectorConfig::connector_with_no_client_auth)
                .map_err(|e| {
                    format!("cannot load this system's CA certificates ({e}): set gateway.broker.tls.caFile to the PEM file of the CA that signed the broker's certificate")
                }),
        }
    }

    /// Whom the link trusts, in words for an error.
    fn trusted(&self) -> String {
        match &self.ca {
            Some((path, _)) => format!("the CA in gateway.broker.tls.caFile ({})", path.display()),
            None => "a CA this system trusts (or set gateway.broker.tls.caFile)".to_owned(),
        }
    }
}

/// Connects to `url` (with its credentials): in plain TCP for `amqp://`, over TLS trusting
/// `tls` for `amqps://`. The error never holds the URL (it has the password).
pub(super) async fn connect(
    url: &str,
    props: ConnectionProperties,
    tls: &LinkTls,
) -> Result<Connection, String> {
    let uri: AMQPUri = url
        .parse()
        .map_err(|_| "not a valid AMQP URL (check gateway.broker.urls)".to_owned())?;
    if uri.scheme == AMQPScheme::AMQP {
        return Connection::connect_uri(uri, props)
            .await
            .map_err(|e| e.to_string());
    }
    let connector = tls.connector()?;
    let trusted = tls.trusted();
    let runtime = lapin::runtime::default_runtime().map_err(|e| e.to_string())?;
    Connection::connector(
        uri,
        runtime,
        async move |uri: AMQPUri, runtime| {
            let (host, port) = (uri.authority.host.clone(), uri.authority.port);
            let plain = AMQPUri {
                scheme: AMQPScheme::AMQP,
                ..uri
            };
            let stream = plain
                .connect_with_config_async(TLSConfig::default(), &runtime)
                .await?;
            stream.into_rustls(&connector, &host).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("the TLS handshake with {host}:{port} failed ({e}): check that {trusted} signed the broker's certificate, that {host} is a name in that certificate, and that port {port} is the broker's TLS listener"),
                )
                .into()
            })
        },
        props,
    )
    .await
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_be_readable_and_hold_a_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let e = LinkTls::from_ca_file(&missing).expect_err("missing");
        assert!(e.to_string().starts_with("cannot read"), "{e}");
        for (what, pem) in [
            (
                "a key is no CA",
                "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIB1jwHcXEXy1YB6MQd3UB7D0U6MiZ9aaZ0dsqMXAV5Pd\n-----END PRIVATE KEY-----\n",
            ),
            (
                "not a certificate",
                "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
            ),
        ] {
            let file = dir.path().join("ca.pem");
            std::fs::write(&file, pem).expect("write");
            let e = LinkTls::from_ca_file(&file).expect_err(what);
            assert!(
                e.to_string().contains("no usable certificate"),
                "{what}: {e}"
            );
        }
    }
}

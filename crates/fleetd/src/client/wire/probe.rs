//! The backend health prober's client: one `GET` of a model backend's `healthUrl`, plain
//! HTTP/1.1 over one TCP connection (fleetd carries no TLS client; the configuration refuses an
//! https `healthUrl`), path and query kept, the whole exchange under one timeout. Its errors are
//! worded for a backend, never for fleetd's own daemon.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Why a health endpoint gave no status. Each message reads after "backend down: ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The URL cannot be fetched (validation keeps such URLs out of a running config).
    #[error("its healthUrl {url:?} cannot be fetched: {why}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The connection was refused or could not be made.
    #[error("its health endpoint {url} refused the connection ({reason})")]
    Connect {
        /// The URL.
        url: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// No answer in time.
    #[error("its health endpoint {url} did not answer within {ms} ms")]
    Timeout {
        /// The URL.
        url: String,
        /// The limit.
        ms: u128,
    },
    /// The HTTP exchange broke.
    #[error("its health endpoint {url} broke off the HTTP exchange ({reason})")]
    Http {
        /// The URL.
        url: String,
        /// hyper's words.
        reason: String,
    },
}

/// The HTTP status `url` answers a `GET` with, within `timeout`.
pub(crate) async fn get_status(url: &str, timeout: Duration) -> Result<u16, ProbeError> {
    let target = Target::parse(url)?;
    match tokio::time::timeout(timeout, exchange(url, &target)).await {
        Ok(answer) => answer,
        Err(_) => Err(ProbeError::Timeout {
            url: url.to_owned(),
            ms: timeout.as_millis(),
        }),
    }
}

/// Where a `healthUrl` points.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// Path and query, at least `/`.
    path: String,
}

impl Target {
    fn parse(url: &str) -> Result<Self, ProbeError> {
        let bad = |why: &str| ProbeError::BadUrl {
            url: url.to_owned(),
            why: why.to_owned(),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("it is not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("the prober speaks plain http only"));
        }
        let authority = uri.authority().ok_or_else(|| bad("it names no host"))?;
        Ok(Self {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            path: uri
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str)
                .to_owned(),
        })
    }
}

async fn exchange(url: &str, target: &Target) -> Result<u16, ProbeError> {
    let stream = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| ProbeError::Connect {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
    let http = |e: hyper::Error| ProbeError::Http {
        url: url.to_owned(),
        reason: e.to_string(),
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http)?;
    // Drives the socket; dropped with the exchange (only the status is read, not the body).
    let driver = tokio::spawn(connection);
    let request = http::Request::get(target.path.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .body(Empty::<Bytes>::new())
        .map_err(|e| ProbeError::BadUrl {
            url: url.to_owned(),
            why: e.to_string(),
        })?;
    let answer = sender.send_request(request).await;
    driver.abort();
    Ok(answer.map_err(http)?.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_health_url_keeps_its_path_and_query() {
        assert_eq!(
            Target::parse("http://127.0.0.1:8080/v1/health?deep=1").expect("parses"),
            Target {
                host: "127.0.0.1".to_owned(),
                port: 8080,
                authority: "127.0.0.1:8080".to_owned(),
                path: "/v1/health?deep=1".to_owned(),
            }
        );
        assert_eq!(Target::parse("http://[::1]/").expect("parses").host, "::1");
        assert_eq!(Target::parse("http://lab").expect("parses").path, "/");
        let https = Target::parse("https://api.example.com/health").expect_err("no TLS");
        assert!(https.to_string().contains("plain http only"), "{https}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_worded_for_a_backend() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/health", listener.local_addr().expect("addr"));
        drop(listener);
        let err = get_status(&url, Duration::from_secs(5))
            .await
            .expect_err("nothing listens");
        let text = err.to_string();
        assert!(
            text.contains("health endpoint") && text.contains(&url),
            "{text}"
        );
        assert!(!text.contains("fleetd"), "CLI wording: {text}");
    }
}

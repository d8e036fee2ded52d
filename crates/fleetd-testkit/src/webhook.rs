//! A webhook receiver for the notification tests: an HTTP server on a loopback port (its own
//! runtime, in this process) that records every request it is sent — its headers and JSON body
//! — and answers as told: `200`, `500`, or never (a hung endpoint).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `200 OK`.
    Ok,
    /// `500 Internal Server Error`.
    Fail,
    /// Nothing, ever: the request hangs.
    Hang,
}

/// One request received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Its body, as sent.
    pub raw: Vec<u8>,
    /// Its body as JSON (`Null` when it is not).
    pub body: Value,
}

impl Received {
    /// Header `name` (lower-case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
struct Shared {
    received: Mutex<Vec<Received>>,
    answer: Answer,
}

/// A running receiver.
#[derive(Debug)]
pub struct Webhook {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

impl Webhook {
    /// Starts one that answers `answer`.
    pub fn start(answer: Answer) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let shared = Arc::new(Shared {
            received: Mutex::default(),
            answer,
        });
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = axum::Router::new()
            .fallback(receive)
            .with_state(Arc::clone(&shared));
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            shared,
            _runtime: runtime,
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// What it received so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared
            .received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let received = Received {
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        raw: body.to_vec(),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    shared
        .received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(received);
    match shared.answer {
        Answer::Ok => StatusCode::OK,
        Answer::Fail => StatusCode::INTERNAL_SERVER_ERROR,
        Answer::Hang => std::future::pending().await,
    }
}

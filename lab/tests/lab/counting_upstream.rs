//! An HTTP/1.1 upstream that counts the requests it ran per operation, to hold the proxy's
//! counts against.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// An upstream that counts the requests it ran per method, path and body (one operation
/// each, as the proxy tells them apart).
pub struct CountingUpstream {
    addr: SocketAddr,
    runs: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingUpstream {
    pub async fn start() -> CountingUpstream {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let runs: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let counts = runs.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let counts = counts.clone();
                connections.spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let counts = counts.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body.collect().await.map(|b| b.to_bytes());
                            let body = body.unwrap_or_default();
                            let op = format!(
                                "{} {} {}",
                                parts.method,
                                parts.uri.path(),
                                String::from_utf8_lossy(&body)
                            );
                            *counts.lock().expect("not poisoned").entry(op).or_default() += 1;
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        CountingUpstream { addr, runs, task }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Runs so far, per `METHOD path body`.
    pub fn runs(&self) -> HashMap<String, u64> {
        self.runs.lock().expect("not poisoned").clone()
    }
}

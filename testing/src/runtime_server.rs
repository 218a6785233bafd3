//! A tower service served over loopback from a tokio runtime of its own, on a thread of its
//! own, of either flavour: the server side of the lease-renewal tests, whose claims are renewed
//! (or not) by what that runtime does.

use std::future::Future;
use std::net::SocketAddr;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{BoxError, Service};

/// The server's runtime.
#[derive(Clone, Copy, Debug)]
pub enum Flavour {
    CurrentThread,
    /// Current-thread, its drivers polled every 4 task polls rather than 61.
    CurrentThreadEventInterval4,
    /// Multi-thread, two workers.
    MultiThread,
}

/// A runtime of `flavour`, with IO and time.
pub fn runtime(flavour: Flavour) -> tokio::runtime::Runtime {
    match flavour {
        Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Flavour::CurrentThreadEventInterval4 => {
            let mut b = tokio::runtime::Builder::new_current_thread();
            b.event_interval(4);
            b
        }
        Flavour::MultiThread => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    }
    .enable_all()
    .build()
    .expect("runtime")
}

/// A server on a thread of its own: stopped, and its thread joined, when dropped.
pub struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// The server whose thread ends when `stop`'s receiver hears it dropped.
    pub fn new(
        stop: tokio::sync::oneshot::Sender<()>,
        thread: std::thread::JoinHandle<()>,
    ) -> Server {
        Server {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A listener on a free loopback port, for a runtime that has yet to start.
pub fn listener() -> (std::net::TcpListener, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("addr");
    (listener, addr)
}

/// Accepts connections on `listener` for ever, each served by `svc` over hyper's HTTP/1.1 in
/// a task of its own.
pub async fn accept<S, B>(listener: std::net::TcpListener, svc: S)
where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::from_std(listener).expect("listener");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let svc = svc.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                tower::ServiceExt::oneshot(svc.clone(), req)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Serves the service `make` returns (made on the server's runtime) over loopback from a
/// runtime of `flavour` on a thread of its own, until the returned server is dropped.
pub fn serve_on<F, Fut, S, B>(flavour: Flavour, make: F) -> (SocketAddr, Server)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = S>,
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (listener, addr) = listener();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        runtime(flavour).block_on(async move {
            let svc = make().await;
            tokio::select! {
                _ = accept(listener, svc) => {}
                _ = stop_rx => {}
            }
        });
    });
    (addr, Server::new(stop_tx, thread))
}

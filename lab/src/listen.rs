//! Serving HTTP/1.1 and HTTP/2 connections on a bound listener, until dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::LabError;
use tower_retry_safety::BoxError;

/// Binds `addr`; the error names the address (a port in use, an address not of this host).
pub(crate) async fn bind(flag: &str, addr: SocketAddr) -> Result<TcpListener, LabError> {
    TcpListener::bind(addr)
        .await
        .map_err(|err| LabError::new(flag, format!("cannot listen on {addr}: {err}")))
}

/// The accept loop and every connection it serves; dropping it closes them all (a held
/// answer included), so a proxy or an upstream ends with its owner.
#[derive(Debug)]
pub(crate) struct Listening {
    task: JoinHandle<()>,
    stop: Arc<Notify>,
    open: Arc<AtomicUsize>,
}

/// Counts a connection as open until its task ends, or is aborted.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Listening {
    /// Closes the listener; connections already open are served until dropped.
    pub(crate) fn stop_accepting(&self) {
        // A stored permit: the accept loop sees it even if it is not waiting right now.
        self.stop.notify_one();
    }

    /// Connections being served now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves each connection with `handler`, HTTP/1.1 or HTTP/2 as the client speaks (hyper's
/// auto server).
pub(crate) fn serve<F, Fut, B, E>(listener: TcpListener, handler: F) -> Listening
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<B>, E>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    E: Into<BoxError>,
{
    serve_connections(listener, move |stream| {
        let svc = service_fn(handler.clone());
        async move {
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        }
    })
}

/// Serves each accepted connection with `connection`, in a task of its own.
pub(crate) fn serve_connections<F, Fut>(listener: TcpListener, connection: F) -> Listening
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let stop = Arc::new(Notify::new());
    let stopped = stop.clone();
    let open = Arc::new(AtomicUsize::new(0));
    let counter = open.clone();
    let task = tokio::spawn(async move {
        // Owned here: aborting this task drops the set, which aborts every connection.
        let mut connections = JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                _ = stopped.notified() => break,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else {
                // Out of descriptors, or a connection reset before accept: keep serving, after
                // a pause that lets connections close (no busy loop while descriptors lack).
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let open = Open(counter.clone());
            let serving = connection(stream);
            connections.spawn(async move {
                serving.await;
                drop(open);
            });
        }
        drop(listener);
        while connections.join_next().await.is_some() {}
    });
    Listening { task, stop, open }
}

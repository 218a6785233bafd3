//! Errors that tower and hyper-util return in place of sending, built through the real crates:
//! each is classified on what it proves about the service below (called or not).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tower::buffer::Buffer;
use tower::load_shed::LoadShed;
use tower::util::Optional;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_retry_safety::classify::classify_error;
use tower_retry_safety::{FailureClass, RetryPolicy, StopReason};

type Req = Request<String>;
type Res = Response<String>;

/// An inner service that counts its calls. `ready`: whether `poll_ready` says so (`None`:
/// it fails); `panics`: whether `call` panics after counting.
#[derive(Clone)]
struct Inner {
    calls: Arc<AtomicUsize>,
    ready: Option<bool>,
    panics: bool,
}

impl Inner {
    fn new(ready: Option<bool>, panics: bool) -> Self {
        Inner {
            calls: Arc::default(),
            ready,
            panics,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Req> for Inner {
    type Response = Res;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Res, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.ready {
            Some(true) => Poll::Ready(Ok(())),
            Some(false) => Poll::Pending,
            None => Poll::Ready(Err("pool closed".into())),
        }
    }

    fn call(&mut self, _: Req) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        assert!(!self.panics, "the inner call panics after it was made");
        std::future::ready(Ok(Response::new(String::new())))
    }
}

fn post() -> Req {
    Request::post("/v1/messages").body(String::new()).unwrap()
}

#[tokio::test]
async fn load_shed_overloaded_is_not_sent_and_a_post_is_retried() {
    let inner = Inner::new(Some(false), false);
    let err = LoadShed::new(inner.clone())
        .oneshot(post())
        .await
        .unwrap_err();
    assert!(err.is::<tower::load_shed::error::Overloaded>(), "{err:?}");
    assert_eq!(classify_error(&*err), FailureClass::NotSent);

    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .no_budget()
        .build()
        .unwrap();
    let err = policy
        .layer(LoadShed::new(inner.clone()))
        .oneshot(post())
        .await
        .unwrap_err();
    assert!(err.is_not_sent(), "{err:?}");
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn optional_none_is_not_sent() {
    let err = Optional::new(None::<Inner>)
        .oneshot(post())
        .await
        .unwrap_err();
    assert!(err.is::<tower::util::error::optional::None>(), "{err:?}");
    assert_eq!(classify_error(&*err), FailureClass::NotSent);
}

#[tokio::test]
async fn buffer_service_error_is_not_sent() {
    // The inner readiness fails: the worker hands the request a ServiceError instead of
    // calling the inner service, and so every later one.
    let inner = Inner::new(None, false);
    let (mut buffer, worker) = Buffer::pair(inner.clone(), 4);
    tokio::spawn(worker);
    let first = buffer
        .ready()
        .await
        .unwrap()
        .call(post())
        .await
        .unwrap_err();
    assert!(
        first.is::<tower::buffer::error::ServiceError>(),
        "{first:?}"
    );
    assert_eq!(classify_error(&*first), FailureClass::NotSent);
    let later = buffer.ready().await.unwrap_err();
    assert!(
        later.is::<tower::buffer::error::ServiceError>(),
        "{later:?}"
    );
    assert_eq!(classify_error(&*later), FailureClass::NotSent);
    assert_eq!(inner.calls(), 0);
}

#[tokio::test]
async fn buffer_closed_is_ambiguous_because_the_inner_call_may_have_run() {
    // The inner call ran, then panicked in the worker: the caller sees Closed.
    let inner = Inner::new(Some(true), true);
    let (mut buffer, worker) = Buffer::pair(inner.clone(), 4);
    tokio::spawn(worker);
    let err = buffer
        .ready()
        .await
        .unwrap()
        .call(post())
        .await
        .unwrap_err();
    assert!(err.is::<tower::buffer::error::Closed>(), "{err:?}");
    assert_eq!(inner.calls(), 1);
    assert_eq!(classify_error(&*err), FailureClass::Ambiguous);
}

type Connecting = Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TcpStream>>> + Send>>;

/// Connects, then waits until the server's first bytes have arrived, so hyper's connection
/// task reads them before it handles the request.
fn connect(uri: Uri) -> Connecting {
    Box::pin(async move {
        let stream = TcpStream::connect(uri.authority().map_or("", |a| a.as_str())).await?;
        stream.readable().await?;
        Ok(TokioIo::new(stream))
    })
}

#[tokio::test]
async fn hyper_util_canceled_is_not_sent() {
    // An HTTP/2 server that says GOAWAY (last-stream-id 0) before any request: hyper gives
    // the request back unsent, and hyper-util returns it as Canceled on a fresh connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            // SETTINGS (empty), then GOAWAY: last-stream-id 0, NO_ERROR. Kept open.
            let frames = [
                0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
            ];
            let _ = socket.write_all(&frames).await;
            tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut socket, &mut sink).await;
            });
        }
    });
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, Empty<Bytes>>(tower::service_fn(connect));
    let req = Request::post(format!("http://{addr}/v1/messages"))
        .body(Empty::new())
        .unwrap();
    let err = client.request(req).await.unwrap_err();
    // The kind is read from Display: pin the string.
    assert_eq!(err.to_string(), "client error (Canceled)", "{err:?}");
    assert_eq!(classify_error(&err), FailureClass::NotSent);
}

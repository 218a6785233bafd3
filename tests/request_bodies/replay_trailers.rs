//! A streamed upload with trailers, over hyper's HTTP/1.1 on loopback: the retry replays the
//! body chunked, trailers included (a replay that claimed an exact length would go out with a
//! content-length, and hyper would drop the trailers).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport};

/// What each attempt delivered to the server: its bytes and its trailers.
type Seen = Arc<Mutex<Vec<(Bytes, Option<HeaderMap>)>>>;

/// Reads each request whole; answers the first 503, the others 200.
async fn serve() -> (std::net::SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let state = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = state.clone();
                    async move {
                        let collected = req.into_body().collect().await?;
                        let trailers = collected.trailers().cloned();
                        let first = {
                            let mut seen = state.lock().unwrap();
                            seen.push((collected.to_bytes(), trailers));
                            seen.len() == 1
                        };
                        let mut res = Response::new(Empty::<Bytes>::new());
                        if first {
                            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        }
                        Ok::<_, hyper::Error>(res)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_chunked_upload_is_replayed_with_its_trailers() {
    let (addr, seen) = serve().await;
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("c0ffee"));
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"part one, "))),
        Ok(Frame::data(Bytes::from_static(b"part two"))),
        Ok(Frame::trailers(trailers.clone())),
    ];
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    let req = Request::put(format!("http://{addr}/v1/files/1"))
        // hyper sends the trailer fields the request declares.
        .header("trailer", "x-checksum")
        .body(body)
        .unwrap();
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(5), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<BoxBody<Bytes, Infallible>>();
    let res = policy.layer(client).oneshot(req).await.unwrap();
    let report = RetryReport::of(&res).unwrap().clone();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "{report:?} {:?}",
        seen.lock().unwrap()
    );
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 2);
    let seen = seen.lock().unwrap();
    let whole = Bytes::from_static(b"part one, part two");
    assert_eq!(
        *seen,
        [
            (whole.clone(), Some(trailers.clone())),
            (whole, Some(trailers))
        ]
    );
}

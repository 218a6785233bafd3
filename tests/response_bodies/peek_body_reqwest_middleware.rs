//! `PeekBodyMiddleware`, the response body classifier's reqwest adapter, from an adversarial
//! review: it keeps the whole response, delivers a body error, does not wait on a chunked stream
//! that also declares a content-length, and, misordered, never retries a write.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::peek_body_support::{policy, rate_limited, raw_server};
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use tower_retry_safety::peek::PeekBodyMiddleware;
use tower_retry_safety::{FailureClass, RetrySafetyMiddleware};

#[derive(Clone, Debug, PartialEq)]
struct Marker(u32);

/// Innermost: marks each response with an extension of its own.
struct Mark;
#[async_trait::async_trait]
impl Middleware for Mark {
    async fn handle(
        &self,
        req: reqwest::Request,
        ext: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut res = next.run(req, ext).await?;
        res.extensions_mut().insert(Marker(7));
        Ok(res)
    }
}

#[tokio::test]
async fn the_reqwest_middleware_keeps_the_whole_response() {
    let raw: &'static [u8] =
        b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nx-a: 1\r\nx-a: 2\r\n\r\nok";
    let (addr, _) = raw_server(raw, Duration::ZERO).await;
    let url = format!("http://{addr}/a?secret=1");
    let plain = reqwest::Client::new();
    let want = plain.get(&url).send().await.unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .with(PeekBodyMiddleware::new(4096, |_, _, _: &[u8]| None).when(|_, _| true))
        .with(Mark)
        .build();
    let res = client.get(&url).send().await.unwrap();
    assert_eq!(res.status(), want.status());
    assert_eq!(res.version(), want.version());
    assert_eq!(res.headers(), want.headers());
    assert_eq!(res.url(), want.url());
    assert_eq!(res.remote_addr(), want.remote_addr());
    assert!(res.remote_addr().is_some());
    assert_eq!(res.content_length(), want.content_length());
    assert_eq!(res.extensions().get::<Marker>(), Some(&Marker(7)));
    assert_eq!(res.bytes().await.unwrap(), want.bytes().await.unwrap());
}

/// A body cut short: the caller still gets the error (a body error).
#[tokio::test]
async fn the_reqwest_middleware_delivers_a_body_error() {
    let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_";
    let (addr, count) = raw_server(raw, Duration::ZERO).await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .with(PeekBodyMiddleware::new(4096, |_, _, _: &[u8]| {
            Some(FailureClass::NotSent)
        }))
        .build();
    let res = client
        .post(format!("http://{addr}/charge"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let err = res.bytes().await.unwrap_err();
    assert!(err.is_body() || err.is_decode(), "{err:?}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// As the tower test: the default classifier waits on a chunked stream that also carries
/// a Content-Length header.
#[tokio::test]
async fn the_reqwest_middleware_waits_on_a_chunked_stream_with_a_content_length() {
    let raw: &'static [u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n3\r\nabc\r\n";
    let (addr, _) = raw_server(raw, Duration::from_secs(30)).await;
    // Control: without the classifier the head arrives at once.
    let plain = reqwest::Client::new()
        .get(format!("http://{addr}/events"))
        .send();
    let head = tokio::time::timeout(Duration::from_secs(2), plain).await;
    assert_eq!(head.expect("control").unwrap().status(), 200);
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .with(PeekBodyMiddleware::new(4096, rate_limited))
        .build();
    let sent = client.get(format!("http://{addr}/events")).send();
    let res = tokio::time::timeout(Duration::from_secs(2), sent).await;
    assert!(
        res.is_ok(),
        "the head of a stream was held back by the default classifier"
    );
}

/// Added before `RetrySafetyMiddleware`, the classifier runs once, after the retries: its
/// verdict cannot make a write retryable. (Misordering is silent.)
#[tokio::test]
async fn misordered_middleware_never_retries_a_write() {
    let raw: &'static [u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nrate_limited";
    let (addr, count) = raw_server(raw, Duration::ZERO).await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(PeekBodyMiddleware::new(4096, rate_limited))
        .with(RetrySafetyMiddleware::new(policy()))
        .build();
    let res = client
        .post(format!("http://{addr}/charge"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(res.bytes().await.unwrap(), "rate_limited");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

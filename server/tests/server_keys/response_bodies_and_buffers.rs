//! The server layer's edge cases, from an adversarial review of its performance rework (each
//! failed before its fix): a response body that fails mid-stream reaches the client as a
//! failure, not a clean shorter body (in process and over hyper); a stored header value does
//! not pin a connection's buffer (nor, for comparison, does a stored one-chunk body); a stored
//! response's trailers are answered again.

use crate::keyed_requests::{body_of, keyed, Chunk, In};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

fn failing_body() -> StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Chunk>>> {
    StreamBody::new(futures_util::stream::iter(vec![
        Ok(Frame::data(Bytes::from_static(b"partial-"))),
        Err::<Frame<Bytes>, BoxError>("upstream reset mid-body".into()),
    ]))
}

/// A response body that fails mid-stream: the layer reads it for the store, meets the error,
/// keeps the head — and hands the client the part read, then the rest of the body, which is
/// over (the error was consumed by the layer). The client sees a body that ended cleanly: a
/// truncated response taken for a whole one. The error must reach the client.
#[tokio::test]
async fn a_response_body_failing_mid_stream_is_not_handed_on_as_a_whole_body() {
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(|_req: In| async {
        Ok::<_, Infallible>(Response::new(failing_body()))
    }));
    let res = svc.clone().oneshot(keyed("mid", "x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let got = res.into_body().collect().await.map(|c| c.to_bytes());
    // Without the layer, collect() fails ("upstream reset mid-body").
    let direct = failing_body().collect().await;
    assert!(direct.is_err(), "the body itself fails");
    assert!(
        got.is_err(),
        "the body failed mid-stream, but the client got a clean end of body: {got:?}"
    );
}

/// The same over real sockets (hyper server, chunked): the client must not receive a proper
/// chunked terminator, i.e. a complete response, when the handler's body failed.
#[tokio::test]
async fn over_hyper_a_failing_response_body_is_a_clean_truncated_response() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(|_req: Request<_>| async {
        let body = StreamBody::new(futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"partial-"))),
            Err::<Frame<Bytes>, std::io::Error>(std::io::Error::other("upstream reset")),
        ]));
        Ok::<_, Infallible>(Response::new(body))
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    svc.clone().oneshot(req)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nidempotency-key: \"sock\"\r\ncontent-length: 1\r\nconnection: close\r\n\r\nx",
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    // hyper may abort the connection before it flushes what it had (the client then sees no
    // response at all): either way, never a clean end.
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a failed body was ended with a clean chunked terminator (the client cannot tell it \
         was cut):\n{text}"
    );
}

/// Tracks whether the allocation behind a `Bytes` is still alive.
struct Tracked(Arc<AtomicBool>, Vec<u8>);

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.1
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A big buffer (think: hyper's read buffer of a proxied upstream response) of which the
/// response keeps a 12-byte slice as a header value. MemoryStore copies the body into a buffer
/// of its own (so a body slice does not pin its buffer) but keeps header values as given: the
/// 1 MiB buffer stays alive as long as the entry, while the store accounts ~200 bytes for it.
/// hyper's h1 parser makes every header value a slice of the connection's read buffer.
#[tokio::test]
async fn a_stored_header_value_does_not_pin_a_large_buffer() {
    let freed = Arc::new(AtomicBool::new(false));
    let big = Bytes::from_owner(Tracked(freed.clone(), vec![b'h'; 1 << 20]));
    let store = MemoryStore::new();
    let layer = IdempotencyLayer::new(store);
    let value = big.slice(0..12);
    drop(big);
    let value = Arc::new(std::sync::Mutex::new(Some(value)));
    let svc = layer.layer(service_fn(move |_req: In| {
        let v = value.lock().unwrap().take().unwrap();
        async move {
            let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
            res.headers_mut()
                .insert("x-upstream", HeaderValue::from_maybe_shared(v).unwrap());
            Ok::<_, Infallible>(res)
        }
    }));
    let res = svc.clone().oneshot(keyed("hdr", "x")).await.unwrap();
    drop(body_of(res).await);
    let again = svc.clone().oneshot(keyed("hdr", "x")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["x-upstream"], "hhhhhhhhhhhh");
    drop(again);
    assert!(
        freed.load(Ordering::SeqCst),
        "the store keeps a 12-byte header that pins a 1 MiB buffer (MemoryStore accounts only \
         for the 12 bytes): its byte limit does not bound its memory"
    );
}

/// For comparison: a one-chunk body sliced from the same kind of buffer is copied by
/// MemoryStore (with_own_body), so it does not pin the buffer.
#[tokio::test]
async fn a_stored_one_chunk_body_does_not_pin_a_large_buffer() {
    let freed = Arc::new(AtomicBool::new(false));
    let big = Bytes::from_owner(Tracked(freed.clone(), vec![b'b'; 1 << 20]));
    let chunk = Arc::new(std::sync::Mutex::new(Some(big.slice(0..10))));
    drop(big);
    let layer = IdempotencyLayer::new(MemoryStore::new());
    let svc = layer.layer(service_fn(move |_req: In| {
        let c = chunk.lock().unwrap().take().unwrap();
        async move { Ok::<_, Infallible>(Response::new(Full::new(c))) }
    }));
    let res = svc.clone().oneshot(keyed("body", "x")).await.unwrap();
    assert_eq!(body_of(res).await, "bbbbbbbbbb");
    let again = svc.clone().oneshot(keyed("body", "x")).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(again).await, "bbbbbbbbbb");
    assert!(freed.load(Ordering::SeqCst), "the body's buffer is pinned");
}

/// The server layer stores a response whose body ends with trailers and answers a repeat of
/// the key with the same body and the same trailers (gRPC's status lives there). Moved here
/// from the client's tests/request_bodies/replay_trailers.rs.
#[tokio::test]
async fn a_repeat_gets_the_stored_responses_trailers() {
    use http::HeaderMap;
    use http_body_util::Either;
    use std::sync::atomic::AtomicUsize;

    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = tower::service_fn(move |_req: Request<Either<Full<Bytes>, Full<Bytes>>>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-outcome", HeaderValue::from_static("done"));
            let frames = vec![
                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"body"))),
                Ok(Frame::trailers(trailers)),
            ];
            Ok::<_, Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(
                frames,
            ))))
        }
    });
    let svc = IdempotencyLayer::new(MemoryStore::new()).layer(handler);
    let send = || {
        Request::post("/v1/jobs")
            .header("idempotency-key", "\"t-1\"")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap()
    };
    for stored in [false, true] {
        let res = svc.clone().oneshot(send()).await.unwrap();
        assert_eq!(res.headers().contains_key("idempotent-replayed"), stored);
        let collected = res.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["x-outcome"], "done");
        assert_eq!(collected.to_bytes(), "body");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

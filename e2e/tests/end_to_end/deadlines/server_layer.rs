//! The server's half through real sockets: `DeadlineLayer` in front of the idempotency layer
//! and a handler that counts its calls.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{service_fn, BoxError, ServiceBuilder};
use tower_idempotency_keys::deadline::{DeadlineLayer, DEADLINE_NOTE};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::deadline::Inbound;

use retry_safety_testing::runtime_server::{accept, listener};

const MAX: Duration = Duration::from_secs(2);

/// A server on loopback: the deadline layer, the idempotency layer, and a handler that counts
/// its calls and answers the time it was given, in milliseconds.
fn server() -> (std::net::SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let handler = service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
        seen.fetch_add(1, Ordering::SeqCst);
        let left = req
            .extensions()
            .get::<Inbound>()
            .map_or(u128::MAX, |i| i.remaining().as_millis());
        async move { Ok::<_, BoxError>(Response::new(Full::new(Bytes::from(left.to_string())))) }
    });
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(MAX))
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service(handler);
    let (socket, addr) = listener();
    tokio::spawn(accept(socket, svc));
    (addr, calls)
}

async fn send(req: Request<Full<Bytes>>) -> (Response<()>, String) {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let res = client.request(req).await.expect("a response");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        Response::from_parts(parts, ()),
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn get(addr: std::net::SocketAddr, timeout: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}/work"))
        .header("request-timeout-ms", timeout)
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// A request that arrives with no time left is answered 504 at once; the handler is not
/// called. A gRPC call with `grpc-timeout: 0m` gets `DEADLINE_EXCEEDED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_caller_has_gone_is_answered_at_once_and_nothing_runs() {
    let (addr, calls) = server();
    let (res, _) = send(get(addr, "0")).await;
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    let grpc = Request::post(format!("http://{addr}/lab.v1.Ledger/Put"))
        .header("content-type", "application/grpc")
        .header("grpc-timeout", "0m")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let (res, _) = send(grpc).await;
    assert_eq!(res.headers()["grpc-status"], "4");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// Bad deadline headers are ignored (the server's maximum applies) and one over the maximum
/// is capped; the answer says which. The handler runs each time, within the maximum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_or_long_deadline_headers_are_ignored_or_capped_and_the_answer_says_which() {
    let (addr, calls) = server();
    let cases = [
        ("abc", Some("ignored-malformed")),
        ("-5", Some("ignored-malformed")),
        ("1.5", Some("ignored-malformed")),
        ("99999999999999999999", Some("ignored-too-long")),
        ("3600000", Some("capped")),
        ("1000", None),
    ];
    for (value, note) in cases {
        let (res, left) = send(get(addr, value)).await;
        assert_eq!(res.status(), StatusCode::OK, "{value}");
        assert_eq!(
            res.headers()
                .get(DEADLINE_NOTE)
                .map(|v| v.to_str().expect("ascii")),
            note,
            "{value}"
        );
        let left: u128 = left.parse().expect("milliseconds");
        assert!(left <= MAX.as_millis(), "{value}: {left} ms");
    }
    assert_eq!(calls.load(Ordering::SeqCst), cases.len() as u32);
}

/// A keyed request whose deadline passes while its body arrives (after the layer read the
/// deadline, before the key is claimed and the handler called) is answered 504 and its key is
/// freed: the same key with time left then runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_whose_deadline_passes_before_its_handler_frees_its_key() {
    let (addr, calls) = server();
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = "POST /work HTTP/1.1\r\nhost: x\r\nidempotency-key: \"k-1\"\r\n\
                request-timeout-ms: 50\r\ncontent-length: 2\r\n\r\n{";
    stream.write_all(head.as_bytes()).await.expect("head");
    // The rest of the body comes after the deadline.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stream.write_all(b"}").await.expect("body");
    let mut answer = vec![0; 1024];
    let n = stream.read(&mut answer).await.expect("answer");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler did not run");
    let again = Request::post(format!("http://{addr}/work"))
        .header("idempotency-key", "\"k-1\"")
        .header("request-timeout-ms", "1000")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let (res, _) = send(again).await;
    assert_eq!(res.status(), StatusCode::OK, "the key was free");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

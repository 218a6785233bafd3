//! The server's rule through real sockets: once a keyed handler has been called, its key is
//! never freed. Each write is applied exactly once, whatever happens after the handler
//! started: the client times out or disconnects mid-handler, a server-side timeout or an
//! error cuts the handler after it applied.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use retry_safety_testing::fault_server::FaultServer;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::{RetryPolicy, RetryReport};

/// The client gives up on an attempt after this...
const CLIENT_TIMEOUT: Duration = Duration::from_millis(300);
/// ...while the handler, having applied, takes this long to answer.
const AFTER_APPLY: &str = "1200";
const OPS: usize = 4;

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Retries that outlast the handler: a 409 while it runs asks for 1 s.
fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .mint_idempotency_keys(true)
        .max_retries(8)
        .backoff(Duration::from_millis(50), Duration::from_millis(400))
        .no_budget()
        .build()
        .unwrap()
}

fn slow_post(url: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("x-handler-delay-ms", AFTER_APPLY)
        .body(Full::new(Bytes::from_static(b"{\"to\":\"a@example.com\"}")))
        .unwrap()
}

/// The Composio case over hyper-util: the email is sent, the rest of the handler is slower
/// than the client's timeout; the client drops the connection and retries with the same key.
#[tokio::test]
async fn tower_client_timing_out_mid_handler_gets_the_stored_response_of_one_run() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let svc = ServiceBuilder::new()
        .layer(policy())
        .timeout(CLIENT_TIMEOUT)
        .service(client());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OPS {
        let (svc, url) = (svc.clone(), server.url(&format!("tower-{i}")));
        tasks.spawn(async move { svc.oneshot(slow_post(&url)).await });
    }
    while let Some(done) = tasks.join_next().await {
        let res = done.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        let report = res.extensions().get::<RetryReport>().unwrap();
        assert!(report.attempts() >= 2, "{report:?}");
    }
    for i in 0..OPS {
        assert_eq!(server.applied(&format!("tower-{i}")), 1, "tower-{i}");
    }
}

/// The same through reqwest-middleware, with reqwest's per-request timeout.
#[tokio::test]
async fn reqwest_client_timing_out_mid_handler_gets_the_stored_response_of_one_run() {
    use tower_retry_safety::RetrySafetyMiddleware;

    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy()))
        .build();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OPS {
        let (client, url) = (client.clone(), server.url(&format!("reqwest-{i}")));
        tasks.spawn(async move {
            client
                .post(url)
                .timeout(CLIENT_TIMEOUT)
                .header("x-handler-delay-ms", AFTER_APPLY)
                .body("{\"to\":\"a@example.com\"}")
                .send()
                .await
        });
    }
    while let Some(done) = tasks.join_next().await {
        let res = done.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
    }
    for i in 0..OPS {
        assert_eq!(server.applied(&format!("reqwest-{i}")), 1, "reqwest-{i}");
    }
}

/// A client that sends a keyed write and disconnects while the handler runs: the handler
/// finishes, a repeat meanwhile gets 409, a repeat afterwards the stored response.
#[tokio::test]
async fn a_client_disconnecting_mid_handler_leaves_one_run_and_its_response() {
    let server = FaultServer::start_with_keys(IdempotencyLayer::new(MemoryStore::new())).await;
    let body = "{\"to\":\"a@example.com\"}";
    let raw = format!(
        "POST /ops/gone HTTP/1.1\r\nhost: {}\r\nidempotency-key: \"k-gone\"\r\n\
         x-handler-delay-ms: 1000\r\ncontent-length: {}\r\n\r\n{body}",
        server.addr(),
        body.len()
    );
    let mut socket = TcpStream::connect(server.addr()).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    for _ in 0..200 {
        if server.applied("gone") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(server.applied("gone"), 1, "the handler ran");
    drop(socket);

    let again = || {
        Request::post(server.url("gone"))
            .header("idempotency-key", "\"k-gone\"")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    let meanwhile = client().request(again()).await.unwrap();
    assert_eq!(meanwhile.status(), StatusCode::CONFLICT);
    let mut after = client().request(again()).await.unwrap();
    for _ in 0..100 {
        if after.status() != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = client().request(again()).await.unwrap();
    }
    assert_eq!(after.status(), StatusCode::OK);
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    let text = after.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, "POST gone");
    assert_eq!(server.applied("gone"), 1);
}

type Applied = Arc<Mutex<HashMap<String, u32>>>;

#[derive(Clone, Copy)]
enum Ending {
    /// The handler applies, then is cut by a `tower::timeout` inside the layer.
    ServerTimeout,
    /// The handler applies, then returns an error.
    ErrorAfterApply,
}

/// A keyed hyper server: `IdempotencyLayer` over a handler that applies (counted per path)
/// and then ends as `ending` says.
async fn keyed_server(ending: Ending) -> (SocketAddr, Applied) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let applied = Applied::default();
    let counts = applied.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (counts, layer) = (counts.clone(), layer.clone());
            let handler = tower::service_fn(move |req: Request<Either<Full<Bytes>, Incoming>>| {
                *counts
                    .lock()
                    .unwrap()
                    .entry(req.uri().path().to_owned())
                    .or_default() += 1;
                async move {
                    match ending {
                        Ending::ServerTimeout => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            Ok(Response::new(Full::new(Bytes::from_static(b"late"))))
                        }
                        // A concrete error type: a handler returning a boxed error
                        // under `tower::timeout` trips rustc's higher-ranked `Send` proof
                        // inside `tokio::spawn`.
                        Ending::ErrorAfterApply => Err(std::io::Error::other(
                            "the backend went away after the write",
                        )),
                    }
                }
            });
            let svc = ServiceBuilder::new()
                .layer(layer)
                .timeout(Duration::from_millis(200))
                .service(handler);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| svc.clone().oneshot(req));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, applied)
}

/// The handler was cut after it applied: hyper closes the first attempt's connection (an
/// ambiguous failure), the keyed retry gets the stored \"outcome unknown\" entry, which says
/// not to retry, and the write ran once.
async fn cut_after_apply(ending: Ending) {
    let (addr, applied) = keyed_server(ending).await;
    let svc = tower::Layer::layer(&policy(), client());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..OPS {
        let (svc, url) = (svc.clone(), format!("http://{addr}/v1/send/{i}"));
        tasks.spawn(async move {
            svc.oneshot(
                Request::post(url)
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap(),
            )
            .await
        });
    }
    while let Some(done) = tasks.join_next().await {
        let res = done.unwrap().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert_eq!(res.headers()["x-should-retry"], "false");
        assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 2);
    }
    let applied = applied.lock().unwrap();
    assert_eq!(applied.len(), OPS);
    assert!(applied.values().all(|&n| n == 1), "{applied:?}");
}

#[tokio::test]
async fn a_server_side_timeout_after_apply_keeps_the_key() {
    cut_after_apply(Ending::ServerTimeout).await;
}

#[tokio::test]
async fn a_handler_error_after_apply_keeps_the_key() {
    cut_after_apply(Ending::ErrorAfterApply).await;
}

//! Nothing secret leaks: no query string, body byte or header value other than the request id
//! and the idempotency key appears in an error's Display or Debug, a report, or a tracing
//! event; those two are capped in length wherever they are echoed.

use std::time::Duration;

use http::Request;
use retry_safety_testing::logs::{block_on, capture};
use retry_safety_testing::script::{status, Outcome, Reset, Script, Timeout};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{RetryPolicy, RetryReport};

const SECRETS: [&str; 5] = [
    "QUERYSECRET",
    "BODYSECRET",
    "AUTHSECRET",
    "COOKIESECRET",
    "CUSTOMSECRET",
];

fn request(method: &str, request_id: &str, key: &str) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("http://api.test/v1/tools/execute?token=QUERYSECRET&x=1")
        .header("authorization", "Bearer AUTHSECRET")
        .header("cookie", "session=COOKIESECRET")
        .header("x-custom", "CUSTOMSECRET")
        .header("x-request-id", request_id)
        .header("idempotency-key", key)
        .body("{\"card\":\"BODYSECRET\"}".to_owned())
        .unwrap()
}

fn everything_echoed(method: &str, request_id: &str, key: &str, script: Vec<Outcome>) -> String {
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .build()
        .unwrap();
    let (logs, text) = capture(|| {
        block_on(async {
            let out = policy
                .layer(Script::new(script))
                .oneshot(request(method, request_id, key))
                .await;
            match out {
                Ok(res) => format!("{:?}", res.extensions().get::<RetryReport>().unwrap()),
                Err(e) => format!("{e}\n{e:?}\n{:?}", e.report().unwrap()),
            }
        })
    });
    format!("{text}\n{logs}")
}

#[test]
fn no_secret_in_errors_reports_or_events() {
    let cases: [(&str, Vec<Outcome>); 4] = [
        ("POST", vec![Timeout]),
        ("POST", vec![status(503)]),
        ("GET", vec![Reset, Reset, Reset]),
        ("GET", vec![status(503), status(200)]),
    ];
    for (method, script) in cases {
        let all = everything_echoed(method, "req-1", "\"key-1\"", script.clone());
        for secret in SECRETS {
            assert!(
                !all.contains(secret),
                "{secret} leaked ({method} {script:?}):\n{all}"
            );
        }
        assert!(all.contains("req-1"), "the request id is echoed:\n{all}");
    }
}

#[test]
fn request_id_and_key_are_capped() {
    let long_id = "i".repeat(1000);
    let all = everything_echoed("POST", &long_id, "\"k\"", vec![Timeout]);
    assert!(all.contains(&"i".repeat(128)), "{all}");
    assert!(
        !all.contains(&"i".repeat(129)),
        "a request id longer than 128 bytes was echoed"
    );

    // A key longer than 255 bytes is malformed: it is never echoed at all.
    let long_key = format!("\"{}\"", "k".repeat(400));
    let all = everything_echoed("POST", "r", &long_key, vec![Timeout]);
    assert!(
        !all.contains(&"k".repeat(256)),
        "an over-long key was echoed"
    );
    let key = format!("\"{}\"", "k".repeat(253));
    let all = everything_echoed("POST", "r", &key, vec![Timeout]);
    assert!(all.contains(&"k".repeat(253)));
}

#[test]
fn a_request_id_with_control_or_non_ascii_bytes_is_not_echoed() {
    let policy = RetryPolicy::builder().build().unwrap();
    let mut req = request("POST", "x", "\"k\"");
    req.headers_mut().insert(
        "x-request-id",
        http::HeaderValue::from_bytes(b"caf\xc3\xa9\tid").unwrap(),
    );
    let err = block_on(policy.layer(Script::new([Timeout])).oneshot(req)).unwrap_err();
    assert_eq!(err.request_id(), None);
}

/// Every `Display` and `Debug` along an error's `source()` chain.
fn whole_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut all = String::new();
    let mut next = Some(err);
    while let Some(e) = next {
        all.push_str(&format!("{e}\n{e:?}\n"));
        next = e.source();
    }
    all
}

/// A server that reads a request and closes the connection without answering: an ambiguous
/// failure from a real transport.
async fn closing_server() -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
        }
    });
    addr
}

/// Real hyper-util errors (refused, closed without a response) behind the layer, with a
/// secret in the query: nothing along the chain prints it.
#[tokio::test]
async fn no_query_secret_along_real_hyper_util_error_chains() {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let refused = retry_safety_testing::fault_server::refused_addr().await;
    let closing = closing_server().await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let svc = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap()
        .layer(client);
    for (method, addr) in [("GET", refused), ("POST", closing), ("GET", closing)] {
        let req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}/v1/execute?api_key=QUERYSECRET"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let err = svc.clone().oneshot(req).await.unwrap_err();
        let all = whole_chain(&err);
        assert!(!all.contains("QUERYSECRET"), "{method} {addr}:\n{all}");
        assert!(all.contains("/v1/execute"), "{all}");
    }
}

/// Real reqwest errors through the adapter: the error, its chain and reqwest-middleware's own
/// `Display` and `Debug` of it never print the query string.
#[cfg(feature = "reqwest-middleware")]
#[tokio::test]
async fn no_query_secret_along_real_reqwest_error_chains() {
    use tower_retry_safety::RetrySafetyMiddleware;

    let refused = retry_safety_testing::fault_server::refused_addr().await;
    let closing = closing_server().await;
    let policy = RetryPolicy::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .no_budget()
        .build()
        .unwrap();
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetrySafetyMiddleware::new(policy))
        .build();
    let cases = [
        (reqwest::Method::GET, refused, None),
        (reqwest::Method::POST, closing, None),
        // reqwest's own per-request timeout.
        (
            reqwest::Method::POST,
            closing,
            Some(Duration::from_millis(50)),
        ),
    ];
    for (method, addr, timeout) in cases {
        let mut req = client.request(
            method.clone(),
            format!("http://{addr}/v1/execute?api_key=QUERYSECRET"),
        );
        if let Some(timeout) = timeout {
            req = req.timeout(timeout);
        }
        let err = req.send().await.unwrap_err();
        let mut all = format!("{err}\n{err:?}\n{err:#}\n");
        if let reqwest_middleware::Error::Middleware(inner) = &err {
            let ours = inner
                .downcast_ref::<tower_retry_safety::Error>()
                .expect("our error");
            all.push_str(&whole_chain(ours));
        } else {
            panic!("expected the adapter's error, got {err:?}");
        }
        assert!(!all.contains("QUERYSECRET"), "{method} {addr}:\n{all}");
        assert!(all.contains("/v1/execute"), "{all}");
    }
}

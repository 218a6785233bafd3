//! Hostile deadline and attempt headers over real sockets: huge, negative, exponents,
//! `NaN`/`inf`, sub-nanosecond fractions, overflow, non-ASCII bytes, `attempt=0; max=0`, each
//! alone and all at once, to `DeadlineLayer` → `IdempotencyLayer` → `ConcurrencyLimit` →
//! handler, under a 30 s maximum and under `Duration::MAX`. Every request is answered (no
//! panic, no dropped connection), with 200 or the layer's 504; no key runs twice.
//!
//! Written by the adversarial review of issue 48 (the attack held).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use tower::limit::ConcurrencyLimitLayer;
use tower::{service_fn, ServiceBuilder};
use tower_idempotency_keys::deadline::DeadlineLayer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

use super::loopback::{send, serve, Ledger};

/// Each header with the values sent for it.
const HOSTILE: &[(&str, &[&[u8]])] = &[
    (
        "request-timeout-ms",
        &[
            b"99999999999999999999999",
            b"18446744073709551616",
            b"-1",
            b"1e3",
            b"NaN",
            b"inf",
            b"0x10",
            b"",
            b" 5",
            b"\xef\xbc\x91",
        ],
    ),
    (
        "grpc-timeout",
        &[
            b"99999999H",
            b"0n",
            b"1",
            b"H",
            b"-1S",
            b"999999999S",
            b"1.5S",
        ],
    ),
    (
        "x-stainless-read-timeout",
        &[
            b"0.0000001",
            b"1e3",
            b"NaN",
            b"inf",
            b"-0.5",
            b"9999999999.999999999",
            b"11111111111111111111111111111111111111",
            b"0.",
            b"0.00000000000000000000000000001",
        ],
    ),
    (
        "x-stainless-timeout",
        &[b"0", b"9999999999", b"99999999999", b"-1", b"1.5"],
    ),
    ("connect-timeout-ms", &[b"9999999999", b"+1"]),
    ("x-envoy-expected-rq-timeout-ms", &[b"9999999999", b"1 "]),
    (
        "amz-sdk-request",
        &[
            b"attempt=0; max=0",
            b"attempt=99999999999",
            b"attempt=1; max=1; max=2",
            b"=",
            b";;;;",
            b"attempt==1",
        ],
    ),
    ("request-attempt", &[b"0", b"99999999999", b"-1"]),
    ("x-stainless-retry-count", &[b"-1", b"999999"]),
    ("x-envoy-attempt-count", &[b"0"]),
    ("grpc-previous-rpc-attempts", &[b"x"]),
];

fn server(max: Duration, ledger: &Ledger) -> std::net::SocketAddr {
    let ledger = ledger.clone();
    serve(
        ServiceBuilder::new()
            .layer(DeadlineLayer::new(max))
            .layer(IdempotencyLayer::new(MemoryStore::new()))
            .layer(ConcurrencyLimitLayer::new(2))
            .service(service_fn(move |req: Request<_>| {
                ledger.record(&req);
                async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
            })),
    )
}

async fn post(
    addr: std::net::SocketAddr,
    key: &str,
    headers: &[(&str, &[u8])],
) -> (Response<()>, String) {
    let mut req = Request::post(format!("http://{addr}/work"))
        .header("idempotency-key", format!("\"{key}\""));
    for (name, value) in headers {
        req = req.header(
            *name,
            HeaderValue::from_bytes(value).expect("a field value"),
        );
    }
    send(
        req.body(Full::new(Bytes::from_static(b"{}")))
            .expect("request"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_deadline_headers_are_answered_and_never_run_a_key_twice() {
    for max in [Duration::from_secs(30), Duration::MAX] {
        let ledger = Ledger::default();
        let addr = server(max, &ledger);
        let mut n = 0;
        let mut every = Vec::new();
        for (name, values) in HOSTILE {
            for value in *values {
                every.push((*name, *value));
                for _ in 0..2 {
                    // The same key twice: the second gets the stored response or a fresh run, never both.
                    let (res, _) = post(addr, &format!("k{n}"), &[(name, value)]).await;
                    assert!(
                        matches!(res.status(), StatusCode::OK | StatusCode::GATEWAY_TIMEOUT),
                        "{name}: {value:?} answered {}",
                        res.status()
                    );
                }
                assert!(ledger.runs(&format!("\"k{n}\"")) <= 1, "{name}: {value:?}");
                n += 1;
            }
        }
        // All at once (a header repeated with different values included).
        let (res, _) = post(addr, "all", &every).await;
        assert!(matches!(
            res.status(),
            StatusCode::OK | StatusCode::GATEWAY_TIMEOUT
        ));
        assert!(ledger.total() <= n + 1);
    }
}

//! A keyed request served on a current-thread runtime logs, once per layer and runtime, the
//! bound that renewal has there (the server docs' "Renewal guarantee"); a multi-thread runtime
//! logs nothing of the kind.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use retry_safety_testing::logs::capture;
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};

const WARNING: &str = "serves keyed requests on a current-thread runtime";

/// Three keyed POSTs through one layer, on a runtime from `builder`.
fn three_keyed_posts(mut builder: tokio::runtime::Builder) -> String {
    let runtime = builder.enable_all().build().unwrap();
    let (logs, ()) = capture(|| {
        runtime.block_on(async {
            let svc = IdempotencyLayer::new(MemoryStore::new()).layer(tower::service_fn(
                |_req: Request<_>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                },
            ));
            for key in ["a", "b", "c"] {
                let req = Request::post("http://h/v1/send")
                    .header("idempotency-key", format!("\"{key}\""))
                    .body(Full::new(Bytes::from_static(b"{}")))
                    .unwrap();
                let res = svc.clone().oneshot(req).await.unwrap();
                assert_eq!(res.status(), 200);
            }
        })
    });
    logs
}

#[test]
fn a_current_thread_runtime_is_warned_of_once() {
    let logs = three_keyed_posts(tokio::runtime::Builder::new_current_thread());
    assert_eq!(logs.matches(WARNING).count(), 1, "{logs}");
}

#[test]
fn a_multi_thread_runtime_is_not_warned_of() {
    let logs = three_keyed_posts(tokio::runtime::Builder::new_multi_thread());
    assert_eq!(logs.matches(WARNING).count(), 0, "{logs}");
    assert!(!logs.contains("WARN"), "{logs}");
}

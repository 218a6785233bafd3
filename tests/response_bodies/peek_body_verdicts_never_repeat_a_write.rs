//! The response body classifier's verdicts (`PeekBodyLayer`), from an adversarial review: a
//! verdict is used up by the layer that decides (an outer layer never repeats a write on it), and
//! of two stacked classifiers the stricter verdict holds.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::peek_body_support::{policy, post, rate_limited};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_retry_safety::peek::PeekBodyLayer;
use tower_retry_safety::{FailureClass, RetryPolicy, RetryReport};

/// A handler that applies a write, then calls an upstream through its own retry stack
/// (`RetrySafety` over `PeekBodyLayer`) and returns the upstream's response as is. The
/// upstream always says `rate_limited` (proof that *the upstream* applied nothing). The
/// handler itself is called through an outer `RetrySafety`, for a POST: the outer layer must
/// not take the inner classifier's `NotSent` as proof that the *handler* applied nothing.
#[tokio::test]
async fn a_verdict_consumed_by_an_inner_retry_layer_does_not_make_an_outer_layer_repeat_a_write() {
    let upstream = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-length", "12")
                .body(Full::new(Bytes::from_static(b"rate_limited")))
                .unwrap(),
        )
    });
    let inner_stack = ServiceBuilder::new()
        .layer(
            RetryPolicy::builder()
                .max_retries(1)
                .backoff(Duration::from_millis(1), Duration::from_millis(1))
                .no_budget()
                .build()
                .unwrap(),
        )
        .layer(PeekBodyLayer::new(64, rate_limited))
        .service(upstream);

    let applied = Arc::new(AtomicUsize::new(0));
    let handler = {
        let applied = applied.clone();
        tower::service_fn(move |_req: Request<Full<Bytes>>| {
            let applied = applied.clone();
            let inner_stack = inner_stack.clone();
            async move {
                // The handler's own write.
                applied.fetch_add(1, Ordering::SeqCst);
                // Then the upstream call; its final response is returned as is.
                inner_stack
                    .oneshot(post("http://upstream.test/charge"))
                    .await
            }
        })
    };
    let outer = policy().layer(handler);
    let res = outer.oneshot(post("http://app.test/order")).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        applied.load(Ordering::SeqCst),
        1,
        "the outer layer repeated a write on a verdict that an inner layer had already used"
    );
}

/// SUSPECTED (design): two stacked classifiers inside one retry layer disagree: the inner one says `Final`, the
/// outer one `NotSent`. The stricter verdict should hold (as for route spellings): a write
/// that one classifier calls final is not repeated.
#[tokio::test]
async fn stacked_classifiers_the_stricter_verdict_holds() {
    let applied = Arc::new(AtomicUsize::new(0));
    let seen = applied.clone();
    let svc = ServiceBuilder::new()
        .layer(policy())
        .layer(PeekBodyLayer::new(64, |_, _, _: &[u8]| {
            Some(FailureClass::NotSent)
        }))
        .layer(PeekBodyLayer::new(64, |_, _, _: &[u8]| {
            Some(FailureClass::Final)
        }))
        .service(tower::service_fn(move |_: Request<Full<Bytes>>| {
            seen.fetch_add(1, Ordering::SeqCst);
            async {
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-length", "2")
                        .body(Full::new(Bytes::from_static(b"ok")))
                        .unwrap(),
                )
            }
        }));
    let res = svc.oneshot(post("http://api.test/")).await.unwrap();
    assert_eq!(RetryReport::of(&res).unwrap().attempts(), 1);
    assert_eq!(applied.load(Ordering::SeqCst), 1);
}

//! What `ReadWholeLayer` costs a request in allocations: a 16 KiB GET through the layer over an
//! in-process service, with and without it, body read to its end. Counted with a global
//! allocator that tallies this thread's allocations.

use std::convert::Infallible;
use std::future::{ready, Ready};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::resume::ReadWholeLayer;
use tower_retry_safety::RetryPolicy;

use retry_safety_testing::alloc::{allocations, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Answers at once with a 16 KiB body (a handle to shared bytes: no allocation of its own).
#[derive(Clone)]
struct Answer16k(Bytes);

impl Service<Request<Full<Bytes>>> for Answer16k {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        ready(Ok(Response::new(Full::new(self.0.clone()))))
    }
}

fn get() -> Request<Full<Bytes>> {
    Request::get("https://api.example.com/v1/files/1")
        .header("user-agent", "sdk/1.0")
        .body(Full::default())
        .unwrap()
}

/// Allocations of one GET through `svc`, its body read to the end (`req` built beforehand).
fn allocations_of_get<S, B>(svc: &mut S) -> u64
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let req = get();
    allocations(|| {
        let svc = svc.ready().now_or_never().unwrap().unwrap();
        let res = svc.call(req).now_or_never().unwrap().unwrap();
        let body = res.into_body().collect().now_or_never().unwrap().unwrap();
        assert_eq!(body.to_bytes().len(), 16 * 1024);
    })
}

#[test]
fn read_whole_adds_a_bounded_number_of_allocations_to_a_get() {
    let answer = Answer16k(Bytes::from(vec![7u8; 16 * 1024]));
    let policy = RetryPolicy::builder().build().unwrap();
    let mut without = policy.layer(answer.clone());
    let mut with = policy.layer(ReadWholeLayer::new().layer(answer));
    // Warm up (lazy statics, the budget's thread slot).
    allocations_of_get(&mut without);
    allocations_of_get(&mut with);
    let (a, b) = (
        allocations_of_get(&mut without),
        allocations_of_get(&mut with),
    );
    println!("allocations per 16 KiB GET: layer {a}, layer + ReadWholeLayer {b}");
    // Measured: 7. The reading's state and the read chunks' queue; for a GET, what a resume
    // would send: the sender's box and its copies of the request's headers and extensions.
    // The response's bytes are the service's, not copied.
    assert_eq!(b - a, 7, "layer {a}, with ReadWholeLayer {b}");
}

/// As `Answer16k`, with a strong `ETag`: a body streamed past the limit may resume.
#[derive(Clone)]
struct Answer16kWithEtag(Bytes);

impl Service<Request<Full<Bytes>>> for Answer16kWithEtag {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        let mut res = Response::new(Full::new(self.0.clone()));
        res.headers_mut()
            .insert("etag", http::HeaderValue::from_static("\"v1\""));
        ready(Ok(res))
    }
}

#[test]
fn read_whole_adds_a_bounded_number_of_allocations_to_a_get_that_streams() {
    let answer = Answer16kWithEtag(Bytes::from(vec![7u8; 16 * 1024]));
    let policy = RetryPolicy::builder().build().unwrap();
    let mut without = policy.layer(answer.clone());
    // Past a 1 KiB limit: the body streams, ready to resume with `Range`.
    let mut with = policy.layer(ReadWholeLayer::new().limit(1024).layer(answer));
    allocations_of_get(&mut without);
    allocations_of_get(&mut with);
    let (a, b) = (
        allocations_of_get(&mut without),
        allocations_of_get(&mut with),
    );
    println!("allocations per streamed 16 KiB GET: layer {a}, layer + ReadWholeLayer {b}");
    // Measured: 10. What a resume would send (the sender's box and its copies of the request's
    // headers and extensions), the resume's state, and the slot the retry layer hands its
    // bookkeeping through and the body's report (each an `Arc` and a box in the response's
    // extensions, a map this response did not have before).
    assert_eq!(b - a, 10, "layer {a}, with ReadWholeLayer {b}");
}

#[test]
fn a_per_attempt_timeout_adds_the_attempts_clock_and_nothing_more() {
    let answer = Answer16k(Bytes::from(vec![7u8; 16 * 1024]));
    let plain = RetryPolicy::builder().build().unwrap();
    let timed = RetryPolicy::builder()
        .attempt_timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut without = plain.layer(ReadWholeLayer::new().layer(answer.clone()));
    let mut with = timed.layer(ReadWholeLayer::new().layer(answer));
    allocations_of_get(&mut without);
    allocations_of_get(&mut with);
    let (a, b) = (
        allocations_of_get(&mut without),
        allocations_of_get(&mut with),
    );
    println!("allocations per 16 KiB GET read whole: no timeout {a}, a per-attempt timeout {b}");
    // Measured: 4. The timer's box (a sleep, as before the attempt's clock), and the clock: its
    // shared flag (an `Arc`), its place in the request's extensions, and its place in the copy
    // of them that a resume would send. Without `ReadWholeLayer` the clock costs 2.
    assert_eq!(b - a, 4, "no timeout {a}, a per-attempt timeout {b}");
}

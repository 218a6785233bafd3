//! `classify`, `classify_response` and `decide` allocate nothing, and the layer allocates only
//! what its contract needs: counted with a global allocator that tallies this thread's
//! allocations.

use crate::allocations;
use std::time::Duration;

use std::convert::Infallible;
use std::future::{ready, Ready};

use futures_util::FutureExt;
use http::{Method, Request, Response};
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{FailureClass, Idempotency, NoRetry, RetryPolicy, RetryReport};

fn policy(rules: usize) -> RetryPolicy {
    let mut b = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .deadline(Duration::from_secs(30));
    for i in 0..rules {
        b = b.route(
            Method::POST,
            &format!("/v1/r{i}/{{id}}/items/{{item}}"),
            Idempotency::Idempotent,
        );
    }
    b.build().unwrap()
}

#[test]
fn classify_and_decide_allocate_nothing() {
    for rules in [0, 1, 1000] {
        let p = policy(rules);
        let hit = Request::post("http://h/v1/r0/42/items/7?x=1")
            .body(())
            .unwrap();
        let miss = Request::post("http://h/v1/nothing/here").body(()).unwrap();
        let keyed = Request::post("http://h/v1/messages")
            .header("idempotency-key", "\"k-123\"")
            .body(())
            .unwrap();
        let mut marked = Request::get("http://h/v1/x").body(()).unwrap();
        marked.extensions_mut().insert(Idempotency::NonIdempotent);
        let res = Response::builder()
            .status(503)
            .header("retry-after", "3")
            .body(())
            .unwrap();
        let ambiguous = FailureClass::Ambiguous.into();
        let n = allocations(|| {
            for req in [&hit, &miss, &keyed, &marked] {
                let verdict = p.classify(req);
                std::hint::black_box(p.decide(
                    &verdict,
                    &ambiguous,
                    0,
                    Some(Duration::from_secs(5)),
                ));
                let c = p.classify_response(&verdict, &res);
                std::hint::black_box(p.decide(&verdict, &c, 1, None));
            }
        });
        assert_eq!(n, 0, "{rules} rules");
    }
}

/// Rules whose other spellings are looked at: a NonIdempotent rule that an Idempotent one
/// shadows as sent, and a template not already lower-case and normalised (its own folded
/// router). No static and wildcard siblings: matchit allocates to backtrack past those, with or
/// without respelling.
fn spelling_policy(rules: usize) -> RetryPolicy {
    let mut b = RetryPolicy::builder()
        .route(Method::PUT, "/v1/%73end/{id}", Idempotency::Idempotent)
        .route(Method::PUT, "/v1/send/{id}", Idempotency::NonIdempotent)
        .route(Method::POST, "/v1/Mixed/{id}/", Idempotency::NonIdempotent);
    for i in 0..rules {
        b = b.route(
            Method::PUT,
            &format!("/v1/r{i}/{{id}}/items/{{item}}"),
            Idempotency::Idempotent,
        );
    }
    b.build().unwrap()
}

#[test]
fn paths_with_other_spellings_are_respelled_without_allocating() {
    for rules in [0, 1, 1000] {
        let p = spelling_policy(rules);
        let mut requests: Vec<Request<()>> = [
            "/v1/send/m1/",
            "/v1/%73end/m2",
            "/v1/SEND/m3",
            "/v1//send/m4",
            "/v1/./send/m5",
            "/v1/x/../send/m6",
        ]
        .into_iter()
        .map(|path| {
            Request::put(format!("http://h{path}?x=1"))
                .body(())
                .unwrap()
        })
        .collect();
        requests.push(Request::post("http://h/V1/mixed/7").body(()).unwrap());
        // A path of the stack buffer's full length.
        let long = format!("/v1/send/{}/", "a".repeat(256 - "/v1/send//".len()));
        assert_eq!(long.len(), 256);
        requests.push(Request::put(long.as_str()).body(()).unwrap());
        // Respelled, then no rule: the whole slow path.
        let miss = Request::put("http://h/V2//other/./x/").body(()).unwrap();
        let ambiguous = FailureClass::Ambiguous.into();
        let mut verdicts = Vec::with_capacity(requests.len() + 1);
        let n = allocations(|| {
            for req in requests.iter().chain([&miss]) {
                let verdict = p.classify(req);
                std::hint::black_box(p.decide(&verdict, &ambiguous, 0, None));
                verdicts.push(verdict.idempotency());
            }
        });
        assert_eq!(n, 0, "{rules} rules");
        // Every one went past the path as sent (which says Idempotent or nothing).
        let (last, respelled) = verdicts.split_last().unwrap();
        assert!(
            respelled.iter().all(|v| *v == Idempotency::NonIdempotent),
            "{verdicts:?}"
        );
        assert_eq!(*last, Idempotency::Idempotent, "the method's verdict");
    }
}

#[test]
fn only_a_path_longer_than_the_stack_buffer_allocates() {
    let p = spelling_policy(0);
    let long = Request::put(format!("/v1/send/{}/", "a".repeat(256)))
        .body(())
        .unwrap();
    let mut verdict = None;
    let n = allocations(|| verdict = Some(p.classify(&long)));
    assert_eq!(verdict.unwrap().idempotency(), Idempotency::NonIdempotent);
    assert_eq!(n, 1, "one scratch buffer on the heap");
}

#[test]
fn the_counter_counts() {
    // Guards the test above against a counter that never moves.
    let n = allocations(|| {
        std::hint::black_box(vec![1u8; 16]);
    });
    assert_eq!(n, 1);
}

/// Answers at once, with or without an extension already in the response (hyper-util's
/// client puts its connection info there).
#[derive(Clone)]
struct Instant200 {
    with_extension: bool,
}

#[derive(Clone)]
struct ConnectionInfo;

impl Service<Request<String>> for Instant200 {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        let mut res = Response::new(());
        if self.with_extension {
            res.extensions_mut().insert(ConnectionInfo);
        }
        ready(Ok(res))
    }
}

fn request(method: Method, never_retried: bool) -> Request<String> {
    let mut req = Request::builder()
        .method(method)
        .uri("https://api.example.com/v1/messages")
        .header("content-type", "application/json")
        .header("user-agent", "sdk/1.0")
        .body(String::new())
        .unwrap();
    if never_retried {
        req.extensions_mut().insert(NoRetry);
    }
    req
}

/// Allocations made while `svc` answers `req` (both built beforehand), and the response.
fn allocations_of_call<S>(svc: &mut S, req: Request<String>) -> (u64, Option<Response<()>>)
where
    S: Service<Request<String>, Response = Response<()>>,
    S::Error: std::fmt::Debug,
{
    let mut res = None;
    let n = allocations(|| {
        let svc = svc.ready().now_or_never().unwrap().unwrap();
        res = svc.call(req).now_or_never().map(|r| r.unwrap());
    });
    (n, res)
}

/// Allocations of the copy a retry needs: the headers (a `String` body copies nothing when
/// empty; the URI's bytes are shared).
fn copy_allocations() -> u64 {
    let req = request(Method::GET, false);
    allocations(|| {
        std::hint::black_box(req.headers().clone());
    })
}

#[test]
fn the_layer_allocates_the_copy_the_marker_and_the_report_and_nothing_else() {
    let policy = RetryPolicy::builder().build().unwrap();
    let copy = copy_allocations();
    assert!(copy > 0, "the headers' copy allocates");
    for with_extension in [false, true] {
        let inner = Instant200 { with_extension };
        let mut bare = inner.clone();
        let mut layered = policy.layer(inner);
        // The report: a boxed value, plus the map and its table when the response had no
        // extensions yet.
        let report = if with_extension { 1 } else { 3 };
        // The attempt marker: the request's extension map and its table (the marker itself is
        // zero-sized).
        let marker = 2;
        for method in [Method::GET, Method::POST] {
            let (base, _) = allocations_of_call(&mut bare, request(method.clone(), false));
            let (n, res) = allocations_of_call(&mut layered, request(method.clone(), false));
            let res = res.expect("an instant service answers on the first poll");
            assert_eq!(res.extensions().get::<RetryReport>().unwrap().attempts(), 1);
            assert_eq!(
                n - base,
                copy + marker + report,
                "{method} (response extensions: {with_extension})"
            );
        }
        // A request that can never be retried: no copy, no service clone, no marker.
        let (base, _) = allocations_of_call(&mut bare, request(Method::POST, true));
        let (n, res) = allocations_of_call(&mut layered, request(Method::POST, true));
        assert!(res.unwrap().extensions().get::<RetryReport>().is_some());
        assert_eq!(
            n - base,
            report,
            "never retried (response extensions: {with_extension})"
        );
    }
}

//! The attempt's clock over real sockets: the per-attempt timeout bounds each wait for a frame
//! (a stall within the limit is a cut and the body is read again; one past the limit that cannot
//! resume is cut too), a slow but healthy body is read whole, and the deadline stays absolute (a
//! streamed body it ends says so), through a plain stack, a `Buffer`, a spawned attempt, a second
//! retry layer and the reqwest adapter.
//!
//! Found by the adversarial review, round 2, of reading whole bodies (issue 23).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{assert_no_splice, req, slow, stall_at, whole, HANG, SMALL};
use crate::read_whole_reqwest::{all_said, reqwest_client, reqwest_read_all, BIG, HALF};
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, policy, read_all, stack};
use tower::buffer::BufferLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_retry_safety::resume::{NoResume, ReadWholeLayer, WholeBody};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

/// **Hang.** A body past the limit that cannot resume (a `GET` without a validator, an unkeyed
/// `POST`) and stalls for good after half of it: the per-attempt timeout does not bound the
/// wait for its next frame, though `attempt_clock.rs` says the per-attempt timeout bounds
/// "each wait for a frame of the body, as it does for a body that streams to the caller" and
/// the README counts "a wait for a frame longer than the per-attempt timeout" as a cut.
///
/// What happens: 1 request; the caller gets the head and 100000 bytes, then its read waits
/// forever (here until the test's 8 s guard): `WholeBody::poll_frame` runs the idle clock only
/// through a `Resume` (`resume.poll_idle`), and a body that `not_resuming` has none. The same
/// with a per-attempt timeout and a deadline (the deadline does not end it either).
///
/// Fixed (the fix proposed): give a streamed body that cannot resume the idle clock too (fill the `ResumeSlot`, or a
/// lighter slot with the attempt's limit, for every streamed body, and cut it with a
/// `BodyCutError` whose `why_no_resume` says why no resume was made).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stall_past_the_limit_that_cannot_resume_is_cut_by_the_per_attempt_timeout() {
    let t = Duration::from_millis(200);
    let mut hung = Vec::new();
    for (what, method, deadline) in [
        ("GET without a validator", Method::GET, None),
        ("unkeyed POST", Method::POST, None),
        (
            "GET without a validator, deadline 1 s",
            Method::GET,
            Some(Duration::from_secs(1)),
        ),
    ] {
        let server = Raw::start(|_, _| stall_at(BIG, 1, HALF, &[])).await;
        let mut policy = policy().attempt_timeout(t);
        if let Some(deadline) = deadline {
            policy = policy.deadline(deadline);
        }
        let res = stack(policy.build().unwrap())
            .oneshot(req(method, &server.url("/f"), &[]))
            .await
            .expect("the head arrives");
        // 40 per-attempt timeouts (and 8 deadlines): a hang.
        let guard = Duration::from_secs(8);
        let read = tokio::time::timeout(guard, read_all(res.into_body())).await;
        assert_eq!(server.requests(), 1, "{what}");
        let Ok((bytes, err)) = read else {
            hung.push(what);
            continue;
        };
        assert_eq!(bytes.len(), HALF, "{what}");
        let err = err.expect("a stall is a cut");
        assert!(find_cut(&*err).is_some(), "{what}: {err}");
    }
    assert!(hung.is_empty(), "the body's read hangs: {hung:?}");
}

/// A small body that stalls for good after half, with a per-attempt timeout and no deadline:
/// the wait for its next frame is a cut, and the body is read again. Through the tower stack,
/// with a `Buffer` between the retry layer and `ReadWhole`, with a task of its own for the
/// attempt (the clock set from another task), with a second retry layer inside, and through
/// the reqwest adapter. 2 requests each, the body whole.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_stall_within_the_limit_without_a_deadline_is_cut_and_read_again_in_every_stack() {
    let t = Duration::from_millis(250);
    let mk = || policy().attempt_timeout(t).build().unwrap();
    for stack_name in ["plain", "buffer", "spawned", "nested", "reqwest"] {
        let server = Raw::start(|n, _| {
            if n == 1 {
                stall_at(SMALL, 1, SMALL / 2, &[])
            } else {
                whole("200 OK", SMALL, 1, &[])
            }
        })
        .await;
        let url = server.url("/f");
        let read = async {
            if stack_name == "reqwest" {
                let res = reqwest_client(mk())
                    .get(&url)
                    .send()
                    .await
                    .expect("answered");
                let (bytes, err) = reqwest_read_all(res).await;
                (bytes, err.map(|e| Box::new(e) as BoxError))
            } else {
                let res = any_stack(stack_name, mk())
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                    .expect("answered");
                read_all(res.into_body()).await
            }
        };
        let (bytes, err) = tokio::time::timeout(HANG, read)
            .await
            .unwrap_or_else(|_| panic!("{stack_name}: hangs"));
        assert!(err.is_none(), "{stack_name}: {err:?}");
        assert_eq!(bytes, rep(SMALL, 1), "{stack_name}");
        assert_eq!(server.requests(), 2, "{stack_name}");
    }
}

/// A small body that is slow but keeps coming (16 frames 60 ms apart, about 1 s) under a
/// per-attempt timeout of 250 ms: read whole in one request in every stack (the clock is set
/// from another task behind a `Buffer` or a spawned attempt, or from inside a second layer).
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_slow_healthy_small_body_is_read_whole_in_every_stack() {
    let t = Duration::from_millis(250);
    let mk = || policy().attempt_timeout(t).build().unwrap();
    for stack_name in ["plain", "buffer", "spawned", "nested", "reqwest"] {
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let url = server.url("/f");
        let read = async {
            if stack_name == "reqwest" {
                let res = reqwest_client(mk())
                    .get(&url)
                    .send()
                    .await
                    .expect("answered");
                let (bytes, err) = reqwest_read_all(res).await;
                (bytes, err.map(|e| Box::new(e) as BoxError))
            } else {
                let res = any_stack(stack_name, mk())
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                    .unwrap_or_else(|e| panic!("{stack_name}: {e}"));
                read_all(res.into_body()).await
            }
        };
        let (bytes, err) = tokio::time::timeout(HANG, read)
            .await
            .unwrap_or_else(|_| panic!("{stack_name}: hangs"));
        assert!(err.is_none(), "{stack_name}: {err:?}");
        assert_eq!(bytes, rep(SMALL, 1), "{stack_name}");
        assert_eq!(server.requests(), 1, "{stack_name}");
    }
}

/// The deadline stays absolute while a slow body is read inside the attempt, in every stack:
/// the request ends in an error that names the deadline, 1 request.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn the_deadline_cuts_a_slow_body_read_inside_the_attempt_in_every_stack() {
    for (stack_name, with_attempt) in [
        ("plain", true),
        ("plain", false),
        ("buffer", true),
        ("spawned", true),
        ("nested", true),
        ("nested", false),
        ("reqwest", true),
        ("reqwest", false),
    ] {
        let mut p = policy().deadline(Duration::from_millis(500));
        if with_attempt {
            p = p.attempt_timeout(Duration::from_millis(200));
        }
        let p = p.build().unwrap();
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let url = server.url("/f");
        let out = async {
            if stack_name == "reqwest" {
                match reqwest_client(p).get(&url).send().await {
                    Ok(res) => Ok(reqwest_read_all(res).await.1.map(|e| e.to_string())),
                    Err(e) => Err(all_said(&e)),
                }
            } else {
                match any_stack(stack_name, p)
                    .oneshot(req(Method::GET, &url, &[]))
                    .await
                {
                    Ok(res) => Ok(read_all(res.into_body()).await.1.map(|e| all_said(&*e))),
                    Err(e) => Err(all_said(&e)),
                }
            }
        };
        let out = tokio::time::timeout(HANG, out)
            .await
            .unwrap_or_else(|_| panic!("{stack_name} {with_attempt}: hangs"));
        let said = match out {
            Err(said) => said,
            Ok(Some(said)) => said,
            Ok(None) => panic!("{stack_name} {with_attempt}: read whole past the deadline"),
        };
        assert!(
            said.to_lowercase().contains("deadline"),
            "{stack_name} {with_attempt}: {said}"
        );
        assert_eq!(server.requests(), 1, "{stack_name} {with_attempt}");
    }
}

/// The deadline fires while a body past the limit streams (a `GET` with a strong ETag, 20
/// frames 100 ms apart): the body ends in a `BodyCutError` that says the deadline ended it
/// (`is_deadline`), not resumed (`Refused`), its report stopped at the deadline; 1 request, no
/// range request. The same for a trusted keyed `POST` past the limit.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn the_deadline_ends_a_streamed_body_and_the_error_says_so() {
    for (method, keys) in [(Method::GET, &[][..]), (Method::POST, &["k-8"][..])] {
        let server = Raw::start(|_, _| {
            let data = rep(BIG, 1);
            let mut acts = vec![Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()]))];
            for (i, piece) in data.chunks(10_000).enumerate() {
                if i > 0 {
                    acts.push(Act::Pause(100));
                }
                acts.push(Act::W(piece.to_vec()));
            }
            acts
        })
        .await;
        let policy = policy()
            .honor_idempotency_key(true)
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_millis(700))
            .build()
            .unwrap();
        let res = stack(policy)
            .oneshot(req(method.clone(), &server.url("/f"), keys))
            .await
            .expect("the head arrives before the deadline");
        let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
            .await
            .expect("no hang");
        assert_no_splice(method.as_str(), &bytes, &err, &rep(BIG, 1));
        let err = err.unwrap_or_else(|| panic!("{method}: read whole past the deadline"));
        let cut = find_cut(&*err).expect("a BodyCutError");
        assert!(cut.is_deadline(), "{method}: {cut}");
        assert!(cut.to_string().contains("deadline"), "{method}: {cut}");
        assert_eq!(cut.why_no_resume(), Some(NoResume::Refused), "{method}");
        assert_eq!(
            cut.report().map(RetryReport::stop_reason),
            Some(StopReason::Deadline),
            "{method}"
        );
        assert_eq!(server.requests(), 1, "{method}");
        assert_eq!(server.ranges(), 0, "{method}");
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// The stacks the clock tests run through: the retry layer, then (`buffer`) a `Buffer`,
/// (`spawned`) a service that runs each attempt in a task of its own, or (`nested`) a second
/// retry layer, then `ReadWhole` over hyper-util's client.
fn any_stack(
    name: &str,
    policy: RetryPolicy,
) -> tower::util::BoxCloneService<
    Request<Full<Bytes>>,
    Response<WholeBody<Incoming>>,
    tower_retry_safety::Error,
> {
    let read = ReadWholeLayer::new();
    match name {
        "plain" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(read)
                .service(client()),
        ),
        "buffer" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(BufferLayer::new(8))
                .layer(read)
                .service(client()),
        ),
        "spawned" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(tower::layer::layer_fn(Spawned))
                .layer(read)
                .service(client()),
        ),
        "nested" => tower::util::BoxCloneService::new(
            ServiceBuilder::new()
                .layer(policy)
                .layer(self::policy().build().unwrap())
                .layer(read)
                .service(client()),
        ),
        other => panic!("no stack {other}"),
    }
}

/// Runs each call of the inner service in a task of its own.
#[derive(Clone)]
struct Spawned<S>(S);

impl<S, R> Service<R> for Spawned<S>
where
    S: Service<R> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let fut = self.0.call(req);
        Box::pin(async move {
            tokio::spawn(fut)
                .await
                .map_err(|e| Box::new(e) as BoxError)?
                .map_err(Into::into)
        })
    }
}

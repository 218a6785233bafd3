//! Resumes with `Range` are bounded as retries are (`max_retries`, the budget, the deadline)
//! and counted in reports a reqwest caller can read; a cut response that the server marks final,
//! or asks to wait for (`Retry-After`), is not read again sooner.
//!
//! Found by the adversarial review of reading whole bodies (issue 23).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{policy, req};
use crate::read_whole_reqwest::{reqwest_client, BIG, HALF};
use http::Method;
use http_body_util::BodyExt;
use retry_safety_testing::raw_server::{cl, head, rep, Act, Raw};
use retry_safety_testing::read_whole::{find_cut, read_all, stack};
use tower::ServiceExt;
use tower_retry_safety::budget::Budget;
use tower_retry_safety::resume::{BodyReport, NoResume};
use tower_retry_safety::{RetryPolicy, RetryReport, StopReason};

/// Every response is cut after 0 bytes of its body (the first one, and every `206`).
async fn always_cut_at_zero() -> Raw {
    Raw::start(|_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::Close,
        ],
        Some(from) => vec![
            Act::W(head(
                "206 Partial Content",
                &[
                    format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                    cl(BIG - from as usize),
                    "etag: \"v1\"".into(),
                ],
            )),
            Act::Close,
        ],
    })
    .await
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_cut_after_zero_bytes_stop_at_max_retries() {
    let server = always_cut_at_zero().await;
    let res = stack(policy().max_retries(4).build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (mut parts, body) = res.into_parts();
    let _ = parts.extensions.remove::<RetryReport>();
    let mut body = body;
    let mut bytes = 0;
    let err = loop {
        match body.frame().await {
            Some(Ok(f)) => bytes += f.data_ref().map_or(0, |d| d.len()),
            Some(Err(e)) => break e,
            None => panic!("clean end"),
        }
    };
    assert_eq!(bytes, 0);
    assert_eq!(
        find_cut(&*err).unwrap().why_no_resume(),
        Some(NoResume::Refused)
    );
    assert_eq!(server.ranges(), 4);
    assert_eq!(server.requests(), 5);
    let report = body.report().expect("report");
    assert_eq!(report.attempts(), 5);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
}

struct Counted(AtomicU32, AtomicU32);

impl Budget for Counted {
    fn deposit(&self) {}
    fn withdraw(&self) -> bool {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_take_from_the_budget() {
    let server = always_cut_at_zero().await;
    let budget = Arc::new(Counted(AtomicU32::new(2), AtomicU32::new(0)));
    struct Shared(Arc<Counted>);
    impl Budget for Shared {
        fn deposit(&self) {}
        fn withdraw(&self) -> bool {
            self.0.withdraw()
        }
    }
    let policy = RetryPolicy::builder()
        .max_retries(50)
        .backoff(Duration::from_millis(1), Duration::from_millis(2))
        .budget(Shared(budget.clone()))
        .build()
        .unwrap();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let mut body = res.into_body();
    let (_, err) = read_all(&mut body).await;
    assert!(err.is_some());
    assert_eq!(server.ranges(), 2);
    assert_eq!(budget.1.load(Ordering::SeqCst), 3);
    assert_eq!(body.report().unwrap().stop_reason(), StopReason::Budget);
}

/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn resumes_obey_the_deadline() {
    let server = always_cut_at_zero().await;
    let policy = RetryPolicy::builder()
        .max_retries(100)
        .backoff(Duration::from_millis(40), Duration::from_millis(40))
        .no_budget()
        .deadline(Duration::from_millis(400))
        .build()
        .unwrap();
    let start = Instant::now();
    let res = stack(policy)
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let (_, err) = read_all(res.into_body()).await;
    assert!(err.is_some());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(server.ranges() <= 12, "{}", server.ranges());
}

/// The reqwest adapter: a body resumed with `Range` is recovered, and a report a reqwest caller
/// can reach counts the resume.
///
/// What happened: a 200000-byte `GET` cut after 100000 bytes was resumed (1 range request, the
/// caller got every byte), but `RetryReport::of_reqwest(&res)` is the head's report (1
/// attempt), and `WholeBody::report()` is out of reach inside a `reqwest::Body`. When resumes
/// stopped, the `BodyCutError` said `Refused` without the report either.
///
/// Fixed: a `BodyReport` handle in the response's extensions, which the resume updates after
/// each decision (`BodyReport::of_reqwest`), and the report in the `BodyCutError` when resumes
/// stop (see `reqwest_resumes_that_stop_say_why_in_the_error_report`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_resumes_are_counted_in_a_report_the_caller_can_read() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                        "etag: \"v1\"".into(),
                    ],
                )),
                Act::W(w[from..].to_vec()),
            ]
        }
    })
    .await;
    let mut res = reqwest_client(policy().build().unwrap())
        .get(server.url("/f"))
        .send()
        .await
        .unwrap();
    let mut bytes = Vec::new();
    while let Some(chunk) = res.chunk().await.unwrap() {
        bytes.extend_from_slice(&chunk);
    }
    assert_eq!(bytes, whole);
    assert_eq!(server.ranges(), 1);
    // The head's report stops at the head; the body's counts the resume.
    assert_eq!(
        RetryReport::of_reqwest(&res).expect("a report").attempts(),
        1
    );
    let report = BodyReport::of_reqwest(&res)
        .expect("a body that may resume has a body report")
        .get()
        .expect("the body was cut");
    assert_eq!(report.attempts(), 2, "the resume is not counted");
    let first = report.attempt_outcomes().next().expect("a record");
    assert_eq!(first.body_cut_after(), Some(HALF as u64));
}

/// Resumes that stop (every range request cut after 0 bytes) end the reqwest body in an error
/// whose `BodyCutError` carries the report: the attempts, and why they stopped.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn reqwest_resumes_that_stop_say_why_in_the_error_report() {
    let whole = rep(BIG, 1);
    let w = whole.clone();
    let server = Raw::start(move |_, seen| match seen.range {
        None => vec![
            Act::W(head("200 OK", &[cl(BIG), "etag: \"v1\"".into()])),
            Act::W(w[..HALF].to_vec()),
            Act::Close,
        ],
        Some(from) => {
            let from = from as usize;
            vec![
                Act::W(head(
                    "206 Partial Content",
                    &[
                        format!("content-range: bytes {from}-{}/{BIG}", BIG - 1),
                        cl(BIG - from),
                        "etag: \"v1\"".into(),
                    ],
                )),
                Act::Close,
            ]
        }
    })
    .await;
    let mut res = reqwest_client(policy().max_retries(2).build().unwrap())
        .get(server.url("/f"))
        .send()
        .await
        .unwrap();
    let handle = BodyReport::of_reqwest(&res)
        .cloned()
        .expect("a body report");
    let mut got = 0;
    let err = loop {
        match res.chunk().await {
            Ok(Some(chunk)) => got += chunk.len(),
            Ok(None) => panic!("the body ended whole though every resume was cut"),
            Err(err) => break err,
        }
    };
    assert_eq!(got, HALF);
    assert_eq!(server.ranges(), 2);
    let cut = find_cut(&err).expect("a BodyCutError in the chain");
    assert_eq!(cut.why_no_resume(), Some(NoResume::Refused));
    let report = cut.report().expect("the error carries the report");
    assert_eq!(report.attempts(), 3);
    assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
    assert_eq!(handle.get().expect("published").attempts(), 3);
}

/// A response that the server marks final (`x-should-retry: false`, "makes any response
/// final"), whose small body is cut.
///
/// What happens: a `GET` answered `503` with `x-should-retry: false` and a 1000-byte body is
/// final when whole (1 request). Cut after 500 bytes (every time), it is read again until
/// retries are used up: 6 requests for `max_retries(5)`, against the server's explicit word.
/// `Attempts::on_response` goes to `on_body_cut` before the status and headers are classified,
/// and `on_body_cut` classifies every cut `Ambiguous`, so the hint (and a stored-response mark,
/// `idempotent-replayed: true`, which is final too) is never read for a cut body.
///
/// Fix: in `on_response`, classify the status and headers first; when the classification is
/// final because of the server's hint or a stored-response mark, stop (the body ends in its
/// `BodyCutError`); only otherwise call `on_body_cut`.
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_cut_response_the_server_marks_final_is_not_read_again() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head(
                "503 Service Unavailable",
                &[cl(1000), "x-should-retry: false".into()],
            )),
            Act::W(rep(500, 1)),
            Act::Close,
        ]
    })
    .await;
    let res = stack(policy().build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let _ = read_all(res.into_body()).await;
    assert_eq!(server.requests(), 1);
}

/// Same root cause: a cut `503` with `Retry-After: 2` is read again after the policy's backoff
/// (1-5 ms here), not after the 2 s the server asked for (`on_body_cut` passes `None` for
/// Retry-After). 2 requests within a few ms for `max_retries(1)`.
///
/// Fix: as above: classify the status and headers, and keep the classification's
/// `Retry-After` (`Classification::with_retry_after(FailureClass::Ambiguous, retry_after)`).
///
/// Found by the adversarial review of reading whole bodies (issue 23).
#[tokio::test]
async fn a_cut_response_with_retry_after_is_not_read_again_sooner() {
    let server = Raw::start(|_, _| {
        vec![
            Act::W(head(
                "503 Service Unavailable",
                &[cl(1000), "retry-after: 2".into()],
            )),
            Act::W(rep(500, 1)),
            Act::Close,
        ]
    })
    .await;
    let start = Instant::now();
    let res = stack(policy().max_retries(1).build().unwrap())
        .oneshot(req(Method::GET, &server.url("/f"), None))
        .await
        .unwrap();
    let elapsed = start.elapsed();
    let _ = read_all(res.into_body()).await;
    assert!(
        server.requests() == 1 || elapsed >= Duration::from_secs(2),
        "{} requests in {elapsed:?}",
        server.requests()
    );
}

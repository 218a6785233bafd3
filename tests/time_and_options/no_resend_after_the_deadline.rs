//! Nothing is handed to the inner service after the call's deadline: a resend that waits for
//! tower's `ConcurrencyLimit(1)` to be ready while another call holds the only permit is not
//! sent once the deadline has passed. Real sockets: hyper-util's client to a hyper server on
//! 127.0.0.1 that counts what it reads and applies. The test orders events (who holds the
//! permit, who waits for it) by signals, not by timing; real time only keeps the other call's
//! permit held until well after the deadline.

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use retry_safety_testing::runtime_server::{accept, listener};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service, ServiceExt};
use tower_retry_safety::{RequestOptions, RetryPolicy, StopReason};

/// The call's deadline: long enough for its first attempt on a busy machine.
const DEADLINE: Duration = Duration::from_millis(1500);
/// How long after the deadline the other call keeps the permit, when the resend still waits.
const MARGIN: Duration = Duration::from_millis(500);

/// What the server saw, and the signals that order the test.
#[derive(Default)]
struct Ledger {
    /// When each request to `/write` was read.
    write_reads: Mutex<Vec<Instant>>,
    /// `/write` requests applied (every one but the first, which is answered 503 first).
    applied: AtomicU32,
    /// The write's first attempt was read (it holds the permit).
    first_read: Notify,
    /// Answer the write's first attempt now.
    answer_first: Notify,
    /// The other call was read: it holds the permit.
    other_read: Notify,
    /// Answer the other call now.
    release_other: Notify,
}

/// The server: `/write`'s first attempt is answered 503 (which the policy declares not
/// applied) when the test says; later ones are applied and answered 201. `/other` is held
/// until the test releases it.
async fn serve(ledger: Arc<Ledger>) -> std::net::SocketAddr {
    let (listener, addr) = listener();
    let svc = tower::service_fn(move |req: Request<Incoming>| {
        let ledger = ledger.clone();
        async move {
            let status = if req.uri().path() == "/write" {
                let reads = {
                    let mut reads = ledger.write_reads.lock().unwrap();
                    reads.push(Instant::now());
                    reads.len()
                };
                if reads == 1 {
                    ledger.first_read.notify_one();
                    ledger.answer_first.notified().await;
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    ledger.applied.fetch_add(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            } else {
                ledger.other_read.notify_one();
                ledger.release_other.notified().await;
                StatusCode::OK
            };
            let mut res = Response::new(Full::new(Bytes::new()));
            *res.status_mut() = status;
            Ok::<_, Infallible>(res)
        }
    });
    tokio::spawn(accept(listener, svc));
    addr
}

fn request(addr: std::net::SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
        .unwrap()
}

/// A POST with a 1.5 s deadline; its first attempt is answered 503, declared not applied,
/// so a resend follows. While the first attempt holds `ConcurrencyLimit(1)`'s only permit,
/// another call queues for it, and takes it when the 503 arrives; the server holds that call
/// past the deadline. The resend waits in `poll_ready`. It used to be handed on as soon as the
/// permit came back, after the deadline: the server read the write twice, once after the
/// deadline, applied it, and the caller got 201. Now the call ends at its deadline with an
/// error that says so, and nothing more reaches the server: read once, 0 reads after the
/// deadline, 0 applied.
///
/// Issue 41 item 3, fifth review.
#[tokio::test]
async fn a_resend_waiting_behind_a_concurrency_limit_is_not_sent_after_the_deadline() {
    let ledger = Arc::new(Ledger::default());
    let addr = serve(ledger.clone()).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let limited = ConcurrencyLimit::new(client, 1);
    let policy = RetryPolicy::builder()
        .not_applied_statuses([StatusCode::SERVICE_UNAVAILABLE])
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(3)
        .no_budget()
        .build()
        .unwrap();
    let mut svc = policy.layer(limited.clone());
    let mut write = request(addr, "/write");
    write
        .extensions_mut()
        .insert(RequestOptions::new().deadline(DEADLINE));
    // The first attempt takes the permit here; the deadline counts from the call, so this
    // instant is at or after the layer's.
    let call = svc.ready().await.unwrap().call(write);
    let deadline = Instant::now() + DEADLINE;
    let mut write = tokio::spawn(call);
    ledger.first_read.notified().await;

    // The other call queues for the permit that the first attempt holds.
    let queued = Arc::new(Notify::new());
    let mut other_svc = limited.clone();
    let signal = queued.clone();
    let other = tokio::spawn(async move {
        let mut first_poll = true;
        poll_fn(|cx| {
            let ready = other_svc.poll_ready(cx);
            if std::mem::take(&mut first_poll) {
                assert!(ready.is_pending(), "the first attempt holds the permit");
                signal.notify_one();
            }
            ready
        })
        .await
        .unwrap();
        other_svc.call(request(addr, "/other")).await
    });
    queued.notified().await;
    ledger.answer_first.notify_one();
    ledger.other_read.notified().await;

    // The other call holds the permit until the write's call has ended, or (when its resend
    // still waits for the permit) until well after the deadline.
    let ended = tokio::select! {
        ended = &mut write => Some(ended),
        () = tokio::time::sleep_until(deadline + MARGIN) => None,
    };
    ledger.release_other.notify_one();
    let result = match ended {
        Some(ended) => ended,
        None => write.await,
    }
    .unwrap();
    assert_eq!(other.await.unwrap().unwrap().status(), StatusCode::OK);

    let reads = ledger.write_reads.lock().unwrap().clone();
    let after_deadline = reads.iter().filter(|at| **at > deadline).count();
    let applied = ledger.applied.load(Ordering::SeqCst);
    assert_eq!(
        (reads.len(), after_deadline, applied),
        (1, 0, 0),
        "(reads of the write, reads after the deadline, applied); the call got {:?}",
        result.as_ref().map(Response::status)
    );
    let err = result.expect_err("the call ends at its deadline");
    assert_eq!(err.stop_reason(), StopReason::Deadline, "{err}");
    assert_eq!(err.attempts(), 1, "{err}");
    assert!(!err.may_have_been_applied(), "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
}

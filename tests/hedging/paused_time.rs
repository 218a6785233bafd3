//! Hedging through the tower layer, on paused time: a scripted inner service says how long
//! each attempt takes and how it ends; the tests count the attempts it saw.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport, StopReason};

/// How attempt n (from 1) ends: after this long, with this status (`None`: an error that says
/// nothing about whether it was sent).
type Script = fn(u32) -> (u64, Option<u16>);

async fn run(
    policy: &RetryPolicy,
    req: Request<String>,
    script: Script,
) -> (Result<Response<String>, tower_retry_safety::Error>, u32) {
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let svc = policy
        .clone()
        .layer(service_fn(move |_req: Request<String>| {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                let (ms, status) = script(n);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                match status {
                    Some(s) => {
                        let mut res = Response::builder().status(s);
                        if s == 429 {
                            // It asks for a 5 s wait.
                            res = res.header("retry-after", "5");
                        }
                        Ok(res.body(format!("attempt {n}")).unwrap())
                    }
                    None => Err::<_, std::io::Error>(std::io::Error::other("dropped")),
                }
            }
        }));
    let res = svc.oneshot(req).await;
    (res, calls.load(Ordering::SeqCst))
}

/// A hedge after `ms`, one allowed per request (the hedge budget starts empty: each request
/// deposits its extra load).
fn fixed(ms: u64) -> RetryPolicy {
    RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(ms)).max_extra_load(1.0))
        .no_budget()
        .build()
        .unwrap()
}

fn get() -> Request<String> {
    Request::get("http://api.example/items")
        .body(String::new())
        .unwrap()
}

fn report(res: &Response<String>) -> &RetryReport {
    RetryReport::of(res).expect("the layer adds a report")
}

#[tokio::test(start_paused = true)]
async fn a_slow_read_is_hedged_and_the_hedge_wins() {
    let (res, calls) = run(&fixed(10), get(), |n| {
        if n == 1 {
            (500, Some(200))
        } else {
            (2, Some(200))
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 2");
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (2, 1, Some(2), 1)
    );
    assert_eq!(r.attempts(), 2);
    assert_eq!(r.stop_reason(), StopReason::Final);
    assert!(
        r.to_string().contains("1 hedged, attempt 2 answered first"),
        "{r}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fast_read_is_not_hedged() {
    let (res, calls) = run(&fixed(10), get(), |_| (3, Some(200))).await;
    let res = res.unwrap();
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (1, 0, None, 0)
    );
    // A plain retry of a hedge-able request is no hedge, and wins nothing.
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .backoff(Duration::from_millis(1), Duration::from_millis(1))
        .build()
        .unwrap();
    let (res, calls) = run(&policy, get(), |n| {
        (3, Some(if n == 1 { 503 } else { 200 }))
    })
    .await;
    let res = res.unwrap();
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (2, 0, None, 0)
    );
}

/// The first attempt answers while the hedge is in flight: it wins, the hedge is dropped.
#[tokio::test(start_paused = true)]
async fn the_first_attempt_can_still_win() {
    let (res, calls) = run(&fixed(10), get(), |n| {
        if n == 1 {
            (15, Some(200))
        } else {
            (100, Some(200))
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 1");
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (2, 1, Some(1), 1)
    );
}

/// Never twice: a POST without a trusted key is sent once however slow it is, whatever the
/// hedge settings.
#[tokio::test(start_paused = true)]
async fn a_write_without_a_trusted_key_is_never_hedged() {
    let settings = [
        Hedge::fixed(Duration::from_millis(1)).max_extra_load(1.0),
        Hedge::fixed(Duration::from_millis(1))
            .max_extra_load(1.0)
            .keyed_writes(true)
            .max_hedges(10),
        Hedge::learned().min_samples(1).max_extra_load(1.0),
    ];
    for hedge in settings {
        let policy = RetryPolicy::builder()
            .hedge(hedge.clone())
            .max_retries(10)
            .no_budget()
            .build()
            .unwrap();
        // Teach the learned delay with reads first.
        for _ in 0..3 {
            run(&policy, get(), |_| (1, Some(200))).await.0.unwrap();
        }
        let post = Request::post("http://api.example/pay")
            .header("idempotency-key", "\"untrusted\"")
            .body("{}".to_string())
            .unwrap();
        let (res, calls) = run(&policy, post, |_| (500, Some(200))).await;
        let r = report(res.as_ref().unwrap()).clone();
        assert_eq!((calls, r.hedges()), (1, 0), "{hedge:?}");
    }
}

/// A retryable failure while the first attempt is slow sends the next attempt at once; a
/// success then wins.
#[tokio::test(start_paused = true)]
async fn a_retryable_failure_of_the_hedge_sends_the_next_at_once() {
    let script: Script = |n| match n {
        1 => (500, Some(200)),
        2 => (5, Some(503)),
        _ => (2, Some(200)),
    };
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .backoff(Duration::from_secs(5), Duration::from_secs(5))
        .no_budget()
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let (res, calls) = run(&policy, get(), script).await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 3");
    // At once: no 5 s backoff (paused time: the clock moves only by the sleeps).
    assert!(started.elapsed() < Duration::from_secs(1));
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (3, 1, Some(3), 1)
    );
    let statuses: Vec<_> = r.attempt_outcomes().map(|a| a.status()).collect();
    assert_eq!(statuses[0], Some(StatusCode::SERVICE_UNAVAILABLE));
}

/// A hedge answered 429 with Retry-After is not followed by another send at once: the first
/// attempt's answer is awaited.
#[tokio::test(start_paused = true)]
async fn a_hedge_told_to_wait_sends_nothing_more_at_once() {
    let (res, calls) = run(&fixed(10), get(), |n| {
        if n == 1 {
            (100, Some(200))
        } else {
            (2, Some(429))
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 1");
    let r = report(&res);
    assert_eq!((calls, r.hedges(), r.won_by()), (2, 1, Some(1)));
}

/// A final outcome ends every attempt: the hedge's 404 is the answer, the first is dropped.
#[tokio::test(start_paused = true)]
async fn a_final_outcome_ends_all_attempts() {
    let (res, calls) = run(&fixed(10), get(), |n| {
        if n == 1 {
            (500, Some(200))
        } else {
            (2, Some(404))
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (2, 1, Some(2), 1)
    );
}

/// `max_retries` bounds the sends, hedges included: with 1, one hedge and no retry after it.
#[tokio::test(start_paused = true)]
async fn hedges_count_against_max_retries() {
    let policy = RetryPolicy::builder()
        .hedge(
            Hedge::fixed(Duration::from_millis(10))
                .max_extra_load(1.0)
                .max_hedges(5),
        )
        .max_retries(1)
        .no_budget()
        .build()
        .unwrap();
    let (res, calls) = run(&policy, get(), |_| (100, Some(503))).await;
    let res = res.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = report(&res);
    assert_eq!((calls, r.hedges()), (2, 1));
    assert_eq!(r.stop_reason(), StopReason::RetriesExhausted);
    let policy0 = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .max_retries(0)
        .build()
        .unwrap();
    let (_, calls) = run(&policy0, get(), |_| (100, Some(200))).await;
    assert_eq!(calls, 1);
}

/// Up to `max_hedges` hedges, each a delay after the last send, as far as the hedge budget
/// allows: a fresh policy has saved one token (this request's), so one hedge; after fast
/// requests saved more, two.
#[tokio::test(start_paused = true)]
async fn several_hedges_each_after_the_delay_within_the_hedge_budget() {
    let policy = RetryPolicy::builder()
        .hedge(
            Hedge::fixed(Duration::from_millis(10))
                .max_extra_load(1.0)
                .max_hedges(2),
        )
        .max_retries(5)
        .no_budget()
        .build()
        .unwrap();
    let slow_twice: Script = |n| {
        if n < 3 {
            (500, Some(200))
        } else {
            (1, Some(200))
        }
    };
    let (res, calls) = run(&policy, get(), slow_twice).await;
    let res = res.unwrap();
    // Both slow: the first, sent first, answers first.
    assert_eq!(res.body(), "attempt 1");
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (2, 1, Some(1), 1)
    );
    for _ in 0..2 {
        run(&policy, get(), |_| (1, Some(200))).await.0.unwrap();
    }
    let (res, calls) = run(&policy, get(), slow_twice).await;
    let res = res.unwrap();
    assert_eq!(res.body(), "attempt 3");
    let r = report(&res);
    assert_eq!(
        (calls, r.hedges(), r.won_by(), r.superseded()),
        (3, 2, Some(3), 2)
    );
}

/// The hedge budget: with 25 % extra load, at most one hedge per four requests, all slow.
#[tokio::test(start_paused = true)]
async fn hedges_never_exceed_the_extra_load() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(0.25))
        .no_budget()
        .build()
        .unwrap();
    let mut sent = 0;
    let mut hedges = 0;
    for _ in 0..40 {
        let (res, calls) = run(&policy, get(), |n| {
            if n == 1 {
                (50, Some(200))
            } else {
                (1, Some(200))
            }
        })
        .await;
        sent += calls;
        hedges += report(&res.unwrap()).hedges();
    }
    assert_eq!(hedges, 10);
    assert_eq!(sent, 50);
}

/// Hedges spend the retry budget too: an empty one sends none.
#[tokio::test(start_paused = true)]
async fn hedges_spend_the_retry_budget() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .lock_free_budget(Duration::from_secs(10), 0, 0.0)
        .build()
        .unwrap();
    for _ in 0..5 {
        let (res, calls) = run(&policy, get(), |_| (50, Some(200))).await;
        assert_eq!((calls, report(&res.unwrap()).hedges()), (1, 0));
    }
}

/// The learned delay: no hedge before the host has `min_samples` latencies; then the
/// quantile (p50 at 50 % extra load) of what it learned.
#[tokio::test(start_paused = true)]
async fn the_learned_delay_needs_samples_first() {
    let policy = RetryPolicy::builder()
        .hedge(Hedge::learned().max_extra_load(0.5).min_samples(10))
        .no_budget()
        .build()
        .unwrap();
    let mut hedged = 0;
    for i in 0..10 {
        // All fast but the 10th, slow: below min_samples, so never hedged.
        let script: Script = if i == 9 {
            |_| (300, Some(200))
        } else {
            |_| (4, Some(200))
        };
        let (res, _) = run(&policy, get(), script).await;
        hedged += report(&res.unwrap()).hedges();
    }
    assert_eq!(hedged, 0);
    let (res, calls) = run(&policy, get(), |n| {
        if n == 1 {
            (300, Some(200))
        } else {
            (1, Some(200))
        }
    })
    .await;
    let res = res.unwrap();
    assert_eq!((calls, report(&res).won_by()), (2, Some(2)));
}

/// The attempt hook names the attempt decided on, in the order sent: the hedge that answered
/// first is attempt 2, though its outcome came first.
#[tokio::test(start_paused = true)]
async fn the_attempt_hook_names_the_hedge_that_answered() {
    let events = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = events.clone();
    let policy = RetryPolicy::builder()
        .hedge(Hedge::fixed(Duration::from_millis(10)).max_extra_load(1.0))
        .on_attempt(move |e| {
            let status = e.status.map(|s| s.as_u16());
            seen.lock().unwrap().push((e.attempt, status, e.decision));
        })
        .build()
        .unwrap();
    let script: Script = |n| {
        if n == 1 {
            (500, Some(200))
        } else {
            (2, Some(200))
        }
    };
    let (res, calls) = run(&policy, get(), script).await;
    assert_eq!(res.unwrap().body(), "attempt 2");
    assert_eq!(calls, 2);
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events,
        [(
            2,
            Some(200),
            tower_retry_safety::policy::Decision::Stop(StopReason::Final)
        )]
    );
}

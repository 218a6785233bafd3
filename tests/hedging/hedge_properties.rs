//! Property tests of hedging, on paused time: for any latencies and outcomes of the attempts,
//! any verdict and any limits, a write without a trusted key is never hedged nor sent again
//! after it may have been applied, sends stay within `max_retries`, hedges within
//! `max_hedges`, and the report counts exactly the sends the inner service saw.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use proptest::prelude::*;
use retry_safety_testing::logs::block_on;
use tower::{service_fn, Layer, ServiceExt};
use tower_retry_safety::{Hedge, RetryPolicy, RetryReport};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Read,
    Write,
    KeyedWrite,
}

#[derive(Clone, Copy, Debug)]
enum End {
    Status(u16),
    /// 429 asking for a 1 s wait.
    TooMany,
    Refused,
    Reset,
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        Just(End::Status(200)),
        Just(End::Status(404)),
        Just(End::Status(503)),
        Just(End::Status(409)),
        Just(End::TooMany),
        Just(End::Refused),
        Just(End::Reset),
    ]
}

fn request(kind: Kind) -> Request<String> {
    let mut req = match kind {
        Kind::Read => Request::get("http://h/v1/items"),
        _ => Request::post("http://h/v1/messages"),
    }
    .body("payload".to_owned())
    .unwrap();
    if let Kind::KeyedWrite = kind {
        req.headers_mut()
            .insert("idempotency-key", HeaderValue::from_static("\"k\""));
    }
    req
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn hedging_keeps_the_promises(
        kind in prop_oneof![Just(Kind::Read), Just(Kind::Write), Just(Kind::KeyedWrite)],
        attempts in prop::collection::vec((0u64..60, end()), 1..8),
        max_retries in 0u32..5,
        max_hedges in 1u32..4,
        keyed_writes in any::<bool>(),
    ) {
        let policy = RetryPolicy::builder()
            .max_retries(max_retries)
            .backoff(Duration::from_millis(5), Duration::from_millis(20))
            .honor_idempotency_key(true)
            .hedge(
                Hedge::fixed(Duration::from_millis(10))
                    .max_extra_load(1.0)
                    .max_hedges(max_hedges)
                    .keyed_writes(keyed_writes),
            )
            .no_budget()
            .build()
            .unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let script = attempts.clone();
        let svc = policy.layer(service_fn(move |_req: Request<String>| {
            let n = seen.fetch_add(1, Ordering::SeqCst) as usize;
            let (ms, end) = script[n.min(script.len() - 1)];
            async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let status = match end {
                    End::Status(s) => s,
                    End::TooMany => 429,
                    End::Refused => {
                        return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
                    }
                    End::Reset => {
                        return Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
                    }
                };
                let mut res = Response::builder().status(status);
                if let End::TooMany = end {
                    res = res.header("retry-after", "1");
                }
                Ok(res.body(format!("{}", n + 1)).unwrap())
            }
        }));
        let out = block_on(svc.oneshot(request(kind)));
        let calls = calls.load(Ordering::SeqCst);
        let report: RetryReport = match &out {
            Ok(res) => RetryReport::of(res).unwrap().clone(),
            Err(e) => e.report().unwrap().clone(),
        };

        prop_assert!(calls >= 1);
        prop_assert!(calls <= max_retries + 1, "{calls} sends");
        prop_assert_eq!(report.attempts(), calls);
        prop_assert!(report.hedges() <= max_hedges);
        prop_assert!(report.hedges() < calls || report.hedges() == 0);
        let hedgeable = matches!(kind, Kind::Read) || (matches!(kind, Kind::KeyedWrite) && keyed_writes);
        if !hedgeable {
            prop_assert_eq!(report.hedges(), 0);
        }
        if matches!(kind, Kind::Write) {
            // Sent again only after attempts that never reached the server.
            for (_, sent) in &attempts[..(calls as usize - 1).min(attempts.len())] {
                prop_assert!(matches!(sent, End::Refused), "resent after {sent:?}");
            }
            prop_assert_eq!(report.superseded(), 0);
        }
        if let (Some(won), Ok(res)) = (report.won_by(), &out) {
            prop_assert!(report.hedges() > 0);
            prop_assert!(won >= 1 && won <= calls);
            prop_assert_eq!(res.body(), &won.to_string());
        }
    }
}

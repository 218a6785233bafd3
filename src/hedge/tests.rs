use std::time::Duration;

use http::Method;

use crate::hedge::Hedge;

use crate::classify::Idempotency;

use crate::classify::NoRetry;

use crate::policy::RetryPolicy;

fn policy(hedge: Hedge) -> RetryPolicy {
    RetryPolicy::builder()
        .honor_idempotency_key_for_host("trusted.example")
        .route(Method::POST, "/search", Idempotency::Idempotent)
        .hedge(hedge)
        .build()
        .unwrap()
}

fn may_hedge(policy: &RetryPolicy, req: http::request::Builder) -> bool {
    let req = req.body(()).unwrap();
    policy.hedging().unwrap().may_hedge(&policy.classify(&req))
}

/// Every way a request can be called safe or not, with and without the keyed-write opt-in.
#[test]
fn only_requests_a_repeat_cannot_harm_may_be_hedged() {
    for keyed in [false, true] {
        let p = policy(Hedge::fixed(Duration::from_millis(5)).keyed_writes(keyed));
        let get = http::Request::get("http://trusted.example/a");
        assert!(may_hedge(&p, get), "GET");
        let search = http::Request::post("http://any.example/search");
        assert!(may_hedge(&p, search), "route rule");
        let marked = http::Request::post("http://any.example/x").extension(Idempotency::Idempotent);
        assert!(may_hedge(&p, marked), "marker");
        let no_retry = http::Request::get("http://any.example/x").extension(NoRetry);
        assert!(!may_hedge(&p, no_retry), "NoRetry");
        // A write without a key, or with a key its target is not trusted to honour: never.
        let post = http::Request::post("http://trusted.example/pay");
        assert!(!may_hedge(&p, post), "POST without key, keyed {keyed}");
        let untrusted =
            http::Request::post("http://other.example/pay").header("idempotency-key", "\"k\"");
        assert!(!may_hedge(&p, untrusted), "untrusted key, keyed {keyed}");
        let marked_write =
            http::Request::put("http://other.example/x").extension(Idempotency::NonIdempotent);
        assert!(!may_hedge(&p, marked_write), "marked write, keyed {keyed}");
        // A trusted key: only with the opt-in.
        let keyed_post =
            http::Request::post("http://trusted.example/pay").header("idempotency-key", "\"k\"");
        assert_eq!(may_hedge(&p, keyed_post), keyed, "keyed POST");
    }
}

#[test]
fn bad_settings_are_refused_naming_the_setting() {
    let bad = [
        Hedge::learned().max_extra_load(0.0),
        Hedge::learned().max_extra_load(-0.1),
        Hedge::learned().max_extra_load(1.01),
        Hedge::learned().max_extra_load(f64::NAN),
        Hedge::fixed(Duration::ZERO),
        Hedge::learned().min_samples(0),
        Hedge::learned().max_hedges(0),
        Hedge::learned().max_hedges(11),
    ];
    for hedge in bad {
        let err = RetryPolicy::builder()
            .hedge(hedge.clone())
            .build()
            .unwrap_err();
        assert_eq!(err.setting_name(), "hedge", "{hedge:?}");
    }
    assert!(RetryPolicy::builder()
        .hedge(Hedge::learned().max_extra_load(1.0))
        .build()
        .is_ok());
}

/// No learned delay before the minimum of samples; then the quantile the extra load sets,
/// never below the floor; hosts apart.
#[test]
fn the_learned_delay_waits_for_samples_and_keeps_hosts_apart() {
    let p = policy(Hedge::learned().max_extra_load(0.1).min_samples(50));
    let h = p.hedging().unwrap();
    let slow = h.slot(|| Some(("slow.example", None)));
    let fast = h.slot(|| Some(("fast.example", None)));
    assert_ne!(slow, fast);
    for i in 0..49u64 {
        h.add_sample(slow, Duration::from_millis(20 + i % 5));
        h.add_sample(fast, Duration::from_micros(100));
    }
    assert_eq!(h.delay(slow), None);
    h.add_sample(slow, Duration::from_millis(20));
    h.add_sample(fast, Duration::from_micros(100));
    let slow_delay = h.delay(slow).unwrap();
    assert!(slow_delay >= Duration::from_millis(24), "{slow_delay:?}");
    assert!(slow_delay <= Duration::from_millis(28), "{slow_delay:?}");
    // 100 µs learned, 1 ms floor.
    assert_eq!(h.delay(fast), Some(Duration::from_millis(1)));
}

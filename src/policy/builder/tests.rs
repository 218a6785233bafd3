use super::*;

fn err(b: RetryPolicyBuilder) -> BuildError {
    b.build().unwrap_err()
}

#[test]
fn defaults_build() {
    let p = RetryPolicyBuilder::new().build().unwrap();
    let i = &p.inner;
    assert_eq!(i.max_retries, 2);
    assert_eq!(i.backoff.initial, Duration::from_millis(500));
    assert_eq!(i.backoff.max, Duration::from_secs(8));
    assert_eq!(i.responses.max_retry_after, Duration::from_secs(60));
    assert_eq!(i.deadline, None);
    assert!(i.budget.is_some());
    let statuses: Vec<u16> = i
        .responses
        .retry_statuses
        .iter()
        .map(|s| s.as_u16())
        .collect();
    assert_eq!(statuses, [408, 429, 500, 502, 503, 504]);
}

#[test]
fn backoff_initial_above_max() {
    let e = err(RetryPolicyBuilder::new().backoff(Duration::from_secs(10), Duration::from_secs(1)));
    assert_eq!(e.setting_name(), "backoff");
    assert!(e.to_string().contains("initial 10s is above max 1s"), "{e}");
}

#[test]
fn budget_out_of_range() {
    let cases = [
        (Duration::from_millis(500), 10, 0.2, "ttl 500ms"),
        (Duration::from_secs(61), 10, 0.2, "ttl 61s"),
        (Duration::from_secs(10), 10, -0.1, "retry_percent -0.1"),
        (Duration::from_secs(10), 10, 1000.5, "retry_percent 1000.5"),
        (Duration::from_secs(10), 10, f32::NAN, "retry_percent NaN"),
        (
            Duration::from_secs(10),
            u32::MAX,
            0.2,
            "min_per_sec 4294967295",
        ),
    ];
    for (ttl, min, pct, needle) in cases {
        let e = err(RetryPolicyBuilder::new().tps_budget(ttl, min, pct));
        assert_eq!(e.setting_name(), "tps_budget");
        assert!(e.to_string().contains(needle), "{e}");
    }
}

#[test]
fn lock_free_budget_out_of_range() {
    let cases = [
        (Duration::from_millis(500), 0.2, "ttl 500ms"),
        (Duration::from_secs(10), 1000.5, "retry_percent 1000.5"),
    ];
    for (ttl, pct, needle) in cases {
        let e = err(RetryPolicyBuilder::new().lock_free_budget(ttl, 10, pct));
        assert_eq!(e.setting_name(), "lock_free_budget");
        assert!(e.to_string().contains(needle), "{e}");
    }
    let b = RetryPolicyBuilder::new().lock_free_budget(Duration::from_secs(1), 0, 0.0);
    assert!(format!("{b:?}").contains("LockFreeBudget"));
    assert!(b.build().is_ok());
}

#[test]
fn route_errors_name_the_rule() {
    let e = err(RetryPolicyBuilder::new()
        .route(Method::POST, "/v1/search", Idempotency::Idempotent)
        .route(Method::POST, "/v1/search", Idempotency::NonIdempotent));
    assert_eq!(
        e.to_string(),
        "invalid retry policy setting `route`: POST /v1/search: two rules for the same method and template"
    );
    let e =
        err(RetryPolicyBuilder::new().route(Method::GET, "/v1/{unclosed", Idempotency::Idempotent));
    assert!(e.to_string().contains("GET /v1/{unclosed"), "{e}");
}

#[test]
fn other_bad_settings() {
    let e = err(RetryPolicyBuilder::new().max_retries(101));
    assert!(
        e.to_string().contains("101 is above the limit of 100"),
        "{e}"
    );
    let e = err(RetryPolicyBuilder::new().retry_statuses([StatusCode::OK]));
    assert!(e.to_string().contains("200 OK is a success status"), "{e}");
    let e = err(RetryPolicyBuilder::new().deadline(Duration::ZERO));
    assert_eq!(e.setting_name(), "deadline");
}

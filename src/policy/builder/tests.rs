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

/// A request whose host the layer cannot see (origin form, no `Host`: tonic's generated
/// clients, hyper's connection-level `SendRequest`, a proxy's forwarded request) is classified
/// failing closed: a host-scoped write rule holds, a host-scoped read rule and key trust do
/// not; the verdict says its host was unknown. A `Host` header or the policy's origin
/// restores the host-scoped behaviour.
#[test]
fn a_request_without_a_visible_host_fails_closed() {
    use crate::classify::Idempotency;
    use crate::classify::VerdictSource;
    let policy = RetryPolicy::builder()
        .route_for_host(
            "api.test",
            Method::GET,
            "/v1/run",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "api.test",
            Method::POST,
            "/v1/search",
            Idempotency::Idempotent,
        )
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    let req = |method: Method, path: &str, host: Option<&str>| {
        let mut b = http::Request::builder().method(method).uri(path);
        if let Some(host) = host {
            b = b.header(http::header::HOST, host);
        }
        b.header("idempotency-key", "\"k\"").body(()).unwrap()
    };
    // Unknown host: the write rule holds, the read rule and the trust do not.
    let run = policy.classify(&req(Method::GET, "/v1/run", None));
    assert_eq!(
        (run.idempotency(), run.source()),
        (Idempotency::NonIdempotent, VerdictSource::Route)
    );
    assert!(run.host_unknown());
    assert!(!run.keys_honored());
    let search = policy.classify(&req(Method::POST, "/v1/search", None));
    assert_eq!(search.source(), VerdictSource::Method);
    assert_eq!(search.idempotency(), Idempotency::NonIdempotent);
    assert!(!search.is_keyed());
    assert!(search.host_unknown());
    // A Host header, or the origin, makes both apply.
    let origin = policy.for_origin("https://api.test").unwrap();
    for (policy, host) in [(&policy, Some("api.test")), (&origin, None)] {
        let search = policy.classify(&req(Method::POST, "/v1/search", host));
        assert_eq!(search.source(), VerdictSource::Route, "{host:?}");
        assert!(search.keys_honored() && !search.host_unknown());
    }
    // A `Host` that names another host than the origin (where the channel sends): the server
    // may route by either, so the host is unknown and nothing host-scoped but a write rule
    // applies (issue 41, item 1: it used to outrank the origin).
    let elsewhere = origin.classify(&req(Method::POST, "/v1/search", Some("other.test")));
    assert_eq!(elsewhere.source(), VerdictSource::Method);
    assert!(!elsewhere.keys_honored() && elsewhere.host_unknown());
    // A policy that scopes nothing to hosts never looks, and never says the host was unknown.
    let plain = RetryPolicy::builder().build().unwrap();
    assert!(!plain
        .classify(&req(Method::POST, "/v1/search", None))
        .host_unknown());
}

#[test]
fn an_origin_on_its_schemes_default_port_reaches_that_port() {
    use crate::classify::Idempotency;
    use crate::classify::VerdictSource;
    let policy = RetryPolicy::builder()
        .route_for_host(
            "api.test:443",
            Method::POST,
            "/v1/search",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let search = || http::Request::post("/v1/search").body(()).unwrap();
    let https = policy.for_origin("https://api.test").unwrap();
    assert_eq!(https.classify(&search()).source(), VerdictSource::Route);
    let http = policy.for_origin("http://api.test").unwrap();
    assert_eq!(http.classify(&search()).source(), VerdictSource::Method);
}

#[test]
fn a_bad_origin_is_refused_naming_it_and_hiding_user_information() {
    let policy = RetryPolicy::builder().build().unwrap();
    for bad in ["", "api.test/v1", "a b"] {
        let err = policy.for_origin(bad).unwrap_err();
        assert_eq!(err.setting_name(), "for_origin", "{bad:?}");
    }
    let err = policy.for_origin("https://user:pw@api.test").unwrap_err();
    assert!(!err.to_string().contains("pw"), "{err}");
}

/// The warning that a request's host was not visible is logged once per policy, not once per
/// request, and names the way out.
#[test]
fn an_unknown_host_is_warned_about_once() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let policy = RetryPolicy::builder()
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..3 {
            let req = http::Request::post("/v1/send?token=secret")
                .body(())
                .unwrap();
            assert!(policy.classify(&req).host_unknown());
        }
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("shows no host").count(), 1, "{text}");
    assert!(
        text.contains("for_origin") && !text.contains("secret"),
        "{text}"
    );
}

/// A request whose URI and `Host` header name different hosts, or that carries two `Host`
/// fields, has no known host: the server may route by either, so a write rule for either holds
/// (fail closed). A `Host` header with spaces around its value is that host (parsers trim them).
/// From the adversarial review of the host-unknown change.
#[test]
fn disagreeing_or_repeated_host_fields_make_the_host_unknown() {
    use crate::classify::Idempotency;
    let policy = RetryPolicy::builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let put = |uri: &str, hosts: &[&str]| {
        let mut b = http::Request::put(uri);
        for h in hosts {
            b = b.header(http::header::HOST, *h);
        }
        policy.classify(&b.body(()).unwrap())
    };
    let disagree = put("http://127.0.0.1:8080/v1/send", &["api.test"]);
    assert!(disagree.host_unknown());
    assert_eq!(disagree.idempotency(), Idempotency::NonIdempotent);
    let twice = put("/v1/send", &["other.test", "api.test"]);
    assert!(twice.host_unknown());
    assert_eq!(twice.idempotency(), Idempotency::NonIdempotent);
    let agree = put("http://API.test/v1/send", &["api.test:80"]);
    assert!(!agree.host_unknown());
    assert_eq!(agree.idempotency(), Idempotency::NonIdempotent);
    let spaced = put("/v1/send", &[" api.test "]);
    assert!(!spaced.host_unknown());
    assert_eq!(spaced.idempotency(), Idempotency::NonIdempotent);
    let elsewhere = put("http://other.test/v1/send", &["other.test"]);
    assert_eq!(elsewhere.idempotency(), Idempotency::Idempotent);
}

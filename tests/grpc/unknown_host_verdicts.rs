//! Verdicts when a request shows no host (the adversarial review of the host-unknown and
//! may-have-been-applied change): host-scoped rules fail closed, the spellings of a host and
//! port reach the rule scoped to it, `RetryPolicy::for_origin` takes base URLs and refuses
//! what no channel sends to, host-scoped key trust needs the host, and the host-unknown
//! warning shows no secret.
#![cfg(feature = "tonic")]

use std::time::Duration;

use http::{HeaderValue, Method, Request};
use tower_retry_safety::classify::VerdictSource;
use tower_retry_safety::{Idempotency, RetryPolicy, RetryPolicyBuilder};

pub(crate) fn builder() -> RetryPolicyBuilder {
    RetryPolicy::builder()
        .no_budget()
        .jitter(false)
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .max_retries(2)
}

fn origin_form(method: Method, path: &str) -> http::request::Builder {
    Request::builder().method(method).uri(path)
}

/// From the adversarial review of the host/applied change: with no visible host, a
/// host-scoped `NonIdempotent` rule beats an unscoped `Idempotent` rule for the same route,
/// and a caller's marker still beats both.
#[test]
fn a_host_scoped_write_rule_beats_an_unscoped_idempotent_rule_when_the_host_is_unknown() {
    let policy = builder()
        .route(Method::PUT, "/v1/send", Idempotency::Idempotent)
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    let verdict = policy.classify(&req);
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
    assert_eq!(verdict.source(), VerdictSource::Route);
    assert!(verdict.host_unknown() && verdict.can_apply());
    // The marker speaks first.
    let mut marked = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    marked.extensions_mut().insert(Idempotency::Idempotent);
    let verdict = policy.classify(&marked);
    assert_eq!(verdict.idempotency(), Idempotency::Idempotent);
    assert_eq!(verdict.source(), VerdictSource::Marker);
    // Another host, named: the unscoped rule applies.
    let other = origin_form(Method::PUT, "/v1/send")
        .header("host", "other.test")
        .body(())
        .unwrap();
    let verdict = policy.classify(&other);
    assert_eq!(verdict.idempotency(), Idempotency::Idempotent);
    assert!(!verdict.host_unknown());
}

/// From the adversarial review of the host/applied change: a `Host` header the layer cannot
/// read (empty, or bytes that are not visible ASCII) is no host: the write rule holds.
#[test]
fn an_empty_or_unreadable_host_header_is_an_unknown_host() {
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    for value in [
        HeaderValue::from_static(""),
        HeaderValue::from_bytes(b"api.t\xe9st").unwrap(),
    ] {
        let mut req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
        req.headers_mut().insert("host", value.clone());
        let verdict = policy.classify(&req);
        assert!(verdict.host_unknown(), "{value:?}");
        assert_eq!(
            verdict.idempotency(),
            Idempotency::NonIdempotent,
            "{value:?}"
        );
    }
}

/// From the adversarial review of the host/applied change: the spellings of one host and
/// port in a `Host` header reach the rule scoped to it (IPv6 with a port, uppercase, a
/// trailing dot, an IPv4 shorthand).
#[test]
fn host_header_spellings_reach_a_port_scoped_rule() {
    let policy = builder()
        .route_for_host(
            "[0::1]:8080",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "127.0.0.1:8080",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    for host in [
        "[::1]:8080",
        "[0:0:0:0:0:0:0:1]:8080",
        "127.1:8080",
        "127.0.0.1.:8080",
    ] {
        let req = origin_form(Method::PUT, "/v1/send")
            .header("host", host)
            .body(())
            .unwrap();
        let verdict = policy.classify(&req);
        assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent, "{host}");
        assert!(!verdict.host_unknown(), "{host}");
    }
}

/// From the adversarial review of the host/applied change: a `Host` header without a port
/// names the host but not the port (an origin-form request on the scheme's default port
/// omits it, RFC 9110 §7.2). A `NonIdempotent` rule scoped to that host on a port must hold
/// (fail closed: the request may be for that port); before the fix it was skipped and the
/// PUT was called idempotent by its method.
#[test]
fn a_port_scoped_write_rule_holds_when_the_host_header_has_no_port() {
    let policy = builder()
        .route_for_host(
            "api.test:443",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send")
        .header("host", "api.test")
        .body(())
        .unwrap();
    assert_eq!(
        policy.classify(&req).idempotency(),
        Idempotency::NonIdempotent
    );
    // A port-scoped read rule does not apply to an unknown port (also fail closed).
    let read = builder()
        .route_for_host(
            "api.test:443",
            Method::POST,
            "/v1/search",
            Idempotency::Idempotent,
        )
        .build()
        .unwrap();
    let req = origin_form(Method::POST, "/v1/search")
        .header("host", "api.test")
        .body(())
        .unwrap();
    assert_eq!(
        read.classify(&req).idempotency(),
        Idempotency::NonIdempotent
    );
}

/// From the adversarial review of the host/applied change: `for_origin` with a host alone
/// gives no port; a `NonIdempotent` rule scoped to that host on a port must still hold.
#[test]
fn a_port_scoped_write_rule_holds_with_an_origin_without_a_port() {
    let policy = builder()
        .route_for_host(
            "127.0.0.1:50051",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap()
        .for_origin("127.0.0.1")
        .unwrap();
    let req = origin_form(Method::PUT, "/v1/send").body(()).unwrap();
    let verdict = policy.classify(&req);
    assert!(!verdict.host_unknown());
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
}

/// From the adversarial review of the host/applied change: `for_origin`'s odd inputs. User
/// information is refused without echoing the password; a trailing slash, IPv6 and a default
/// port are taken; a path without a scheme is refused.
#[test]
fn for_origin_takes_base_urls_and_refuses_user_information_without_echoing_it() {
    let policy = builder()
        .route_for_host(
            "127.0.0.1:80",
            Method::PUT,
            "/v1/send",
            Idempotency::NonIdempotent,
        )
        .route_for_host(
            "[::1]:50051",
            Method::PUT,
            "/v1/put",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let err = policy
        .for_origin("http://user:hunter2@127.0.0.1:50051")
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    assert!(policy.for_origin("127.0.0.1:50051/").is_err());
    assert!(policy.for_origin("").is_err());
    let put = |path: &str| origin_form(Method::PUT, path).body(()).unwrap();
    // The default port of the scheme is the port.
    let default_port = policy.for_origin("http://127.0.0.1/").unwrap();
    assert_eq!(
        default_port.classify(&put("/v1/send")).idempotency(),
        Idempotency::NonIdempotent
    );
    let v6 = policy.for_origin("http://[0:0::1]:50051/").unwrap();
    assert_eq!(
        v6.classify(&put("/v1/put")).idempotency(),
        Idempotency::NonIdempotent
    );
    // A `Host` naming another host than the origin (where the channel sends) leaves the host
    // unknown, and the write rule holds (issue 41, item 1: the header used to outrank it).
    let named = origin_form(Method::PUT, "/v1/put")
        .header("host", "elsewhere.test")
        .body(())
        .unwrap();
    assert_eq!(
        v6.classify(&named).idempotency(),
        Idempotency::NonIdempotent
    );
    assert!(v6.classify(&named).host_unknown());
    // Port 0 and an unspecified address are no origin a channel sends to (issue 41, item 2).
    for bad in [
        "http://127.0.0.1:0",
        "127.0.0.1:0",
        "http://0.0.0.0:50051",
        "ftp://127.0.0.1:1",
    ] {
        assert_eq!(
            policy.for_origin(bad).unwrap_err().setting_name(),
            "for_origin",
            "{bad}"
        );
    }
}

/// From the adversarial review of the host/applied change: a keyed POST whose key is trusted
/// only for a host is not keyed when its host is unknown (no retry after an ambiguous
/// failure), and is with the origin.
#[test]
fn host_scoped_key_trust_does_not_apply_to_an_unknown_host() {
    let policy = builder()
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    let req = || {
        origin_form(Method::POST, "/v1/send")
            .header("idempotency-key", "\"k-1\"")
            .body(())
            .unwrap()
    };
    let verdict = policy.classify(&req());
    assert!(verdict.host_unknown());
    assert!(!verdict.is_keyed());
    assert_eq!(verdict.idempotency(), Idempotency::NonIdempotent);
    let with_origin = policy.for_origin("https://api.test").unwrap();
    let verdict = with_origin.classify(&req());
    assert!(verdict.is_keyed() && !verdict.host_unknown());
}

/// From the adversarial review of the host/applied change: a GET that a rule scoped to a host
/// calls a write can apply when its host is unknown (the rule holds), and a GET no rule names
/// cannot.
#[test]
fn a_get_with_a_host_scoped_write_rule_can_apply_when_its_host_is_unknown() {
    let policy = builder()
        .route_for_host(
            "api.test",
            Method::GET,
            "/v1/trigger",
            Idempotency::NonIdempotent,
        )
        .build()
        .unwrap();
    let trigger = origin_form(Method::GET, "/v1/trigger").body(()).unwrap();
    let verdict = policy.classify(&trigger);
    assert!(verdict.host_unknown() && verdict.can_apply());
    let read = origin_form(Method::GET, "/v1/other").body(()).unwrap();
    assert!(!policy.classify(&read).can_apply());
}

/// From the adversarial review of the host/applied change: the one-time warning names the
/// method and path only: no query string, no header value.
#[test]
fn the_host_unknown_warning_shows_no_query_or_header_value() {
    let policy = builder()
        .honor_idempotency_key_for_host("api.test")
        .build()
        .unwrap();
    let (logs, ()) = retry_safety_testing::logs::capture(|| {
        for _ in 0..3 {
            let req = origin_form(Method::POST, "/v1/send?token=query-secret")
                .header("authorization", "Bearer header-secret")
                .header("idempotency-key", "\"key-secret\"")
                .body(())
                .unwrap();
            assert!(policy.classify(&req).host_unknown());
        }
    });
    assert_eq!(logs.matches("shows no host").count(), 1, "{logs}");
    for secret in ["query-secret", "header-secret", "key-secret", "token="] {
        assert!(!logs.contains(secret), "{secret}: {logs}");
    }
}

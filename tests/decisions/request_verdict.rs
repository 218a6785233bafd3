//! Every precedence rule of the request verdict (`RetryPolicy::classify`'s docs).

use http::{Method, Request};
use tower_retry_safety::classify::VerdictSource;
use tower_retry_safety::{Idempotency, NoRetry, RetryPolicy};

use Idempotency::{Idempotent, NonIdempotent};

fn policy() -> RetryPolicy {
    RetryPolicy::builder()
        .route(Method::POST, "/v1/search", Idempotent)
        .route(Method::PUT, "/v1/messages/send", NonIdempotent)
        .route(Method::POST, "/v1/tools/{slug}/execute", NonIdempotent)
        .route(Method::POST, "/v1/files/{*path}", Idempotent)
        .honor_idempotency_key(true)
        .build()
        .unwrap()
}

fn req(method: Method, uri: &str) -> Request<()> {
    Request::builder().method(method).uri(uri).body(()).unwrap()
}

fn verdict(r: &Request<()>) -> (Idempotency, VerdictSource) {
    let v = policy().classify(r);
    (v.idempotency(), v.source())
}

#[test]
fn method_defaults_follow_rfc_9110() {
    for m in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
        let m = Method::from_bytes(m.as_bytes()).unwrap();
        assert_eq!(
            verdict(&req(m.clone(), "/x")),
            (Idempotent, VerdictSource::Method),
            "{m}"
        );
    }
    for m in ["POST", "PATCH", "CONNECT", "PURGE", "LINK", "MKCOL"] {
        let m = Method::from_bytes(m.as_bytes()).unwrap();
        let uri = if m == Method::CONNECT {
            "example.com:443"
        } else {
            "/x"
        };
        assert_eq!(
            verdict(&req(m.clone(), uri)),
            (NonIdempotent, VerdictSource::Method),
            "{m}"
        );
    }
}

#[test]
fn route_outranks_method() {
    assert_eq!(
        verdict(&req(Method::POST, "/v1/search")),
        (Idempotent, VerdictSource::Route)
    );
    assert_eq!(
        verdict(&req(Method::PUT, "/v1/messages/send")),
        (NonIdempotent, VerdictSource::Route)
    );
    assert_eq!(
        verdict(&req(Method::POST, "/v1/files/a/b.txt")),
        (Idempotent, VerdictSource::Route)
    );
}

#[test]
fn query_string_never_takes_part_in_matching() {
    assert_eq!(
        verdict(&req(
            Method::POST,
            "https://api.example.com/v1/search?q=a&page=2"
        )),
        (Idempotent, VerdictSource::Route)
    );
    assert_eq!(
        verdict(&req(
            Method::POST,
            "/v1/tools/GMAIL_SEND/execute?dry_run=true"
        )),
        (NonIdempotent, VerdictSource::Route)
    );
}

#[test]
fn absolute_uris_match_on_path() {
    assert_eq!(
        verdict(&req(Method::POST, "http://127.0.0.1:8080/v1/search")),
        (Idempotent, VerdictSource::Route)
    );
}

#[test]
fn key_outranks_method_when_honoured() {
    let mut r = req(Method::POST, "/v1/messages");
    r.headers_mut()
        .insert("idempotency-key", "\"8e03978e-40d5\"".parse().unwrap());
    let v = policy().classify(&r);
    assert_eq!(
        (v.idempotency(), v.source()),
        (Idempotent, VerdictSource::IdempotencyKey)
    );
    assert!(v.is_keyed());
}

/// A read is idempotent by its method: a trusted key keeps that verdict (and says it is keyed),
/// so what takes only requests idempotent of themselves, like hedging, still takes it.
#[test]
fn a_keyed_read_stays_idempotent_by_its_method() {
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        let mut r = req(method.clone(), "/v1/messages");
        r.headers_mut()
            .insert("idempotency-key", "\"8e03978e-40d5\"".parse().unwrap());
        let v = policy().classify(&r);
        assert_eq!(
            (v.idempotency(), v.source()),
            (Idempotent, VerdictSource::Method),
            "{method}"
        );
        assert!(v.is_keyed(), "{method}");
    }
}

#[test]
fn key_is_ignored_unless_honoured() {
    let p = RetryPolicy::builder().build().unwrap();
    let mut r = req(Method::POST, "/v1/messages");
    r.headers_mut()
        .insert("idempotency-key", "\"abc\"".parse().unwrap());
    let v = p.classify(&r);
    assert_eq!(
        (v.idempotency(), v.source()),
        (NonIdempotent, VerdictSource::Method)
    );
    assert!(!v.is_keyed());
}

#[test]
fn empty_or_malformed_key_does_not_count() {
    for bad in ["", "\"\"", "\"open", "two words", "\"bad\\q\""] {
        let mut r = req(Method::POST, "/v1/messages");
        r.headers_mut()
            .insert("idempotency-key", bad.parse().unwrap());
        assert_eq!(
            verdict(&r),
            (NonIdempotent, VerdictSource::Method),
            "{bad:?}"
        );
    }
}

#[test]
fn key_header_name_is_settable() {
    let p = RetryPolicy::builder()
        .honor_idempotency_key(true)
        .idempotency_key_header("x-idempotency-key".parse().unwrap())
        .build()
        .unwrap();
    let mut r = req(Method::POST, "/v1/messages");
    r.headers_mut()
        .insert("x-idempotency-key", "k-1".parse().unwrap());
    assert_eq!(p.classify(&r).source(), VerdictSource::IdempotencyKey);
    let mut r = req(Method::POST, "/v1/messages");
    r.headers_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    assert_eq!(p.classify(&r).source(), VerdictSource::Method);
}

#[test]
fn route_outranks_key() {
    let mut r = req(Method::POST, "/v1/tools/GMAIL_SEND/execute");
    r.headers_mut()
        .insert("idempotency-key", "\"k\"".parse().unwrap());
    let v = policy().classify(&r);
    assert_eq!(
        (v.idempotency(), v.source()),
        (NonIdempotent, VerdictSource::Route)
    );
    // Unscoped trust does not cover a route a rule calls a write: the key does not count.
    assert!(!v.keys_honored());
    assert!(!v.is_keyed());
}

/// What decides a request's verdict in `every_combination_of_marker_rule_key_and_trust`.
#[derive(Clone, Copy, Debug)]
enum Decider {
    ByMethod,
    WriteRule,
    WriteMarker,
    ReadRule,
    ReadMarker,
}

/// Whom a policy trusts with idempotency keys in `every_combination_of_marker_rule_key_and_trust`.
#[derive(Clone, Copy, Debug)]
enum Trust {
    None,
    Unscoped,
    ThisHost,
    OtherHost,
    RouteHonors,
    RouteIgnores,
}

/// A policy with a read rule (`POST /v1/search`), a write rule (`POST /v1/send`) and `trust`.
fn policy_trusting(trust: Trust) -> RetryPolicy {
    let mut b = RetryPolicy::builder()
        .route(Method::POST, "/v1/search", Idempotent)
        .route(Method::POST, "/v1/send", NonIdempotent);
    b = match trust {
        Trust::None => b,
        Trust::Unscoped => b.honor_idempotency_key(true),
        Trust::ThisHost => b.honor_idempotency_key_for_host("api.test"),
        Trust::OtherHost => b.honor_idempotency_key_for_host("other.test"),
        // A route's word outranks the host's and unscoped trust, both given here.
        Trust::RouteHonors => b.route_honors_idempotency_key(Method::POST, "/v1/{*any}", true),
        Trust::RouteIgnores => b
            .honor_idempotency_key(true)
            .honor_idempotency_key_for_host("api.test")
            .route_honors_idempotency_key(Method::POST, "/v1/{*any}", false),
    };
    b.build().unwrap()
}

/// A POST to `api.test` whose verdict `decider` decides, with an idempotency key if `has_key`.
fn request_decided_by(decider: Decider, has_key: bool) -> Request<()> {
    let path = match decider {
        Decider::WriteRule => "/v1/send",
        Decider::ReadRule => "/v1/search",
        _ => "/v1/other",
    };
    let mut r = req(Method::POST, &format!("http://api.test{path}"));
    match decider {
        Decider::WriteMarker => {
            r.extensions_mut().insert(NonIdempotent);
        }
        Decider::ReadMarker => {
            r.extensions_mut().insert(Idempotent);
        }
        _ => {}
    }
    if has_key {
        r.headers_mut()
            .insert("idempotency-key", "\"k-1\"".parse().unwrap());
    }
    r
}

/// Every combination of what decides (method, rule, marker), key (none, present) and trust
/// (none, unscoped, the request's host, another host, the route honours keys, the route
/// ignores them): whether a repeat is harmless.
#[test]
fn every_combination_of_marker_rule_key_and_trust() {
    use Decider::*;
    const TRUSTS: [Trust; 6] = [
        Trust::None,
        Trust::Unscoped,
        Trust::ThisHost,
        Trust::OtherHost,
        Trust::RouteHonors,
        Trust::RouteIgnores,
    ];
    // Harmless with a key, per trust in TRUSTS order. Without a key only reads are harmless.
    let table: [(Decider, [bool; 6]); 5] = [
        (ByMethod, [false, true, true, false, true, false]),
        (WriteRule, [false, false, true, false, true, false]),
        (WriteMarker, [false, false, true, false, true, false]),
        (ReadRule, [true, true, true, true, true, true]),
        (ReadMarker, [true, true, true, true, true, true]),
    ];
    for (decider, with_key) in table {
        for (trust, expect_keyed) in TRUSTS.into_iter().zip(with_key) {
            for has_key in [false, true] {
                let r = request_decided_by(decider, has_key);
                let v = policy_trusting(trust).classify(&r);
                let harmless = v.idempotency() == Idempotent || v.is_keyed();
                let reads = matches!(decider, ReadRule | ReadMarker);
                let expect = if has_key { expect_keyed } else { reads };
                assert_eq!(harmless, expect, "{decider:?} {trust:?} key={has_key}");
                if !has_key {
                    assert!(!v.is_keyed());
                }
            }
        }
    }
}

#[test]
fn hosts_that_cannot_be_trusted_are_refused_by_build() {
    for bad in ["", "api.test/v1", "api test", "https://user:pw@api.test"] {
        let err = RetryPolicy::builder()
            .honor_idempotency_key_for_host(bad)
            .build()
            .unwrap_err();
        assert_eq!(
            err.setting_name(),
            "honor_idempotency_key_for_host",
            "{bad}"
        );
        assert!(!err.to_string().contains("user:pw"), "{err}");
    }
    // What a user holds: a host, an authority with a port, a base URL.
    for good in [
        "[::1]",
        "api.test:443",
        "https://api.test",
        "http://api.test:8080/v1/",
    ] {
        RetryPolicy::builder()
            .honor_idempotency_key_for_host(good)
            .build()
            .unwrap();
    }
}

#[test]
fn marker_outranks_route_key_and_method() {
    let mut r = req(Method::POST, "/v1/search");
    r.headers_mut()
        .insert("idempotency-key", "\"k\"".parse().unwrap());
    r.extensions_mut().insert(NonIdempotent);
    assert_eq!(verdict(&r), (NonIdempotent, VerdictSource::Marker));

    let mut r = req(Method::POST, "/v1/tools/x/execute");
    r.extensions_mut().insert(Idempotent);
    assert_eq!(verdict(&r), (Idempotent, VerdictSource::Marker));

    let mut r = req(Method::GET, "/v1/things");
    r.extensions_mut().insert(NonIdempotent);
    assert_eq!(verdict(&r), (NonIdempotent, VerdictSource::Marker));
}

#[test]
fn no_retry_outranks_everything() {
    let mut r = req(Method::GET, "/v1/search");
    r.extensions_mut().insert(Idempotent);
    r.extensions_mut().insert(NoRetry);
    let v = policy().classify(&r);
    assert!(v.is_no_retry());
    assert_eq!(v.source(), VerdictSource::Marker);
    let plain = policy().classify(&req(Method::GET, "/v1/search"));
    assert!(!plain.is_no_retry());
}

/// A rule scoped to a host applies to that host only, outranks a rule for every host there,
/// and never reaches another host.
#[test]
fn host_scoped_rules_apply_to_their_host_only() {
    let p = RetryPolicy::builder()
        .route(Method::POST, "/v1/search", NonIdempotent)
        .route_for_host("API.a.test", Method::POST, "/v1/search", Idempotent)
        .route_for_host("api.a.test", Method::PUT, "/v1/send/{id}", NonIdempotent)
        .build()
        .unwrap();
    let v = |uri: &str, m: Method| {
        let v = p.classify(&req(m, uri));
        (v.idempotency(), v.source())
    };
    // Its host, on any port and in any case: the host's rules.
    assert_eq!(
        v("http://api.a.test:8443/v1/search", Method::POST),
        (Idempotent, VerdictSource::Route)
    );
    assert_eq!(
        v("http://API.A.TEST/v1/send/m1", Method::PUT),
        (NonIdempotent, VerdictSource::Route)
    );
    // Another host: the rules for every host, then the method.
    assert_eq!(
        v("http://api.b.test/v1/search", Method::POST),
        (NonIdempotent, VerdictSource::Route)
    );
    assert_eq!(
        v("http://api.b.test/v1/send/m1", Method::PUT),
        (Idempotent, VerdictSource::Method)
    );
    // No host in the URI: the request may be for that host, so its write rule holds (fail
    // closed); its read rule does not, and the rule for every host decides. (Until the host
    // blind spot over tonic `Channel`s was found, no host's rule applied here: the PUT was
    // idempotent by its method.)
    assert_eq!(
        v("/v1/send/m1", Method::PUT),
        (NonIdempotent, VerdictSource::Route)
    );
    assert_eq!(
        v("/v1/search", Method::POST),
        (NonIdempotent, VerdictSource::Route)
    );
    // A rule for a host and port holds on that port only.
    let p = RetryPolicy::builder()
        .route_for_host("api.a.test:8443", Method::GET, "/x", NonIdempotent)
        .build()
        .unwrap();
    assert_eq!(
        p.classify(&req(Method::GET, "https://api.a.test:8443/x"))
            .idempotency(),
        NonIdempotent
    );
    assert_eq!(
        p.classify(&req(Method::GET, "https://api.a.test/x"))
            .idempotency(),
        Idempotent
    );
    let err = RetryPolicy::builder()
        .route_for_host("api.a.test", Method::GET, "no-slash", Idempotent)
        .build()
        .unwrap_err();
    assert_eq!(err.setting_name(), "route_for_host");
}

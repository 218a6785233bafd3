//! What every resend and hedge carries, against a recording inner service on paused time: a
//! retry's and a hedge's copy carry the first attempt's method (an extension method), URI with
//! query, version, multi-valued headers and extensions; per-attempt headers are set, not
//! accumulated; minted keys are copied once. From the review of 2026-12-04.

use retry_safety_testing::recording_service::{base, recording, values, Seen, Tag};
use std::time::Duration;

use http::{HeaderMap, Method, Request, StatusCode, Version};
use tower::{Layer, ServiceExt};
use tower_retry_safety::{Hedge, Idempotency};

fn without(headers: &HeaderMap, names: &[&str]) -> HeaderMap {
    let mut h = headers.clone();
    for n in names {
        h.remove(*n);
    }
    h
}

/// A WebDAV request with everything a copy could lose.
fn dav_request() -> Request<String> {
    let mut req = Request::builder()
        .method(Method::from_bytes(b"PROPFIND").unwrap())
        .uri("http://api.test/dav/a%20b/?depth=1&x=2&x=3")
        .version(Version::HTTP_2)
        .header("accept", "application/xml")
        .header("accept", "text/plain")
        .header("x-multi", "1")
        .header("x-multi", "2")
        .header("x-multi", "3")
        .header("depth", "1")
        .body(String::from("<propfind/>"))
        .unwrap();
    req.extensions_mut().insert(Tag("caller"));
    req.extensions_mut().insert(Idempotency::Idempotent);
    req
}

fn assert_same_head(seen: &[Seen], extra: &[&str]) {
    let first = &seen[0];
    let mut strip = vec!["x-attempt"];
    strip.extend_from_slice(extra);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.method.as_str(), "PROPFIND", "attempt {}", i + 1);
        assert_eq!(
            s.uri,
            "http://api.test/dav/a%20b/?depth=1&x=2&x=3",
            "attempt {}",
            i + 1
        );
        assert_eq!(s.version, Version::HTTP_2, "attempt {}", i + 1);
        assert_eq!(s.tag, Some(Tag("caller")), "attempt {}", i + 1);
        assert_eq!(
            without(&s.headers, &strip),
            without(&first.headers, &strip),
            "attempt {}",
            i + 1
        );
        assert_eq!(
            values(&s.headers, "accept"),
            ["application/xml", "text/plain"]
        );
        assert_eq!(values(&s.headers, "x-multi"), ["1", "2", "3"]);
        assert_eq!(
            values(&s.headers, "x-attempt"),
            [format!("{}", i + 1)],
            "attempt {}",
            i + 1
        );
    }
}

/// Retries of an extension method (marked idempotent) carry the first attempt's method, URI
/// with its query, HTTP/2, multi-valued headers and the caller's extension; the attempt header
/// is one value per attempt. Exactly 3 calls (503, 503, 200).
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn retries_copy_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(0, 503), (0, 503), (0, 200)]);
    let res = base()
        .build()
        .unwrap()
        .layer(svc)
        .oneshot(dav_request())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 3);
    assert_same_head(&seen, &[]);
}

/// A hedge carries the same head as the attempt it hedges: 2 calls, the hedge 50 ms after.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn a_hedge_copies_the_whole_head_of_an_extension_method() {
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let policy = base()
        .hedge(Hedge::fixed(Duration::from_millis(50)).max_extra_load(1.0))
        .build()
        .unwrap();
    let res = policy.layer(svc).oneshot(dav_request()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at, Duration::from_millis(50));
    assert_same_head(&seen, &[]);
}

/// Minted keys go into the head every retry and hedge copies: a POST answered 503 then 200 is
/// sent twice with the one minted key (one value each); hedged (`keyed_writes`), its hedge
/// carries the same key. A DELETE a marker calls a write gets a key but unscoped trust yields
/// to the marker: a 503 is final, 1 call.
///
/// Found by the review of 2026-12-04.
#[tokio::test(start_paused = true)]
async fn minted_keys_are_copied_once_into_every_resend() {
    let policy = base().mint_idempotency_keys(true).build().unwrap();
    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    let res = policy.clone().layer(svc).oneshot(post).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let hedged = base()
        .mint_idempotency_keys(true)
        .hedge(
            Hedge::fixed(Duration::from_millis(50))
                .max_extra_load(1.0)
                .keyed_writes(true),
        )
        .build()
        .unwrap();
    let (svc, log) = recording(&[(10_000, 200), (0, 200)]);
    let post = Request::post("http://api.test/v1/orders")
        .body(String::from("{}"))
        .unwrap();
    hedged.layer(svc).oneshot(post).await.unwrap();
    {
        let seen = log.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[1].at, Duration::from_millis(50));
        let k0 = values(&seen[0].headers, "idempotency-key");
        assert_eq!(k0.len(), 1);
        assert_eq!(values(&seen[1].headers, "idempotency-key"), k0);
    }

    let (svc, log) = recording(&[(0, 503), (0, 200)]);
    let mut delete = Request::delete("http://api.test/v1/queue/head")
        .body(String::new())
        .unwrap();
    delete.extensions_mut().insert(Idempotency::NonIdempotent);
    let res = policy.layer(svc).oneshot(delete).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    let seen = log.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(values(&seen[0].headers, "idempotency-key").len(), 1);
}

//! Never twice: a write that is never repeated (a key not trusted, `NoRetry`,
//! `max_retries(0)`, a key that makes nothing safe) is sent once, through both front ends, and
//! keeps its response under the deadline; a trusted keyed write within the limit that stalls is
//! resent once.
//!
//! Found by the adversarial review, round 2, of reading whole bodies (issue 23).

use std::time::Duration;

use super::{cut_at, req, slow, HANG, REPLAYED, SMALL};
use crate::read_whole_reqwest::{reqwest_client, reqwest_read_all, BIG, HALF};
use http::Method;
use retry_safety_testing::raw_server::{rep, Raw};
use retry_safety_testing::read_whole::{find_cut, policy, read_all, stack};
use tower::ServiceExt;
use tower_retry_safety::{NoRetry, RetryPolicy};

/// **Weaker (a write's response lost).** A write whose key the policy does not trust (or a
/// keyed write marked `NoRetry`, or one with `max_retries(0)`) is never sent again, but
/// `ReadWhole` reads its small body inside the attempt anyway (`may_repeat` looks only at the
/// header: `has_key`), under the attempt's clock. The README promises, for "a write without a
/// trusted key", "never read inside the attempt (a slow body keeps its response)".
///
/// What happens: the server applies the write and answers `200` with 8 KiB in 512-byte frames
/// 60 ms apart (about 1 s); per-attempt timeout 300 ms, deadline 700 ms. The per-attempt timer
/// is (rightly) extended, but the deadline cuts the attempt while the body is read: the caller
/// gets `Err(Error)` (timed out, "may have been applied") instead of the `200` and a body
/// ending in a `BodyCutError` with the status. 1 request, 1 write (never twice holds). An
/// unkeyed write streams and keeps its response (see the regression test below).
///
/// Fixed (the fix proposed): let the retry layer tell `ReadWhole` whether it may repeat the attempt (e.g. a flag in
/// `AttemptClock`, or a marker the layer inserts when `Plan::may_retry` and the verdict's
/// `repeat_is_harmless`), and stream the others untouched; or, when the deadline fires while
/// `ReadWhole` reads, return the response whose body ends in a `BodyCutError`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn a_write_that_is_never_repeated_keeps_its_response_under_the_deadline() {
    let base = || {
        policy()
            .attempt_timeout(Duration::from_millis(300))
            .deadline(Duration::from_millis(700))
    };
    let cases: Vec<(&str, RetryPolicy, bool)> = vec![
        ("key not trusted", base().build().unwrap(), false),
        (
            "trusted key, NoRetry",
            base().honor_idempotency_key(true).build().unwrap(),
            true,
        ),
        (
            "trusted key, max_retries(0)",
            base()
                .honor_idempotency_key(true)
                .max_retries(0)
                .build()
                .unwrap(),
            false,
        ),
    ];
    let mut lost = Vec::new();
    for (what, policy, no_retry) in cases {
        let server = Raw::start(|_, _| slow("200 OK", SMALL, 1, 60, &[])).await;
        let mut r = req(Method::POST, &server.url("/v1/send"), &["k-slow"]);
        if no_retry {
            r.extensions_mut().insert(NoRetry);
        }
        let out = tokio::time::timeout(HANG, stack(policy).oneshot(r))
            .await
            .expect("no hang");
        assert_eq!(server.writes(), 1, "{what}: never twice");
        match out {
            Ok(res) => {
                let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
                    .await
                    .expect("no hang");
                match err {
                    None => assert_eq!(bytes, rep(SMALL, 1), "{what}"),
                    Some(err) => assert!(find_cut(&*err).is_some(), "{what}: {err}"),
                }
            }
            Err(e) => lost.push(format!("{what}: {e}")),
        }
    }
    assert!(lost.is_empty(), "responses lost: {lost:#?}");
}

/// Keys that do not make a write safe to repeat, whatever `ReadWhole` sees in the header: an
/// empty key, an empty sf-string, a malformed key, a trusted key with `NoRetry` or
/// `max_retries(0)`, an untrusted key whose first answer spoofs the stored-response mark. Within and past
/// the limit, through both front ends: 1 request, 1 write, the body ends in a `BodyCutError`.
///
/// Found by the adversarial review, round 2, of reading whole bodies (issue 23).
#[tokio::test]
async fn writes_whose_key_makes_nothing_safe_are_sent_once() {
    for (what, keys, policy, no_retry) in keys_that_make_nothing_safe() {
        for (len, at) in [(1000, 500), (BIG, HALF)] {
            let extra = extra_of(what);
            let server = Raw::start(move |_, _| {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                cut_at("201 Created", len, 1, at, &extra)
            })
            .await;
            let mut r = req(Method::POST, &server.url("/v1/send"), &keys);
            if no_retry {
                r.extensions_mut().insert(NoRetry);
            }
            let res = stack(policy.clone()).oneshot(r).await.expect("answered");
            let (bytes, err) = tokio::time::timeout(HANG, read_all(res.into_body()))
                .await
                .expect("no hang");
            assert_eq!(server.writes(), 1, "tower {what} {len}");
            assert_eq!(server.requests(), 1, "tower {what} {len}");
            assert_eq!(bytes, rep(len, 1)[..at], "tower {what} {len}");
            let err = err.unwrap_or_else(|| panic!("tower {what} {len}: a cut"));
            let cut = find_cut(&*err).expect("a BodyCutError");
            assert_eq!(cut.bytes_received(), at as u64);
            assert_eq!(cut.status(), 201);

            // reqwest
            let server2 = Raw::start({
                let extra: Vec<String> = extra_of(what);
                move |_, _| {
                    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                    cut_at("201 Created", len, 1, at, &extra)
                }
            })
            .await;
            let mut b = reqwest_client(policy.clone())
                .post(server2.url("/v1/send"))
                .body("{}");
            for key in &keys {
                b = b.header("Idempotency-Key", *key);
            }
            if no_retry {
                b = b.with_extension(NoRetry);
            }
            let res = b.send().await.expect("answered");
            let (bytes, err) = tokio::time::timeout(HANG, reqwest_read_all(res))
                .await
                .expect("no hang");
            assert_eq!(server2.writes(), 1, "reqwest {what} {len}");
            assert_eq!(bytes, rep(len, 1)[..at], "reqwest {what} {len}");
            assert!(err.is_some(), "reqwest {what} {len}");
        }
    }
}

/// Keys that make nothing safe: what each is, the keys sent, the policy, and whether the
/// request is marked `NoRetry`.
fn keys_that_make_nothing_safe() -> Vec<(&'static str, Vec<&'static str>, RetryPolicy, bool)> {
    let trusted = || policy().honor_idempotency_key(true);
    vec![
        ("empty key", vec![""], trusted().build().unwrap(), false),
        (
            "empty sf-string",
            vec!["\"\""],
            trusted().build().unwrap(),
            false,
        ),
        (
            "malformed key",
            vec!["a b"],
            trusted().build().unwrap(),
            false,
        ),
        ("NoRetry", vec!["k-1"], trusted().build().unwrap(), true),
        (
            "max_retries(0)",
            vec!["k-1"],
            trusted().max_retries(0).build().unwrap(),
            false,
        ),
        (
            "untrusted key, spoofed stored-response mark",
            vec!["k-1"],
            policy().build().unwrap(),
            false,
        ),
        (
            "trusted for another host only",
            vec!["k-1"],
            policy()
                .honor_idempotency_key_for_host("api.example.com")
                .build()
                .unwrap(),
            false,
        ),
    ]
}

fn extra_of(what: &str) -> Vec<String> {
    if what.contains("spoofed") || what.contains("another host") {
        vec![REPLAYED.to_string()]
    } else {
        vec![]
    }
}

//! The layer over a scripted inner service, with paused tokio time: idempotency keys on the
//! client side (minted, kept when the caller set one, trusted per host) and `409` on a keyed
//! request.

use crate::scripted_layer::{builder, get, post, run};
use retry_safety_testing::script::{ok, status, Reset, Script, Status, Timeout};
use tower_retry_safety::{Idempotency, RetryReport};

// --- idempotency keys, client side ---

fn key_of(call: &retry_safety_testing::script::Call) -> Option<String> {
    call.headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_minted_key_is_the_same_on_every_attempt_and_makes_a_write_retryable() {
    let script = Script::new([Timeout, Reset, ok()]);
    let res = run(builder().mint_idempotency_keys(true), &script, post())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let keys: Vec<_> = script.calls().iter().map(key_of).collect();
    assert_eq!(keys.len(), 3);
    let key = keys[0].clone().unwrap();
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{keys:?}"
    );
    // An sf-string holding a UUID v4.
    let inner = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap();
    assert_eq!(inner.len(), 36);
    assert_eq!(inner.as_bytes()[14], b'4', "{inner}");
    let r = res.extensions().get::<RetryReport>().unwrap();
    assert_eq!(r.idempotency_key(), Some(inner));
    assert!(r.verdict().is_keyed());
}

#[tokio::test(start_paused = true)]
async fn minted_keys_differ_between_requests_and_reads_get_none() {
    let a = Script::new([ok()]);
    let b = Script::new([ok()]);
    let c = Script::new([ok()]);
    run(builder().mint_idempotency_keys(true), &a, post())
        .await
        .unwrap();
    run(builder().mint_idempotency_keys(true), &b, post())
        .await
        .unwrap();
    run(builder().mint_idempotency_keys(true), &c, get())
        .await
        .unwrap();
    assert_ne!(key_of(&a.calls()[0]), key_of(&b.calls()[0]));
    assert!(key_of(&a.calls()[0]).is_some());
    assert_eq!(key_of(&c.calls()[0]), None);
}

#[tokio::test(start_paused = true)]
async fn a_key_the_caller_set_is_never_replaced() {
    let mut req = post();
    req.headers_mut()
        .insert("idempotency-key", "\"caller-key-1\"".parse().unwrap());
    let script = Script::new([Reset, ok()]);
    let res = run(builder().mint_idempotency_keys(true), &script, req)
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let keys: Vec<_> = script.calls().iter().map(key_of).collect();
    assert_eq!(
        keys,
        [
            Some("\"caller-key-1\"".into()),
            Some("\"caller-key-1\"".into())
        ]
    );

    // A malformed key is not replaced either, and it does not count: the write is not retried.
    let mut req = post();
    req.headers_mut()
        .insert("idempotency-key", "\"unterminated".parse().unwrap());
    let script = Script::new([Reset, ok()]);
    let err = run(builder().mint_idempotency_keys(true), &script, req)
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(
        key_of(&script.calls()[0]).as_deref(),
        Some("\"unterminated")
    );
}

#[tokio::test(start_paused = true)]
async fn a_keyed_write_marked_non_idempotent_is_retried_only_where_its_host_is_trusted() {
    let marked = || {
        let mut req = post();
        req.extensions_mut().insert(Idempotency::NonIdempotent);
        req
    };
    // Unscoped trust (minting alone) yields to the marker: the endpoint may ignore keys.
    let script = Script::new([Timeout, ok()]);
    let err = run(builder().mint_idempotency_keys(true), &script, marked())
        .await
        .unwrap_err();
    assert!(err.retry_suppressed());
    assert_eq!(script.count(), 1);
    // Trust scoped to the host outweighs it: the key makes the repeat harmless.
    let script = Script::new([Timeout, ok()]);
    let trusted = builder()
        .mint_idempotency_keys(true)
        .honor_idempotency_key_for_host("API.test");
    let res = run(trusted, &script, marked()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.count(), 2);
    assert_eq!(key_of(&script.calls()[0]), key_of(&script.calls()[1]));
}

#[tokio::test(start_paused = true)]
async fn conflict_on_a_keyed_request_is_retried_and_422_and_400_are_final() {
    let keyed = || {
        let mut r = post();
        r.headers_mut()
            .insert("idempotency-key", "\"k-409\"".parse().unwrap());
        r
    };
    let honour = || builder().honor_idempotency_key(true);
    let script = Script::new([Status(409, vec![("retry-after", "1")]), ok()]);
    let res = run(honour(), &script, keyed()).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(script.call_times_ms(), [0, 1000]);

    for code in [422, 400] {
        let script = Script::new([status(code), ok()]);
        let res = run(honour(), &script, keyed()).await.unwrap();
        assert_eq!(res.status(), code);
        assert_eq!(script.count(), 1);
    }
    // Without a key, a 409 is final.
    let script = Script::new([status(409), ok()]);
    let res = run(honour(), &script, get()).await.unwrap();
    assert_eq!(res.status(), 409);
    assert_eq!(script.count(), 1);
}

//! The server's `IdempotencyLayer` in front of tonic (the adversarial review of the gRPC
//! support, issue 24): a keyed write's stored response keeps its trailers, concurrent repeats
//! of a key run once, a handler's UNAVAILABLE is kept by default, malformed key metadata is refused as
//! INVALID_ARGUMENT, and the Redis and PostgreSQL stores keep trailers. Two defects the review
//! found are fixed and their tests run: a handler's UNAVAILABLE was stored even with
//! `store_server_errors(false)`; an answer too large to keep sent again as a status-less
//! response.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use retry_safety_testing::grpc::misbehaving_server::{builder, client, entry, within, Rev};
use retry_safety_testing::grpc::{request, serve_keyed, Fault};
use tonic::Code;
use tower::Layer;
use tower_idempotency_keys::{stores::MemoryStore, IdempotencyLayer};
use tower_retry_safety::grpc::MAY_HAVE_BEEN_APPLIED_KEY;
use tower_retry_safety::{NoRetry, RetryPolicyBuilder};

fn keyed<T>(message: T, id: &str, key: &str) -> tonic::Request<T> {
    let mut req = request(message, id, None);
    req.metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    req
}

fn keyed_builder() -> RetryPolicyBuilder {
    builder().honor_idempotency_key(true)
}

/// A keyed write whose answer (a failing status in trailers after a message, with a custom
/// trailer) is lost after the server stored it: the retry gets the stored answer, its
/// grpc-status, grpc-message and custom trailer; and an OK one with its custom trailer.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_keyed_writes_stored_response_keeps_its_trailers() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new()).layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;

    let mut req = keyed(entry("t-fail"), "t-fail", "k-fail");
    req.metadata_mut()
        .insert("x-rev", "then|9|stored message".parse().unwrap());
    req.metadata_mut().insert(
        "x-fault",
        Fault::UnavailableAfterApply.header().parse().unwrap(),
    );
    let status = within("t-fail", client.append(req)).await.unwrap_err();
    assert_eq!(lab.applied("t-fail"), 1);
    assert_eq!(lab.attempts("t-fail").len(), 2);
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "stored message");
    assert_eq!(status.metadata().get("x-custom-trailer").unwrap(), "kept");

    let mut req = keyed(entry("t-ok"), "t-ok", "k-ok");
    req.metadata_mut()
        .insert("x-rev", "then|0|".parse().unwrap());
    req.metadata_mut()
        .insert("x-fault", Fault::ResetAfterApply.header().parse().unwrap());
    let res = within("t-ok", client.append(req)).await.unwrap();
    assert_eq!(res.get_ref().applied, 1);
    assert_eq!(res.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(res.metadata().get("x-custom-trailer").unwrap(), "kept");
    assert_eq!(lab.applied("t-ok"), 1);
    assert_eq!(lab.applied_twice(), 0);
}

/// Eight concurrent calls with one key: the handler runs once; every other call gets
/// ABORTED (in flight) or the stored response, never a second run.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn concurrent_repeats_of_a_key_run_once() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let once = keyed_builder().max_retries(0).build().unwrap();
    let mut calls = Vec::new();
    for _ in 0..8 {
        let mut client = client(addr, once.clone()).await;
        calls.push(tokio::spawn(async move {
            let mut req = keyed(entry("burst"), "burst", "k-burst");
            req.metadata_mut()
                .insert("x-delay-ms", "200".parse().unwrap());
            req.extensions_mut().insert(NoRetry);
            client.append(req).await
        }));
    }
    let mut ok = 0;
    for call in calls {
        match within("burst", call).await.unwrap() {
            Ok(res) => {
                assert_eq!(res.get_ref().applied, 1);
                ok += 1;
            }
            Err(status) => assert_eq!(status.code(), Code::Aborted, "{status:?}"),
        }
    }
    assert!(ok >= 1);
    assert_eq!(lab.applied("burst"), 1);
}

/// A handler's own UNAVAILABLE before it applied anything (its database was down), behind
/// the server layer told so (`store_server_errors(false)`: the handler promises a server error
/// applied nothing, as for an HTTP 5xx). For gRPC the same failure is an HTTP 200 with
/// `grpc-status: 14`.
///
/// What happened (the review's finding): the layer stored it like a success even so, so the
/// client's keyed retry got the stored UNAVAILABLE (marked `idempotent-replayed`,
/// final) and the key was burnt: 0 applied, 2 attempts, the call failed. Fixed: a
/// trailers-only status that gRPC maps to a 5xx (UNAVAILABLE among them) is a server error for
/// `store_server_errors` (`server::outcome::is_server_error`), in lease and atomic mode.
///
/// (The review read `store_server_errors` as off by default; it is on: by default a server
/// error is stored and sent to every repeat, the key kept, the write not run again; see the next test.)
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_handlers_unavailable_before_apply_does_not_burn_the_key() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new())
                .store_server_errors(false)
                .layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("down"), "down", "k-down");
    req.metadata_mut()
        .insert("x-rev", "unavailable-first".parse().unwrap());
    let res = within("down", client.append(req)).await;
    assert_eq!(lab.attempts("down").len(), 2);
    assert!(
        res.is_ok(),
        "the key was burnt by a stored UNAVAILABLE: {res:?}"
    );
    assert_eq!(lab.applied("down"), 1);
}

/// The default keeps a handler's UNAVAILABLE, as it keeps an HTTP 5xx: the server cannot know
/// that nothing was applied, so the repeat gets the stored answer and the handler does not run
/// again (2 attempts, 0 applied, the call fails with the stored UNAVAILABLE).
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn by_default_a_handlers_unavailable_is_stored_and_answered_again() {
    let rev = Rev::default();
    let layer = {
        let rev = rev.clone();
        tower::layer::layer_fn(move |routes| {
            IdempotencyLayer::new(MemoryStore::new()).layer(rev.layer(routes))
        })
    };
    let (addr, lab) = serve_keyed(layer).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("kept"), "kept", "k-kept");
    req.metadata_mut()
        .insert("x-rev", "unavailable-first".parse().unwrap());
    let res = within("kept", client.append(req)).await;
    assert_eq!(lab.attempts("kept").len(), 2);
    let status = res.expect_err("the stored UNAVAILABLE is sent again");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(lab.applied("kept"), 0);
}

/// Malformed key metadata (non-ASCII bytes, too long, empty) is answered INVALID_ARGUMENT;
/// nothing runs, no panic.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn malformed_key_metadata_is_refused_as_invalid_argument() {
    let (addr, lab) = serve_keyed(IdempotencyLayer::new(MemoryStore::new())).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let long = "k".repeat(300);
    let values: Vec<HeaderValue> = vec![
        HeaderValue::from_bytes(b"\xffbad\x80").unwrap(),
        HeaderValue::from_str(&long).unwrap(),
        HeaderValue::from_static(""),
    ];
    for (i, value) in values.into_iter().enumerate() {
        let id = format!("bad-{i}");
        let mut req = request(entry(&id), &id, None);
        let mut http_req = http::Request::new(());
        http_req.headers_mut().insert("idempotency-key", value);
        let md = tonic::metadata::MetadataMap::from_headers(http_req.headers().clone());
        for kv in md.iter() {
            if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
                req.metadata_mut().insert(k.clone(), v.clone());
            }
        }
        let status = within(&id, client.append(req)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{i}: {status:?}");
        assert_eq!(lab.applied(&id), 0);
    }
}

/// A keyed gRPC write whose answer is over `max_response_bytes`: the layer keeps its head
/// only (`idempotent-replay-body: omitted`), and a repeat of the key gets it. For gRPC
/// that head is a 200 with `content-type: application/grpc`, no message and no
/// `grpc-status`: the client must still learn that the call ran and was not repeated.
///
/// Found by the review, fixed (wrong stored response): it was a status-less gRPC response;
/// tonic turns it into `UNKNOWN` "protocol error: missing grpc-status trailer, stream was terminated without a
/// final status (possible truncation by a proxy or load balancer)" (counts: applied 1,
/// attempts 2). Nothing in the code or message says the call ran; only the raw
/// `idempotent-replay-body: omitted` header does, and `retry-safety-may-have-been-applied`
/// is absent because `mark_status` only marks a trailers-only failure. Fix: in
/// `server::grpc::answer`, turn a stored response with `idempotent-replay-body` (and the "outcome
/// unknown" 500) into a trailers-only status that says the first call ran (e.g. `UNKNOWN`
/// or `DATA_LOSS` with "applied; its answer was too large to keep"), and let the client's
/// `mark_status` see it.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn a_keyed_answer_too_large_to_keep_is_answered_again_as_a_status_that_says_it_ran() {
    let (addr, lab) =
        serve_keyed(IdempotencyLayer::new(MemoryStore::new()).max_response_bytes(4)).await;
    let mut client = client(addr, keyed_builder().build().unwrap()).await;
    let mut req = keyed(entry("big"), "big", "k-big");
    req.metadata_mut().insert(
        "x-fault",
        Fault::UnavailableAfterApply.header().parse().unwrap(),
    );
    let res = within("big", client.append(req)).await;
    assert_eq!(lab.applied("big"), 1);
    assert_eq!(lab.attempts("big").len(), 2);
    let status = res.expect_err("no stored message to answer with");
    assert_eq!(
        status
            .metadata()
            .get(MAY_HAVE_BEEN_APPLIED_KEY)
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("true".to_owned()),
        "the stored response does not say it ran: {status:?}"
    );
}

/// A record with trailers in Redis round-trips; a record of the older kind `C` (no
/// trailers, as a server before this change wrote it) is read as a response without them.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn redis_keeps_trailers_and_reads_the_older_record_kind() {
    use tower_idempotency_keys::{
        stores::RedisStore, Begin, Entry as StoreEntry, Fingerprint, IdempotencyStore,
        StoredResponse,
    };
    let redis = retry_safety_testing::redis::TestRedis::start("grpc-trailers");
    let store = RedisStore::connect(redis.url())
        .await
        .unwrap()
        .prefix(redis.prefix());
    let fp = Fingerprint::of(&Method::POST, "/lab.v1.Ledger/Append", b"x");
    let Begin::Started(claim) = store.begin("t", fp, Duration::from_secs(30)).await.unwrap() else {
        panic!("free key")
    };
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("9"));
    trailers.insert("grpc-message", HeaderValue::from_static("m%20x"));
    trailers.append("x-custom", HeaderValue::from_static("a"));
    trailers.append("x-custom", HeaderValue::from_static("b"));
    let stored = StoredResponse::new(
        http::StatusCode::OK,
        headers.clone(),
        Bytes::from_static(b"\0\0\0\0\x02\x08\x01"),
    )
    .with_trailers(trailers.clone());
    store
        .complete("t", claim, fp, stored, Duration::from_secs(60))
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("t").await.unwrap() else {
        panic!("completed")
    };
    assert_eq!(response.trailers(), Some(&trailers));
    assert_eq!(response.headers(), &headers);

    // Kind `C`: version 1, kind, token, fingerprint, status, no headers, a 2-byte body.
    let mut old = vec![1u8, b'C'];
    old.extend_from_slice(&7u64.to_be_bytes());
    old.extend_from_slice(fp.as_bytes());
    old.extend_from_slice(&200u16.to_be_bytes());
    old.extend_from_slice(&0u16.to_be_bytes());
    old.extend_from_slice(&2u32.to_be_bytes());
    old.extend_from_slice(b"ok");
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{}old", redis.prefix()))
        .arg(old)
        .query_async(&mut conn)
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("old").await.unwrap() else {
        panic!("the older record kind is not read")
    };
    assert_eq!(response.body().as_ref(), b"ok");
    assert!(response.trailers().is_none());
    drop(redis);
}

/// A record with trailers (repeated names, a percent-encoded message) round-trips through
/// PostgreSQL (non-atomic `PostgresStore`), as through Redis.
///
/// Found by the adversarial review of the gRPC support (issue 24).
#[tokio::test]
async fn postgres_keeps_trailers() {
    use tower_idempotency_keys::{
        stores::PostgresStore, Begin, Entry as StoreEntry, Fingerprint, IdempotencyStore,
        StoredResponse,
    };
    let db = retry_safety_testing::pg::TestDb::new().await;
    let store = PostgresStore::from_pool(db.pool(2).await);
    store.migrate().await.unwrap();
    let fp = Fingerprint::of(&Method::POST, "/lab.v1.Ledger/Append", b"x");
    let Begin::Started(claim) = store.begin("t", fp, Duration::from_secs(30)).await.unwrap() else {
        panic!("free key")
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("9"));
    trailers.insert("grpc-message", HeaderValue::from_static("m%20x"));
    trailers.append("x-custom", HeaderValue::from_static("a"));
    trailers.append("x-custom", HeaderValue::from_static("b"));
    let stored = StoredResponse::new(http::StatusCode::OK, HeaderMap::new(), Bytes::new())
        .with_trailers(trailers.clone());
    store
        .complete("t", claim, fp, stored, Duration::from_secs(60))
        .await
        .unwrap();
    let Some(StoreEntry::Completed { response, .. }) = store.get("t").await.unwrap() else {
        panic!("completed")
    };
    assert_eq!(response.trailers(), Some(&trailers));
}

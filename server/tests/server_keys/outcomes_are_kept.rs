//! The server layer's edge cases, from an adversarial review of its performance rework: a
//! handler whose lease ran out with no other claim keeps its outcome (a slow `complete`, a
//! handler busy past its lease in one poll: each failed before its fix); the checks of the
//! rework: panics at every point, drops while the body is buffered or the outcome stored, and
//! a detached handler's late error each keep an outcome.

use crate::keyed_requests::{body_of, keyed, Chunk, In};
use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{Full, StreamBody};
use tower::{service_fn, BoxError, Layer, ServiceExt};
use tower_idempotency_keys::{
    stores::MemoryStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyLayer,
    IdempotencyStore, StoreError, StoredResponse,
};

/// A MemoryStore whose `complete` takes `delay` (a slow Redis, a busy store): renewal has
/// stopped before the outcome is stored ("renewal stops before the outcome is stored"), so a
/// complete that takes longer than what is left of the lease finds the lease over, is
/// refused as fenced although no one took the key over, and the outcome is dropped: the
/// handler ran, and its key is free for a second run.
struct SlowComplete {
    inner: MemoryStore,
    delay: Duration,
}

impl IdempotencyStore for SlowComplete {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        self.inner.begin(key, fingerprint, lease)
    }
    fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.renew(key, token, lease)
    }
    fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let delay = self.delay;
        let key = key.to_owned();
        async move {
            tokio::time::sleep(delay).await;
            self.inner
                .complete(&key, token, fingerprint, response, ttl)
                .await
        }
    }
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Entry>, StoreError>> + Send {
        self.inner.get(key)
    }
    fn release(
        &self,
        key: &str,
        token: FencingToken,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.inner.release(key, token)
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_complete_does_not_let_the_lease_lapse_and_free_the_key() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let store = SlowComplete {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(100),
    };
    let layer = IdempotencyLayer::new(store).lease(Duration::from_millis(60));
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"charged"))))
        }
    }));
    let first = svc.clone().oneshot(keyed("slow-store", "x")).await.unwrap();
    assert_eq!(body_of(first).await, "charged");
    let again = svc.clone().oneshot(keyed("slow-store", "x")).await.unwrap();
    let status = again.status();
    let stored = again.headers().get("idempotent-replayed").cloned();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran twice for one key (second answer {status}, stored {stored:?}): the \
         lease lapsed while the outcome was being stored, complete was refused as fenced, and \
         the outcome was dropped"
    );
}

/// A handler that works for longer than the lease within one poll (CPU-bound or a blocking
/// call, before its first await): the keeper's timer is polled only once the handler is
/// pending, so no renewal happens; the lease lapses with no one else holding the key, the
/// complete is refused as fenced, the outcome is dropped and a repeat runs the handler again.
#[tokio::test]
async fn a_handler_busy_past_its_lease_in_one_poll_keeps_its_outcome() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_millis(30));
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            // 100 ms of work without an await, with a 30 ms lease.
            std::thread::sleep(Duration::from_millis(100));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"charged"))))
        }
    }));
    let first = svc.clone().oneshot(keyed("busy", "x")).await.unwrap();
    assert_eq!(body_of(first).await, "charged");
    let again = svc.clone().oneshot(keyed("busy", "x")).await.unwrap();
    let status = again.status();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no other claim took the key, yet its outcome was dropped (fenced) and the handler \
         ran again (second answer {status})"
    );
}

/// A panic at each point of the handler: before its future, in its first poll, after an
/// await, and in the response body while it is buffered. Each leaves the unknown entry.
#[tokio::test]
async fn panics_at_every_point_keep_an_unknown_outcome() {
    for point in 0..4u8 {
        let runs = Arc::new(AtomicU32::new(0));
        let r = runs.clone();
        let layer = IdempotencyLayer::new(MemoryStore::new());
        let svc = layer.layer(service_fn(move |_req: In| {
            r.fetch_add(1, Ordering::SeqCst);
            if point == 0 {
                panic!("in call");
            }
            async move {
                if point == 1 {
                    panic!("first poll");
                }
                tokio::task::yield_now().await;
                if point == 2 {
                    panic!("after an await");
                }
                let body = StreamBody::new(futures_util::stream::poll_fn(
                    |_| -> std::task::Poll<Option<Chunk>> { panic!("in the body") },
                ));
                Ok::<_, Infallible>(Response::new(body))
            }
        }));
        let first = tokio::spawn(svc.clone().oneshot(keyed("p", "x"))).await;
        assert!(
            first.is_err(),
            "point {point}: the panic reaches the caller"
        );
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
        let res = svc.clone().oneshot(keyed("p", "x")).await.unwrap();
        assert_eq!(res.status(), 500, "point {point}");
        assert_eq!(res.headers()["x-should-retry"], "false");
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

/// Dropped while the response body is buffered (the handler has answered, its body streams),
/// and dropped while the outcome is being stored (a store whose complete takes 10 ms): the
/// rest runs detached, the whole response is stored, one run.
#[tokio::test(start_paused = true)]
async fn dropped_while_buffering_or_storing_the_outcome_is_kept() {
    // While buffering.
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_millis(30));
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            let (mut tx, body) = http_body_util::channel::Channel::<Bytes, Infallible>::new(4);
            tokio::spawn(async move {
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    tx.send_data(Bytes::from_static(b"cd")).await.unwrap();
                }
            });
            Ok::<_, Infallible>(Response::new(body))
        }
    }));
    let cut = tokio::time::timeout(
        Duration::from_millis(120),
        svc.clone().oneshot(keyed("buf", "x")),
    )
    .await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let res = svc.clone().oneshot(keyed("buf", "x")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(res).await, "cdcdcdcd");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // While storing.
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let store = SlowComplete {
        inner: MemoryStore::new(),
        delay: Duration::from_millis(10),
    };
    let layer = IdempotencyLayer::new(store);
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"stored"))))
        }
    }));
    let cut = tokio::time::timeout(
        Duration::from_millis(25),
        svc.clone().oneshot(keyed("st", "x")),
    )
    .await;
    assert!(cut.is_err());
    let res = svc.clone().oneshot(keyed("st", "x")).await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT, "still storing");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let res = svc.clone().oneshot(keyed("st", "x")).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(body_of(res).await, "stored");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A handler error after a long pending handler (lease 30 ms, error at 200 ms), detached:
/// the unknown entry, never a freed key.
#[tokio::test(start_paused = true)]
async fn a_detached_handler_erroring_after_its_lease_keeps_an_unknown_outcome() {
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let layer = IdempotencyLayer::new(MemoryStore::new()).lease(Duration::from_millis(30));
    let svc = layer.layer(service_fn(move |_req: In| {
        r.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Err::<Response<Full<Bytes>>, BoxError>("db timeout after the write".into())
        }
    }));
    let cut = tokio::time::timeout(
        Duration::from_millis(5),
        svc.clone().oneshot(keyed("err", "x")),
    )
    .await;
    assert!(cut.is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let res = svc.clone().oneshot(keyed("err", "x")).await.unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(res.headers()["x-should-retry"], "false");
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

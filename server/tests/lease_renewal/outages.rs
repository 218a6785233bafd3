//! A store out of reach while a handler runs: the claim outlives any outage that ends before
//! the lease its last renewal set. Which renewal lands when is timing only, so this runs on
//! paused tokio time, over a store that refuses every call (as a refused connection fails:
//! at once) for a window that opens just after a renewal. `tests/stores/redis_stalls.rs` does
//! the same through real sockets on a real `redis-server`.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_idempotency_keys::{
    stores::MemoryStore, Begin, Entry, FencingToken, Fingerprint, IdempotencyLayer,
    IdempotencyStore, StoreError, StoredResponse,
};

const LEASE: Duration = Duration::from_secs(60);

/// A memory store that goes out of reach for `outage` from its first successful renewal.
#[derive(Clone)]
struct Outage {
    inner: Arc<MemoryStore>,
    outage: Duration,
    /// When the outage ends, once it has begun.
    until: Arc<Mutex<Option<Instant>>>,
}

impl Outage {
    fn check(&self) -> Result<(), StoreError> {
        let until = *self.until.lock().unwrap();
        match until {
            Some(end) if Instant::now() < end => Err(StoreError::new("connection refused")),
            _ => Ok(()),
        }
    }
}

impl IdempotencyStore for Outage {
    async fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> Result<Begin, StoreError> {
        self.check()?;
        self.inner.begin(key, fingerprint, lease).await
    }

    async fn renew(
        &self,
        key: &str,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner.renew(key, token, lease).await?;
        let mut until = self.until.lock().unwrap();
        if until.is_none() {
            *until = Some(Instant::now() + self.outage);
        }
        Ok(())
    }

    async fn complete(
        &self,
        key: &str,
        token: FencingToken,
        fingerprint: Fingerprint,
        response: StoredResponse,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner
            .complete(key, token, fingerprint, response, ttl)
            .await
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.check()?;
        self.inner.get(key).await
    }

    async fn release(&self, key: &str, token: FencingToken) -> Result<(), StoreError> {
        self.check()?;
        self.inner.release(key, token).await
    }
}

/// A handler that counts its runs and works for two leases; a repeat a lease and a half in,
/// after the outage. Returns the repeat's status and the runs.
async fn repeat_after_outage(fraction: f64) -> (StatusCode, usize) {
    let runs = Arc::new(AtomicUsize::new(0));
    let store = Outage {
        inner: Arc::new(MemoryStore::new()),
        outage: LEASE.mul_f64(fraction),
        until: Arc::default(),
    };
    let counter = runs.clone();
    let svc = IdempotencyLayer::new(store)
        .lease(LEASE)
        .layer(tower::service_fn(move |_req: Request<_>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(LEASE * 2).await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        }));
    let send = || {
        Request::post("/v1/send")
            .header("idempotency-key", "\"outage\"")
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap()
    };
    let first = tokio::spawn(svc.clone().oneshot(send()));
    tokio::time::sleep(LEASE.mul_f64(1.5)).await;
    let during = svc.oneshot(send()).await.unwrap().status();
    let _ = first.await;
    (during, runs.load(Ordering::SeqCst))
}

/// Outages of 0.85 and 0.95 of the lease, from just after a renewal (refused at once): the
/// repeat after them gets 409 and the handler runs once. Before the fix a failed renewal was
/// tried again a quarter lease after the attempt, the first attempt after the outage came
/// after the lease had ended, and the repeat ran the handler again (runs 2).
///
/// issue 41 item 13, adversarial review of the server.
#[tokio::test(start_paused = true)]
async fn an_outage_ending_before_the_lease_keeps_the_claim() {
    for fraction in [0.85, 0.95] {
        let (during, runs) = repeat_after_outage(fraction).await;
        assert_eq!(
            (during, runs),
            (StatusCode::CONFLICT, 1),
            "an outage of {fraction} of the lease"
        );
    }
}

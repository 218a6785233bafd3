//! (helper) A store that answers `begin` late, after taking the claim (a slow network, a
//! store that just reconnected): the lease runs from the claim, so renewals must be timed from
//! the request to `begin`, not from its reply.

use std::future::Future;
use std::time::Duration;

use tower_idempotency_keys::{
    Begin, Entry, FencingToken, Fingerprint, IdempotencyStore, StoreError, StoredResponse,
};

/// `inner`, whose `begin` replies `reply_after` after it took the claim.
pub(crate) struct SlowBegin<St> {
    pub(crate) inner: St,
    pub(crate) reply_after: Duration,
}

impl<St: IdempotencyStore> IdempotencyStore for SlowBegin<St> {
    fn begin(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Begin, StoreError>> + Send {
        let claimed = self.inner.begin(key, fingerprint, lease);
        let wait = self.reply_after;
        async move {
            let out = claimed.await;
            tokio::time::sleep(wait).await;
            out
        }
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
        self.inner.complete(key, token, fingerprint, response, ttl)
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

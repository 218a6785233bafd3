//! What the engine marks on each attempt it sends, in the request's extensions: that this crate
//! sent it (an inner layer of this crate then leaves retrying to the outer one), the policy's
//! key header, and the attempt's number.

/// Marks a request sent by a [`RetrySafety`](crate::service::RetrySafety) layer (or the reqwest adapter), so that an inner
/// layer of this crate leaves retrying to the outermost one (RFC 9110: a client SHOULD NOT retry a failed
/// automatic retry). A unit struct: inserting it allocates no box of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerAttempt;

/// The header that carries the policy's idempotency key, put beside [`LayerAttempt`] only when
/// it is not `idempotency-key`: a front end that reads bodies
/// recognises a keyed write by it.
#[derive(Clone, Debug)]
pub(crate) struct KeyHeader(pub(crate) http::HeaderName);

impl KeyHeader {
    /// Whether `headers` carry a key: under the policy's header if the attempt's `extensions`
    /// name one, else under `idempotency-key`.
    pub(crate) fn in_request(headers: &http::HeaderMap, extensions: &http::Extensions) -> bool {
        match extensions.get::<KeyHeader>() {
            Some(KeyHeader(name)) => headers.contains_key(name),
            // A constant name: a `&str` would be parsed on every lookup.
            None => headers.contains_key(crate::policy::DEFAULT_KEY_HEADER),
        }
    }

    /// Marks an attempt's `extensions` with the policy's key header, when it is not the
    /// default.
    #[inline]
    pub(crate) fn mark(policy: &crate::policy::RetryPolicy, extensions: &mut http::Extensions) {
        let headers = policy.headers();
        if headers.custom_key_header {
            extensions.insert(KeyHeader(headers.idempotency_key_header.clone()));
        }
    }
}

/// The number of a resend, in its request's extensions: 2 for the first resend (a retry or a
/// hedge), 3 for the next… Read it with [`attempt_number`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttemptNumber(pub(crate) u32);

/// Which attempt of a request this is, as the tower layer or the reqwest adapter sent it (1
/// for the first), read from the request's extensions by a layer or middleware further in —
/// tower-http's `trace`, reqwest-tracing — to tag its own span. `None` for a request this
/// crate did not send.
///
/// The first attempt carries no number of its own (only the layer's mark), so that it
/// allocates nothing more; each resend carries its number.
///
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use tower::{service_fn, Layer, ServiceExt};
/// use tower_retry_safety::service::attempt_number;
/// use tower_retry_safety::RetryPolicy;
///
/// let policy = RetryPolicy::builder().build()?;
/// let svc = policy.layer(service_fn(|req: http::Request<String>| async move {
///     let n = attempt_number(req.extensions());
///     let status = if n == Some(1) { 503 } else { 200 };
///     http::Response::builder().status(status).body(format!("{n:?}"))
/// }));
/// let req = http::Request::get("http://api.example/items").body(String::new())?;
/// let res = svc.oneshot(req).await?;
/// assert_eq!(res.body(), "Some(2)");
/// assert_eq!(attempt_number(&http::Extensions::new()), None);
/// # Ok(()) }
/// # tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap().block_on(demo()).unwrap();
/// ```
pub fn attempt_number(extensions: &http::Extensions) -> Option<u32> {
    match extensions.get::<AttemptNumber>() {
        Some(n) => Some(n.0),
        None => extensions.get::<LayerAttempt>().map(|_| 1),
    }
}

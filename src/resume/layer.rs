use tower_layer::Layer;

use super::ReadWhole;

/// The default limit: bodies of a known length up to 64 KiB are read inside the attempt.
pub const DEFAULT_READ_LIMIT: u64 = 64 * 1024;

/// Makes a response body part of the attempt: put it inside [`RetrySafety`](crate::service::RetrySafety)
/// and a body whose length the transport knows to be within the limit is read whole before
/// the layer decides. A body cut mid-way is then a failure of that attempt, which the layer
/// recovers as the decision model allows: a request whose repeat is harmless (idempotent, or
/// keyed with a trusted key, sent again with the same key) is sent again, with backoff, the
/// retry budget and the deadline like any retry, and the caller sees one whole body. A write
/// whose repeat could repeat its side effect is never sent again: the caller gets the response
/// (the server had answered), and its body ends, after the bytes that arrived, with a
/// [`BodyCutError`](crate::resume::BodyCutError) that says so.
///
/// Each re-read is an attempt in the [`RetryReport`](crate::attempts::RetryReport);
/// [`AttemptOutcome::body_cut_after`](crate::attempts::AttemptOutcome::body_cut_after) gives the bytes
/// that had arrived before the cut. The layer's per-attempt timeout bounds the wait for the
/// head, then each wait for a frame of the body (the retry layer's timer leaves the body to
/// this layer once the head is in): a body that stalls is cut and read again, and a slow body
/// that keeps coming is read to its end. The deadline stays absolute.
///
/// A longer body, or one without a known length (chunked, server-sent events), is handed on as
/// it streams. For a `GET` answered `200` with a strong validator (a strong `ETag`, or a
/// `Last-Modified` at least a second older than the response's `Date`), a cut there asks for
/// the rest with `Range: bytes=N-` and `If-Range`, as the retry layer decides (it hands its
/// bookkeeping to the body when it returns the response): the `206` must continue the same
/// representation (`Content-Range` to the same end, the same `ETag` and `Content-Encoding`;
/// bytes a superset repeats are skipped), and the caller's body continues. Where that cannot be
/// proven (no validator, a `200`, a changed `ETag`), nothing is spliced: the body ends in the
/// original error, whose [`why_no_resume`](crate::resume::BodyCutError::why_no_resume) says
/// why. A keyed write (its key trusted by the policy) past the limit is sent again whole with
/// the same key, never with `Range`, and its body continues only if the answer is the server's
/// stored response, the same response (marked as stored, the same status, length, coding and
/// `ETag`): the bytes already delivered are skipped.
/// [`WholeBody::report`](crate::resume::WholeBody::report) and
/// [`BodyReport`](crate::resume::BodyReport) cover the resumes. While such a body
/// streams, the policy's per-attempt timeout bounds each wait for a frame (a stall is cut and
/// resumed; a long transfer that keeps moving is not), and its deadline stays absolute. Without a retry
/// layer outside, nothing decides a resume and none is made.
///
/// Only a request the retry layer may send again is read inside the attempt: one idempotent by
/// its method, or carrying an `Idempotency-Key` header. Any other write streams its body, so a
/// slow body never costs it its response (it would not be sent again anyway), and a cut ends
/// the body with a [`BodyCutError`](crate::resume::BodyCutError) after the response's status.
/// A request that only the policy's rules or markers make idempotent streams too.
///
/// Ranges count encoded bytes: put a decompression layer outside this one, never inside.
///
/// Each `GET` and keyed write keeps a copy of its request (and a clone of the inner service)
/// for a resume. Without this layer, response types and costs stay as they were.
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::ServiceBuilder;
/// use tower_retry_safety::resume::ReadWholeLayer;
/// use tower_retry_safety::RetryPolicy;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
/// let svc = ServiceBuilder::new()
///     .layer(RetryPolicy::builder().attempt_timeout(Duration::from_secs(10)).build()?)
///     .layer(ReadWholeLayer::new()) // bodies up to 64 KiB are part of the attempt
///     .service(client);
/// # let _ = svc;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ReadWholeLayer {
    limit: u64,
}

impl ReadWholeLayer {
    /// Reads bodies of a known length up to [`DEFAULT_READ_LIMIT`] (64 KiB).
    pub fn new() -> Self {
        ReadWholeLayer {
            limit: DEFAULT_READ_LIMIT,
        }
    }

    /// The longest body read inside the attempt, in bytes. Defaults to 64 KiB. Memory held per
    /// request is at most this much.
    ///
    /// ```
    /// use tower_retry_safety::resume::ReadWholeLayer;
    ///
    /// let layer = ReadWholeLayer::new().limit(16 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }
}

impl Default for ReadWholeLayer {
    fn default() -> Self {
        ReadWholeLayer::new()
    }
}

impl<S> Layer<S> for ReadWholeLayer {
    type Service = ReadWhole<S>;

    fn layer(&self, inner: S) -> ReadWhole<S> {
        ReadWhole::new(inner, self.limit)
    }
}

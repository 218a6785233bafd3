//! `reqwest::Body` behind the tower layer (hyper-util's `Client<_, reqwest::Body>`).

use bytes::Bytes;

use crate::ReplayBody;

/// A buffered body (built from bytes or a string: `as_bytes()` is `Some`) is replayed;
/// a stream (`Body::wrap_stream`) is sent once, and the report says
/// [`StopReason::BodyNotReplayable`](crate::StopReason::BodyNotReplayable).
///
/// reqwest exposes a buffered body only as a slice, so each copy copies its bytes.
///
/// ```
/// use tower_retry_safety::ReplayBody;
///
/// let buffered = reqwest::Body::from("{\"to\":\"a@example.com\"}");
/// let copy = buffered.try_clone_body().expect("a buffered body replays");
/// assert_eq!(copy.as_bytes(), buffered.as_bytes());
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
impl ReplayBody for reqwest::Body {
    fn try_clone_body(&self) -> Option<Self> {
        let bytes = self.as_bytes()?;
        Some(reqwest::Body::from(Bytes::copy_from_slice(bytes)))
    }
}

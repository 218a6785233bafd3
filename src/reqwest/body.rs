//! `reqwest::Body` behind the tower layer (hyper-util's `Client<_, reqwest::Body>`).

use bytes::Bytes;

use crate::service::Recorded;

use crate::service::ReplayBody;

use crate::service::ReplayBuffer;

/// A buffered body (built from bytes or a string: `as_bytes()` is `Some`) is copied for each
/// retry; reqwest exposes it only as a slice, so each copy copies its bytes. A stream
/// (`Body::wrap_stream`, `Body::wrap`) is recorded as it streams, up to the policy's
/// [`replay_buffer`](crate::RetryPolicyBuilder::replay_buffer), and each attempt gets a
/// `Body::wrap` of its replay (see [`Replayable`](crate::service::Replayable)).
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

    fn record(self, buffer: &ReplayBuffer) -> Recorded<Self> {
        Recorded::stream(self, buffer, reqwest::Body::wrap)
    }
}

//! The size hint of a body that sends some bytes it holds before the rest of another body:
//! the replay buffer's recording, a response body read to classify it.

use http_body::{Body, SizeHint};

/// `rest`'s hint (nothing, if there is no rest) with `ahead` bytes in front. Unless the whole
/// body's length was `known` from the start, no upper bound is given: a transport told the
/// exact length of a body that streamed without one would send it with a content-length
/// (hyper's h1 would then drop its trailers).
pub(crate) fn with_bytes_ahead<B: Body>(rest: Option<&B>, ahead: u64, known: bool) -> SizeHint {
    let rest = rest.map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
    let mut hint = SizeHint::new();
    hint.set_lower(rest.lower().saturating_add(ahead));
    if let Some(upper) = rest.upper().filter(|_| known) {
        hint.set_upper(upper.saturating_add(ahead));
    }
    hint
}

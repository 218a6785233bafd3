//! The size hint of a body that sends some bytes it holds before the rest of another body:
//! the replay buffer's recording, a response body read to classify it.

use http_body::{Body, SizeHint};

/// `rest`'s hint (nothing, if there is no rest) with `ahead` bytes in front.
pub(crate) fn with_bytes_ahead<B: Body>(rest: Option<&B>, ahead: u64) -> SizeHint {
    let rest = rest.map_or_else(|| SizeHint::with_exact(0), Body::size_hint);
    let mut hint = SizeHint::new();
    hint.set_lower(rest.lower().saturating_add(ahead));
    if let Some(upper) = rest.upper() {
        hint.set_upper(upper.saturating_add(ahead));
    }
    hint
}

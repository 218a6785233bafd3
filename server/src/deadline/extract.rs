//! The axum extractor of the caller's deadline.

use axum_core::extract::FromRequestParts;
use tower_retry_safety::deadline::Inbound;

/// The deadline the request arrived with, as [`DeadlineLayer`](super::DeadlineLayer) read
/// it; `None` when the route is not behind that layer. Never rejects.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency_keys::deadline::CallerDeadline;
///
/// async fn handler(CallerDeadline(deadline): CallerDeadline) -> String {
///     match deadline {
///         Some(d) => format!("{} ms left", d.remaining().as_millis()),
///         None => "no deadline".to_owned(),
///     }
/// }
/// # let _ = handler;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct CallerDeadline(pub Option<Inbound>);

impl<S: Send + Sync> FromRequestParts<S> for CallerDeadline {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(CallerDeadline(parts.extensions.get::<Inbound>().copied()))
    }
}

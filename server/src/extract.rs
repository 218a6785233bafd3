//! axum extractors (feature `axum`): the request's [`RequestKey`] and, with `postgres`, its
//! [`KeyTransaction`](crate::postgres::atomic::KeyTransaction).

use std::fmt;

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::{header, HeaderValue, StatusCode};

use crate::derive::RequestKey;

/// The rejection of an extractor that found no keyed request: the request carried no
/// `Idempotency-Key` (a method the layer does not
/// [require keys for](crate::layer::IdempotencyLayer::require_key_for)), or the route is not behind
/// the idempotency layer. Answers 400 and says which header is missing.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug)]
pub struct NotKeyed(());

impl fmt::Display for NotKeyed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("this endpoint needs an Idempotency-Key header")
    }
}

impl std::error::Error for NotKeyed {}

impl IntoResponse for NotKeyed {
    fn into_response(self) -> Response {
        // The `Display` text, then the key's form.
        let mut res = Response::new(axum_core::body::Body::from(format!(
            "{self}: a quoted string, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\""
        )));
        *res.status_mut() = StatusCode::BAD_REQUEST;
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    }
}

/// The request's key, in an axum handler behind the idempotency layer.
///
/// ```
/// use tower_idempotency_keys::RequestKey;
///
/// async fn send(key: RequestKey) -> String {
///     format!("outbound key {}", key.derive("send-email"))
/// }
/// # let _ = send;
/// ```
impl<S: Send + Sync> FromRequestParts<S> for RequestKey {
    type Rejection = NotKeyed;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, NotKeyed> {
        parts.extensions.get().cloned().ok_or(NotKeyed(()))
    }
}

/// The request's transaction, in an axum handler behind the layer in atomic mode.
///
/// ```no_run
/// use tower_idempotency_keys::KeyTransaction;
///
/// async fn create(tx: KeyTransaction) -> Result<&'static str, String> {
///     let mut conn = tx.acquire().await.map_err(|e| e.to_string())?;
///     sqlx::query("INSERT INTO orders (note) VALUES ('one')")
///         .execute(&mut *conn)
///         .await
///         .map_err(|_| "could not save the order".to_owned())?;
///     Ok("created")
/// }
/// # let _ = create;
/// ```
#[cfg(feature = "postgres")]
impl<S: Send + Sync> FromRequestParts<S> for crate::postgres::atomic::KeyTransaction {
    type Rejection = NotKeyed;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _state: &S,
    ) -> Result<Self, NotKeyed> {
        parts.extensions.get().cloned().ok_or(NotKeyed(()))
    }
}

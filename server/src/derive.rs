//! The request's key, as the handler sees it, and the keys derived from it for the handler's
//! own outbound calls.

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;
use sha2::{Digest, Sha256};

/// The `Idempotency-Key` of the request being handled, put in the request's extensions by
/// the server layer ([`IdempotencyLayer`](crate::layer::IdempotencyLayer) in either mode) for every
/// keyed request it hands to the handler.
///
/// A handler that calls a provider (send an email, charge a card) cannot roll that call back
/// with its own transaction. After a crash, the client repeats its key and the handler runs
/// again: it must send the provider **the same key it sent the first time**, so that the
/// provider answers with its stored response instead of repeating. [`derive`](Self::derive) gives that key: stable
/// across runs, processes and versions, one per label, and distinct between scopes.
///
/// ```
/// use tower_idempotency_keys::RequestKey;
///
/// fn send_email<B>(req: &http::Request<B>) -> Option<http::HeaderValue> {
///     let key = req.extensions().get::<RequestKey>()?;
///     // Put it on the outbound request's `Idempotency-Key` header, sent through
///     // `tower-retry-safety`'s client layer with keys trusted for the provider's host.
///     Some(key.derive("send-email").header_value())
/// }
/// # let _ = send_email::<()>;
/// ```
///
/// `Debug` shows the client's key, which is no secret (it is in the request's headers and
/// logs); never the scope.
#[derive(Clone, PartialEq, Eq)]
pub struct RequestKey {
    /// The key as stored: a hash of the scope, then the client's key.
    stored: Arc<str>,
    /// The key as the client sent it.
    shown: Arc<str>,
}

impl RequestKey {
    pub(crate) fn new(stored: Arc<str>, shown: Arc<str>) -> Self {
        RequestKey { stored, shown }
    }

    /// The key as the client sent it (without quotes).
    pub fn as_str(&self) -> &str {
        &self.shown
    }

    /// A child key for the outbound call that the handler names `label` (`"send-email"`,
    /// `"charge/1"`): a SHA-256 of the key's scope, the key and the label, in hex with a `d1-`
    /// prefix (67 characters of visible ASCII, a valid key for every server that honours
    /// them). The same request, re-run after a crash on any server of the fleet, derives the
    /// same key; another label, key or scope derives another.
    pub fn derive(&self, label: &str) -> DerivedKey {
        let mut hash = Sha256::new();
        hash.update(b"tower-retry-safety derived key v1\0");
        // Lengths first, so no two different (key, label) pairs hash the same bytes.
        for part in [self.stored.as_bytes(), label.as_bytes()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        let digest = hash.finalize();
        let mut out = String::with_capacity(3 + 64);
        out.push_str("d1-");
        for b in digest {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        DerivedKey(out)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Debug for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RequestKey").field(&&*self.shown).finish()
    }
}

/// A key derived by [`RequestKey::derive`], for an outbound request's `Idempotency-Key`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DerivedKey(String);

impl DerivedKey {
    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as a header value, in the Structured Field string form (`"d1-…"`).
    pub fn header_value(&self) -> HeaderValue {
        let mut quoted = Vec::with_capacity(self.0.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(self.0.as_bytes());
        quoted.push(b'"');
        // Hex digits and a dash between quotes: always a valid header value.
        HeaderValue::from_bytes(&quoted).unwrap_or_else(|_| HeaderValue::from_static("\"d1-\""))
    }
}

impl fmt::Display for DerivedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(stored: &str, shown: &str) -> RequestKey {
        RequestKey::new(stored.into(), shown.into())
    }

    #[test]
    fn derived_keys_are_stable_and_distinct_by_scope_key_and_label() {
        let k = key("k-1", "k-1");
        assert_eq!(k.derive("email"), key("k-1", "k-1").derive("email"));
        assert_ne!(k.derive("email"), k.derive("charge"));
        assert_ne!(k.derive("email"), key("k-2", "k-2").derive("email"));
        // Scoped: the stored key starts with the scope's hash.
        assert_ne!(k.derive("email"), key("aa|k-1", "k-1").derive("email"));
        // Lengths are hashed: ("k-1", "email") and ("k-1e", "mail") differ.
        assert_ne!(k.derive("email"), key("k-1e", "k-1e").derive("mail"));
        let d = k.derive("email");
        assert_eq!(d.as_str().len(), 67);
        let header = d.header_value();
        assert_eq!(
            tower_retry_safety::wire::idempotency_key(&header),
            Some(d.as_str())
        );
        // A fixed value (computed apart, in Python's hashlib): a derivation that changed between
        // versions would send a provider a new key for a re-run, and the provider would apply
        // it again.
        assert_eq!(
            d.as_str(),
            "d1-64e41a5dba7391fb3bb8bb1749c96ef267df5ef4f22cfa7f45770170aa30c2fc"
        );
    }
}

//! Which operation an attempt belongs to, told as a client would repeat it.

use std::fmt;

use http::{HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};

use super::LabError;

/// The most characters of an operation id that output shows: ids can carry anything a
/// client sent.
const SHOWN: usize = 64;

/// An operation's identity: attempts with the same id are one operation, its first attempt
/// the one that gets a fault. Shown (`Display` and `Debug`) capped at 64 characters: it may
/// hold a key, a header's value or a query string.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OpId(String);

/// Capped as `Display` is: never the whole id.
impl fmt::Debug for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpId({:?})", self.to_string())
    }
}

impl OpId {
    /// The id as the lab keys it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Capped at 64 characters: the id may hold what a client sent.
impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(SHOWN) {
            Some((end, _)) => write!(f, "{}…", &self.0[..end]),
            None => f.write_str(&self.0),
        }
    }
}

/// How the proxy tells operations apart, first rule that speaks:
///
/// 1. the `Idempotency-Key` header, or the one named by `--key-header` (a Structured Field string and its bare form are one key,
///    as the server layer reads them);
/// 2. a header of the caller's choice (`x-request-id`, `x-stainless-retry-id`…), repeated on
///    every attempt by the client;
/// 3. the method, the path with its query, and the value at a JSON pointer into the body
///    (`--op-id /request_id`), for APIs whose bodies differ per attempt;
/// 4. the method, the path with its query, and a SHA-256 fingerprint of the body.
#[derive(Clone, Debug)]
pub struct OpIdentity {
    key_header: HeaderName,
    op_header: Option<HeaderName>,
    pointer: Option<String>,
}

impl Default for OpIdentity {
    fn default() -> Self {
        OpIdentity {
            key_header: HeaderName::from_static("idempotency-key"),
            op_header: None,
            pointer: None,
        }
    }
}

impl OpIdentity {
    /// Keys, then method, path and body fingerprint.
    pub fn new() -> Self {
        Self::default()
    }

    /// The header that carries an idempotency key, for a server that names it otherwise
    /// (`x-idempotency-key`). Refuses an invalid header name.
    ///
    /// Defaults to `idempotency-key`.
    pub fn key_header_name(mut self, name: &str) -> Result<Self, LabError> {
        self.key_header = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| LabError::new("--key-header", format!("{name:?} is not a header name")))?;
        Ok(self)
    }

    /// A header that names the operation when no key does. Refuses an invalid header name.
    ///
    /// Defaults to none.
    pub fn op_header(mut self, name: &str) -> Result<Self, LabError> {
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| LabError::new("--op-header", format!("{name:?} is not a header name")))?;
        self.op_header = Some(name);
        Ok(self)
    }

    /// A JSON pointer (RFC 6901: empty, or `/` then reference tokens) to the value that names
    /// the operation in a JSON body. A body that is not JSON, or lacks the value, falls back
    /// to the fingerprint.
    ///
    /// Defaults to none.
    pub fn op_id_pointer(mut self, pointer: &str) -> Result<Self, LabError> {
        if !pointer.is_empty() && !pointer.starts_with('/') {
            return Err(LabError::new(
                "--op-id",
                format!("{pointer:?} is not a JSON pointer: it must start with '/'"),
            ));
        }
        if has_bad_escape(pointer) {
            return Err(LabError::new(
                "--op-id",
                format!("{pointer:?} is not a JSON pointer: '~' must be followed by 0 or 1"),
            ));
        }
        self.pointer = Some(pointer.to_owned());
        Ok(self)
    }

    /// The header that carries an idempotency key.
    pub fn key_header(&self) -> &HeaderName {
        &self.key_header
    }

    /// The operation of an attempt. `path_and_query` is the request target's path and query.
    pub fn identify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> OpId {
        if let Some(key) = header_text(headers, &self.key_header) {
            return OpId(format!("key {}", unquote(key)));
        }
        if let Some(name) = &self.op_header {
            if let Some(value) = header_text(headers, name) {
                return OpId(format!("{name} {value}"));
            }
        }
        if let Some(value) = self.pointer.as_deref().and_then(|p| pointed(body, p)) {
            return OpId(format!("{method} {path_and_query} {value}"));
        }
        let digest = Sha256::new()
            .chain_update(method.as_str())
            .chain_update([0])
            .chain_update(path_and_query)
            .chain_update([0])
            .chain_update(body)
            .finalize();
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        OpId(format!("{method} {path_and_query} sha256:{hex}"))
    }
}

fn header_text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let value = headers.get(name)?.to_str().ok()?.trim();
    (!value.is_empty()).then_some(value)
}

/// `"k-1"` and `k-1` are one key (the server layer reads both forms alike).
fn unquote(key: &str) -> &str {
    key.strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .unwrap_or(key)
}

fn has_bad_escape(pointer: &str) -> bool {
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return true;
        }
    }
    false
}

/// The JSON text of the value at `pointer` in a JSON body.
fn pointed(body: &[u8], pointer: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_slice(body).ok()?;
    doc.pointer(pointer).map(|v| v.to_string())
}

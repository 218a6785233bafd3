//! Which operation an attempt belongs to, told as a client would repeat it.
//!
//! # The design
//!
//! An attempt names its operation in up to three ways, its [`OpSignals`]; the proxy's ledger
//! links attempts into operations with them, and the first attempt of each operation is the
//! one that gets a fault:
//!
//! 1. **the op header** (`--op-header NAME`, an explicit opt-in): a value the test harness
//!    sets once per logical call and the client repeats on every attempt. When an attempt
//!    carries it, it alone decides: the harness said which call this is.
//! 2. **the key** (`Idempotency-Key`, or `--key-header`): attempts with one key are one
//!    operation, whatever their bodies.
//! 3. **the content**: the method, the path with its query, and a SHA-256 fingerprint of the
//!    body; a multipart body is fingerprinted by its parts' headers and contents, without its
//!    boundary (SDKs draw one per attempt); with `--op-id /json/pointer`, the value there
//!    instead of the body.
//!
//! A resend that keeps neither the op header nor its key — a client that mints a new key
//! per retry, exactly what the lab is there to catch — is linked by its content: an attempt
//! whose content matches an operation whose client has not been given a 2xx yet (its first
//! attempt failed, or is still running) belongs to it, even if its key differs. Such an
//! operation's identity is *uncertain*: it may be two calls with one body. The report counts
//! them, and one that reached the upstream twice is counted applied twice, so the run
//! fails rather than passes; `--op-header` (or a body that differs per call) tells them
//! apart. Attempts without a key or op header whose contents match are one operation, as a
//! client repeating a call sends the same request.
//!
//! What the lab cannot see: a resend whose key *and* content both differ from its first
//! attempt's (a body with a timestamp or nonce per attempt, no key kept), without an op
//! header. It counts as a new operation; `--op-header` or `--op-id` is then the only way to
//! count it.

use std::fmt;

use http::{HeaderMap, HeaderName, Method};
use sha2::{Digest, Sha256};

use crate::error::LabError;
use crate::multipart;

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

/// What one attempt says about its operation: the op header's value, the key, and the
/// content (see the module docs for how the ledger links them). Each is shown capped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpSignals {
    op: Option<OpId>,
    key: Option<OpId>,
    content: OpId,
}

impl OpSignals {
    /// The op header's value, when `--op-header` names one and the attempt carries it.
    pub fn op_header(&self) -> Option<&OpId> {
        self.op.as_ref()
    }

    /// The idempotency key, unquoted, if any.
    pub fn key(&self) -> Option<&OpId> {
        self.key.as_ref()
    }

    /// The method, path with query, and the body's fingerprint (or the `--op-id` value).
    pub fn content(&self) -> &OpId {
        &self.content
    }
}

/// How the proxy tells operations apart: the op header, the key, and the content (see the
/// module docs).
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
    /// Keys and content; no op header.
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

    /// A header whose value names the logical call, set by the test harness and repeated by
    /// the client on every attempt: when present, it alone decides which operation an
    /// attempt belongs to. Refuses an invalid header name.
    ///
    /// Defaults to none.
    pub fn op_header(mut self, name: &str) -> Result<Self, LabError> {
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| LabError::new("--op-header", format!("{name:?} is not a header name")))?;
        self.op_header = Some(name);
        Ok(self)
    }

    /// A JSON pointer (RFC 6901: empty, or `/` then reference tokens) to the value that names
    /// the operation in a JSON body, for APIs whose bodies differ per attempt: it stands for
    /// the body in the content. A body that is not JSON, or lacks the value, is fingerprinted.
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

    /// What an attempt says about its operation. `path_and_query` is the request target's
    /// path and query.
    pub fn identify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> OpSignals {
        // A Structured Field string and its bare form are one key, as the server layer reads them.
        let key =
            header_text(headers, &self.key_header).map(|k| OpId(format!("key {}", unquote(k))));
        let op = self.op_header.as_ref().and_then(|name| {
            header_text(headers, name).map(|value| OpId(format!("{name} {value}")))
        });
        OpSignals {
            op,
            key,
            content: self.content(method, path_and_query, headers, body),
        }
    }

    fn content(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> OpId {
        if let Some(value) = self.pointer.as_deref().and_then(|p| pointed(body, p)) {
            return OpId(format!("{method} {path_and_query} {value}"));
        }
        let mut hasher = Sha256::new()
            .chain_update(method.as_str())
            .chain_update([0])
            .chain_update(path_and_query)
            .chain_update([0]);
        if !multipart::hash_parts(headers, body, &mut hasher) {
            hasher.update(body);
        }
        let digest = hasher.finalize();
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

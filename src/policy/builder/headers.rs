//! The headers the policy reads and writes.

use super::*;

impl RetryPolicyBuilder {
    /// The header that carries the idempotency key.
    ///
    /// Defaults to `idempotency-key`.
    pub fn idempotency_key_header(mut self, name: HeaderName) -> Self {
        self.headers.custom_key_header = name != DEFAULT_KEY_HEADER;
        self.headers.idempotency_key_header = name;
        self
    }

    /// The server hint header: `false` makes any response final, `true` makes a non-success
    /// response retryable (still suppressed for non-idempotent requests). `None` ignores it.
    ///
    /// Defaults to `x-should-retry`.
    pub fn should_retry_header(mut self, name: Option<HeaderName>) -> Self {
        self.responses.should_retry_header = name;
        self
    }

    /// The header with which a server that honours idempotency keys marks a stored response: its stored
    /// response to an earlier request with the same key, sent again (this crate's
    /// `tower_idempotency_keys::IdempotencyLayer` sets `idempotent-replayed: true`).
    /// A response whose header says `true` is final, whatever its status: every repeat of the
    /// key would get the same answer. The report says so
    /// ([`StopReason::StoredResponse`](crate::policy::StopReason::StoredResponse)): the server had already run the
    /// request. `None` ignores the header.
    ///
    /// Defaults to `idempotent-replayed`.
    pub fn stored_response_header(mut self, name: Option<HeaderName>) -> Self {
        self.responses.stored_response_header = name;
        self
    }

    /// The header whose value identifies a request for support, read from the request or the
    /// response and echoed in errors and reports (capped in length). `None` disables it.
    ///
    /// Defaults to `x-request-id`.
    pub fn request_id_header(mut self, name: Option<HeaderName>) -> Self {
        self.headers.request_id_header = name;
        self
    }

    /// A header set on each attempt to its number (`1` for the first), so servers can see
    /// retries. `None` sets nothing.
    ///
    /// Defaults to none.
    pub fn attempt_header(mut self, name: Option<HeaderName>) -> Self {
        self.headers.attempt_header = name;
        self
    }
}

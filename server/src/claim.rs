//! A key that a request claimed: what its handler's run, its renewals and its settling share.

use std::sync::Arc;

use crate::mode::Config;
use crate::store::{FencingToken, Fingerprint};

/// A key this request claimed, whose handler is about to run.
pub(crate) struct Claimed<St> {
    pub(crate) store: Arc<St>,
    pub(crate) config: Arc<Config>,
    /// The key as stored (scoped, if keys are scoped).
    pub(crate) key: Arc<str>,
    /// The key as the client sent it: what logs show (a scope may be a secret).
    pub(crate) shown: Arc<str>,
    pub(crate) token: FencingToken,
    /// The request's fingerprint: a completion that outlived the claim's lease writes it anew.
    pub(crate) fingerprint: Fingerprint,
}

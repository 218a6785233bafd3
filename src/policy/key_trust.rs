//! Where the policy trusts the target to honour idempotency keys. A key that the server
//! ignores protects nothing, so trust is given explicitly, and the most specific word wins.

use http::Method;

use super::builder::BuildError;

#[derive(Clone, Debug, Default)]
pub(crate) struct KeyTrust {
    /// Unscoped trust (`honor_idempotency_key(true)`, or minting with no host named): every
    /// target, except requests a marker or route rule explicitly calls a write.
    pub(crate) everywhere: bool,
    /// Hosts that honour keys, lowercase, without port.
    pub(crate) hosts: Vec<Box<str>>,
}

impl KeyTrust {
    /// Whether a key on this request would be honoured by its target.
    ///
    /// `explicit_write`: a marker or route rule called the request non-idempotent. Unscoped
    /// trust does not outweigh that (the rule may be there because that endpoint ignores
    /// keys); trust scoped to the request's host does. `host` is asked only when hosts are
    /// named: finding it in a URI costs about 400 instructions, a tenth of the layer's work.
    #[inline]
    pub(crate) fn trusted<'h>(
        &self,
        _method: &Method,
        host: impl FnOnce() -> Option<&'h str>,
        _path: &str,
        explicit_write: bool,
    ) -> bool {
        if !self.hosts.is_empty() {
            if let Some(host) = host() {
                if self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
                    return true;
                }
            }
        }
        self.everywhere && !explicit_write
    }

    pub(crate) fn add_host(&mut self, host: &str) -> Result<(), BuildError> {
        let bad = |why: &str| BuildError::host("honor_idempotency_key_for_host", host, why);
        if host.is_empty() {
            return Err(bad("it is empty"));
        }
        if host.contains("://") || host.contains('/') {
            return Err(bad("give the host alone, without scheme or path"));
        }
        if !host.starts_with('[') && host.contains(':') {
            return Err(bad("give the host without a port: trust covers every port"));
        }
        if host.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(bad("a host is visible ASCII"));
        }
        self.hosts.push(host.to_ascii_lowercase().into());
        Ok(())
    }
}

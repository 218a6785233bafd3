//! Where the policy trusts the target to honour idempotency keys. A key that the server
//! ignores protects nothing, so trust is given explicitly, and the most specific word wins.

use http::Method;

use super::host_routes::host_scope;
use crate::build_error::BuildError;
use crate::classify::host::{HostScope, RequestHost};
use crate::classify::routes::{RouteTable, RuleValue};

#[derive(Clone, Debug, Default)]
pub(crate) struct KeyTrust {
    /// Routes known to honour keys, or to ignore them. The table's fail-closed matching
    /// carries over as it should: "ignores keys" matches every spelling of a path, "honours
    /// keys" only the path as written.
    pub(crate) routes: RouteTable<KeyHonor>,
    /// Unscoped trust (`honor_idempotency_key(true)`, or minting with no host named): every
    /// target, except requests a marker or route rule explicitly calls a write.
    pub(crate) everywhere: bool,
    /// Hosts (and ports) that honour keys.
    pub(crate) hosts: Vec<HostScope>,
}

/// What a route does with an idempotency key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyHonor {
    Honors,
    Ignores,
}

impl RuleValue for KeyHonor {
    /// A key that may be ignored protects nothing, whatever the spelling that reached it.
    const STRICT: Self = KeyHonor::Ignores;
}

impl KeyTrust {
    /// Whether a key on this request would be honoured by its target.
    ///
    /// `explicit_write`: a marker or route rule called the request non-idempotent. Unscoped
    /// trust does not outweigh that (the rule may be there because that endpoint ignores
    /// keys); trust scoped to the request's host does. A route's word outranks the host's,
    /// which outranks unscoped trust. `host` is `None` unless the policy names hosts: finding
    /// it in a URI is a good part of the layer's work.
    #[inline]
    pub(crate) fn trusted(
        &self,
        method: &Method,
        host: Option<&RequestHost<'_>>,
        path: &str,
        explicit_write: bool,
    ) -> bool {
        if let Some(route) = self.routes.lookup(method, path) {
            return route == KeyHonor::Honors;
        }
        if let Some(host) = host {
            if self.hosts.iter().any(|h| h.covers(&host.host, host.port)) {
                return true;
            }
        }
        self.everywhere && !explicit_write
    }

    pub(crate) fn add_route(
        &mut self,
        method: Method,
        template: &str,
        honors: bool,
    ) -> Result<(), BuildError> {
        let honor = if honors {
            KeyHonor::Honors
        } else {
            KeyHonor::Ignores
        };
        self.routes
            .insert(method, template, honor)
            .map_err(|e| e.for_setting("route_honors_idempotency_key"))
    }

    pub(crate) fn add_host(&mut self, host: &str) -> Result<(), BuildError> {
        let scope = host_scope("honor_idempotency_key_for_host", host)?;
        self.hosts.push(scope);
        Ok(())
    }
}

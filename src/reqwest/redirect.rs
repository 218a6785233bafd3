//! Redirects that never carry a deadline on: reqwest follows them below the middleware,
//! copying every header of the request it redirects, so the time left would go stale and
//! could reach a host that never asked for it.

use crate::classify::host::HostSeen;
use crate::policy::RetryPolicy;

/// reqwest's default limit, kept: a chain longer than this is an error.
const MAX_REDIRECTS: usize = 10;

/// The redirect policy for a `reqwest::Client` under a policy that hands deadlines on: it
/// follows redirects as reqwest's default does (at most ten), except a redirect
/// from a host `policy` sends its deadline to, which it hands back to the caller as the 3xx.
pub(super) fn policy_for(policy: &RetryPolicy) -> reqwest::redirect::Policy {
    let policy = policy.clone();
    reqwest::redirect::Policy::custom(move |attempt| {
        let carried = attempt.previous().last().is_some_and(|from| {
            let hops = policy.hops();
            let seen = || match from.host_str() {
                Some(host) => HostSeen::Uri(host, from.port_or_known_default()),
                None => HostSeen::Nothing,
            };
            // A host the policy cannot place may have carried them too (fail closed).
            !hops.hosts.is_empty()
                && (seen().target(policy.origin()).is_none()
                    || hops.sends_to(seen, policy.origin()).is_some())
        });
        if carried {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// Whether reqwest followed a redirect for an attempt that carried deadline headers (the
/// response's URL is not the one sent): the headers went on with a stale value, perhaps to a
/// host that never asked. Said loudly, with the setup that prevents it; hosts only, never a
/// path or query.
pub(super) fn warn_if_followed(sent: &reqwest::Url, res: &reqwest::Response) {
    let to = res.url();
    if to == sent {
        return;
    }
    tracing::error!(
        from = sent.host_str().unwrap_or(""),
        to = to.host_str().unwrap_or(""),
        "the client followed a redirect with this request's deadline headers, a stale time \
         left perhaps to a host that never asked for it: build the reqwest Client with \
         `.redirect(RetrySafetyMiddleware::redirect_policy())`"
    );
}

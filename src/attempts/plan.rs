//! What the front ends decide about a request before its first attempt.

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method};

use super::LayerAttempt;
use crate::classify::{idempotency_key, Idempotency, RequestVerdict, StackErrors};
use crate::policy::{RequestOptions, RetryPolicy};
use crate::target::cap;

/// Longest request id echoed in reports, errors and logs.
pub(crate) const MAX_REQUEST_ID_LEN: usize = 128;

/// A header value fit to echo: printable ASCII, capped.
pub(super) fn printable(value: Option<&HeaderValue>, max: usize) -> Option<Box<str>> {
    let value = value?.to_str().ok()?;
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return None;
    }
    Some(cap(value, max).into())
}

/// A request carries few headers, so one pass comparing names costs less than two hashed
/// lookups: each lookup hashes the name byte by byte, a comparison costs a few instructions;
/// around eight names they break even.
const SCAN_UP_TO: usize = 8;

/// The first values of two headers (see [`SCAN_UP_TO`]).
#[inline]
fn two_headers<'h>(
    headers: &'h HeaderMap,
    a: &HeaderName,
    b: Option<&HeaderName>,
) -> (Option<&'h HeaderValue>, Option<&'h HeaderValue>) {
    if headers.keys_len() > SCAN_UP_TO {
        return (headers.get(a), b.and_then(|b| headers.get(b)));
    }
    let (mut found_a, mut found_b) = (None, None);
    for (name, value) in headers {
        if found_a.is_none() && name == a {
            found_a = Some(value);
        }
        if found_b.is_none() && b == Some(name) {
            found_b = Some(value);
        }
    }
    (found_a, found_b)
}

/// [`two_headers`] and whether the request is a gRPC call, in the same pass: the content type
/// is compared with the other names rather than looked up.
#[inline]
#[allow(clippy::type_complexity)]
fn two_headers_and_grpc<'h>(
    headers: &'h HeaderMap,
    a: &HeaderName,
    b: Option<&HeaderName>,
) -> (Option<&'h HeaderValue>, Option<&'h HeaderValue>, bool) {
    use crate::classify::grpc::is_grpc;
    if headers.keys_len() > SCAN_UP_TO {
        let (a, b) = two_headers(headers, a, b);
        return (a, b, is_grpc(headers));
    }
    let (mut found_a, mut found_b, mut content_type) = (None, None, None);
    for (name, value) in headers {
        if found_a.is_none() && name == a {
            found_a = Some(value);
        }
        if found_b.is_none() && b == Some(name) {
            found_b = Some(value);
        }
        if content_type.is_none() && name == http::header::CONTENT_TYPE {
            content_type = Some(value);
        }
    }
    let grpc = content_type.is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    (found_a, found_b, grpc)
}

/// What the front ends decide about a request before its first attempt, in one place so the
/// tower layer and the reqwest adapter cannot drift apart.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(super) verdict: RequestVerdict,
    /// An outer layer of this crate sent this attempt and decides about retries.
    pub(super) outer_layer: bool,
    /// The request's well-formed idempotency key, read once for the verdict and the report.
    pub(super) key: Option<Box<str>>,
    /// Whether the request has an idempotency-key header at all, well-formed or not: a
    /// caller's key is never replaced by a minted one.
    pub(super) has_key_header: bool,
    /// The request id from the request's headers, read in the same pass as the key.
    pub(super) request_id: Option<Box<str>>,
    /// The caller's per-request settings, if any.
    pub(super) options: Option<RequestOptions>,
    /// A gRPC call (a POST with `content-type: application/grpc…`), with the `grpc-timeout`
    /// the caller set, if any: it is the call's deadline too.
    pub(super) grpc: Option<Option<std::time::Duration>>,
    /// What the client stack's own errors say (the front end's hook; none by default).
    pub(super) stack: &'static StackErrors,
    /// The convention the request hands its deadline and attempt number on in (an HTTP host
    /// that asked), if it does.
    pub(super) sends_deadline: Option<crate::deadline::Convention>,
    /// The deadline the task this runs in arrived with, if the policy inherits it.
    pub(super) inbound: Option<crate::deadline::Inbound>,
}

impl Plan {
    /// `host` is called only if the policy trusts named hosts. `authority` is the URI's
    /// authority as written, when the front end has one that the request goes to (a fast
    /// look for the hosts deadlines go to). Inlined: called once per
    /// request, from each front end's start (out of line, its arguments were spilled and
    /// copied: 19 instructions per request more in a build that LLVM chose not to inline it).
    #[inline]
    pub(crate) fn new<'h>(
        policy: &RetryPolicy,
        method: &Method,
        host: impl FnOnce() -> crate::classify::host::HostSeen<'h>,
        authority: Option<&str>,
        path: &str,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Self {
        let names = policy.headers();
        let (key_name, id_name) = (
            &names.idempotency_key_header,
            names.request_id_header.as_ref(),
        );
        // gRPC calls are POSTs (the gRPC-over-HTTP/2 spec): any other method pays no look at
        // its content type.
        let (key, request_id, grpc) = if method == Method::POST {
            two_headers_and_grpc(headers, key_name, id_name)
        } else {
            let (key, request_id) = two_headers(headers, key_name, id_name);
            (key, request_id, false)
        };
        let has_key_header = key.is_some();
        let key = key.and_then(idempotency_key::parse);
        // The host is found at most once, for the rules and the deadline's hosts alike.
        let (mut seen, mut find) = (None, Some(host));
        let mut host = || {
            *seen.get_or_insert_with(|| {
                find.take()
                    .map_or(crate::classify::host::HostSeen::Nothing, |f| f())
            })
        };
        let verdict = policy.classify_parts(method, &mut host, path, key.is_some(), extensions);
        let hops = policy.hops();
        // A host spelled in the URI exactly as the policy names it, with no `Host` to say
        // otherwise, is that host: nothing to parse or make canonical.
        let sends_deadline = match authority.and_then(|a| hops.spelled(a, headers)) {
            Some(convention) => Some(convention),
            None => hops.sends_to(&mut host, policy.origin()),
        };
        Plan {
            verdict,
            outer_layer: extensions.get::<LayerAttempt>().is_some(),
            key: key.map(Into::into),
            has_key_header,
            request_id: printable(request_id, MAX_REQUEST_ID_LEN),
            options: extensions.get::<RequestOptions>().copied(),
            grpc: grpc.then(|| {
                headers
                    .get(crate::classify::grpc::GRPC_TIMEOUT)
                    .and_then(crate::classify::grpc::parse_timeout)
            }),
            stack: &StackErrors::NONE,
            sends_deadline,
            // The request's own `Inbound` first: a call that runs in another task (a
            // `Buffer`'s worker) carries its caller's deadline with it.
            inbound: if hops.inherit {
                extensions
                    .get::<crate::deadline::Inbound>()
                    .copied()
                    .or_else(crate::deadline::current)
            } else {
                None
            },
        }
    }

    /// Reads the client stack's own errors with `stack` (a front end's hook: the tower layer
    /// takes it from the request body's type).
    #[inline]
    pub(crate) fn read_errors_with(&mut self, stack: &'static StackErrors) {
        self.stack = stack;
    }

    /// Gives a non-idempotent request without a key a minted one when the policy mints
    /// them; the outer layer already did for an attempt it sent.
    #[inline]
    pub(crate) fn mint_key(&mut self, policy: &RetryPolicy, headers: &mut HeaderMap) {
        if self.outer_layer
            || !policy.mints_keys()
            || self.verdict.idempotency() == Idempotency::Idempotent
            || self.has_key_header
        {
            return;
        }
        if let Some(key) = policy.mint_key(headers) {
            self.verdict = self.verdict.with_key(true);
            self.key = Some(key);
        }
    }

    /// Retries allowed for this request: its own option, or the policy's.
    #[inline]
    pub(super) fn max_retries(&self, policy: &RetryPolicy) -> u32 {
        self.options
            .and_then(|o| o.max_retries)
            .unwrap_or(policy.max_retries())
    }

    /// Whether this layer could ever send the request again, so a copy is worth keeping.
    #[inline]
    pub(crate) fn may_retry(&self, policy: &RetryPolicy) -> bool {
        !self.outer_layer && !self.verdict.is_no_retry() && self.max_retries(policy) > 0
    }

    /// Whether to mark the attempts: the outermost layer owns retries, whatever its
    /// `max_retries` (a `NoRetry` request is recognised by inner layers anyway).
    #[inline]
    pub(crate) fn marks_attempts(&self) -> bool {
        !self.outer_layer && !self.verdict.is_no_retry()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `two_headers` answers as two `HeaderMap::get`s would, by scan or by lookup.
    #[test]
    fn two_headers_finds_the_first_value_of_each_name_like_get() {
        let key = HeaderName::from_static("idempotency-key");
        let id = HeaderName::from_static("x-request-id");
        for extra in [0, 2, 20] {
            let mut headers = HeaderMap::new();
            for i in 0..extra {
                let name = HeaderName::from_bytes(format!("x-filler-{i}").as_bytes()).unwrap();
                headers.insert(name, HeaderValue::from_static("f"));
            }
            headers.append(&id, HeaderValue::from_static("first"));
            headers.append(&id, HeaderValue::from_static("second"));
            headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("a/b"));
            let scanned = two_headers(&headers, &key, Some(&id));
            assert_eq!(scanned, (headers.get(&key), headers.get(&id)), "{extra}");
            assert_eq!(scanned.1.unwrap(), "first");
            assert_eq!(two_headers(&headers, &id, None), (headers.get(&id), None));
            {
                let (a, b, grpc) = two_headers_and_grpc(&headers, &key, Some(&id));
                assert_eq!((a, b), scanned);
                assert!(!grpc);
                let mut grpc_headers = headers.clone();
                grpc_headers.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/grpc+proto"),
                );
                assert!(
                    two_headers_and_grpc(&grpc_headers, &key, Some(&id)).2,
                    "{extra}"
                );
            }
            // The same name asked twice is found twice.
            assert_eq!(
                two_headers(&headers, &id, Some(&id)),
                (headers.get(&id), headers.get(&id))
            );
        }
    }
}

//! Writes and reads, told apart by method and by `--write` / `--read` route rules in
//! tower-retry-safety's route syntax (`POST /v1/tools/{slug}/execute`, `GET /files/{*path}`).

use http::Method;

use tower_retry_safety::classify::VerdictSource;
use tower_retry_safety::{Idempotency, RetryPolicy};

use crate::error::LabError;

/// Whether a repeat of a request is harmful, as the lab counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// A repeat may repeat a side effect (POST, PATCH, or a `--write` route): the proxy
    /// counts it applied twice when it reached the upstream twice.
    Write,
    /// A repeat is harmless (GET, HEAD, OPTIONS, PUT, DELETE by RFC 9110, or a `--read`
    /// route): the proxy counts it recovered when the client's last attempt got a 2xx.
    Read,
}

impl RouteKind {
    /// `write` or `read`.
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Write => "write",
            RouteKind::Read => "read",
        }
    }
}

#[derive(Clone, Debug)]
struct Rule {
    label: String,
    kind: RouteKind,
    /// This rule alone: which rule matched names the row it is counted in.
    alone: RetryPolicy,
}

/// The `--write` and `--read` rules. A retry policy's route rules decide the kind (the most
/// specific template wins; where spellings of a path disagree, the write), read through its
/// public classification; the first rule of that kind that matches names the route a request
/// is counted under. A request no rule matches is counted under its method.
#[derive(Clone, Debug)]
pub struct RouteKinds {
    routes: Vec<(Method, String, Idempotency)>,
    table: RetryPolicy,
    rules: Vec<Rule>,
}

impl Default for RouteKinds {
    fn default() -> Self {
        Self::new()
    }
}

/// A policy with `routes` as its only rules: what classifies a request here.
fn policy_of(routes: &[(Method, String, Idempotency)]) -> Result<RetryPolicy, String> {
    let mut builder = RetryPolicy::builder();
    for (method, template, verdict) in routes {
        builder = builder.route(method.clone(), template, *verdict);
    }
    builder.build().map_err(|err| err.to_string())
}

impl RouteKinds {
    /// No rules: every request is counted under its method, its kind the method's.
    pub fn new() -> Self {
        RouteKinds {
            routes: Vec::new(),
            table: RetryPolicy::builder()
                .build()
                .unwrap_or_else(|_| unreachable!("the default policy builds")),
            rules: Vec::new(),
        }
    }

    /// Adds a rule: `spec` is a method, a space and a path template (`POST /v1/{*rest}`).
    /// `flag` names the argument in an error.
    pub fn add(&mut self, flag: &str, spec: &str, kind: RouteKind) -> Result<(), LabError> {
        let (method, template) = parse_spec(flag, spec)?;
        let verdict = match kind {
            RouteKind::Write => Idempotency::NonIdempotent,
            RouteKind::Read => Idempotency::Idempotent,
        };
        let rule = (method.clone(), template.to_owned(), verdict);
        let alone = policy_of(std::slice::from_ref(&rule));
        self.routes.push(rule);
        let table = alone.and_then(|alone| Ok((alone, policy_of(&self.routes)?)));
        let (alone, table) = match table {
            Ok(built) => built,
            Err(err) => {
                self.routes.pop();
                return Err(LabError::new(flag, route_reason(&err, spec)));
            }
        };
        self.table = table;
        self.rules.push(Rule {
            label: format!("{method} {template}"),
            kind,
            alone,
        });
        Ok(())
    }

    /// The kind of a request and the route it is counted under. `path` excludes the query.
    pub fn classify(&self, method: &Method, path: &str) -> (RouteKind, String) {
        let Some(verdict) = route_verdict(&self.table, method, path) else {
            let kind = match Idempotency::of_method(method) {
                Idempotency::NonIdempotent => RouteKind::Write,
                Idempotency::Idempotent => RouteKind::Read,
            };
            return (kind, format!("{method} (any path)"));
        };
        let kind = match verdict {
            Idempotency::NonIdempotent => RouteKind::Write,
            Idempotency::Idempotent => RouteKind::Read,
        };
        let label = self
            .rules
            .iter()
            .find(|r| r.kind == kind && route_verdict(&r.alone, method, path).is_some())
            .map_or_else(
                || format!("{method} (a {} rule)", kind.name()),
                |r| r.label.clone(),
            );
        (kind, label)
    }
}

/// The verdict of `policy`'s route rules on a request, if one matched.
fn route_verdict(policy: &RetryPolicy, method: &Method, path: &str) -> Option<Idempotency> {
    let req = http::Request::builder()
        .method(method.clone())
        .uri(path)
        .body(())
        .ok()?;
    let verdict = policy.classify(&req);
    (verdict.source() == VerdictSource::Route).then(|| verdict.idempotency())
}

/// `POST /v1/{*rest}` as a method and a template.
pub(crate) fn parse_spec<'a>(flag: &str, spec: &'a str) -> Result<(Method, &'a str), LabError> {
    let (method, template) = spec.trim().split_once(' ').ok_or_else(|| {
        LabError::new(
            flag,
            format!("{spec:?} is not a route: write a method, a space and a path, as in 'POST /v1/{{*rest}}'"),
        )
    })?;
    // Methods are case-sensitive (RFC 9110 §9.1): `post` would be a method no client sends,
    // and the rule would match nothing.
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(LabError::new(
            flag,
            format!(
                "{method:?}: methods are case-sensitive; write {:?}",
                method.to_ascii_uppercase()
            ),
        ));
    }
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| LabError::new(flag, format!("{method:?} is not an HTTP method")))?;
    Ok((method, template.trim()))
}

/// The route table's reason, without its "invalid retry policy setting" preamble: the lab
/// has no policy.
fn route_reason(message: &str, spec: &str) -> String {
    let reason = message
        .split_once(": ")
        .map_or(message, |(_, rest)| rest)
        .to_owned();
    if reason.is_empty() {
        format!("{spec:?} is not a valid route")
    } else {
        reason
    }
}

//! Writes and reads, told apart by method and by `--write` / `--read` route rules in the
//! crate's own route syntax (`POST /v1/tools/{slug}/execute`, `GET /files/{*path}`).

use http::Method;

use super::LabError;
use crate::classify::routes::RouteTable;
use crate::Idempotency;

/// Whether a repeat of a request is harmful, as the lab counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A repeat may repeat a side effect (POST, PATCH, or a `--write` route): the proxy
    /// counts it applied twice when it reached the upstream twice.
    Write,
    /// A repeat is harmless (GET, HEAD, OPTIONS, PUT, DELETE by RFC 9110, or a `--read`
    /// route): the proxy counts it recovered when the client's last attempt got a 2xx.
    Read,
}

impl Kind {
    /// `write` or `read`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Write => "write",
            Kind::Read => "read",
        }
    }
}

#[derive(Clone, Debug)]
struct Rule {
    label: String,
    kind: Kind,
    /// This rule alone: which rule matched names the row it is counted in.
    alone: RouteTable<Idempotency>,
}

/// The `--write` and `--read` rules. The crate's route table decides the kind (the most
/// specific template wins; where spellings of a path disagree, the write); the first rule of
/// that kind that matches names the route a request is counted under. A request no rule
/// matches is counted under its method.
#[derive(Clone, Debug, Default)]
pub struct RouteKinds {
    table: RouteTable<Idempotency>,
    rules: Vec<Rule>,
}

impl RouteKinds {
    /// No rules: every request is counted under its method, its kind the method's.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule: `spec` is a method, a space and a path template (`POST /v1/{*rest}`).
    /// `flag` names the argument in an error.
    pub fn add(&mut self, flag: &str, spec: &str, kind: Kind) -> Result<(), LabError> {
        let (method, template) = parse_spec(flag, spec)?;
        let verdict = match kind {
            Kind::Write => Idempotency::NonIdempotent,
            Kind::Read => Idempotency::Idempotent,
        };
        let mut alone = RouteTable::default();
        alone
            .insert(method.clone(), template, verdict)
            .and_then(|()| self.table.insert(method.clone(), template, verdict))
            .map_err(|err| LabError::new(flag, route_reason(&err.to_string(), spec)))?;
        self.rules.push(Rule {
            label: format!("{method} {template}"),
            kind,
            alone,
        });
        Ok(())
    }

    /// The kind of a request and the route it is counted under. `path` excludes the query.
    pub fn classify(&self, method: &Method, path: &str) -> (Kind, String) {
        let Some(verdict) = self.table.lookup(method, path) else {
            let kind = match Idempotency::of_method(method) {
                Idempotency::NonIdempotent => Kind::Write,
                Idempotency::Idempotent => Kind::Read,
            };
            return (kind, format!("{method} (any path)"));
        };
        let kind = match verdict {
            Idempotency::NonIdempotent => Kind::Write,
            Idempotency::Idempotent => Kind::Read,
        };
        let label = self
            .rules
            .iter()
            .find(|r| r.kind == kind && r.alone.lookup(method, path).is_some())
            .map_or_else(
                || format!("{method} (a {} rule)", kind.name()),
                |r| r.label.clone(),
            );
        (kind, label)
    }
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

//! Route rules: method + path template → [`Idempotency`], looked up through one
//! [`matchit::Router`] per method so that lookup cost does not grow with the rule count.

use http::Method;

use super::Idempotency;
use crate::policy::BuildError;

/// The standard methods get a fixed slot; extension methods share a short list (its length is
/// the number of distinct extension methods with rules, not the number of rules).
const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
    Method::TRACE,
    Method::CONNECT,
];

/// The most parameters a template may have. matchit panics past 26; far fewer is plenty.
const MAX_PARAMETERS: usize = 16;

/// Parameters in a template: `{` that does not start an escaped `{{`.
fn parameter_count(template: &str) -> usize {
    let mut count = 0;
    let mut bytes = template.bytes().peekable();
    while let Some(b) = bytes.next() {
        if b == b'{' {
            if bytes.peek() == Some(&b'{') {
                bytes.next();
            } else {
                count += 1;
            }
        }
    }
    count
}

#[derive(Clone, Debug, Default)]
pub(crate) struct RouteTable {
    standard: [Option<matchit::Router<Idempotency>>; 9],
    extension: Vec<(Method, matchit::Router<Idempotency>)>,
    len: usize,
}

fn standard_slot(method: &Method) -> Option<usize> {
    STANDARD.iter().position(|m| m == method)
}

impl RouteTable {
    pub(crate) fn insert(
        &mut self,
        method: Method,
        template: &str,
        idempotency: Idempotency,
    ) -> Result<(), BuildError> {
        if !template.starts_with('/') {
            return Err(BuildError::route(
                &method,
                template,
                "a path template must start with '/'",
            ));
        }
        if template.contains('?') {
            return Err(BuildError::route(
                &method,
                template,
                "a path template must not contain a query string: queries never take part in matching",
            ));
        }
        if parameter_count(template) > MAX_PARAMETERS {
            return Err(BuildError::route(
                &method,
                template,
                format!("a path template may have at most {MAX_PARAMETERS} parameters"),
            ));
        }
        let router = match standard_slot(&method) {
            Some(slot) => self.standard[slot].get_or_insert_with(matchit::Router::new),
            None => {
                let pos = match self.extension.iter().position(|(m, _)| *m == method) {
                    Some(pos) => pos,
                    None => {
                        self.extension
                            .push((method.clone(), matchit::Router::new()));
                        self.extension.len() - 1
                    }
                };
                &mut self.extension[pos].1
            }
        };
        router.insert(template, idempotency).map_err(|err| {
            let reason = match err {
                matchit::InsertError::Conflict { with } if with == template => {
                    "two rules for the same method and template".to_owned()
                }
                matchit::InsertError::Conflict { with } => {
                    format!("it overlaps the rule for {method} {with}")
                }
                other => other.to_string(),
            };
            BuildError::route(&method, template, reason)
        })?;
        self.len += 1;
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The rule for this method and path, if any. The path must not include the query.
    pub(crate) fn lookup(&self, method: &Method, path: &str) -> Option<Idempotency> {
        // The common case, a policy without routes: not even the method's slot is looked up.
        if self.len == 0 {
            return None;
        }
        let router = match standard_slot(method) {
            Some(slot) => self.standard[slot].as_ref(),
            None => self
                .extension
                .iter()
                .find(|(m, _)| m == method)
                .map(|(_, r)| r),
        }?;
        router.at(path).ok().map(|m| *m.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rules: &[(Method, &str, Idempotency)]) -> RouteTable {
        let mut t = RouteTable::default();
        for (m, p, i) in rules {
            t.insert(m.clone(), p, *i).unwrap();
        }
        t
    }

    #[test]
    fn parameters_and_catch_all_match() {
        let t = table(&[
            (
                Method::POST,
                "/v1/tools/{slug}/execute",
                Idempotency::NonIdempotent,
            ),
            (Method::POST, "/v1/files/{*path}", Idempotency::Idempotent),
        ]);
        assert_eq!(
            t.lookup(&Method::POST, "/v1/tools/GMAIL_SEND/execute"),
            Some(Idempotency::NonIdempotent)
        );
        assert_eq!(
            t.lookup(&Method::POST, "/v1/files/a/b/c.txt"),
            Some(Idempotency::Idempotent)
        );
        assert_eq!(t.lookup(&Method::POST, "/v1/tools/x"), None);
        // Rules are per method.
        assert_eq!(t.lookup(&Method::PUT, "/v1/files/a"), None);
    }

    #[test]
    fn extension_methods_have_their_own_rules() {
        let purge = Method::from_bytes(b"PURGE").unwrap();
        let t = table(&[(purge.clone(), "/cache/{key}", Idempotency::Idempotent)]);
        assert_eq!(t.lookup(&purge, "/cache/x"), Some(Idempotency::Idempotent));
        let other = Method::from_bytes(b"LINK").unwrap();
        assert_eq!(t.lookup(&other, "/cache/x"), None);
    }

    #[test]
    fn duplicate_rule_is_named() {
        let mut t = table(&[(Method::PUT, "/v1/a/{id}", Idempotency::Idempotent)]);
        let err = t
            .insert(Method::PUT, "/v1/a/{id}", Idempotency::NonIdempotent)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("PUT /v1/a/{id}"), "{msg}");
        assert!(
            msg.contains("two rules for the same method and template"),
            "{msg}"
        );
        assert_eq!(t.len(), 1);
    }

    /// Found by the `route_template` fuzz target: matchit panics on more than 26 parameters.
    #[test]
    fn too_many_parameters_is_an_error_not_a_panic() {
        let template: String = (0..30).map(|i| format!("/{{p{i}}}")).collect();
        let mut t = RouteTable::default();
        let err = t
            .insert(Method::GET, &template, Idempotency::Idempotent)
            .unwrap_err();
        assert!(err.to_string().contains("at most 16 parameters"), "{err}");
        let sixteen: String = (0..16).map(|i| format!("/{{p{i}}}")).collect();
        t.insert(Method::GET, &sixteen, Idempotency::Idempotent)
            .unwrap();
        // Escaped braces are not parameters.
        assert_eq!(parameter_count("/a/{{literal}}/{id}"), 1);
    }

    #[test]
    fn invalid_templates_are_named() {
        let mut t = RouteTable::default();
        for bad in [
            "/v1/{unclosed",
            "/v1/{*path}/more",
            "no-slash",
            "/a?x=1",
            "/v1/{}",
        ] {
            let err = t
                .insert(Method::GET, bad, Idempotency::Idempotent)
                .unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert!(t.is_empty());
    }
}

//! Route rules: method + path template → [`Idempotency`], looked up through matchit routers per
//! method so that lookup cost does not grow with the rule count.
//!
//! A server may route other spellings of a path to the same handler (see [`spelling`]), so a
//! request's path is matched in three spellings and the stricter verdict wins:
//!
//! 1. as sent, against the templates as written: the only source of `Idempotent` verdicts, so
//!    no guess about the server's normalisation makes a write retryable;
//! 2. normalised (unreserved escapes decoded, dot and empty segments removed, so a trailing
//!    slash is ignored), against the templates as written: a `NonIdempotent` match counts;
//! 3. normalised and in ASCII lower case, against the templates normalised and lower-cased the
//!    same way (outside parameter names): a `NonIdempotent` match counts. Case-sensitive routers
//!    (axum, matchit) would not route `/v1/SEND/m1` to `/v1/send/{id}`, but IIS, ASP.NET and
//!    some gateways do, and a repeated write costs more than a retry not taken;
//! 4. in the lenient spelling (`;parameters` cut, every ASCII escape decoded, `%2F` and `\`
//!    read as `/`; see [`spelling`]), lower-cased, against the folded templates: a
//!    `NonIdempotent` match counts. Tomcat routes `/v1/send;v=1/m2`, and gunicorn with Flask
//!    routes `/v1%2Fsend/m3`, to `/v1/send/{id}`.
//!
//! In each spelling the most specific rule wins, as in matchit: a catch-all
//! `NonIdempotent` rule with a specific `Idempotent` exception keeps its exception. The folded
//! router therefore holds every rule, not only the `NonIdempotent` ones, though only its
//! `NonIdempotent` answers count.
//!
//! Cost: a path with no other spelling (the usual lower-case, normalised path under templates
//! already in that form) is looked up once, as is, with one scan of its bytes; other paths are
//! respelled in a stack buffer (heap only past [`spelling::STACK_PATH`] bytes).

use http::Method;

use super::{spelling, Idempotency};

/// What a rule says, in a table that fails closed: one of its values is strict (counts when
/// any spelling of a path matches it), the other lenient (counts only as written).
pub(crate) trait RuleValue: Copy + Eq + Send + Sync + 'static {
    /// The strict value.
    const STRICT: Self;
}

impl RuleValue for Idempotency {
    /// A write: a repeat is harmful, whatever the spelling that reached the handler.
    const STRICT: Self = Idempotency::NonIdempotent;
}
use crate::build_error::BuildError;

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

/// Rounds of decoding in the lenient spelling: servers decode once (a few, twice).
const LENIENT_ROUNDS: usize = 3;

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

/// The rules for one method.
#[derive(Clone, Debug)]
struct MethodRoutes<V> {
    /// Templates as written.
    exact: matchit::Router<V>,
    /// Templates normalised and lower-cased (spelling 3). `None` while every template is
    /// already in that form: `exact` then serves, and holds the table only once.
    folded: Option<matchit::Router<V>>,
    /// Whether any rule is strict: otherwise only spelling 1 can decide.
    any_non_idempotent: bool,
}

impl<V> Default for MethodRoutes<V> {
    fn default() -> Self {
        MethodRoutes {
            exact: matchit::Router::new(),
            folded: None,
            any_non_idempotent: false,
        }
    }
}

/// The stricter of two values: lenient only if both are.
fn stricter<V: RuleValue>(a: V, b: V) -> V {
    if a == V::STRICT || b == V::STRICT {
        V::STRICT
    } else {
        a
    }
}

fn is_non_idempotent<V: RuleValue>(router: &matchit::Router<V>, path: &str) -> bool {
    router.at(path).is_ok_and(|m| *m.value == V::STRICT)
}

impl<V: RuleValue> MethodRoutes<V> {
    fn insert(&mut self, method: &Method, template: &str, idempotency: V) -> Result<(), String> {
        let folded = spelling::fold_template(template);
        if self.folded.is_none() && folded != template {
            // Every template so far folds to itself: the folded table is the exact one.
            self.folded = Some(self.exact.clone());
        }
        self.exact
            .insert(template, idempotency)
            .map_err(|err| match err {
                matchit::InsertError::Conflict { with } if with == template => {
                    "two rules for the same method and template".to_owned()
                }
                matchit::InsertError::Conflict { with } => {
                    format!("it overlaps the rule for {method} {with}")
                }
                other => other.to_string(),
            })?;
        if let Some(router) = &mut self.folded {
            if let Err(reason) = insert_folded(router, method, &folded, idempotency) {
                // Leave the table as it was: one rule, in both routers or in neither.
                self.exact.remove(template);
                return Err(reason);
            }
        }
        self.any_non_idempotent |= idempotency == V::STRICT;
        Ok(())
    }

    fn lookup(&self, path: &str) -> Option<V> {
        let as_sent = self.exact.at(path).ok().map(|m| *m.value);
        // Other spellings can only make the verdict stricter.
        if as_sent == Some(V::STRICT) || !self.any_non_idempotent {
            return as_sent;
        }
        let shape = spelling::shape(path);
        if !shape.normalises && !shape.has_upper && !shape.lenient && self.folded.is_none() {
            // The path and every template are their own other spellings: nothing to copy.
            return as_sent;
        }
        if self.other_spelling_is_non_idempotent(path, shape) {
            Some(V::STRICT)
        } else {
            as_sent
        }
    }

    /// Spellings 2 and 3, respelled in place in one scratch buffer.
    fn other_spelling_is_non_idempotent(&self, path: &str, shape: spelling::Shape) -> bool {
        spelling::with_scratch(path.len(), |buf| {
            let len = if shape.normalises {
                spelling::normalise_into(path, buf)
            } else {
                buf.copy_from_slice(path.as_bytes());
                path.len()
            };
            // Respelling keeps UTF-8 (it splits at '/', decodes only to ASCII); were it ever
            // not, fail closed.
            let Ok(normalised) = std::str::from_utf8(&buf[..len]) else {
                return true;
            };
            if shape.normalises && is_non_idempotent(&self.exact, normalised) {
                return true;
            }
            buf[..len].make_ascii_lowercase();
            let Ok(folded) = std::str::from_utf8(&buf[..len]) else {
                return true;
            };
            is_non_idempotent(self.folded.as_ref().unwrap_or(&self.exact), folded)
        }) || (shape.lenient && self.lenient_spelling_is_non_idempotent(path))
    }

    /// Spelling 4, in up to [`LENIENT_ROUNDS`] rounds of decoding, each also without a
    /// format suffix. Two scratch buffers, each on the stack up to [`spelling::STACK_PATH`].
    fn lenient_spelling_is_non_idempotent(&self, path: &str) -> bool {
        let router = self.folded.as_ref().unwrap_or(&self.exact);
        spelling::with_scratch(path.len(), |current| {
            spelling::with_scratch(path.len(), |next| {
                current.copy_from_slice(path.as_bytes());
                let mut len = path.len();
                for _ in 0..LENIENT_ROUNDS {
                    let cut = spelling::lenient_into(&current[..len], next);
                    let Ok(decoded) = std::str::from_utf8(&next[..cut]) else {
                        return true;
                    };
                    len = spelling::normalise_into(decoded, current);
                    current[..len].make_ascii_lowercase();
                    let Ok(spelled) = std::str::from_utf8(&current[..len]) else {
                        return true;
                    };
                    if is_non_idempotent(router, spelled)
                        || spelling::without_format(spelled)
                            .is_some_and(|bare| is_non_idempotent(router, bare))
                    {
                        return true;
                    }
                    if !spelling::has_ascii_escape(&current[..len]) {
                        return false;
                    }
                }
                // Still escaped after every round: a path built to outlast the check.
                true
            })
        })
    }
}

/// Inserts a folded template. Rules that differ only in letter case or spelling
/// (`/v1/Send/{id}`, `/v1/send/{id}/`) are one route to a server that folds them, and which
/// of the two handlers it runs is not knowable here: they share one entry holding the stricter
/// verdict. Any other overlap that only folding creates is refused, like an overlap as written.
fn insert_folded<V: RuleValue>(
    router: &mut matchit::Router<V>,
    method: &Method,
    folded: &str,
    idempotency: V,
) -> Result<(), String> {
    let with = match router.insert(folded, idempotency) {
        Ok(()) => return Ok(()),
        Err(matchit::InsertError::Conflict { with }) => with,
        Err(other) => return Err(other.to_string()),
    };
    let overlap = || {
        format!(
            "once letter case and spelling are folded, it overlaps another rule: \
             {method} {folded} against {method} {with}"
        )
    };
    if spelling::template_shape(&with) != spelling::template_shape(folded) {
        return Err(overlap());
    }
    let existing = router.remove(with.as_str()).ok_or_else(overlap)?;
    router
        .insert(folded, stricter(existing, idempotency))
        .map_err(|_| {
            // Not expected: the same shape was just removed. Put the old entry back.
            let _ = router.insert(with.as_str(), existing);
            overlap()
        })
}

/// Rules per method, each answering a `V` (the request verdict by default; key trust has a
/// value of its own).
#[derive(Clone, Debug)]
pub(crate) struct RouteTable<V = Idempotency> {
    standard: [Option<MethodRoutes<V>>; 9],
    extension: Vec<(Method, MethodRoutes<V>)>,
    len: usize,
}

impl<V> Default for RouteTable<V> {
    fn default() -> Self {
        RouteTable {
            standard: Default::default(),
            extension: Vec::new(),
            len: 0,
        }
    }
}

fn standard_slot(method: &Method) -> Option<usize> {
    STANDARD.iter().position(|m| m == method)
}

impl<V: RuleValue> RouteTable<V> {
    pub(crate) fn insert(
        &mut self,
        method: Method,
        template: &str,
        idempotency: V,
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
        if spelling::has_dot_segment(template) {
            return Err(BuildError::route(
                &method,
                template,
                "a path template must not have '.' or '..' segments: servers remove them before routing",
            ));
        }
        let routes = match standard_slot(&method) {
            Some(slot) => self.standard[slot].get_or_insert_with(MethodRoutes::default),
            None => {
                let pos = match self.extension.iter().position(|(m, _)| *m == method) {
                    Some(pos) => pos,
                    None => {
                        self.extension
                            .push((method.clone(), MethodRoutes::default()));
                        self.extension.len() - 1
                    }
                };
                &mut self.extension[pos].1
            }
        };
        routes
            .insert(&method, template, idempotency)
            .map_err(|reason| BuildError::route(&method, template, reason))?;
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

    /// The rule for this method and path, if any, the stricter over the path's spellings (see
    /// the module docs). The path must not include the query. Allocates only for a path over
    /// [`spelling::STACK_PATH`] bytes that has another spelling.
    #[inline]
    pub(crate) fn lookup(&self, method: &Method, path: &str) -> Option<V> {
        // The common case, a policy without routes: not even the method's slot is looked up,
        // nor a function called.
        if self.len == 0 {
            return None;
        }
        self.lookup_rules(method, path)
    }

    fn lookup_rules(&self, method: &Method, path: &str) -> Option<V> {
        let routes = match standard_slot(method) {
            Some(slot) => self.standard[slot].as_ref(),
            None => self
                .extension
                .iter()
                .find(|(m, _)| m == method)
                .map(|(_, r)| r),
        }?;
        routes.lookup(path)
    }
}

#[cfg(test)]
mod tests;

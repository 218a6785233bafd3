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
    pub(crate) fn lookup(&self, method: &Method, path: &str) -> Option<V> {
        // The common case, a policy without routes: not even the method's slot is looked up.
        if self.len == 0 {
            return None;
        }
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

    const SEND: &str = "/v1/send/{id}";

    fn send_rule() -> RouteTable {
        table(&[(Method::PUT, SEND, Idempotency::NonIdempotent)])
    }

    fn put(t: &RouteTable, path: &str) -> Option<Idempotency> {
        t.lookup(&Method::PUT, path)
    }

    #[test]
    fn a_non_idempotent_rule_matches_every_spelling() {
        let t = send_rule();
        for path in [
            "/v1/send/m0",
            "/v1/send/m1/",
            "/v1/send/m1//",
            "/v1/%73end/m2",
            "/v1/%73%65%6E%64/m2",
            "/v1/SEND/m3",
            "/V1/Send/M3",
            "/v1/%53END/m3",
            "/v1//send/m4",
            "//v1/send/m4",
            "/v1/./send/m5",
            "/v1/x/../send/m6",
            "/v1/x/%2E%2e/send/m6",
            "/../v1/send/m6",
            // A parameter value in escapes, decoded or not, is still one segment.
            "/v1/send/m%37",
            "/v1/send/a%2Fb",
            // Decoded before routing by WSGI servers and Go's ServeMux.
            "/v1%2Fsend/m8",
            "/v1/send%2Fm8",
            "/v1%2fsend%2Fm8",
            "/v1%252Fsend/m8",
            // Segment parameters, cut by servlet containers.
            "/v1/send;v=1/m2",
            "/v1;a=b/send;jsessionid=x/m2",
            "/v1/send/m2;v=1",
            // A backslash, read as a slash by IIS.
            "/v1\\send/m9",
            "/v1%5Csend/m9",
        ] {
            assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
        }
        for path in [
            "/v1/send;v=1",
            "/v1/send%3Bv=1/m2/x",
            "/v1/send",
            "/v1/send/",
            "/v1/send/m9/more",
            "/v1/x/send/m9",
        ] {
            assert_eq!(put(&t, path), None, "{path}");
        }
    }

    /// Found by review: Rails routes `capture.json` to the `capture` action.
    #[test]
    fn a_format_suffix_is_routed_alike() {
        let t = table(&[(
            Method::POST,
            "/v1/charges/{id}/capture",
            Idempotency::NonIdempotent,
        )]);
        let post = |path| t.lookup(&Method::POST, path);
        for path in [
            "/v1/charges/c1/capture.json",
            "/v1/charges/c1/capture.xml",
            "/v1/charges/c1/capture%2Ejson",
            "/v1/charges/c1/Capture.JSON",
        ] {
            assert_eq!(post(path), Some(Idempotency::NonIdempotent), "{path}");
        }
        for path in ["/v1/charges/c1/.capture", "/v1/charges/c1/captured.json"] {
            assert_eq!(post(path), None, "{path}");
        }
    }

    #[test]
    fn escapes_decode_in_either_hex_case() {
        let t = table(&[
            (Method::PUT, "/v1/~user/{id}", Idempotency::NonIdempotent),
            (Method::PUT, "/v1/a-b/{id}", Idempotency::NonIdempotent),
            (Method::PUT, "/v1/a%2Fb/{id}", Idempotency::NonIdempotent),
        ]);
        for path in [
            "/v1/%7Euser/x",
            "/v1/%7euser/x",
            "/v1/a%2db/x",
            "/v1/a%2Db/x",
            "/v1/a%2Fb/x",
            // Folding lower-cases the template's escape too.
            "/v1/a%2fb/x",
        ] {
            assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
        }
        assert_eq!(put(&t, "/v1/a/b/x"), None);
    }

    #[test]
    fn catch_all_matches_every_spelling() {
        let t = table(&[(
            Method::DELETE,
            "/v1/files/{*path}",
            Idempotency::NonIdempotent,
        )]);
        for path in [
            "/v1/files/a/b.txt",
            "/v1/files/a/b.txt/",
            "/v1//files//a/b.txt",
            "/v1/FILES/a",
            "/v1/x/../files/a",
            "/v1/%66iles/a",
        ] {
            assert_eq!(
                t.lookup(&Method::DELETE, path),
                Some(Idempotency::NonIdempotent),
                "{path}"
            );
        }
        // The catch-all needs a non-empty tail.
        for path in ["/v1/files", "/v1/files/", "/v1/FILES/"] {
            assert_eq!(t.lookup(&Method::DELETE, path), None, "{path}");
        }
    }

    #[test]
    fn idempotent_rules_match_only_the_path_as_sent() {
        let t = table(&[
            (Method::POST, "/v1/search", Idempotency::Idempotent),
            // A NonIdempotent rule for the method, so other spellings are looked at.
            (Method::POST, "/v1/send/{id}", Idempotency::NonIdempotent),
        ]);
        assert_eq!(
            t.lookup(&Method::POST, "/v1/search"),
            Some(Idempotency::Idempotent)
        );
        // A guess about the server's normalisation never makes a write retryable.
        for path in ["/v1/search/", "/v1/SEARCH", "/v1/%73earch", "/v1//search"] {
            assert_eq!(t.lookup(&Method::POST, path), None, "{path}");
        }
    }

    #[test]
    fn the_stricter_verdict_wins_across_spellings() {
        let t = table(&[
            (Method::PUT, "/v1/{*rest}", Idempotency::Idempotent),
            (Method::PUT, SEND, Idempotency::NonIdempotent),
        ]);
        // As sent, these reach only the Idempotent catch-all; normalised or folded, the send.
        for path in [
            "/v1/send/m0",
            "/v1/send/m1/",
            "/v1/%73end/m2",
            "/v1/SEND/m3",
            "/v1//send/m4",
            "/v1/./send/m5",
            "/v1/x/../send/m6",
        ] {
            assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
        }
        for path in ["/v1/other/x", "/v1/send/m0/more", "/v1/Other"] {
            assert_eq!(put(&t, path), Some(Idempotency::Idempotent), "{path}");
        }
    }

    #[test]
    fn a_specific_idempotent_exception_keeps_its_spelling() {
        let t = table(&[
            (Method::PUT, "/v1/{*rest}", Idempotency::NonIdempotent),
            (Method::PUT, "/v1/files/{id}", Idempotency::Idempotent),
        ]);
        assert_eq!(put(&t, "/v1/files/x"), Some(Idempotency::Idempotent));
        // Other spellings reach the catch-all as sent.
        for path in ["/v1/FILES/x", "/v1/files/x/", "/v1/%66iles/x"] {
            assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
        }
    }

    #[test]
    fn templates_are_folded_too() {
        let t = table(&[(Method::PUT, "/v1/Send/{id}/", Idempotency::NonIdempotent)]);
        for path in ["/v1/Send/m1/", "/v1/send/m1", "/V1/SEND/m1", "/v1/send/m1/"] {
            assert_eq!(put(&t, path), Some(Idempotency::NonIdempotent), "{path}");
        }
        assert_eq!(put(&t, "/v1/sent/m1"), None);
    }

    #[test]
    fn rules_that_fold_together_share_the_stricter_verdict() {
        for order in [false, true] {
            let mut rules = vec![
                (Method::PUT, "/v1/Items/{id}", Idempotency::Idempotent),
                (Method::PUT, "/v1/items/{key}/", Idempotency::NonIdempotent),
            ];
            if order {
                rules.reverse();
            }
            let t = table(&rules);
            assert_eq!(t.len(), 2);
            // As sent the Idempotent rule matches; folded, both are one route.
            assert_eq!(put(&t, "/v1/Items/a"), Some(Idempotency::NonIdempotent));
            assert_eq!(put(&t, "/v1/items/a"), Some(Idempotency::NonIdempotent));
            assert_eq!(put(&t, "/v1/items/a/b"), None);
        }
        // Two Idempotent rules stay Idempotent as sent.
        let t = table(&[
            (Method::GET, "/A/{x}", Idempotency::Idempotent),
            (Method::GET, "/a/{y}", Idempotency::Idempotent),
            (Method::GET, "/n/{x}", Idempotency::NonIdempotent),
        ]);
        assert_eq!(
            t.lookup(&Method::GET, "/A/1"),
            Some(Idempotency::Idempotent)
        );
    }

    #[test]
    fn an_overlap_only_folding_creates_is_named_and_leaves_no_trace() {
        let mut t = table(&[(Method::PUT, "/A/{x}", Idempotency::Idempotent)]);
        let err = t
            .insert(Method::PUT, "/a/{*rest}", Idempotency::NonIdempotent)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("PUT /a/{*rest}: once letter case and spelling are folded")
                && msg.contains("against PUT /a/{x}"),
            "{msg}"
        );
        assert_eq!(t.len(), 1);
        assert_eq!(put(&t, "/a/x/y"), None);
        assert_eq!(put(&t, "/A/x"), Some(Idempotency::Idempotent));
    }

    #[test]
    fn long_paths_are_respelled_too() {
        let t = table(&[(Method::PUT, "/v1/send/{*rest}", Idempotency::NonIdempotent)]);
        let tail = "a".repeat(2 * spelling::STACK_PATH);
        for path in [
            format!("/v1/%73end/{tail}"),
            format!("/V1/send/{tail}"),
            format!("/v1/send//{tail}/"),
        ] {
            assert_eq!(put(&t, &path), Some(Idempotency::NonIdempotent));
        }
    }

    #[test]
    fn paths_that_are_not_absolute_are_only_folded() {
        let t = table(&[(Method::OPTIONS, "/x", Idempotency::NonIdempotent)]);
        assert_eq!(t.lookup(&Method::OPTIONS, "*"), None);
        assert_eq!(t.lookup(&Method::OPTIONS, ""), None);
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
            "/v1/./send",
            "/v1/x/../send",
            "/v1/%2e%2E/send",
        ] {
            let err = t
                .insert(Method::GET, bad, Idempotency::Idempotent)
                .unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        assert!(t.is_empty());
    }
}

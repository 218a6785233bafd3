//! `keys`: a conformance check for a server that honours `Idempotency-Key` (the IETF httpapi
//! draft, and tower-idempotency-keys' rule that a key is freed only when its handler provably
//! did not run). One line per rule; each request uses a key of its own, fresh per run.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::error::LabError;
use crate::headers::RUN_HEADER;
use crate::routes::parse_spec;

mod key_identity;
mod reply;
mod report;
mod rules;

pub use self::report::{KeysReport, RuleResult, RuleVerdict};

/// Headers a stored response must repeat, when the first answer had them.
const HEADERS_THAT_MATTER: [&str; 5] = [
    "content-type",
    "location",
    "content-location",
    "etag",
    RUN_HEADER,
];
/// A repeat that gets 409 (the first still being stored) is sent again, this many times.
const SETTLE_TRIES: usize = 100;
const SETTLE_PAUSE: Duration = Duration::from_millis(50);
/// Every rule, in the order run and reported.
const RULES: [&str; 8] = [
    "malformed-key-400",
    "in-flight-409",
    "other-payload-422",
    "repeat-same-answer",
    "concurrent-run-once",
    "repeat-after-failure",
    "key-case-sensitive",
    "key-kept",
];
/// The most of an answer's body the check reads.
const MAX_BODY: usize = 1024 * 1024;

/// What the check sends, and to where. Its `Debug` shows the headers' names only and the
/// body's length: they may hold credentials.
///
/// # What the server must do
///
/// The check asks the server for three things through headers, which a test deployment honours:
/// `x-lab-hold-ms: N` (the handler holds its answer N ms, so that repeats overlap it), `x-lab-fail`
/// (the handler fails after it may have applied its effect), and a response header
/// `x-lab-handler-run` unique per handler run ([`headers`](crate::headers)); the lab's
/// [`Upstream`](crate::serve::Upstream) does all three. Without the run header, answers that differ
/// still fail a rule, but equal answers cannot tell a stored response from a second run:
/// `repeat-same-answer` and `concurrent-run-once` are then `skip` (unverified), not `pass`. The
/// check first sends one well-formed keyed request: if the route does not answer it 2xx, every rule
/// is `skip`; with a `--body` without `{variant}`, so is every rule when that payload sent again
/// with a fresh key is not answered 2xx (an API that refuses a payload it already applied would
/// otherwise pass rules without keys). `in-flight-409` fails when both requests got one handler
/// run's 2xx after the hold was over (the server held the repeat until the first ended instead of
/// answering 409), and is `skip` when one came sooner (the hold was not honoured: they may not have
/// overlapped); `repeat-after-failure` is `skip` when the failed request got neither a 5xx nor no
/// answer. A rule the server does not let the check try is reported `skip`: a skipped run-once rule
/// leaves the check unpassed (exit 1), a skipped `other-payload-422` (a `--body` without
/// `{variant}`) does not.
#[derive(Clone)]
pub struct KeysCheck {
    target: Uri,
    method: Method,
    path: String,
    concurrency: usize,
    hold: Duration,
    /// How long after its answer a key must still be remembered.
    keep: Duration,
    key_header: HeaderName,
    /// Sent with every request (credentials): values marked sensitive.
    headers: HeaderMap,
    /// The request body, `{variant}` replaced per request; the check's own JSON if none.
    body: Option<String>,
}

impl fmt::Debug for KeysCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("KeysCheck")
            .field("target", &self.target)
            .field("method", &self.method)
            .field("path", &self.path)
            .field("concurrency", &self.concurrency)
            .field("hold", &self.hold)
            .field("keep", &self.keep)
            .field("key_header", &self.key_header)
            .field("headers", &names)
            .field("body_bytes", &self.body.as_ref().map(String::len))
            .finish()
    }
}

/// Where `--body` puts what tells its requests apart.
const VARIANT: &str = "{variant}";

impl KeysCheck {
    /// Checks `route` (`POST /v1/payments`; `{param}` segments are filled with `lab`) on the
    /// server at `target` (`http://HOST:PORT`, without a path or query: the route gives the
    /// path).
    pub fn new(target: &str, route: &str) -> Result<Self, LabError> {
        let target: Uri = target
            .parse()
            .ok()
            .filter(|u: &Uri| u.scheme_str() == Some("http") && u.authority().is_some())
            .ok_or_else(|| LabError::new("--target", "expected an http://HOST:PORT URL"))?;
        if target.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(LabError::new(
                "--target",
                "user information is not supported in the URL",
            ));
        }
        // The route gives the path: a path or query here would be dropped unsent, and a query
        // may hold a credential (`?api_key=`) that `Debug` would show. Refused, not echoed.
        if target.query().is_some() || target.path() != "/" {
            return Err(LabError::new(
                "--target",
                "a path or query is not supported in the URL (the route gives the path)",
            ));
        }
        let (method, template) = parse_spec("--route", route)?;
        if !template.starts_with('/') {
            return Err(LabError::new(
                "--route",
                format!("{template:?}: a path must start with '/'"),
            ));
        }
        Ok(KeysCheck {
            target,
            method,
            path: fill_parameters(template),
            concurrency: 8,
            hold: Duration::from_millis(1000),
            keep: Duration::from_secs(3),
            key_header: HeaderName::from_static("idempotency-key"),
            headers: HeaderMap::new(),
            body: None,
        })
    }

    /// A header sent with every request, as `NAME: VALUE` (an API's `Authorization`). Its
    /// value is never shown (not in errors, output or `Debug`). Refuses a line that is not
    /// `NAME: VALUE` or has an empty value, the key header (each rule sets its own) and the
    /// headers the check's client sets (`host`, `content-length`, `transfer-encoding`).
    pub fn header(mut self, line: &str) -> Result<Self, LabError> {
        let bad = |reason: String| LabError::new("--header", reason);
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad("expected NAME: VALUE".to_owned()))?;
        // Not echoed: a line written the wrong way round may hold the credential.
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| bad("the part before ':' is not a header name".to_owned()))?;
        let set_by_the_check = [
            &self.key_header,
            &http::header::HOST,
            &http::header::CONTENT_LENGTH,
            &http::header::TRANSFER_ENCODING,
        ];
        if set_by_the_check.contains(&&name) {
            return Err(bad(format!("{name} is set by the check")));
        }
        if value.trim().is_empty() {
            // Most often a variable that was not set (`X-Api-Key: $KEY`): said here, not as
            // a 401 that skips every rule.
            return Err(bad(format!("the value of {name} is empty")));
        }
        let mut value = HeaderValue::from_str(value.trim())
            .map_err(|_| bad(format!("the value of {name} is not a valid header value")))?;
        value.set_sensitive(true);
        self.headers.append(name, value);
        Ok(self)
    }

    /// The request body, for a route that accepts only its own payload: each `{variant}` in
    /// it is replaced by a string that differs from request to request of one rule (without
    /// one, every request sends the same body, and the rule that needs another payload for
    /// a key is skipped; that body must then be accepted twice with fresh keys, or every rule
    /// is skipped, as a refusal of it could not be told to be the key's). Set a
    /// `content-type` with [`header`](Self::header) if it is not JSON. It is never shown.
    ///
    /// Defaults to a small JSON object of the check's own.
    pub fn body(mut self, template: &str) -> Self {
        self.body = Some(template.to_owned());
        self
    }

    /// Requests sent at once with one key.
    ///
    /// Defaults to 8.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(2);
        self
    }

    /// How long the handler is asked to hold its answer (the `x-lab-hold-ms` header) so that
    /// repeats overlap it: well above the time requests take to arrive.
    ///
    /// Defaults to 1 s.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }

    /// How long after its answer a key must still be remembered (the IETF draft leaves the
    /// time to the server; APIs keep keys for hours): the first key is sent again once this
    /// has passed, and must get its first answer. A server that forgets keys sooner fails.
    ///
    /// Defaults to 3 s.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Runs every rule against the server.
    pub async fn run(&self) -> KeysReport {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let ctx = Ctx {
            check: self,
            client,
            run,
        };
        // A well-formed keyed request first: a route that refuses it (a payload it does not
        // accept, authentication) lets no rule be tried, and none is passed.
        let baseline = ctx
            .send(&ctx.key("baseline"), ctx.payload("baseline", 0), &[])
            .await;
        let answered = std::time::Instant::now();
        if !baseline.is_success() {
            return skip_all(format!(
                "the route refused the check's request: a well-formed keyed request got {} (want a 2xx)",
                baseline.shown()
            ));
        }
        // A `--body` without `{variant}` sends the baseline's payload with every key. The rules
        // read a refusal (a 400, a 409, a repeat not run) as the key's doing; an API that
        // refuses a payload it already applied, whatever the key, would pass them without
        // honouring keys. So that payload must be accepted again with a fresh key first.
        if ctx.one_payload() {
            let again = ctx
                .send(&ctx.key("baseline-again"), ctx.payload("baseline", 0), &[])
                .await;
            if !again.is_success() {
                return skip_all(format!(
                    "the --body has no {VARIANT}, and its payload sent again with a fresh key got {} (want a 2xx): a refusal could not be told to be the key's",
                    again.shown()
                ));
            }
        }
        KeysReport {
            results: vec![
                ctx.malformed_key().await,
                ctx.in_flight().await,
                ctx.other_payload().await,
                ctx.stored_response().await,
                ctx.concurrent_once().await,
                ctx.after_failure().await,
                ctx.key_case().await,
                ctx.repeat_later(&baseline, answered).await,
            ],
        }
    }
}

/// Every rule skipped, for one reason.
fn skip_all(detail: String) -> KeysReport {
    KeysReport {
        results: RULES
            .into_iter()
            .map(|rule| result(rule, RuleVerdict::Skip, detail.clone()))
            .collect(),
    }
}

fn fill_parameters(template: &str) -> String {
    template
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') && segment.ends_with('}') && !segment.starts_with("{{") {
                "lab"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

struct Ctx<'a> {
    check: &'a KeysCheck,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Fresh per run, so that runs and stores never share a key.
    run: String,
}

fn result(rule: &'static str, verdict: RuleVerdict, detail: impl Into<String>) -> RuleResult {
    RuleResult {
        rule,
        verdict,
        detail: detail.into(),
    }
}

fn pass_if(ok: bool) -> RuleVerdict {
    if ok {
        RuleVerdict::Pass
    } else {
        RuleVerdict::Fail
    }
}

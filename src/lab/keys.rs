//! `keys`: a conformance check for a server that honours `Idempotency-Key` (the IETF httpapi
//! draft, and this crate's rule that a key is freed only when its handler provably did not
//! run). One line per rule; each request uses a key of its own, fresh per run.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::routes::parse_spec;
use super::serve::{FAIL_HEADER, HOLD_HEADER, RUN_HEADER};
use super::LabError;

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
const RULES: [&str; 6] = [
    "malformed-key-400",
    "in-flight-409",
    "other-payload-422",
    "repeat-same-answer",
    "concurrent-run-once",
    "repeat-after-failure",
];
/// The most of an answer's body the check reads.
const MAX_BODY: usize = 1024 * 1024;

/// What the check sends, and to where. Its `Debug` shows the headers' names only and the
/// body's length: they may hold credentials.
#[derive(Clone)]
pub struct KeysCheck {
    target: Uri,
    method: Method,
    path: String,
    concurrency: usize,
    hold: Duration,
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
            .field("key_header", &self.key_header)
            .field("headers", &names)
            .field("body_bytes", &self.body.as_ref().map(String::len))
            .finish()
    }
}

/// Where `--body` puts what tells its requests apart.
const VARIANT: &str = "{variant}";

/// One rule's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server keeps the rule.
    Pass,
    /// The server breaks it.
    Fail,
    /// The rule could not be tried (the server does not honour the check's request).
    Skip,
}

/// One rule, its outcome, and what was seen (statuses and header names only).
#[derive(Clone, Debug)]
pub struct RuleResult {
    /// The rule's short name, such as `in-flight-409`.
    pub rule: &'static str,
    /// Pass, fail or skip.
    pub outcome: Outcome,
    /// What the check saw.
    pub detail: String,
}

/// Every rule's result, in order.
#[derive(Clone, Debug)]
pub struct KeysReport {
    /// One per rule.
    pub results: Vec<RuleResult>,
}

impl KeysReport {
    /// Whether no rule failed and at least one passed. A skipped rule does not fail the check,
    /// but a check whose every rule was skipped verified nothing (a route that refuses the
    /// check's request, a server that cannot be observed): it does not pass, so a CI job
    /// pointed at the wrong route fails rather than reporting a conformance it never saw.
    pub fn passed(&self) -> bool {
        let failed = self.results.iter().any(|r| r.outcome == Outcome::Fail);
        let verified = self.results.iter().any(|r| r.outcome == Outcome::Pass);
        verified && !failed
    }

    /// The result of a rule, by name.
    pub fn rule(&self, name: &str) -> Option<&RuleResult> {
        self.results.iter().find(|r| r.rule == name)
    }
}

impl fmt::Display for KeysReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.results {
            let outcome = match r.outcome {
                Outcome::Pass => "pass",
                Outcome::Fail => "FAIL",
                Outcome::Skip => "skip",
            };
            writeln!(f, "{outcome}  {:<22} {}", r.rule, r.detail)?;
        }
        if self.results.iter().all(|r| r.outcome == Outcome::Skip) {
            writeln!(f, "no rule could be tried: nothing was verified")?;
        }
        Ok(())
    }
}

/// A server's answer, or how the request failed.
#[derive(Clone, Debug)]
enum Reply {
    Answer {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// No answer: the connection closed, or no answer in time.
    NoAnswer,
}

impl Reply {
    fn status(&self) -> Option<StatusCode> {
        match self {
            Reply::Answer { status, .. } => Some(*status),
            Reply::NoAnswer => None,
        }
    }

    fn is_success(&self) -> bool {
        self.status().is_some_and(|s| s.is_success())
    }

    /// What names the handler run behind a 2xx: its run header, else its body. Only the run
    /// header proves two answers came from one run; equal bodies may be two runs.
    fn run(&self) -> Option<Vec<u8>> {
        match self {
            Reply::Answer {
                status,
                headers,
                body,
            } if status.is_success() => Some(match headers.get(RUN_HEADER) {
                Some(run) => run.as_bytes().to_vec(),
                None => body.to_vec(),
            }),
            _ => None,
        }
    }

    /// Whether the answer names its handler run (the run header).
    fn names_run(&self) -> bool {
        matches!(self, Reply::Answer { headers, .. } if headers.contains_key(RUN_HEADER))
    }

    fn shown(&self) -> String {
        match self.status() {
            Some(status) => status.as_u16().to_string(),
            None => "no answer".to_owned(),
        }
    }
}

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
            ],
        }
    }
}

/// Every rule skipped, for one reason.
fn skip_all(detail: String) -> KeysReport {
    KeysReport {
        results: RULES
            .into_iter()
            .map(|rule| result(rule, Outcome::Skip, detail.clone()))
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

fn result(rule: &'static str, outcome: Outcome, detail: impl Into<String>) -> RuleResult {
    RuleResult {
        rule,
        outcome,
        detail: detail.into(),
    }
}

fn pass_if(ok: bool) -> Outcome {
    if ok {
        Outcome::Pass
    } else {
        Outcome::Fail
    }
}

impl Ctx<'_> {
    fn key(&self, rule: &str) -> String {
        format!("\"lab-{}-{rule}\"", self.run)
    }

    fn payload(&self, rule: &str, variant: u32) -> Bytes {
        let tag = format!("lab-{}-{rule}-{variant}", self.run);
        match &self.check.body {
            Some(template) => Bytes::from(template.replace(VARIANT, &tag)),
            None => Bytes::from(format!(
                "{{\"lab\":\"{}\",\"rule\":\"{rule}\",\"variant\":{variant}}}",
                self.run
            )),
        }
    }

    async fn send(&self, key: &str, body: Bytes, extra: &[(&'static str, String)]) -> Reply {
        let check = self.check;
        let uri = format!(
            "{}://{}{}",
            check.target.scheme_str().unwrap_or("http"),
            check.target.authority().map_or("", |a| a.as_str()),
            check.path
        );
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = check.method.clone();
        let Ok(uri) = uri.parse() else {
            return Reply::NoAnswer;
        };
        *req.uri_mut() = uri;
        let headers = req.headers_mut();
        headers.extend(check.headers.clone());
        if !headers.contains_key(http::header::CONTENT_TYPE) {
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if let Ok(key) = HeaderValue::from_str(key) {
            headers.insert(check.key_header.clone(), key);
        }
        for (name, value) in extra {
            if let Ok(value) = HeaderValue::from_str(value) {
                headers.insert(*name, value);
            }
        }
        let limit = check.hold + Duration::from_secs(30);
        let sent = async {
            let res = self.client.request(req).await.ok()?;
            let (head, body) = res.into_parts();
            let body = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .ok()?
                .to_bytes();
            Some(Reply::Answer {
                status: head.status,
                headers: head.headers,
                body,
            })
        };
        match tokio::time::timeout(limit, sent).await {
            Ok(Some(reply)) => reply,
            _ => Reply::NoAnswer,
        }
    }

    /// Sends a repeat, again while it gets 409 (the first may still be being stored).
    async fn send_settled(&self, key: &str, body: Bytes) -> Reply {
        let mut reply = self.send(key, body.clone(), &[]).await;
        for _ in 0..SETTLE_TRIES {
            if reply.status() != Some(StatusCode::CONFLICT) {
                break;
            }
            tokio::time::sleep(SETTLE_PAUSE).await;
            reply = self.send(key, body.clone(), &[]).await;
        }
        reply
    }

    fn hold_header(&self) -> [(&'static str, String); 1] {
        [(HOLD_HEADER, self.check.hold.as_millis().to_string())]
    }

    /// Whether every request sends one payload: a `--body` without `{variant}`.
    fn one_payload(&self) -> bool {
        self.check
            .body
            .as_ref()
            .is_some_and(|b| !b.contains(VARIANT))
    }

    async fn malformed_key(&self) -> RuleResult {
        // An unterminated Structured Field string.
        let reply = self
            .send("\"lab-unterminated", self.payload("malformed", 0), &[])
            .await;
        let ok = reply.status() == Some(StatusCode::BAD_REQUEST);
        result(
            "malformed-key-400",
            pass_if(ok),
            format!("a malformed key got {} (want 400)", reply.shown()),
        )
    }

    async fn in_flight(&self) -> RuleResult {
        let key = self.key("in-flight");
        let body = self.payload("in-flight", 0);
        let hold = self.hold_header();
        let (a, b) = tokio::join!(
            self.send(&key, body.clone(), &hold),
            self.send(&key, body.clone(), &hold)
        );
        let statuses = [a.status(), b.status()];
        if a.is_success() && b.is_success() {
            let detail = |why: &str| {
                format!(
                    "two requests with one key got {} and {}: {why}",
                    a.shown(),
                    b.shown()
                )
            };
            if a.run() != b.run() {
                return result(
                    "in-flight-409",
                    Outcome::Fail,
                    detail("two handler runs (want a 2xx and a 409)"),
                );
            }
            // One run answered both: the second came after the first was stored (the server
            // did not hold its answer as asked), which a correct server answers so.
            let why = if a.names_run() && b.names_run() {
                format!("one handler run; they did not overlap ({HOLD_HEADER} not honoured), the rule was not tried")
            } else {
                format!("equal answers without {RUN_HEADER}: one run or two cannot be told, the rule was not tried")
            };
            return result("in-flight-409", Outcome::Skip, detail(&why));
        }
        let conflict = statuses.contains(&Some(StatusCode::CONFLICT));
        let ok = conflict && (a.is_success() || b.is_success());
        result(
            "in-flight-409",
            pass_if(ok),
            format!(
                "two overlapping requests with one key got {} and {} (want a 2xx and a 409)",
                a.shown(),
                b.shown()
            ),
        )
    }

    async fn other_payload(&self) -> RuleResult {
        if self.one_payload() {
            return result(
                "other-payload-422",
                Outcome::Skip,
                format!("the --body has no {VARIANT}: every request sends the same payload"),
            );
        }
        let key = self.key("other-payload");
        let first = self.send(&key, self.payload("other-payload", 1), &[]).await;
        if !first.is_success() {
            return result(
                "other-payload-422",
                Outcome::Fail,
                format!("the first request got {} (want a 2xx)", first.shown()),
            );
        }
        let reply = self
            .send_settled(&key, self.payload("other-payload", 2))
            .await;
        let ok = reply.status() == Some(StatusCode::UNPROCESSABLE_ENTITY);
        result(
            "other-payload-422",
            pass_if(ok),
            format!(
                "the key reused with another payload got {} (want 422)",
                reply.shown()
            ),
        )
    }

    async fn stored_response(&self) -> RuleResult {
        let key = self.key("stored");
        let body = self.payload("stored", 0);
        let first = self.send(&key, body.clone(), &[]).await;
        let Reply::Answer {
            status,
            headers,
            body: first_body,
        } = &first
        else {
            return result(
                "repeat-same-answer",
                Outcome::Fail,
                "the first request got no answer",
            );
        };
        let repeat = self.send_settled(&key, body).await;
        let Reply::Answer {
            status: again,
            headers: again_headers,
            body: again_body,
        } = &repeat
        else {
            return result(
                "repeat-same-answer",
                Outcome::Fail,
                "the repeat got no answer",
            );
        };
        let mut differ: Vec<&str> = Vec::new();
        if status != again {
            differ.push("status");
        }
        for name in HEADERS_THAT_MATTER {
            if headers.get(name).is_some() && headers.get(name) != again_headers.get(name) {
                differ.push(name);
            }
        }
        if first_body != again_body {
            differ.push("body");
        }
        let compared: Vec<&str> = HEADERS_THAT_MATTER
            .into_iter()
            .filter(|h| headers.contains_key(*h))
            .collect();
        if differ.is_empty() && !(first.names_run() && repeat.names_run()) {
            result(
                "repeat-same-answer",
                Outcome::Skip,
                format!(
                    "a repeat got an equal answer (status {}), but without {RUN_HEADER} a replay cannot be told from a second run: unverified",
                    status.as_u16()
                ),
            )
        } else if differ.is_empty() {
            result(
                "repeat-same-answer",
                Outcome::Pass,
                format!(
                    "a repeat got the first answer: status {}, body, and {}",
                    status.as_u16(),
                    if compared.is_empty() {
                        "no header that matters".to_owned()
                    } else {
                        compared.join(", ")
                    }
                ),
            )
        } else {
            result(
                "repeat-same-answer",
                Outcome::Fail,
                format!(
                    "a repeat's answer differs from the first's in: {} (first {}, repeat {})",
                    differ.join(", "),
                    status.as_u16(),
                    again.as_u16()
                ),
            )
        }
    }

    async fn concurrent_once(&self) -> RuleResult {
        let key = self.key("concurrent");
        let body = self.payload("concurrent", 0);
        let hold = self.hold_header();
        let sends = (0..self.check.concurrency).map(|_| self.send(&key, body.clone(), &hold));
        let mut replies = futures_join_all(sends).await;
        replies.push(self.send_settled(&key, body).await);
        let mut runs: Vec<Vec<u8>> = replies.iter().filter_map(Reply::run).collect();
        let answered = runs.len();
        runs.sort();
        runs.dedup();
        let conflicts = replies
            .iter()
            .filter(|r| r.status() == Some(StatusCode::CONFLICT))
            .count();
        let other = replies.len() - answered - conflicts;
        let ok = runs.len() == 1 && other == 0;
        let named = replies
            .iter()
            .filter(|r| r.is_success())
            .all(Reply::names_run);
        if ok && !named {
            return result(
                "concurrent-run-once",
                Outcome::Skip,
                format!(
                    "{} requests at once and a repeat, one key: {answered} equal 2xx answers, {conflicts} got 409, but without {RUN_HEADER} one run cannot be told from several: unverified",
                    self.check.concurrency
                ),
            );
        }
        result(
            "concurrent-run-once",
            pass_if(ok),
            format!(
                "{} requests at once and a repeat, one key: {answered} answered 2xx from {} handler run(s), {conflicts} got 409, {other} other (want one run)",
                self.check.concurrency,
                runs.len()
            ),
        )
    }

    async fn after_failure(&self) -> RuleResult {
        let key = self.key("failed");
        let body = self.payload("failed", 0);
        let first = self
            .send(&key, body.clone(), &[(FAIL_HEADER, "1".to_owned())])
            .await;
        // Tried only after a failure that may have applied: a 5xx, or no answer. A 2xx or
        // a 4xx says the handler did not fail as asked.
        if first.status().is_some_and(|s| !s.is_server_error()) {
            return result(
                "repeat-after-failure",
                Outcome::Skip,
                format!(
                    "the handler did not fail as asked ({FAIL_HEADER}): it got {}, the rule was not tried",
                    first.shown()
                ),
            );
        }
        // The repeat asks for no failure: a handler run again would answer 2xx.
        let repeat = self.send_settled(&key, body).await;
        let should_retry = match &repeat {
            Reply::Answer { headers, .. } => headers
                // Only true or false is shown: the value is the server's, and could be anything.
                .get("x-should-retry")
                .map(|v| match v.as_bytes().trim_ascii() {
                    b"true" => ", x-should-retry: true",
                    b"false" => ", x-should-retry: false",
                    _ => ", x-should-retry: neither true nor false",
                })
                .unwrap_or_default()
                .to_owned(),
            Reply::NoAnswer => String::new(),
        };
        let ran_again = repeat.is_success();
        result(
            "repeat-after-failure",
            pass_if(!ran_again),
            if ran_again {
                format!(
                    "the handler failed ({}), and a repeat ran it again ({}): the effect may be applied twice",
                    first.shown(),
                    repeat.shown()
                )
            } else {
                format!(
                    "the handler failed ({}); a repeat got {}{should_retry}, the handler not run again",
                    first.shown(),
                    repeat.shown()
                )
            },
        )
    }
}

/// Runs the futures together and returns their outputs in order (no futures-util in the
/// library).
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future,
{
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

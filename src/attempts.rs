//! Per-request bookkeeping shared by the tower layer and the reqwest adapter: classify each
//! attempt's outcome, record it, ask the policy, log, and build the report or the error. Both
//! front ends drive this one type, so the decision has one code path.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use tokio::time::Instant;

use crate::classify::{
    classify_error, idempotency_key, BodyVerdict, Classification, FailureClass, Idempotency,
    RequestVerdict,
};
use crate::error::{Error, Symptom};
use crate::policy::{AttemptEvent, Decision, Facts, RequestOptions, RetryPolicy, StopReason};
use crate::service::report::{AttemptRecord, Records};
use crate::service::{LayerAttempt, NotReplayable, RetryReport};
use crate::timed_out::TimedOut;
use crate::BoxError;

/// Longest request id echoed in reports, errors and logs.
const MAX_REQUEST_ID_LEN: usize = 128;
/// Longest path echoed in errors and logs.
pub(crate) const MAX_PATH_LEN: usize = 256;

/// The method and path of the request, for messages. The query string is never kept.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) method: Method,
    path: TargetPath,
}

#[derive(Clone, Debug)]
enum TargetPath {
    /// Cloning a `Uri` shares its bytes; the path is cut out only when printed.
    Uri(Uri),
    Text(Box<str>),
}

impl Target {
    #[inline]
    pub(crate) fn from_uri(method: Method, uri: Uri) -> Self {
        Target {
            method,
            path: TargetPath::Uri(uri),
        }
    }

    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn from_path(method: Method, path: &str) -> Self {
        Target {
            method,
            path: TargetPath::Text(cap(path, MAX_PATH_LEN).into()),
        }
    }

    /// The request's URI, when the target was made from one.
    pub(crate) fn uri(&self) -> Option<&Uri> {
        match &self.path {
            TargetPath::Uri(uri) => Some(uri),
            TargetPath::Text(_) => None,
        }
    }

    /// The path without query, capped in length.
    pub(crate) fn path(&self) -> &str {
        match &self.path {
            TargetPath::Uri(uri) => cap(uri.path(), MAX_PATH_LEN),
            TargetPath::Text(text) => text,
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(crate) fn cap(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A header value fit to echo: printable ASCII, capped.
fn printable(value: Option<&HeaderValue>, max: usize) -> Option<Box<str>> {
    let value = value?.to_str().ok()?;
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return None;
    }
    Some(cap(value, max).into())
}

/// The first values of two headers. A request carries few headers, so one pass comparing
/// names costs less than two hashed lookups: each lookup hashes the name byte by byte (about
/// 100 instructions for ours), a comparison costs a few; around eight names they break even.
fn two_headers<'h>(
    headers: &'h HeaderMap,
    a: &HeaderName,
    b: Option<&HeaderName>,
) -> (Option<&'h HeaderValue>, Option<&'h HeaderValue>) {
    const SCAN_UP_TO: usize = 8;
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

/// What the front ends decide about a request before its first attempt, in one place so the
/// tower layer and the reqwest adapter cannot drift apart.
#[derive(Debug)]
pub(crate) struct Plan {
    verdict: RequestVerdict,
    /// An outer layer of this crate sent this attempt and decides about retries.
    outer_layer: bool,
    /// The request's well-formed idempotency key, read once for the verdict and the report.
    key: Option<Box<str>>,
    /// Whether the request has an idempotency-key header at all, well-formed or not: a
    /// caller's key is never replaced by a minted one.
    has_key_header: bool,
    /// The request id from the request's headers, read in the same pass as the key.
    request_id: Option<Box<str>>,
    /// The caller's per-request settings, if any.
    options: Option<RequestOptions>,
}

impl Plan {
    /// `host` is called only if the policy trusts named hosts.
    pub(crate) fn new<'h>(
        policy: &RetryPolicy,
        method: &Method,
        host: impl FnOnce() -> Option<&'h str>,
        path: &str,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Self {
        let inner = &policy.inner;
        let (key, request_id) = two_headers(
            headers,
            &inner.idempotency_key_header,
            inner.request_id_header.as_ref(),
        );
        let has_key_header = key.is_some();
        let key = key.and_then(idempotency_key::parse);
        Plan {
            verdict: policy.classify_parts(method, host, path, key.is_some(), extensions),
            outer_layer: extensions.get::<LayerAttempt>().is_some(),
            key: key.map(Into::into),
            has_key_header,
            request_id: printable(request_id, MAX_REQUEST_ID_LEN),
            options: extensions.get::<RequestOptions>().copied(),
        }
    }

    /// Gives a non-idempotent request without a key a minted one when the policy mints
    /// them; the outer layer already did for an attempt it sent.
    #[inline]
    pub(crate) fn mint_key(&mut self, policy: &RetryPolicy, headers: &mut HeaderMap) {
        if self.outer_layer
            || !policy.inner.mint_idempotency_keys
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
    fn max_retries(&self, policy: &RetryPolicy) -> u32 {
        self.options
            .and_then(|o| o.max_retries)
            .unwrap_or(policy.inner.max_retries)
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

pub(crate) struct Attempts {
    policy: RetryPolicy,
    verdict: RequestVerdict,
    target: Target,
    /// Why the request's body cannot be sent again, if it cannot (no copy in hand, or a
    /// recording that stopped being replayable).
    not_replayable: Option<NotReplayable>,
    /// An outer layer of this crate made this attempt and decides about retries.
    outer_layer: bool,
    /// Retries allowed: the request's option or the policy's.
    max_retries: u32,
    /// The request's deadline and per-attempt timeout: its options or the policy's. Only the
    /// outermost layer keeps them; an inner one leaves the time to it.
    deadline: Option<Duration>,
    attempt_timeout: Option<Duration>,
    /// When the first attempt started; read only when there is a deadline.
    started: Option<Instant>,
    first_attempt_at: SystemTime,
    last_attempt_at: SystemTime,
    records: Records,
    request_id: Option<Box<str>>,
    idempotency_key: Option<Box<str>>,
}

impl Attempts {
    /// Starts the bookkeeping for one request and deposits it in the retry budget (unless an
    /// outer layer already did). `kept` says whether the front end kept what it needs to
    /// send the body again, or why not.
    pub(crate) fn start(
        policy: &RetryPolicy,
        plan: Plan,
        target: Target,
        kept: Result<(), NotReplayable>,
    ) -> Self {
        // Without a copy, retries are refused as "body not replayable" — unless the request
        // could never be retried anyway, in which case the decision names the real reason.
        let not_replayable = if plan.may_retry(policy) {
            kept.err()
        } else {
            None
        };
        let max_retries = plan.max_retries(policy);
        let Plan {
            verdict,
            outer_layer,
            key: idempotency_key,
            request_id,
            options,
            ..
        } = plan;
        let inner = &policy.inner;
        let (deadline, attempt_timeout) = if outer_layer {
            (None, None)
        } else {
            (
                options.and_then(|o| o.deadline).or(inner.deadline),
                options
                    .and_then(|o| o.attempt_timeout)
                    .or(inner.attempt_timeout),
            )
        };
        if !outer_layer {
            policy.deposit();
        }
        let now = SystemTime::now();
        Attempts {
            policy: policy.clone(),
            verdict,
            target,
            not_replayable,
            outer_layer,
            max_retries,
            deadline,
            attempt_timeout,
            started: deadline.map(|_| Instant::now()),
            first_attempt_at: now,
            last_attempt_at: now,
            records: Records::default(),
            request_id,
            idempotency_key,
        }
    }

    /// The request's target: kept once, here, for messages and for resending the request.
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// Time before the request's deadline, if it has one.
    #[inline]
    pub(crate) fn time_left(&self) -> Option<Duration> {
        self.deadline
            .zip(self.started)
            .map(|(deadline, started)| deadline.saturating_sub(started.elapsed()))
    }

    /// How long the next attempt may take before the policy's clock cuts it, and why it would
    /// be cut: the per-attempt timeout, or the deadline if it comes first. `None` without
    /// either (no timer at all).
    #[inline]
    pub(crate) fn attempt_limit(&self) -> Option<(Duration, TimedOut)> {
        match (self.attempt_timeout, self.time_left()) {
            (Some(attempt), Some(left)) if attempt < left => Some((attempt, TimedOut::Attempt)),
            (_, Some(left)) => Some((left, TimedOut::Deadline)),
            (Some(attempt), None) => Some((attempt, TimedOut::Attempt)),
            (None, None) => None,
        }
    }

    /// The request's body can no longer be sent again. The first reason found is kept.
    #[cold]
    pub(crate) fn refuse_replay(&mut self, why: NotReplayable) {
        self.not_replayable.get_or_insert(why);
    }

    /// Marks the start of the next attempt, and numbers it in the request's headers when the
    /// policy has an attempt header.
    #[inline]
    pub(crate) fn next_attempt(&mut self, headers: &mut HeaderMap) {
        let number = self.records.len() + 1;
        if number > 1 {
            self.last_attempt_at = SystemTime::now();
        }
        if let Some(name) = &self.policy.inner.attempt_header {
            headers.insert(name.clone(), HeaderValue::from(number));
        }
    }

    /// `extensions` are the response's: a body classifier inside the layer leaves its verdict
    /// there.
    pub(crate) fn on_response(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        extensions: &Extensions,
    ) -> Decision {
        if self.request_id.is_none() {
            if let Some(name) = &self.policy.inner.request_id_header {
                self.request_id = printable(headers.get(name), MAX_REQUEST_ID_LEN);
            }
        }
        let body_verdict = extensions.get::<BodyVerdict>().map(|v| v.0);
        let outcome = self
            .policy
            .classify_status(&self.verdict, status, headers, body_verdict);
        self.decide(outcome, Some(status))
    }

    pub(crate) fn on_error(&mut self, err: &(dyn StdError + 'static)) -> Decision {
        // Whether it may have been applied is read from the records: not sent, or a request the
        // client refused to build (final), did not reach the server.
        let class = classify_error(err);
        self.decide(class.into(), None)
    }

    fn decide(&mut self, outcome: Classification, status: Option<StatusCode>) -> Decision {
        self.records.push(AttemptRecord {
            class: outcome.class(),
            status,
            delay: None,
        });
        let attempt = self.records.len();
        let decision = if self.outer_layer {
            Decision::Stop(StopReason::RetriedByOuterLayer)
        } else {
            let time_left = self.time_left();
            let facts = Facts {
                verdict: &self.verdict,
                outcome: &outcome,
                retries_done: attempt - 1,
                max_retries: self.max_retries,
                time_left,
                replayable: self.not_replayable.is_none(),
            };
            let policy = &self.policy;
            policy.decide_with(facts, || policy.jitter_unit(), || policy.withdraw())
        };
        if let Decision::Retry { after } = decision {
            if let Some(last) = self.records.last_mut() {
                last.delay = Some(after);
            }
        }
        self.log(attempt, &outcome, status, decision);
        if let Some(hook) = &self.policy.inner.on_attempt {
            (hook.0)(&AttemptEvent {
                method: &self.target.method,
                path: self.target.path(),
                attempt,
                class: outcome.class(),
                status,
                verdict_source: self.verdict.source(),
                decision,
            });
        }
        decision
    }

    /// One event per decision that is not the plain end of a request, with OpenTelemetry's
    /// HTTP field names where one exists. A retry is `debug`; a suppressed retry, and a retry
    /// that was refused though the failure called for one (budget, body, deadline, a wait too
    /// long), are `warn`: an operator should see those.
    fn log(
        &self,
        attempt: u32,
        outcome: &Classification,
        status: Option<StatusCode>,
        decision: Decision,
    ) {
        let method = &self.target.method;
        let path = self.target.path();
        let class = outcome.class().as_str();
        let status = status.map(|s| s.as_u16());
        let resend_count = attempt - 1;
        // The fields every attempt event carries, then the event's own.
        macro_rules! event {
            ($level:expr, $($rest:tt)*) => {
                tracing::event!(
                    $level,
                    http.request.method = %method,
                    url.path = path,
                    attempt,
                    http.request.resend_count = resend_count,
                    error.r#type = class,
                    http.response.status_code = status,
                    $($rest)*
                )
            };
        }
        use tracing::Level;
        match decision {
            Decision::Retry { after } => event!(
                Level::DEBUG,
                delay_ms = after.as_millis() as u64,
                "retrying request"
            ),
            Decision::Stop(StopReason::SuppressedNotIdempotent) => event!(
                Level::WARN,
                verdict_source = self.verdict.source().as_str(),
                request_id = self.request_id.as_deref(),
                idempotency_key_untrusted = self.idempotency_key.is_some(),
                "retry suppressed: the request is not idempotent and may have been applied"
            ),
            Decision::Stop(StopReason::Replayed) => event!(
                Level::DEBUG,
                request_id = self.request_id.as_deref(),
                "not retrying request: the response is the server's replay of a stored response"
            ),
            Decision::Stop(
                reason @ (StopReason::Budget
                | StopReason::BodyNotReplayable
                | StopReason::Deadline
                | StopReason::RetryAfterTooLong),
            ) if outcome.class() != FailureClass::Final
                || reason == StopReason::RetryAfterTooLong =>
            {
                event!(
                    Level::WARN,
                    reason = reason.as_str(),
                    request_id = self.request_id.as_deref(),
                    "retry refused"
                )
            }
            Decision::Stop(reason) if outcome.class() != FailureClass::Final => event!(
                Level::DEBUG,
                reason = reason.as_str(),
                "not retrying request"
            ),
            Decision::Stop(_) => {}
        }
    }

    pub(crate) fn into_report(mut self, stop: StopReason) -> RetryReport {
        self.take_report(stop)
    }

    /// The report, its parts taken out of `self`, which is spent afterwards.
    #[inline]
    pub(crate) fn take_report(&mut self, stop: StopReason) -> RetryReport {
        RetryReport {
            verdict: self.verdict,
            records: std::mem::take(&mut self.records),
            stop,
            first_attempt_at: self.first_attempt_at,
            last_attempt_at: self.last_attempt_at,
            request_id: self.request_id.take(),
            idempotency_key: self.idempotency_key.take(),
            body: match stop {
                StopReason::BodyNotReplayable => self.not_replayable,
                _ => None,
            },
        }
    }

    /// The error for a request whose retry could not start because its body could not be
    /// sent again after all (the last attempt's outcome was already dropped for the retry).
    #[cold]
    pub(crate) fn into_body_refused(mut self, why: NotReplayable) -> Error {
        self.refuse_replay(why);
        self.into_error(StopReason::BodyNotReplayable, why.to_string().into())
    }

    /// The error for a request whose last attempt ended in `source`.
    pub(crate) fn into_error(self, stop: StopReason, source: BoxError) -> Error {
        // An inner layer of this crate already wrapped the transport error: unwrap it so the
        // chain reads caller → transport, not caller → layer → layer → transport.
        let source = match source.downcast::<Error>() {
            Ok(inner) => inner.into_source().unwrap_or_else(|inner| Box::new(inner)),
            Err(other) => other,
        };
        let class = self
            .records
            .iter()
            .last()
            .map_or(FailureClass::Ambiguous, |r| r.class);
        let symptom = Symptom::of(&*source);
        let target = self.target.clone();
        let report = self.into_report(stop);
        // One answer for the error and its report: any response but proof that nothing was
        // applied, or a failure after the request may have been sent.
        let maybe_applied = report.may_have_been_applied();
        Error::after_attempts(target, report, class, maybe_applied, symptom, source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an attempt ended in, for the report's cells.
    enum Outcome {
        /// An error of this kind (`ConnectionRefused`: not sent; `TimedOut`: ambiguous).
        Err(std::io::ErrorKind),
        /// A response with this status and, if set, the replay header.
        Res(u16, bool),
    }
    use std::io::ErrorKind::{ConnectionRefused, InvalidInput, TimedOut};
    use Outcome::{Err as E, Res};

    /// Drives the decision core through `outcomes` (one per attempt, until it stops) and
    /// returns the report, and whether the error (if it ended in one) is ambiguous.
    fn drive(
        policy: RetryPolicy,
        req: http::Request<()>,
        outcomes: &[Outcome],
    ) -> (RetryReport, Option<bool>) {
        let (parts, ()) = req.into_parts();
        let plan = Plan::new(
            &policy,
            &parts.method,
            || parts.uri.host(),
            parts.uri.path(),
            &parts.headers,
            &parts.extensions,
        );
        let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
        let mut attempts = Attempts::start(&policy, plan, target, Ok(()));
        for (i, outcome) in outcomes.iter().enumerate() {
            let decision = match outcome {
                E(kind) => attempts.on_error(&std::io::Error::from(*kind)),
                Res(status, replayed) => {
                    let mut headers = HeaderMap::new();
                    if *replayed {
                        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
                    }
                    let status = StatusCode::from_u16(*status).unwrap();
                    attempts.on_response(status, &headers, &Extensions::new())
                }
            };
            let Decision::Stop(stop) = decision else {
                assert!(i + 1 < outcomes.len(), "retried past the last outcome");
                continue;
            };
            assert_eq!(i + 1, outcomes.len(), "stopped before the last outcome");
            return match outcome {
                E(kind) => {
                    let err = attempts.into_error(stop, Box::new(std::io::Error::from(*kind)));
                    let ambiguous = err.is_ambiguous();
                    assert_eq!(
                        ambiguous,
                        err.report().unwrap().may_have_been_applied(),
                        "the error and its report agree"
                    );
                    (err.report().unwrap().clone(), Some(ambiguous))
                }
                Res(..) => (attempts.into_report(stop), None),
            };
        }
        unreachable!("no outcomes")
    }

    fn policy(b: crate::RetryPolicyBuilder) -> RetryPolicy {
        b.jitter(false).no_budget().max_retries(3).build().unwrap()
    }

    fn keyed_post() -> http::Request<()> {
        http::Request::post("http://api.test/v1/messages")
            .header("idempotency-key", "\"k-1\"")
            .body(())
            .unwrap()
    }

    // --- "may this write have been applied?", cell by cell ---

    #[test]
    fn applied_suppressed_after_an_ambiguous_error() {
        let post = http::Request::post("http://api.test/v1/messages")
            .body(())
            .unwrap();
        let (report, err) = drive(policy(RetryPolicy::builder()), post, &[E(TimedOut)]);
        assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
        assert!(report.may_have_been_applied());
        assert_eq!(err, Some(true));
    }

    #[test]
    fn applied_suppressed_on_a_retryable_response() {
        let post = http::Request::post("http://api.test/v1/messages")
            .body(())
            .unwrap();
        let (report, _) = drive(policy(RetryPolicy::builder()), post, &[Res(503, false)]);
        assert_eq!(report.stop_reason(), StopReason::SuppressedNotIdempotent);
        assert!(report.may_have_been_applied());
    }

    /// The case: a keyed write timed out, then met 409 "still in flight" until no
    /// retries were left. The report says retries were exhausted, not suppressed, and the
    /// write may have happened.
    #[test]
    fn applied_exhausted_on_409_after_a_timeout() {
        let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
        let outcomes = [
            E(TimedOut),
            Res(409, false),
            Res(409, false),
            Res(409, false),
        ];
        let (report, _) = drive(p, keyed_post(), &outcomes);
        assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
        assert!(!report.retry_suppressed());
        assert!(report.may_have_been_applied());
    }

    #[test]
    fn applied_on_a_replay_and_exhausted_on_one_when_the_header_is_ignored() {
        let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
        let (report, _) = drive(p, keyed_post(), &[Res(503, false), Res(503, true)]);
        assert_eq!(report.stop_reason(), StopReason::Replayed);
        assert!(report.replayed());
        assert!(report.may_have_been_applied());
        // A policy that ignores the header retries the replay until none are left.
        let p = policy(
            RetryPolicy::builder()
                .honor_idempotency_key(true)
                .replay_header(None),
        );
        let replays = [
            Res(503, false),
            Res(503, true),
            Res(503, true),
            Res(503, true),
        ];
        let (report, _) = drive(p, keyed_post(), &replays);
        assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
        assert!(report.may_have_been_applied());
    }

    #[test]
    fn applied_a_final_response_after_an_ambiguous_attempt() {
        // An idempotent request: retried after the timeout, then a final 404.
        let get = http::Request::get("http://api.test/v1/things/1")
            .body(())
            .unwrap();
        let (report, _) = drive(
            policy(RetryPolicy::builder()),
            get,
            &[E(TimedOut), Res(404, false)],
        );
        assert_eq!(report.stop_reason(), StopReason::Final);
        assert!(report.may_have_been_applied());
        // A keyed write: the timeout, then a 422 (the key reused with another payload).
        let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
        let (report, _) = drive(p, keyed_post(), &[E(TimedOut), Res(422, false)]);
        assert!(report.may_have_been_applied());
        // Then an error that was not sent: the error is still ambiguous.
        let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
        let outcomes = [
            E(TimedOut),
            E(ConnectionRefused),
            E(ConnectionRefused),
            E(ConnectionRefused),
        ];
        let (report, err) = drive(p, keyed_post(), &outcomes);
        assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
        assert_eq!(err, Some(true));
    }

    #[test]
    fn applied_a_success() {
        let post = http::Request::post("http://api.test/v1/messages")
            .body(())
            .unwrap();
        let (report, _) = drive(policy(RetryPolicy::builder()), post, &[Res(201, false)]);
        assert_eq!(report.stop_reason(), StopReason::Final);
        assert!(report.may_have_been_applied());
    }

    #[test]
    fn not_applied_when_no_attempt_reached_the_application() {
        let post = || {
            http::Request::post("http://api.test/v1/messages")
                .body(())
                .unwrap()
        };
        // Never sent: refused every time.
        let refused = [
            E(ConnectionRefused),
            E(ConnectionRefused),
            E(ConnectionRefused),
            E(ConnectionRefused),
        ];
        let (report, err) = drive(policy(RetryPolicy::builder()), post(), &refused);
        assert_eq!(report.stop_reason(), StopReason::RetriesExhausted);
        assert!(!report.may_have_been_applied());
        assert_eq!(err, Some(false));
        // A status the API answers only before applying anything, then refused connections.
        let p =
            policy(RetryPolicy::builder().not_applied_statuses([StatusCode::TOO_MANY_REQUESTS]));
        let outcomes = [
            Res(429, false),
            E(ConnectionRefused),
            E(ConnectionRefused),
            Res(429, false),
        ];
        let (report, _) = drive(p, post(), &outcomes);
        assert!(!report.may_have_been_applied(), "{report:?}");
        // An error the client made before sending (final): not applied.
        let (report, err) = drive(policy(RetryPolicy::builder()), post(), &[E(InvalidInput)]);
        assert_eq!(err, Some(report.may_have_been_applied()));
    }

    // --- a key that is not trusted is visible ---

    #[test]
    fn an_untrusted_key_is_named_in_the_report_and_the_error() {
        // Minting with no host named trusts keys unscoped, which yields to a marker that
        // calls the request a write: the README's marker example.
        let p = policy(RetryPolicy::builder().mint_idempotency_keys(true));
        let mut req = http::Request::post("http://api.test/v1/tools/execute")
            .body(())
            .unwrap();
        req.extensions_mut().insert(Idempotency::NonIdempotent);
        let (parts, ()) = req.into_parts();
        let mut headers = parts.headers.clone();
        let mut plan = Plan::new(
            &p,
            &parts.method,
            || None,
            parts.uri.path(),
            &headers,
            &parts.extensions,
        );
        plan.mint_key(&p, &mut headers);
        let target = Target::from_uri(parts.method.clone(), parts.uri.clone());
        let mut attempts = Attempts::start(&p, plan, target, Ok(()));
        let stop = match attempts.on_error(&std::io::Error::from(TimedOut)) {
            Decision::Stop(stop) => stop,
            d => panic!("{d:?}"),
        };
        let err = attempts.into_error(stop, Box::new(std::io::Error::from(TimedOut)));
        assert!(err.idempotency_key().is_some(), "a key was minted");
        assert!(err.idempotency_key_untrusted());
        assert!(
            err.to_string().contains("not trusted for this target"),
            "{err}"
        );
        assert!(
            err.to_string().contains("honor_idempotency_key_for_host"),
            "{err}"
        );
        let report = err.report().unwrap();
        assert!(report.idempotency_key_untrusted());
        assert!(
            report.to_string().contains("not trusted for this target"),
            "{report}"
        );

        // Trusted (a plain POST, no marker): the key is not called untrusted.
        let p = policy(RetryPolicy::builder().honor_idempotency_key(true));
        let (report, _) = drive(p, keyed_post(), &[E(TimedOut), Res(200, false)]);
        assert!(!report.idempotency_key_untrusted());
        assert!(!report.to_string().contains("not trusted"), "{report}");
    }

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
            // The same name asked twice is found twice.
            assert_eq!(
                two_headers(&headers, &id, Some(&id)),
                (headers.get(&id), headers.get(&id))
            );
        }
    }
}

//! The proxy's counts per route, as a table like the tour's, as JSON, and as a verdict.

use std::fmt::Write as _;

use crate::routes::RouteKind;

/// The counts of one route (a `--write`/`--read` rule, or a method when no rule matched).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteCounts {
    /// The rule (`POST /v1/payments`) or `POST (any path)`.
    pub route: String,
    /// Whether a repeat is harmful.
    pub kind: RouteKind,
    /// Operations seen.
    pub operations: u64,
    /// Attempts seen: operations plus the client's resends.
    pub attempts: u64,
    /// Attempts handed to the upstream, answered or not: each may have applied. Only an
    /// attempt whose connection to the upstream could not be made is not counted.
    pub upstream_requests: u64,
    /// Of those, attempts still at the upstream (no answer yet) when the counts were taken:
    /// counted as applied.
    pub pending: u64,
    /// Writes the upstream may have applied twice or more: two attempts handed to it, unless
    /// its answer to one says it ran nothing (a stored response, a keyed request refused, a
    /// 429). Always 0 for reads.
    pub applied_twice: u64,
    /// Writes whose attempts were linked by content alone across different keys (a client
    /// that changed its key on a resend, or two calls with one body): those applied twice
    /// are counted in `applied_twice`; `--op-header` tells them apart.
    pub uncertain: u64,
    /// Operations whose client was given a 2xx (a later attempt's failure does not take it
    /// back): for reads, the reads recovered. Includes `answered_ok_unconfirmed`.
    pub answered_ok: u64,
    /// Of `answered_ok`, operations whose 2xx may not have arrived: it was given on an
    /// HTTP/1.1 connection whose client had pipelined requests the proxy had not read yet,
    /// behind which a close cannot be seen, and no later look at that connection found the
    /// client still there. The lab cannot know whether these clients received their 2xx:
    /// the true count is between `answered_ok - answered_ok_unconfirmed` and `answered_ok`.
    pub answered_ok_unconfirmed: u64,
    /// Operations whose client was last given an error or a failed response, after the
    /// upstream answered one of its attempts.
    pub failed_after_upstream: u64,
    /// Operations whose client was last given an error or a failed response (or nothing yet),
    /// one of its attempts having been handed to the upstream, which answered none: the
    /// connection broke, or the answer was longer than `--max-body`, or it is still pending.
    pub failed_sent_no_answer: u64,
    /// Operations whose client was last given an error or a failed response, none of its
    /// attempts having been handed to the upstream (a fault before forwarding, or a connect
    /// error to the upstream).
    pub failed_provably_unsent: u64,
}

impl RouteCounts {
    pub(crate) fn new(route: String, kind: RouteKind) -> Self {
        RouteCounts {
            route,
            kind,
            operations: 0,
            attempts: 0,
            upstream_requests: 0,
            pending: 0,
            applied_twice: 0,
            uncertain: 0,
            answered_ok: 0,
            answered_ok_unconfirmed: 0,
            failed_after_upstream: 0,
            failed_sent_no_answer: 0,
            failed_provably_unsent: 0,
        }
    }
}

/// What a proxy counted, per route.
///
/// # What the counts mean
///
/// An attempt reached the upstream (and may have applied) from the moment the proxy hands it to its
/// upstream client, answered or not: a connection that breaks after the upstream read the request,
/// or an answer longer than `--max-body`, does not show the write was not run. Only a connect error
/// to the upstream proves an attempt was not sent. An answer, when one arrives whole, can only take
/// an attempt back: one marked `idempotent-replayed: true` (a stored response, as
/// tower-idempotency-keys' layer and Stripe mark them; `--replayed-header` names another), a 400,
/// 409 or 422 to a keyed request (`Idempotency-Key`, or `--key-header`), or a 429 (RFC 6585:
/// refused for its rate) ran nothing. A 503, even with `Retry-After`, counts as applied: nothing
/// says the handler did not run first. A write is *applied twice* when two or more of its attempts
/// may have applied. What the client got is the answer that completed last for the operation,
/// except that a 2xx, once given, stays (a hedged request's 2xx counts even if a later hedge was
/// begun, and an attempt the client abandoned does not take it back by ending later), and that no
/// answer does not replace one given; an answer held for the slow fault notes nothing unless the
/// client waited it out. An answer is counted only if the client is still there to take it: an
/// HTTP/1.1 client that closed its connection (behind requests it pipelined, which hide the close
/// from hyper) is given nothing. When requests it pipelined are still unread, a close behind them
/// cannot be seen: a 2xx given then counts as answered but *unconfirmed* (the lab cannot know that
/// it arrived) until the proxy finds the client still there on that connection.
///
/// Failed operations are split three ways: the upstream answered one of their attempts
/// (`failed, answered`); an attempt was sent and none answered (`failed, no answer`); none
/// was sent (`failed, never sent`). On SIGINT or SIGTERM the proxy stops accepting and
/// forwarding, waits up to `--drain-ms` for attempts still at the upstream, and reports those
/// still there as `pending` (counted as applied).
///
/// Two identical requests without a key or an op header are one operation to the proxy
/// (a second GET of the same path counts as a resend), and so are two with one body and
/// different keys while the first is unanswered (counted uncertain): give each logical
/// request its own `--op-header` value, or its own path or body, when a test repeats one on
/// purpose. A resend whose key and body both change (a nonce per attempt) cannot be linked
/// without `--op-header` or `--op-id`: it counts as a new operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyReport {
    routes: Vec<RouteCounts>,
    refused_over_limit: u64,
}

/// Whether a count of writes applied twice is within `max_applied_twice`: one of the
/// conditions of [`ProxyReport::passes`].
fn within_allowance(applied_twice: u64, max_applied_twice: u64) -> bool {
    applied_twice <= max_applied_twice
}

impl ProxyReport {
    pub(crate) fn new(routes: Vec<RouteCounts>, refused_over_limit: u64) -> Self {
        ProxyReport {
            routes,
            refused_over_limit,
        }
    }

    /// Requests refused with a 413 for a body over `--max-body`: the lab never saw them
    /// whole, so it checked nothing about them.
    pub fn refused_over_limit(&self) -> u64 {
        self.refused_over_limit
    }

    /// Writes linked by content alone across different keys, on every route.
    pub fn uncertain(&self) -> u64 {
        self.sum(RouteKind::Write, |r| r.uncertain)
    }

    /// Why the run does not pass, if it does not: a write applied twice past the allowance,
    /// no write seen at all (a run that reached nothing verified nothing), or a request the
    /// lab refused for its size (it was never checked).
    pub fn failures(&self, max_applied_twice: u64) -> Vec<String> {
        let mut why = Vec::new();
        if !within_allowance(self.applied_twice(), max_applied_twice) {
            why.push(format!(
                "{} writes may have been applied twice (--max-applied-twice {max_applied_twice})",
                self.applied_twice()
            ));
        }
        if self.writes() == 0 {
            why.push("no write reached the lab: nothing was verified".to_owned());
        }
        if self.refused_over_limit > 0 {
            why.push(format!(
                "{} requests were refused for a body over --max-body: never checked",
                self.refused_over_limit
            ));
        }
        why
    }

    /// One row per route, in the order routes were first seen.
    pub fn routes(&self) -> &[RouteCounts] {
        &self.routes
    }

    fn sum(&self, kind: RouteKind, f: impl Fn(&RouteCounts) -> u64) -> u64 {
        self.routes.iter().filter(|r| r.kind == kind).map(f).sum()
    }

    /// Write operations seen, on every route.
    pub fn writes(&self) -> u64 {
        self.sum(RouteKind::Write, |r| r.operations)
    }

    /// Read operations seen, on every route.
    pub fn reads(&self) -> u64 {
        self.sum(RouteKind::Read, |r| r.operations)
    }

    /// Writes the upstream applied twice or more, on every route.
    pub fn applied_twice(&self) -> u64 {
        self.sum(RouteKind::Write, |r| r.applied_twice)
    }

    /// Reads whose client was given a 2xx.
    pub fn reads_recovered(&self) -> u64 {
        self.sum(RouteKind::Read, |r| r.answered_ok)
    }

    /// Of [`reads_recovered`](ProxyReport::reads_recovered), those whose 2xx the lab cannot know
    /// arrived (see [`RouteCounts::answered_ok_unconfirmed`]).
    pub fn reads_recovered_unconfirmed(&self) -> u64 {
        self.sum(RouteKind::Read, |r| r.answered_ok_unconfirmed)
    }

    /// Writes whose client was given a 2xx.
    pub fn writes_answered(&self) -> u64 {
        self.sum(RouteKind::Write, |r| r.answered_ok)
    }

    /// Of [`writes_answered`](ProxyReport::writes_answered), those whose 2xx the lab cannot know
    /// arrived (see [`RouteCounts::answered_ok_unconfirmed`]).
    pub fn writes_answered_unconfirmed(&self) -> u64 {
        self.sum(RouteKind::Write, |r| r.answered_ok_unconfirmed)
    }

    /// Attempts seen by the proxy, on every route.
    pub fn attempts(&self) -> u64 {
        self.routes.iter().map(|r| r.attempts).sum()
    }

    /// Requests handed to the upstream, on every route.
    pub fn upstream_requests(&self) -> u64 {
        self.routes.iter().map(|r| r.upstream_requests).sum()
    }

    /// Requests still at the upstream when the counts were taken, on every route.
    pub fn pending(&self) -> u64 {
        self.routes.iter().map(|r| r.pending).sum()
    }

    /// Whether the run passes: at most `max_applied_twice` writes may have been applied
    /// twice, at least one write was seen, and no request was refused for its size (see
    /// [`failures`](ProxyReport::failures)). The proxy's exit status is this verdict.
    pub fn passes(&self, max_applied_twice: u64) -> bool {
        self.failures(max_applied_twice).is_empty()
    }

    /// The table printed on stdout: one row per route, then the verdict.
    pub fn table(&self, max_applied_twice: u64) -> String {
        let width = self
            .routes
            .iter()
            .map(|r| r.route.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(5, 48);
        // Says how many 2xx the lab cannot know arrived, when any: the column widens for it.
        let answered: Vec<String> = self
            .routes
            .iter()
            .map(|r| match r.answered_ok_unconfirmed {
                0 => format!("{} / {}", r.answered_ok, r.operations),
                n => format!("{} / {} ({n} unconfirmed)", r.answered_ok, r.operations),
            })
            .collect();
        let ok_width = answered.iter().map(String::len).max().unwrap_or(0).max(13);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$} {:<5} {:>6} {:>8} {:>8} {:>7} {:>13} {:>9} {:>ok_width$} {:>16} {:>17} {:>18}",
            "route",
            "kind",
            "ops",
            "attempts",
            "upstream",
            "pending",
            "applied twice",
            "uncertain",
            "answered 2xx",
            "failed, answered",
            "failed, no answer",
            "failed, never sent",
        );
        for (r, answered) in self.routes.iter().zip(answered) {
            let twice = match r.kind {
                RouteKind::Write => format!("{} / {}", r.applied_twice, r.operations),
                RouteKind::Read => "-".to_owned(),
            };
            let route: String = r.route.chars().take(width).collect();
            let _ = writeln!(
                out,
                "{:<width$} {:<5} {:>6} {:>8} {:>8} {:>7} {:>13} {:>9} {:>ok_width$} {:>16} {:>17} {:>18}",
                route,
                r.kind.name(),
                r.operations,
                r.attempts,
                r.upstream_requests,
                r.pending,
                twice,
                r.uncertain,
                answered,
                r.failed_after_upstream,
                r.failed_sent_no_answer,
                r.failed_provably_unsent,
            );
        }
        let failures = self.failures(max_applied_twice);
        let verdict = if failures.is_empty() {
            "pass".to_owned()
        } else {
            format!("FAIL: {}", failures.join("; "))
        };
        let reads_unconfirmed = match self.reads_recovered_unconfirmed() {
            0 => String::new(),
            n => format!(" ({n} unconfirmed)"),
        };
        let _ = writeln!(
            out,
            "\nwrites applied twice {} / {} ({} uncertain), reads recovered {} / {}{reads_unconfirmed}, refused over --max-body {}: {verdict} (--max-applied-twice {max_applied_twice})",
            self.applied_twice(),
            self.writes(),
            self.uncertain(),
            self.reads_recovered(),
            self.reads(),
            self.refused_over_limit,
        );
        out.push_str(LEGEND);
        out
    }

    /// The counts as one JSON object: `routes` (one object per row, fields as in
    /// [`RouteCounts`]), the totals, `pass` and the `failures` that deny it.
    pub fn to_json(&self, max_applied_twice: u64) -> String {
        let routes: Vec<serde_json::Value> = self
            .routes
            .iter()
            .map(|r| {
                serde_json::json!({
                    "route": r.route,
                    "kind": r.kind.name(),
                    "operations": r.operations,
                    "attempts": r.attempts,
                    "upstream_requests": r.upstream_requests,
                    "pending": r.pending,
                    "applied_twice": r.applied_twice,
                    "uncertain": r.uncertain,
                    "answered_ok": r.answered_ok,
                    "answered_ok_unconfirmed": r.answered_ok_unconfirmed,
                    "failed_after_upstream": r.failed_after_upstream,
                    "failed_sent_no_answer": r.failed_sent_no_answer,
                    "failed_provably_unsent": r.failed_provably_unsent,
                })
            })
            .collect();
        serde_json::json!({
            "routes": routes,
            "writes": self.writes(),
            "reads": self.reads(),
            "applied_twice": self.applied_twice(),
            "uncertain": self.uncertain(),
            "refused_over_limit": self.refused_over_limit,
            "pending": self.pending(),
            "reads_recovered": self.reads_recovered(),
            "reads_recovered_unconfirmed": self.reads_recovered_unconfirmed(),
            "writes_answered": self.writes_answered(),
            "writes_answered_unconfirmed": self.writes_answered_unconfirmed(),
            "max_applied_twice": max_applied_twice,
            "pass": self.passes(max_applied_twice),
            "failures": self.failures(max_applied_twice),
        })
        .to_string()
    }
}

const LEGEND: &str = "\
ops                 operations: attempts linked by op header, key, or method, path and body (a multipart
                    body without its boundary); a resend with another key is linked by its content
upstream            attempts handed to the upstream, answered or not: each may have applied
pending             of those, attempts the upstream had not answered when the counts were taken
applied twice       writes two attempts of which may have applied (an answer marked as a stored
                    response, a keyed 400/409/422, or a 429 applies nothing)
uncertain           writes linked by content alone across different keys: a client that changed its
                    key on a resend, or two calls with one body (--op-header tells them apart)
answered 2xx        operations whose client was given a 2xx (for reads: reads recovered); unconfirmed:
                    of those, given only behind HTTP/1.1 requests pipelined and not yet read, where the
                    client's close cannot be seen: the lab cannot know that they arrived
failed, answered    the client's last answer failed, after the upstream answered an attempt
failed, no answer   the client's last answer failed; an attempt was sent, the upstream answered none
failed, never sent  the client's last answer failed, and no attempt was handed to the upstream
";

#[cfg(test)]
mod tests {
    use super::within_allowance;

    #[test]
    fn the_exit_status_fails_only_past_the_allowed_count() {
        assert!(within_allowance(0, 0));
        assert!(!within_allowance(1, 0));
        assert!(within_allowance(3, 3));
        assert!(!within_allowance(4, 3));
    }
}

//! The proxy's counts per route, as a table like the tour's, as JSON, and as a verdict.

use std::fmt::Write as _;

use super::Kind;

/// The counts of one route (a `--write`/`--read` rule, or a method when no rule matched).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteCounts {
    /// The rule (`POST /v1/payments`) or `POST (any path)`.
    pub route: String,
    /// Whether a repeat is harmful.
    pub kind: Kind,
    /// Operations seen.
    pub operations: u64,
    /// Attempts seen: operations plus the client's resends.
    pub attempts: u64,
    /// Attempts that reached the upstream and were answered by it.
    pub upstream_requests: u64,
    /// Writes the upstream applied twice or more (answers marked as stored responses, and
    /// refusals of keyed requests, apply nothing). Always 0 for reads.
    pub applied_twice: u64,
    /// Operations whose client was last given a 2xx: for reads, the reads recovered.
    pub answered_ok: u64,
    /// Operations whose client was last given an error or a failed response, after one of
    /// its attempts reached the upstream.
    pub failed_after_upstream: u64,
    /// Operations whose client was last given an error or a failed response, none of its
    /// attempts having reached the upstream.
    pub failed_never_sent: u64,
}

impl RouteCounts {
    pub(crate) fn new(route: String, kind: Kind) -> Self {
        RouteCounts {
            route,
            kind,
            operations: 0,
            attempts: 0,
            upstream_requests: 0,
            applied_twice: 0,
            answered_ok: 0,
            failed_after_upstream: 0,
            failed_never_sent: 0,
        }
    }
}

/// What a proxy counted, per route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    routes: Vec<RouteCounts>,
}

/// Whether a run passes: at most `max_applied_twice` writes reached the upstream twice. The
/// proxy's exit status is this verdict.
pub fn passes(applied_twice: u64, max_applied_twice: u64) -> bool {
    applied_twice <= max_applied_twice
}

impl Report {
    pub(crate) fn new(routes: Vec<RouteCounts>) -> Self {
        Report { routes }
    }

    /// One row per route, in the order routes were first seen.
    pub fn routes(&self) -> &[RouteCounts] {
        &self.routes
    }

    fn sum(&self, kind: Kind, f: impl Fn(&RouteCounts) -> u64) -> u64 {
        self.routes.iter().filter(|r| r.kind == kind).map(f).sum()
    }

    /// Write operations seen, on every route.
    pub fn writes(&self) -> u64 {
        self.sum(Kind::Write, |r| r.operations)
    }

    /// Read operations seen, on every route.
    pub fn reads(&self) -> u64 {
        self.sum(Kind::Read, |r| r.operations)
    }

    /// Writes the upstream applied twice or more, on every route.
    pub fn applied_twice(&self) -> u64 {
        self.sum(Kind::Write, |r| r.applied_twice)
    }

    /// Reads whose client was last given a 2xx.
    pub fn reads_recovered(&self) -> u64 {
        self.sum(Kind::Read, |r| r.answered_ok)
    }

    /// Writes whose client was last given a 2xx.
    pub fn writes_answered(&self) -> u64 {
        self.sum(Kind::Write, |r| r.answered_ok)
    }

    /// Attempts seen by the proxy, on every route.
    pub fn attempts(&self) -> u64 {
        self.routes.iter().map(|r| r.attempts).sum()
    }

    /// Requests that reached the upstream, on every route.
    pub fn upstream_requests(&self) -> u64 {
        self.routes.iter().map(|r| r.upstream_requests).sum()
    }

    /// Whether the run passes `--max-applied-twice` (see [`passes`]).
    pub fn passes(&self, max_applied_twice: u64) -> bool {
        passes(self.applied_twice(), max_applied_twice)
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
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<width$} {:<5} {:>6} {:>8} {:>8} {:>13} {:>13} {:>16} {:>16}",
            "route",
            "kind",
            "ops",
            "attempts",
            "upstream",
            "applied twice",
            "answered 2xx",
            "failed, reached",
            "failed, not sent",
        );
        for r in &self.routes {
            let twice = match r.kind {
                Kind::Write => format!("{} / {}", r.applied_twice, r.operations),
                Kind::Read => "-".to_owned(),
            };
            let route: String = r.route.chars().take(width).collect();
            let _ = writeln!(
                out,
                "{:<width$} {:<5} {:>6} {:>8} {:>8} {:>13} {:>13} {:>16} {:>16}",
                route,
                r.kind.name(),
                r.operations,
                r.attempts,
                r.upstream_requests,
                twice,
                format!("{} / {}", r.answered_ok, r.operations),
                r.failed_after_upstream,
                r.failed_never_sent,
            );
        }
        let verdict = if self.passes(max_applied_twice) {
            "pass"
        } else {
            "FAIL"
        };
        let _ = writeln!(
            out,
            "\nwrites applied twice {} / {}, reads recovered {} / {}: {verdict} (--max-applied-twice {max_applied_twice})",
            self.applied_twice(),
            self.writes(),
            self.reads_recovered(),
            self.reads(),
        );
        out.push_str(LEGEND);
        out
    }

    /// The counts as one JSON object: `routes` (one object per row, fields as in
    /// [`RouteCounts`]), the totals, and `pass`.
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
                    "applied_twice": r.applied_twice,
                    "answered_ok": r.answered_ok,
                    "failed_after_upstream": r.failed_after_upstream,
                    "failed_never_sent": r.failed_never_sent,
                })
            })
            .collect();
        serde_json::json!({
            "routes": routes,
            "writes": self.writes(),
            "reads": self.reads(),
            "applied_twice": self.applied_twice(),
            "reads_recovered": self.reads_recovered(),
            "writes_answered": self.writes_answered(),
            "max_applied_twice": max_applied_twice,
            "pass": self.passes(max_applied_twice),
        })
        .to_string()
    }
}

const LEGEND: &str = "\
ops               operations: attempts with one Idempotency-Key, op header, or method, path and body
upstream          attempts that reached the upstream (the first attempt's fault decides whether it does)
applied twice     writes the upstream applied more than once (a stored response applies nothing)
answered 2xx      operations whose last attempt got a 2xx (for reads: reads recovered)
failed, reached   the client's last attempt failed, after the write or read reached the upstream
failed, not sent  the client's last attempt failed, and no attempt reached the upstream
";

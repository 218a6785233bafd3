//! The rules, one method each.

use http::StatusCode;

use super::reply::{futures_join_all, Reply};
use super::report::{RuleResult, RuleVerdict};
use super::{pass_if, result, Ctx, HEADERS_THAT_MATTER, VARIANT};
use crate::headers::{FAIL_HEADER, HOLD_HEADER, RUN_HEADER};

impl Ctx<'_> {
    pub(super) async fn malformed_key(&self) -> RuleResult {
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

    pub(super) async fn in_flight(&self) -> RuleResult {
        let key = self.key("in-flight");
        let body = self.payload("in-flight", 0);
        let hold = self.hold_header();
        let sent = std::time::Instant::now();
        let timed = |body| async {
            let reply = self.send(&key, body, &hold).await;
            (reply, sent.elapsed())
        };
        let ((a, a_took), (b, b_took)) = tokio::join!(timed(body.clone()), timed(body.clone()));
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
                    RuleVerdict::Fail,
                    detail("two handler runs (want a 2xx and a 409)"),
                );
            }
            // One run answered both. Both were sent at once, and neither was answered before
            // the hold was over: the handler held as asked, so the second arrived while the
            // first ran and was held until it ended instead of answered 409. Answered sooner,
            // the hold was not honoured and the second may have come after the first was
            // stored, which a correct server answers so: not tried. (Load only lengthens the
            // times, so it can turn a skip into a fail, never a fail into a pass.)
            let held = a_took.min(b_took) >= self.check.hold;
            let why = if a.names_run() && b.names_run() && held {
                return result(
                    "in-flight-409",
                    RuleVerdict::Fail,
                    detail("one handler run answered both, the second held until the first ended (want a 409 while it runs)"),
                );
            } else if a.names_run() && b.names_run() {
                format!("one handler run; they did not overlap ({HOLD_HEADER} not honoured), the rule was not tried")
            } else {
                format!("equal answers without {RUN_HEADER}: one run or two cannot be told, the rule was not tried")
            };
            return result("in-flight-409", RuleVerdict::Skip, detail(&why));
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

    pub(super) async fn other_payload(&self) -> RuleResult {
        if self.one_payload() {
            return result(
                "other-payload-422",
                RuleVerdict::Skip,
                format!("the --body has no {VARIANT}: every request sends the same payload"),
            );
        }
        let key = self.key("other-payload");
        let first = self.send(&key, self.payload("other-payload", 1), &[]).await;
        if !first.is_success() {
            return result(
                "other-payload-422",
                RuleVerdict::Fail,
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

    pub(super) async fn stored_response(&self) -> RuleResult {
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
                RuleVerdict::Fail,
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
                RuleVerdict::Fail,
                "the repeat got no answer",
            );
        };
        let differ = differences(
            (status, headers, first_body),
            (again, again_headers, again_body),
        );
        let compared: Vec<&str> = HEADERS_THAT_MATTER
            .into_iter()
            .filter(|h| headers.contains_key(*h))
            .collect();
        if differ.is_empty() && !(first.names_run() && repeat.names_run()) {
            result(
                "repeat-same-answer",
                RuleVerdict::Skip,
                format!(
                    "a repeat got an equal answer (status {}), but without {RUN_HEADER} the stored response cannot be told from a second run: unverified",
                    status.as_u16()
                ),
            )
        } else if differ.is_empty() {
            result(
                "repeat-same-answer",
                RuleVerdict::Pass,
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
                RuleVerdict::Fail,
                format!(
                    "a repeat's answer differs from the first's in: {} (first {}, repeat {})",
                    differ.join(", "),
                    status.as_u16(),
                    again.as_u16()
                ),
            )
        }
    }

    pub(super) async fn concurrent_once(&self) -> RuleResult {
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
                RuleVerdict::Skip,
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

    pub(super) async fn after_failure(&self) -> RuleResult {
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
                RuleVerdict::Skip,
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

type Seen<'a> = (&'a StatusCode, &'a http::HeaderMap, &'a bytes::Bytes);

/// What a repeat's answer changed from the first's: its status, a header that matters the
/// first had, its body.
fn differences(first: Seen<'_>, repeat: Seen<'_>) -> Vec<&'static str> {
    let mut differ = Vec::new();
    if first.0 != repeat.0 {
        differ.push("status");
    }
    for name in HEADERS_THAT_MATTER {
        if first.1.get(name).is_some() && first.1.get(name) != repeat.1.get(name) {
            differ.push(name);
        }
    }
    if first.2 != repeat.2 {
        differ.push("body");
    }
    differ
}

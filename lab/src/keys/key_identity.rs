//! The rules about the key itself, beyond one burst of requests: it is compared exactly (a
//! Structured Field string: case matters), and it is remembered for as long as the check
//! asks (`--keep-ms`), so that a repeat later still gets the first answer.

use std::time::Instant;

use http::StatusCode;

use super::reply::Reply;
use super::report::{RuleResult, RuleVerdict};
use super::{result, Ctx};
use crate::headers::RUN_HEADER;

impl Ctx<'_> {
    /// A key that differs from another only in case is another key: it runs the handler
    /// again, and is neither refused as a reuse (422) nor answered with the other's run.
    pub(super) async fn key_case(&self) -> RuleResult {
        const RULE: &str = "key-case-sensitive";
        let upper = format!("\"lab-{}-Case-KEY\"", self.run);
        let lower = upper.to_ascii_lowercase();
        let first = self.send(&upper, self.payload("case", 1), &[]).await;
        if !first.is_success() {
            let detail = format!("the first request got {} (want a 2xx)", first.shown());
            return result(RULE, RuleVerdict::Fail, detail);
        }
        // Another payload where the body allows it: a server comparing keys without case
        // then answers 422; with one payload, it answers the first run.
        let variant = if self.one_payload() { 1 } else { 2 };
        let other = self
            .send_settled(&lower, self.payload("case", variant))
            .await;
        let shown = format!(
            "a key differing only in case got {} after {}",
            other.shown(),
            first.shown()
        );
        if other.status() == Some(StatusCode::UNPROCESSABLE_ENTITY) {
            let detail = format!("{shown}: compared without case, taken as a reuse");
            return result(RULE, RuleVerdict::Fail, detail);
        }
        if !other.is_success() {
            let detail = format!("{shown} (want a 2xx from a run of its own)");
            return result(RULE, RuleVerdict::Fail, detail);
        }
        match (
            first.run() == other.run(),
            first.names_run() && other.names_run(),
        ) {
            (true, true) => result(
                RULE,
                RuleVerdict::Fail,
                format!("{shown}: the first key's run answered it (compared without case)"),
            ),
            (true, false) => result(
                RULE,
                RuleVerdict::Skip,
                format!("{shown}: equal answers without {RUN_HEADER}, unverified"),
            ),
            (false, _) => result(
                RULE,
                RuleVerdict::Pass,
                format!("{shown}: a run of its own"),
            ),
        }
    }

    /// The baseline's key sent again once `keep` has passed since its answer: still its
    /// first answer, from its one run.
    pub(super) async fn repeat_later(&self, baseline: &Reply, answered: Instant) -> RuleResult {
        const RULE: &str = "key-kept";
        let keep = self.check.keep;
        tokio::time::sleep_until((answered + keep).into()).await;
        let repeat = self
            .send_settled(&self.key("baseline"), self.payload("baseline", 0))
            .await;
        let shown = format!(
            "the first key sent again {} ms after its answer got {}",
            keep.as_millis(),
            repeat.shown()
        );
        if !repeat.is_success() || repeat.run() != baseline.run() {
            let detail = format!("{shown}: the key was forgotten (want its first answer)");
            return result(RULE, RuleVerdict::Fail, detail);
        }
        if !(repeat.names_run() && baseline.names_run()) {
            let detail = format!("{shown}: an equal answer without {RUN_HEADER}, unverified");
            return result(RULE, RuleVerdict::Skip, detail);
        }
        result(
            RULE,
            RuleVerdict::Pass,
            format!("{shown}: its first run's answer"),
        )
    }
}

//! The check's report: one rule result per rule, and whether the check as a whole passes.

use std::fmt;

/// One rule's verdict: kept, broken, or not tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleVerdict {
    /// The server keeps the rule.
    Pass,
    /// The server breaks it.
    Fail,
    /// The rule could not be tried (the server does not honour the check's request).
    Skip,
}

/// One rule's result: the rule, its verdict, and what was seen (statuses and header names only).
#[derive(Clone, Debug)]
pub struct RuleResult {
    /// The rule's short name, such as `in-flight-409`.
    pub rule: &'static str,
    /// Pass, fail or skip.
    pub verdict: RuleVerdict,
    /// What the check saw.
    pub detail: String,
}

/// Every rule's result, in order.
#[derive(Clone, Debug)]
pub struct KeysReport {
    /// One per rule.
    pub results: Vec<RuleResult>,
}

/// The rules that say whether a key's handler runs once: the check passes only when each
/// of them was tried and kept. A skip here is not a pass (a server that cannot be observed
/// running once has not been shown to).
pub(super) const RUN_ONCE: [&str; 4] = [
    "in-flight-409",
    "repeat-same-answer",
    "concurrent-run-once",
    "repeat-after-failure",
];

impl KeysReport {
    /// Whether no rule failed and every run-once rule (in flight, repeat,
    /// concurrent, after a failure) passed. A skipped run-once rule leaves the check
    /// unpassed: a server that re-ran every repeat, or held a repeat instead of answering
    /// 409, could not be told from a conforming one, so the check does not say it conforms.
    pub fn passed(&self) -> bool {
        let failed = self.results.iter().any(|r| r.verdict == RuleVerdict::Fail);
        let verified = RUN_ONCE.iter().all(|rule| {
            self.rule(rule)
                .is_some_and(|r| r.verdict == RuleVerdict::Pass)
        });
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
            let verdict = match r.verdict {
                RuleVerdict::Pass => "pass",
                RuleVerdict::Fail => "FAIL",
                RuleVerdict::Skip => "skip",
            };
            writeln!(f, "{verdict}  {:<22} {}", r.rule, r.detail)?;
        }
        if self.results.iter().all(|r| r.verdict == RuleVerdict::Skip) {
            writeln!(f, "no rule could be tried: nothing was verified")?;
        } else if !self.passed() && !self.results.iter().any(|r| r.verdict == RuleVerdict::Fail) {
            writeln!(
                f,
                "not passed: the run-once rules ({}) were not all verified",
                RUN_ONCE.join(", ")
            )?;
        }
        Ok(())
    }
}

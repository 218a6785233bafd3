//! Exponential backoff with "equal jitter": the n-th retry waits a random time in
//! `[base/2, base]` where `base = min(initial * 2^n, max)`. Half of the wait is kept so that a
//! burst of failures never turns into a burst of immediate retries.

use std::time::Duration;

use tower::util::rng::{HasherRng, Rng};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) initial: Duration,
    pub(crate) max: Duration,
}

impl Backoff {
    /// The wait before retry number `retry` (0 for the first retry), where `unit` in `[0, 1]`
    /// is the random draw (1.0 gives the full base delay, which is what a policy without jitter
    /// uses).
    pub(crate) fn delay(&self, retry: u32, unit: f64) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        let base = self
            .initial
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max);
        let half = base / 2;
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            1.0
        };
        // `base - half` rather than `half` so that odd nanosecond counts still reach `base`.
        half + (base - half).mul_f64(unit)
    }
}

/// A fresh draw in `[0, 1)`. `HasherRng` is seeded from std's `RandomState`, which is random
/// per process and per call, and needs no allocation.
pub(crate) fn random_unit() -> f64 {
    HasherRng::new().next_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff {
        initial: Duration::from_millis(500),
        max: Duration::from_secs(8),
    };

    #[test]
    fn doubles_up_to_the_maximum_without_jitter() {
        let delays: Vec<_> = (0..7).map(|n| B.delay(n, 1.0).as_millis()).collect();
        assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
    }

    #[test]
    fn jitter_keeps_at_least_half() {
        assert_eq!(B.delay(0, 0.0), Duration::from_millis(250));
        assert_eq!(B.delay(1, 0.5), Duration::from_millis(750));
        assert_eq!(B.delay(2, f64::NAN), Duration::from_millis(2000));
        assert_eq!(B.delay(2, 7.0), Duration::from_millis(2000));
    }

    #[test]
    fn huge_retry_numbers_saturate() {
        assert_eq!(B.delay(u32::MAX, 1.0), Duration::from_secs(8));
        let big = Backoff {
            initial: Duration::MAX,
            max: Duration::MAX,
        };
        assert_eq!(big.delay(40, 1.0), Duration::MAX);
    }

    #[test]
    fn random_unit_is_in_range() {
        for _ in 0..1000 {
            let u = random_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}

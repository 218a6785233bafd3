//! The HTTP headers that carry a deadline and an attempt number, and how their values are
//! read: digits only, never a panic, never an endless wait.

use std::fmt;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

/// The time left before the caller's deadline, in whole milliseconds, relative (as
/// `grpc-timeout` is: no clocks to agree on).
pub const TIMEOUT_HEADER: HeaderName = HeaderName::from_static("request-timeout-ms");

/// The attempt's number, `1` for the first: a request carrying it comes from a client that
/// retries.
pub const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("request-attempt");

/// The most digits read: 10 digits of milliseconds is over 115 days, far past any cap.
const MAX_DIGITS: usize = 10;

/// Why a deadline header was not used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BadDeadline {
    /// Not a number of milliseconds: empty, signed, fractional, or with other characters.
    Malformed,
    /// More digits than any deadline needs.
    TooLong,
}

impl BadDeadline {
    /// A short name for the answer's header and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            BadDeadline::Malformed => "malformed",
            BadDeadline::TooLong => "too-long",
        }
    }
}

impl fmt::Display for BadDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BadDeadline::Malformed => "the deadline header is not a number of milliseconds",
            BadDeadline::TooLong => "the deadline header has more digits than any deadline",
        })
    }
}

impl std::error::Error for BadDeadline {}

/// A [`TIMEOUT_HEADER`] value: ASCII digits only (no sign, no fraction, no spaces), at most
/// ten of them.
pub fn parse_timeout_ms(value: &HeaderValue) -> Result<Duration, BadDeadline> {
    let digits = value.as_bytes();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BadDeadline::Malformed);
    }
    if digits.len() > MAX_DIGITS {
        return Err(BadDeadline::TooLong);
    }
    let ms = digits
        .iter()
        .fold(0u64, |n, b| n * 10 + u64::from(b - b'0'));
    Ok(Duration::from_millis(ms))
}

/// A `grpc-timeout` value (gRPC over HTTP/2: at most 8 digits and a unit, `H` `M` `S` `m`
/// `u` `n`).
pub fn parse_grpc_timeout(value: &HeaderValue) -> Result<Duration, BadDeadline> {
    crate::classify::grpc::parse_timeout(value).ok_or(BadDeadline::Malformed)
}

/// An [`ATTEMPT_HEADER`] value: a number from 1, or `None`.
pub fn parse_attempt(value: &HeaderValue) -> Option<u32> {
    let text = value.to_str().ok()?;
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|n| *n >= 1)
}

/// The value written for `left`: whole milliseconds, rounded down (the callee must not wait
/// longer than the caller).
pub(crate) fn timeout_value(left: Duration) -> HeaderValue {
    let ms = u64::try_from(left.as_millis())
        .unwrap_or(u64::MAX)
        .min(9_999_999_999);
    // The last value this thread wrote, kept: the requests of one millisecond (or one attempt
    // timeout) share it, a clone instead of a string and an allocation each.
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return HeaderValue::from(ms);
        };
        match &*last {
            Some((kept, value)) if *kept == ms => value.clone(),
            _ => {
                let value = HeaderValue::from(ms);
                *last = Some((ms, value.clone()));
                value
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_digits_only_and_bounded() {
        let parse = |v: &str| parse_timeout_ms(&HeaderValue::from_str(v).expect("value"));
        assert_eq!(parse("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(
            parse("9999999999"),
            Ok(Duration::from_millis(9_999_999_999))
        );
        for bad in ["", "-5", "+5", "1.5", " 5", "5 ", "5ms", "0x10", "1e3"] {
            assert_eq!(parse(bad), Err(BadDeadline::Malformed), "{bad:?}");
        }
        assert_eq!(parse("99999999999"), Err(BadDeadline::TooLong));
        assert_eq!(
            parse("184467440737095516160000"),
            Err(BadDeadline::TooLong),
            "an overflow is refused, not wrapped"
        );
    }

    #[test]
    fn written_timeouts_round_down_and_read_back() {
        let v = timeout_value(Duration::from_micros(1_999_999));
        assert_eq!(v, "1999");
        assert_eq!(parse_timeout_ms(&v), Ok(Duration::from_millis(1999)));
        assert_eq!(timeout_value(Duration::MAX), "9999999999");
    }

    #[test]
    fn grpc_timeouts_follow_the_spec() {
        let parse = |v: &str| parse_grpc_timeout(&HeaderValue::from_str(v).expect("value"));
        assert_eq!(parse("250m"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1S"), Ok(Duration::from_secs(1)));
        for bad in ["", "250", "123456789S", "-1S", "1x", "m"] {
            assert_eq!(parse(bad), Err(BadDeadline::Malformed), "{bad:?}");
        }
    }

    #[test]
    fn attempts_are_numbers_from_one() {
        let parse = |v: &str| parse_attempt(&HeaderValue::from_str(v).expect("value"));
        assert_eq!(parse("1"), Some(1));
        assert_eq!(parse("3"), Some(3));
        for bad in ["0", "", "-1", "x", "999999", "1.0"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}

//! Deadlines written in seconds, as Stainless-generated SDKs (OpenAI's, Anthropic's) send
//! them: `x-stainless-read-timeout` with a fraction, `x-stainless-timeout` in whole seconds
//! cut down by the sender.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tower_retry_safety::deadline::BadDeadline;

/// Seconds, with a fraction if any (`600`, `1.5`, `0.25`): the Python SDKs' read timeout.
pub(crate) const STAINLESS_READ_TIMEOUT: HeaderName =
    HeaderName::from_static("x-stainless-read-timeout");

/// Whole seconds, truncated by the sender: OpenAI's Node SDK sends a 500 ms timeout as `0`.
pub(crate) const STAINLESS_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-timeout");

/// Digits of whole seconds: 10 of them is over 300 years.
const MAX_WHOLE_DIGITS: usize = 10;
/// The longest value read: a float printed in full (`0.3333333333333333`) fits.
const MAX_LEN: usize = 32;

/// An [`STAINLESS_READ_TIMEOUT`] value: digits, then `.` and digits if any; a fraction past
/// nanoseconds is cut (a shorter deadline, never a longer one). No sign, exponent or spaces.
pub(crate) fn parse_fraction(value: &HeaderValue) -> Result<Duration, BadDeadline> {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_LEN {
        return Err(BadDeadline::TooLong);
    }
    let (whole, fraction) = match bytes.iter().position(|b| *b == b'.') {
        Some(dot) => (&bytes[..dot], Some(&bytes[dot + 1..])),
        None => (bytes, None),
    };
    let secs = whole_seconds(whole)?;
    let nanos = match fraction {
        None => 0,
        Some(digits) if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) => {
            return Err(BadDeadline::Malformed)
        }
        Some(digits) => (0..9).fold(0u32, |n, i| {
            n * 10 + digits.get(i).map_or(0, |d| u32::from(d - b'0'))
        }),
    };
    Ok(Duration::new(secs, nanos))
}

/// An [`STAINLESS_TIMEOUT`] value, `n` whole seconds: the sender cut its timeout down to
/// them, so it meant less than `n + 1` — that is the deadline read (`0` is "under a second",
/// never "already gone").
pub(crate) fn parse_truncated(value: &HeaderValue) -> Result<Duration, BadDeadline> {
    let secs = whole_seconds(value.as_bytes())?;
    Ok(Duration::from_secs(secs + 1))
}

fn whole_seconds(digits: &[u8]) -> Result<u64, BadDeadline> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BadDeadline::Malformed);
    }
    if digits.len() > MAX_WHOLE_DIGITS {
        return Err(BadDeadline::TooLong);
    }
    Ok(digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: &str) -> HeaderValue {
        HeaderValue::from_str(v).expect("value")
    }

    #[test]
    fn read_timeouts_are_seconds_with_a_fraction() {
        let parse = |v: &str| parse_fraction(&value(v));
        assert_eq!(parse("600"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0.25"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("600.0"), Ok(Duration::from_secs(600)));
        assert_eq!(
            parse("0.3333333333333333"),
            Ok(Duration::from_nanos(333_333_333))
        );
        for bad in [
            "", ".", "1.", ".5", "-1", "+1", "1e-05", "1.2.3", " 1", "inf", "NaN",
        ] {
            assert_eq!(parse(bad), Err(BadDeadline::Malformed), "{bad:?}");
        }
        assert_eq!(parse("12345678901"), Err(BadDeadline::TooLong));
        assert_eq!(parse(&"1".repeat(40)), Err(BadDeadline::TooLong));
    }

    #[test]
    fn truncated_seconds_mean_under_one_more() {
        let parse = |v: &str| parse_truncated(&value(v));
        assert_eq!(parse("0"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("600"), Ok(Duration::from_secs(601)));
        for bad in ["", "0.5", "-1", "1s", " 1"] {
            assert_eq!(parse(bad), Err(BadDeadline::Malformed), "{bad:?}");
        }
        assert_eq!(parse("99999999999"), Err(BadDeadline::TooLong));
        assert_eq!(parse("9999999999"), Ok(Duration::from_secs(10_000_000_000)));
    }
}

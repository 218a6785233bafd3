//! Counts of attempts already made (`grpc-previous-rpc-attempts`, Stainless SDKs'
//! `x-stainless-retry-count`): digits only, from 0.

use http::{HeaderName, HeaderValue};

/// The retries a Stainless-generated SDK has taken: `0` on its first attempt.
pub(crate) const STAINLESS_RETRY_COUNT: HeaderName =
    HeaderName::from_static("x-stainless-retry-count");

/// At most five digits: more retries than any client makes.
const MAX_DIGITS: usize = 5;

/// A count from 0, or `None` when the value is not one.
pub(crate) fn parse_count(value: &HeaderValue) -> Option<u32> {
    count_of(value.as_bytes())
}

/// ASCII digits, at most five, as a number from 0.
pub(crate) fn count_of(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0')),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_digits_from_zero() {
        let parse = |v: &str| parse_count(&HeaderValue::from_str(v).expect("value"));
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("2"), Some(2));
        assert_eq!(parse("99999"), Some(99_999));
        for bad in ["", "-1", "1.0", "x", "999999", " 1"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}

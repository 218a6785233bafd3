//! AWS SDKs' attempt header, `amz-sdk-request: attempt=N; max=M` (the SDKs' retry
//! specification; a `ttl=…` may come with them). AWS SDKs send no deadline.

use http::{HeaderName, HeaderValue};

/// The header every AWS SDK sends on each attempt.
pub(crate) const AMZ_SDK_REQUEST: HeaderName = HeaderName::from_static("amz-sdk-request");

/// The longest value read: the three pairs the SDKs send fit several times over.
const MAX_LEN: usize = 128;

/// Whether the caller retries: `Some(true)` for a later attempt or a `max` over 1 (an SDK
/// configured with `max=1` makes one attempt), `None` when the value has no well-formed
/// `attempt=N` (from 1).
pub(crate) fn caller_retries(value: &HeaderValue) -> Option<bool> {
    let bytes = value.as_bytes();
    if bytes.len() > MAX_LEN {
        return None;
    }
    let (mut attempt, mut max) = (None, None);
    for pair in bytes.split(|b| *b == b';') {
        let pair = pair.trim_ascii();
        if pair.is_empty() {
            continue;
        }
        let eq = pair.iter().position(|b| *b == b'=')?;
        let (key, number) = (&pair[..eq], &pair[eq + 1..]);
        match key {
            b"attempt" => attempt = Some(super::count::count_of(number)?),
            b"max" => max = Some(super::count::count_of(number)?),
            // `ttl` and whatever a later SDK adds.
            _ => {}
        }
    }
    let attempt = attempt.filter(|n| *n >= 1)?;
    Some(attempt > 1 || max.is_some_and(|m| m > 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_and_max_say_whether_the_sdk_retries() {
        let read = |v: &str| caller_retries(&HeaderValue::from_str(v).expect("value"));
        assert_eq!(read("attempt=1; max=3"), Some(true));
        assert_eq!(read("attempt=2; max=3"), Some(true));
        assert_eq!(read("attempt=1; max=1"), Some(false));
        assert_eq!(read("attempt=1"), Some(false));
        assert_eq!(read("ttl=20240101T000000Z; attempt=2; max=3"), Some(true));
        assert_eq!(read("attempt=1;max=3;"), Some(true));
        for bad in [
            "",
            "max=3",
            "attempt=0; max=3",
            "attempt=x; max=3",
            "attempt=1; max=-1",
            "attempt=1; max",
            "attempt=999999",
        ] {
            assert_eq!(read(bad), None, "{bad:?}");
        }
        assert_eq!(read(&format!("attempt=1; {}", "a=b; ".repeat(40))), None);
    }
}

//! Parsing of the server's "retry after" hints. Every input a server controls is handled
//! without panicking; a value that cannot be read is ignored and the backoff applies.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue};

/// What a response's hints say about the delay before the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// No usable hint: the policy's backoff applies.
    None,
    /// Wait this long. May exceed any cap; the caller compares.
    After(Duration),
}

/// `retry-after-ms` (milliseconds, possibly fractional) first, being the more precise, then
/// `Retry-After` (delay-seconds or an HTTP-date).
/// `now` is called only for an HTTP-date, so the common cases never read the clock.
pub(crate) fn from_headers(headers: &HeaderMap, now: impl FnOnce() -> SystemTime) -> Hint {
    const RETRY_AFTER_MS: http::HeaderName = http::HeaderName::from_static("retry-after-ms");
    if let Some(value) = headers.get(RETRY_AFTER_MS) {
        if let Some(delay) = parse_millis(value) {
            return Hint::After(delay);
        }
    }
    match headers.get(http::header::RETRY_AFTER) {
        Some(value) => parse_retry_after(value, now).map_or(Hint::None, Hint::After),
        None => Hint::None,
    }
}

/// `retry-after-ms: 1500` or `1500.5`. Negative, NaN or garbage: ignored. Huge: saturates.
pub(crate) fn parse_millis(value: &HeaderValue) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    let ms: f64 = text.parse().ok()?;
    if !ms.is_finite() || ms < 0.0 {
        return None;
    }
    // Saturate rather than overflow: a huge value is just "longer than any cap".
    Some(Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX))
}

/// RFC 9110 §10.2.3: `Retry-After: 120` or `Retry-After: Fri, 31 Dec 1999 23:59:59 GMT`.
///
/// Delay-seconds that overflow saturate (they exceed any cap). An HTTP-date in the past is
/// ignored, so the backoff applies rather than a burst of immediate retries.
pub fn parse_retry_after(
    value: &HeaderValue,
    now: impl FnOnce() -> SystemTime,
) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(text).ok()?;
    date.duration_since(now()).ok().filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn delay_seconds() {
        let now = SystemTime::now();
        assert_eq!(parse_retry_after(&hv("0"), || now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&hv("120"), || now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after(&hv(" 7 "), || now),
            Some(Duration::from_secs(7))
        );
    }

    #[test]
    fn overflowing_seconds_saturate() {
        let v = hv("99999999999999999999999999");
        assert_eq!(
            parse_retry_after(&v, SystemTime::now),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn garbage_negative_and_fractional_seconds_are_ignored() {
        let now = SystemTime::now();
        for bad in ["", "soon", "-5", "1.5", "1e3", "0x10", "+3"] {
            assert_eq!(parse_retry_after(&hv(bad), || now), None, "{bad:?}");
        }
    }

    #[test]
    fn non_utf8_is_ignored() {
        let v = HeaderValue::from_bytes(b"\xff\xfe12").unwrap();
        assert_eq!(parse_retry_after(&v, SystemTime::now), None);
        assert_eq!(parse_millis(&v), None);
    }

    #[test]
    fn http_date_in_the_future_and_past() {
        let now = httpdate::parse_http_date("Wed, 02 Dec 2026 17:00:00 GMT").unwrap();
        assert_eq!(
            parse_retry_after(&hv("Wed, 02 Dec 2026 17:00:30 GMT"), || now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after(&hv("Wed, 02 Dec 2026 16:59:00 GMT"), || now),
            None
        );
        assert_eq!(
            parse_retry_after(&hv("Wed, 02 Dec 2026 17:00:00 GMT"), || now),
            None
        );
        assert_eq!(
            parse_retry_after(&hv("Wed, 32 Dec 2026 17:00:00 GMT"), || now),
            None
        );
    }

    #[test]
    fn millis() {
        assert_eq!(parse_millis(&hv("1500")), Some(Duration::from_millis(1500)));
        assert_eq!(parse_millis(&hv("2.5")), Some(Duration::from_micros(2500)));
        assert_eq!(parse_millis(&hv("1e400")), None); // parses to inf
        assert_eq!(parse_millis(&hv("-1")), None);
        assert_eq!(parse_millis(&hv("NaN")), None);
        assert_eq!(parse_millis(&hv("1e300")), Some(Duration::MAX));
    }

    #[test]
    fn millis_win_over_seconds_and_fall_back_when_malformed() {
        let now = SystemTime::now();
        let mut h = HeaderMap::new();
        h.insert("retry-after", hv("10"));
        assert_eq!(
            from_headers(&h, || now),
            Hint::After(Duration::from_secs(10))
        );
        h.insert("retry-after-ms", hv("250"));
        assert_eq!(
            from_headers(&h, || now),
            Hint::After(Duration::from_millis(250))
        );
        h.insert("retry-after-ms", hv("nope"));
        assert_eq!(
            from_headers(&h, || now),
            Hint::After(Duration::from_secs(10))
        );
        assert_eq!(from_headers(&HeaderMap::new(), || now), Hint::None);
    }
}

//! The rules of a `Range` resume: which validator proves a second response the same
//! representation, and whether a `206` continues the body where it was cut.

use std::time::Duration;

use http::header::{CONTENT_ENCODING, CONTENT_RANGE, DATE, ETAG, LAST_MODIFIED};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::cut::NoResume;

/// What the first response said about its representation, to hold a `206` against.
#[derive(Debug)]
pub(crate) struct Expect {
    /// The value for `If-Range`: a strong ETag, or a strong `Last-Modified` date.
    pub(crate) validator: HeaderValue,
    /// Whether `validator` is an ETag (a `206` that sends one must send the same).
    etag: bool,
    encoding: Option<HeaderValue>,
    /// The body's length, if the first response gave it.
    total: Option<u64>,
}

impl Expect {
    /// The validator of a `200`'s headers, or why there is none strong enough (RFC 9110
    /// §13.1.5: `If-Range` needs a strong validator; §8.8.2.2: a `Last-Modified` is strong when
    /// the response's `Date` is at least a second later).
    pub(crate) fn of(headers: &HeaderMap, total: Option<u64>) -> Result<Expect, NoResume> {
        let encoding = headers.get(CONTENT_ENCODING).cloned();
        if let Some(etag) = headers.get(ETAG) {
            if !is_strong_etag(etag.as_bytes()) {
                return Err(NoResume::NoValidator);
            }
            return Ok(Expect {
                validator: etag.clone(),
                etag: true,
                encoding,
                total,
            });
        }
        let date = |name| {
            let value = headers.get(name)?.to_str().ok()?;
            httpdate::parse_http_date(value).ok()
        };
        match (date(LAST_MODIFIED), date(DATE)) {
            (Some(modified), Some(date))
                if date
                    .duration_since(modified)
                    .is_ok_and(|d| d >= Duration::from_secs(1)) =>
            {
                Ok(Expect {
                    validator: headers
                        .get(LAST_MODIFIED)
                        .cloned()
                        .ok_or(NoResume::NoValidator)?,
                    etag: false,
                    encoding,
                    total,
                })
            }
            _ => Err(NoResume::NoValidator),
        }
    }

    /// The body's whole length, once the first response or a `206` said it.
    pub(crate) fn total(&self) -> Option<u64> {
        self.total
    }

    /// Checks a response to `Range: bytes={received}-`: how many of its bytes were already
    /// delivered (a superset starts earlier), or why it does not continue the body. The `206`
    /// must name the same representation: the same strong `ETag`, or the same `Last-Modified`
    /// date (RFC 9110 §15.3.7: a `206` sends the validators a `200` would; one that sends none
    /// cannot be told from another version). A `206` whose length is first said here fixes the
    /// body's.
    pub(crate) fn check(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        received: u64,
    ) -> Result<u64, NoResume> {
        if status != StatusCode::PARTIAL_CONTENT {
            return Err(NoResume::NotTheSame);
        }
        let validator = headers.get(if self.etag { ETAG } else { LAST_MODIFIED });
        if validator != Some(&self.validator) {
            return Err(NoResume::NotTheSame);
        }
        // Ranges count encoded bytes: the same coding, or none on both.
        if headers.get(CONTENT_ENCODING) != self.encoding.as_ref() {
            return Err(NoResume::NotTheSame);
        }
        let (first, last, complete) = headers
            .get(CONTENT_RANGE)
            .and_then(|v| parse_content_range(v.as_bytes()))
            .ok_or(NoResume::NotTheSame)?;
        let total = complete.ok_or(NoResume::NotTheSame)?;
        let same_length = self.total.is_none_or(|t| t == total);
        let to_the_end = last.checked_add(1) == Some(total);
        if !same_length || !to_the_end || first > received {
            return Err(NoResume::NotTheSame);
        }
        self.total = Some(total);
        Ok(received - first)
    }
}

/// An entity tag that is not weak: `"…"` without `W/`.
fn is_strong_etag(value: &[u8]) -> bool {
    value.len() >= 2 && value.first() == Some(&b'"') && value.last() == Some(&b'"')
}

/// `bytes first-last/complete` (`complete` is `None` for `*`). `None` for anything else,
/// a range whose last byte is before its first included.
pub(crate) fn parse_content_range(value: &[u8]) -> Option<(u64, u64, Option<u64>)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let rest = value.strip_prefix("bytes ")?;
    let (range, complete) = rest.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let number = |s: &str| -> Option<u64> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (first, last) = (number(first)?, number(last)?);
    if last < first {
        return None;
    }
    let complete = match complete.trim() {
        "*" => None,
        n => Some(number(n)?),
    };
    if complete.is_some_and(|c| last >= c) {
        return None;
    }
    Some((first, last, complete))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_parses_and_refuses_what_it_must() {
        assert_eq!(parse_content_range(b"bytes 5-9/10"), Some((5, 9, Some(10))));
        assert_eq!(parse_content_range(b"bytes 0-0/*"), Some((0, 0, None)));
        for bad in [
            &b"bytes 9-5/10"[..],
            b"bytes 5-10/10",
            b"bytes -5/10",
            b"bytes 5-/10",
            b"items 5-9/10",
            b"bytes 5-9",
            b"bytes +5-9/10",
            b"bytes 5-9/x",
            b"bytes 99999999999999999999999-9/10",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(parse_content_range(bad), None, "{:?}", bad);
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    #[test]
    fn only_a_strong_validator_is_used() {
        assert_eq!(
            Expect::of(&headers(&[("etag", "W/\"v1\"")]), None).err(),
            Some(NoResume::NoValidator)
        );
        assert_eq!(
            Expect::of(&headers(&[("etag", "v1")]), None).err(),
            Some(NoResume::NoValidator)
        );
        assert!(Expect::of(&headers(&[("etag", "\"v1\"")]), None).is_ok());
        // A date as recent as the response is weak; a second older is strong.
        let weak = headers(&[
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert_eq!(Expect::of(&weak, None).err(), Some(NoResume::NoValidator));
        let strong = headers(&[
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "Sun, 06 Nov 1994 08:49:38 GMT"),
        ]);
        assert!(Expect::of(&strong, None).is_ok());
        let unreadable = headers(&[("last-modified", "yesterday"), ("date", "today")]);
        assert_eq!(
            Expect::of(&unreadable, None).err(),
            Some(NoResume::NoValidator)
        );
    }

    #[test]
    fn a_206_to_a_date_must_carry_the_same_date() {
        let first = headers(&[
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "Sun, 06 Nov 1994 08:49:38 GMT"),
        ]);
        let mut expect = Expect::of(&first, Some(10)).unwrap();
        let same = headers(&[
            ("content-range", "bytes 4-9/10"),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ]);
        assert_eq!(expect.check(StatusCode::PARTIAL_CONTENT, &same, 6), Ok(2));
        for bad in [
            headers(&[
                ("content-range", "bytes 4-9/10"),
                ("last-modified", "Sun, 06 Nov 1994 08:49:39 GMT"),
            ]),
            headers(&[("content-range", "bytes 4-9/10")]),
        ] {
            assert_eq!(
                expect.check(StatusCode::PARTIAL_CONTENT, &bad, 6),
                Err(NoResume::NotTheSame),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_206_must_continue_the_same_body() {
        let mut expect = Expect::of(&headers(&[("etag", "\"v1\"")]), Some(10)).unwrap();
        let ok = headers(&[("content-range", "bytes 4-9/10"), ("etag", "\"v1\"")]);
        assert_eq!(expect.check(StatusCode::PARTIAL_CONTENT, &ok, 6), Ok(2));
        assert_eq!(expect.check(StatusCode::PARTIAL_CONTENT, &ok, 4), Ok(0));
        // Starts after what was delivered: a gap.
        assert_eq!(
            expect.check(StatusCode::PARTIAL_CONTENT, &ok, 3),
            Err(NoResume::NotTheSame)
        );
        assert_eq!(
            expect.check(StatusCode::OK, &ok, 6),
            Err(NoResume::NotTheSame)
        );
        for bad in [
            headers(&[("content-range", "bytes 4-9/10"), ("etag", "\"v2\"")]),
            // No validator: another version cannot be ruled out.
            headers(&[("content-range", "bytes 4-9/10")]),
            headers(&[("content-range", "bytes 4-8/10"), ("etag", "\"v1\"")]),
            headers(&[("content-range", "bytes 4-10/11"), ("etag", "\"v1\"")]),
            headers(&[("content-range", "bytes 4-9/*"), ("etag", "\"v1\"")]),
            headers(&[
                ("content-range", "bytes 4-9/10"),
                ("etag", "\"v1\""),
                ("content-encoding", "gzip"),
            ]),
            headers(&[("etag", "\"v1\"")]),
            headers(&[]),
        ] {
            assert_eq!(
                expect.check(StatusCode::PARTIAL_CONTENT, &bad, 6),
                Err(NoResume::NotTheSame),
                "{bad:?}"
            );
        }
    }
}

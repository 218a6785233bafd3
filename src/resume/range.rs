//! The rules of a resume: which validator proves a second response the same representation,
//! and whether a `206` continues the body where it was cut; or, for a keyed write, whether the
//! answer to the same key is the same response, stored by the server.

use std::time::Duration;

use http::header::{
    CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_RANGE, DATE, ETAG, IF_RANGE, LAST_MODIFIED, RANGE,
};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::cut::NoResume;

/// What the first response said about its representation, to hold a second one against.
#[derive(Debug)]
pub(crate) struct Expect {
    /// The value for `If-Range`: a strong ETag, or a strong `Last-Modified` date. `None` for a
    /// keyed write, which is sent again whole with its key (no `Range` on a write).
    validator: Option<HeaderValue>,
    /// Whether `validator` is an ETag (a `206` that sends one must send the same).
    etag: bool,
    encoding: Option<HeaderValue>,
    /// The body's length, if the first response gave it.
    total: Option<u64>,
    /// For a keyed write: the first response's status and `ETag` (if any), which the stored
    /// response must repeat.
    stored_response_of: Option<(StatusCode, Option<HeaderValue>)>,
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
                validator: Some(etag.clone()),
                etag: true,
                encoding,
                total,
                stored_response_of: None,
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
                    validator: Some(
                        headers
                            .get(LAST_MODIFIED)
                            .cloned()
                            .ok_or(NoResume::NoValidator)?,
                    ),
                    etag: false,
                    encoding,
                    total,
                    stored_response_of: None,
                })
            }
            _ => Err(NoResume::NoValidator),
        }
    }

    /// For a keyed write's response of `status`: sent again with the same key, the answer
    /// must be the server's stored response to this response, which only a known length lets the
    /// stack check to the byte.
    pub(crate) fn stored_response_of(
        status: StatusCode,
        headers: &HeaderMap,
        total: Option<u64>,
    ) -> Result<Expect, NoResume> {
        let total = total.ok_or(NoResume::NoValidator)?;
        Ok(Expect {
            validator: None,
            etag: false,
            encoding: headers.get(CONTENT_ENCODING).cloned(),
            total: Some(total),
            stored_response_of: Some((status, headers.get(ETAG).cloned())),
        })
    }

    /// The body's whole length, once the first response or a `206` said it.
    pub(crate) fn total(&self) -> Option<u64> {
        self.total
    }

    /// The headers that ask for the rest from `received` on: `Range` and `If-Range`; none for
    /// a keyed write (its stored response comes whole).
    pub(crate) fn ask_from(&self, received: u64, headers: &mut HeaderMap) {
        if let Some(validator) = &self.validator {
            headers.insert(RANGE, range_from(received));
            headers.insert(IF_RANGE, validator.clone());
        }
    }

    /// Checks the answer to a keyed write sent again: a stored response (`stored`, as the retry
    /// policy reads the server's mark) of the same status, length, coding and `ETag`, whose
    /// first `received` bytes were delivered already.
    fn check_stored_response(
        &self,
        first: (StatusCode, Option<&HeaderValue>),
        status: StatusCode,
        headers: &HeaderMap,
        received: u64,
        stored: bool,
    ) -> Result<u64, NoResume> {
        let length = headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let same = stored
            && status == first.0
            && length.is_some()
            && length == self.total
            && headers.get(CONTENT_ENCODING) == self.encoding.as_ref()
            && headers.get(ETAG) == first.1;
        if same {
            Ok(received)
        } else {
            Err(NoResume::NotTheSame)
        }
    }

    /// Checks a response to `Range: bytes={received}-`: how many of its bytes were already
    /// delivered (a superset starts earlier), or why it does not continue the body. The `206`
    /// must name the same representation: the same strong `ETag`, or the same `Last-Modified`
    /// date (RFC 9110 §15.3.7: a `206` sends the validators a `200` would; one that sends none
    /// cannot be told from another version). A `206` whose length is first said here fixes the
    /// body's.
    ///
    /// For a keyed write, see `check_stored_response`.
    pub(crate) fn check(
        &mut self,
        status: StatusCode,
        headers: &HeaderMap,
        received: u64,
        stored: bool,
    ) -> Result<u64, NoResume> {
        if let Some((first, etag)) = &self.stored_response_of {
            let first = (*first, etag.as_ref());
            return self.check_stored_response(first, status, headers, received, stored);
        }
        if status != StatusCode::PARTIAL_CONTENT {
            return Err(NoResume::NotTheSame);
        }
        let validator = headers.get(if self.etag { ETAG } else { LAST_MODIFIED });
        if validator.is_none() || validator != self.validator.as_ref() {
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

fn range_from(received: u64) -> HeaderValue {
    HeaderValue::try_from(format!("bytes={received}-")).expect("digits are a valid header value")
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
        assert_eq!(
            expect.check(StatusCode::PARTIAL_CONTENT, &same, 6, false),
            Ok(2)
        );
        for bad in [
            headers(&[
                ("content-range", "bytes 4-9/10"),
                ("last-modified", "Sun, 06 Nov 1994 08:49:39 GMT"),
            ]),
            headers(&[("content-range", "bytes 4-9/10")]),
        ] {
            assert_eq!(
                expect.check(StatusCode::PARTIAL_CONTENT, &bad, 6, false),
                Err(NoResume::NotTheSame),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_206_must_continue_the_same_body() {
        let mut expect = Expect::of(&headers(&[("etag", "\"v1\"")]), Some(10)).unwrap();
        let ok = headers(&[("content-range", "bytes 4-9/10"), ("etag", "\"v1\"")]);
        assert_eq!(
            expect.check(StatusCode::PARTIAL_CONTENT, &ok, 6, false),
            Ok(2)
        );
        assert_eq!(
            expect.check(StatusCode::PARTIAL_CONTENT, &ok, 4, false),
            Ok(0)
        );
        // Starts after what was delivered: a gap.
        assert_eq!(
            expect.check(StatusCode::PARTIAL_CONTENT, &ok, 3, false),
            Err(NoResume::NotTheSame)
        );
        assert_eq!(
            expect.check(StatusCode::OK, &ok, 6, false),
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
                expect.check(StatusCode::PARTIAL_CONTENT, &bad, 6, false),
                Err(NoResume::NotTheSame),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_keyed_writes_answer_must_be_the_same_response_stored() {
        let first = headers(&[("etag", "\"v1\""), ("content-length", "10")]);
        let mut expect = Expect::stored_response_of(StatusCode::CREATED, &first, Some(10)).unwrap();
        let mut asked = HeaderMap::new();
        expect.ask_from(6, &mut asked);
        assert!(asked.is_empty(), "no Range on a write: {asked:?}");
        let stored = headers(&[("etag", "\"v1\""), ("content-length", "10")]);
        assert_eq!(expect.check(StatusCode::CREATED, &stored, 6, true), Ok(6));
        // Not marked as a stored response: the server may have run the write again.
        assert_eq!(
            expect.check(StatusCode::CREATED, &stored, 6, false),
            Err(NoResume::NotTheSame)
        );
        assert_eq!(
            expect.check(StatusCode::OK, &stored, 6, true),
            Err(NoResume::NotTheSame)
        );
        for bad in [
            headers(&[("etag", "\"v1\""), ("content-length", "0")]),
            headers(&[("etag", "\"v1\"")]),
            headers(&[("etag", "\"v2\""), ("content-length", "10")]),
            headers(&[("content-length", "10")]),
            headers(&[
                ("etag", "\"v1\""),
                ("content-length", "10"),
                ("content-encoding", "gzip"),
            ]),
            headers(&[("etag", "\"v1\""), ("content-length", "ten")]),
        ] {
            assert_eq!(
                expect.check(StatusCode::CREATED, &bad, 6, true),
                Err(NoResume::NotTheSame),
                "{bad:?}"
            );
        }
        // Without a known length the stored response could not be checked to the byte.
        assert_eq!(
            Expect::stored_response_of(StatusCode::OK, &first, None).err(),
            Some(NoResume::NoValidator)
        );
    }
}

//! The compact, versioned encoding of a key's entry in a shared store (used by `RedisStore`).
//!
//! ```text
//! version      u8      1
//! kind         u8      b'F' in flight, b'C' completed, b'T' completed with trailers
//! fencing token u64 BE the token of the claim that holds (or completed) the key
//! fingerprint  [u8;32] SHA-256 of the request
//! -- completed entries only --
//! status       u16 BE
//! headers      u16 BE count, then per header: u16 BE name length, name,
//!                                             u32 BE value length, value
//! body         u32 BE length, bytes
//! trailers     (b'T' only) as headers
//! ```
//!
//! The first ten bytes (version, kind, token) are what the compare-and-set scripts compare: a
//! entry of another version never matches, so a server never acts on an entry it cannot read.
//! An entry whose version this server does not know is an error (the layer answers 503 and
//! logs), never misread.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::store::{Entry, FencingToken, Fingerprint, StoredResponse};

/// The version this server writes and reads.
pub(crate) const VERSION: u8 = 1;
const IN_FLIGHT: u8 = b'F';
const COMPLETED: u8 = b'C';
/// A kind of its own, so a server that does not read trailers refuses the entry rather
/// than send it without them, and an entry cut after its body is never read as whole.
const COMPLETED_WITH_TRAILERS: u8 = b'T';
/// Version, kind and fencing token: what a compare-and-set compares.
pub(crate) const HOLDER_LEN: usize = 10;

/// The ten bytes that an in-flight entry held under `token` starts with.
pub(crate) fn in_flight_holder(token: FencingToken) -> [u8; HOLDER_LEN] {
    let mut out = [0; HOLDER_LEN];
    out[0] = VERSION;
    out[1] = IN_FLIGHT;
    out[2..].copy_from_slice(&token.token().to_be_bytes());
    out
}

pub(crate) fn encode_in_flight(token: FencingToken, fingerprint: Fingerprint) -> Vec<u8> {
    let mut out = Vec::with_capacity(HOLDER_LEN + 32);
    out.extend_from_slice(&in_flight_holder(token));
    out.extend_from_slice(fingerprint.as_bytes());
    out
}

/// A completed entry: the claim that completed it, the request's fingerprint, the response.
pub(crate) fn encode_completed(
    token: FencingToken,
    fingerprint: Fingerprint,
    response: &StoredResponse,
) -> Result<Vec<u8>, &'static str> {
    let mut out = Vec::with_capacity(HOLDER_LEN + 32 + response.size());
    let kind = if response.trailers().is_some() {
        COMPLETED_WITH_TRAILERS
    } else {
        COMPLETED
    };
    out.extend_from_slice(&[VERSION, kind]);
    out.extend_from_slice(&token.token().to_be_bytes());
    out.extend_from_slice(fingerprint.as_bytes());
    encode_response(response, &mut out)?;
    Ok(out)
}

/// A completed entry's response part: status, headers, body, appended to `out`.
fn encode_response(response: &StoredResponse, out: &mut Vec<u8>) -> Result<(), &'static str> {
    out.extend_from_slice(&response.status().as_u16().to_be_bytes());
    encode_fields(response.headers(), out)?;
    let body_len = u32::try_from(response.body().len()).map_err(|_| "the body is too long")?;
    out.extend_from_slice(&body_len.to_be_bytes());
    out.extend_from_slice(response.body());
    // Trailers follow the body only when there are some (kind `T`), so an entry without
    // them is the same bytes an older server writes and reads.
    if let Some(trailers) = response.trailers() {
        encode_fields(trailers, out)?;
    }
    Ok(())
}

fn encode_fields(fields: &HeaderMap, out: &mut Vec<u8>) -> Result<(), &'static str> {
    let count = u16::try_from(fields.len()).map_err(|_| "too many headers")?;
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in fields {
        let name = name.as_str().as_bytes();
        let name_len = u16::try_from(name.len()).map_err(|_| "a header name is too long")?;
        let value_len = u32::try_from(value.len()).map_err(|_| "a header value is too long")?;
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(name);
        out.extend_from_slice(&value_len.to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    Ok(())
}

/// Why an entry could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Written by a server of another version.
    UnknownVersion(u8),
    /// Cut short or otherwise malformed.
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::UnknownVersion(v) => write!(
                f,
                "an idempotency entry of version {v}, which this server (version {VERSION}) does not read"
            ),
            DecodeError::Malformed(why) => write!(f, "a malformed idempotency entry: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Malformed("cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// A count, then each field's name and value (headers, or trailers).
    fn fields(&mut self) -> Result<HeaderMap, DecodeError> {
        let count = u16::from_be_bytes(self.array()?);
        // Not `with_capacity(count)`: it panics past the map's size limit.
        let mut fields = HeaderMap::new();
        for _ in 0..count {
            let len = u16::from_be_bytes(self.array()?);
            let name = HeaderName::from_bytes(self.take(usize::from(len))?)
                .map_err(|_| DecodeError::Malformed("header name"))?;
            let len = u32::from_be_bytes(self.array()?) as usize;
            let value = HeaderValue::from_bytes(self.take(len)?)
                .map_err(|_| DecodeError::Malformed("header value"))?;
            fields
                .try_append(name, value)
                .map_err(|_| DecodeError::Malformed("too many headers"))?;
        }
        Ok(fields)
    }
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Entry, DecodeError> {
    let mut r = Reader(bytes);
    let [version] = r.array()?;
    if version != VERSION {
        return Err(DecodeError::UnknownVersion(version));
    }
    let [kind] = r.array()?;
    let _token = r.array::<8>()?;
    let fingerprint = Fingerprint::from_bytes(r.array()?);
    match kind {
        IN_FLIGHT => Ok(Entry::InFlight { fingerprint }),
        COMPLETED | COMPLETED_WITH_TRAILERS => {
            let status = StatusCode::from_u16(u16::from_be_bytes(r.array()?))
                .map_err(|_| DecodeError::Malformed("status"))?;
            let headers = r.fields()?;
            let len = u32::from_be_bytes(r.array()?) as usize;
            let body = Bytes::copy_from_slice(r.take(len)?);
            let mut response = StoredResponse::new(status, headers, body);
            if kind == COMPLETED_WITH_TRAILERS {
                response = response.with_trailers(r.fields()?);
            }
            if !r.0.is_empty() {
                return Err(DecodeError::Malformed("trailing bytes"));
            }
            Ok(Entry::Completed {
                fingerprint,
                response,
            })
        }
        _ => Err(DecodeError::Malformed("kind")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_byte_for_byte() {
        let fp = Fingerprint::of(&http::Method::POST, "/v1/send?to=a", b"hi");
        let token = FencingToken::from_token(0x0102_0304_0506_0708);
        let bytes = encode_in_flight(token, fp);
        assert_eq!(bytes[..HOLDER_LEN], in_flight_holder(token));
        assert_eq!(decode(&bytes), Ok(Entry::InFlight { fingerprint: fp }));

        let mut headers = HeaderMap::new();
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert(
            "x-bin",
            HeaderValue::from_bytes(b"\x80\xff opaque").unwrap(),
        );
        let body = Bytes::from((0..=255u8).collect::<Vec<_>>());
        let response = StoredResponse::new(StatusCode::CREATED, headers, body);
        let bytes = encode_completed(token, fp, &response).unwrap();
        assert_eq!(
            decode(&bytes),
            Ok(Entry::Completed {
                fingerprint: fp,
                response
            })
        );
    }

    #[test]
    fn trailers_round_trip_and_a_record_cut_before_them_is_an_error() {
        let fp = Fingerprint::from_bytes([3; 32]);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.insert("grpc-message", HeaderValue::from_static("ok"));
        let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from("m"))
            .with_trailers(trailers);
        let bytes = encode_completed(FencingToken::from_token(9), fp, &response).unwrap();
        assert_eq!(bytes[1], COMPLETED_WITH_TRAILERS);
        assert_eq!(
            decode(&bytes),
            Ok(Entry::Completed {
                fingerprint: fp,
                response
            })
        );
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn another_version_or_a_cut_record_is_an_error_never_a_misread() {
        let fp = Fingerprint::from_bytes([7; 32]);
        let mut bytes = encode_in_flight(FencingToken::from_token(1), fp);
        bytes[0] = 2;
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownVersion(2)));
        let response = StoredResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::from("x"));
        let bytes = encode_completed(FencingToken::from_token(1), fp, &response).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode(&[]).is_err());
    }

    /// Found in review: a header count past `HeaderMap`'s limit panicked in decode. Many
    /// values read fine; more distinct names than a map holds are malformed, not a panic.
    #[test]
    fn a_huge_header_count_is_read_or_malformed_never_a_panic() {
        let encoded = |count: u16, distinct: bool| {
            let mut bytes = vec![VERSION, COMPLETED];
            bytes.extend_from_slice(&1u64.to_be_bytes());
            bytes.extend_from_slice(&[7; 32]);
            bytes.extend_from_slice(&200u16.to_be_bytes());
            bytes.extend_from_slice(&count.to_be_bytes());
            for i in 0..count {
                let name = if distinct {
                    format!("h{i}")
                } else {
                    "a".to_owned()
                };
                bytes.extend_from_slice(&(name.len() as u16).to_be_bytes());
                bytes.extend_from_slice(name.as_bytes());
                bytes.extend_from_slice(&1u32.to_be_bytes());
                bytes.push(b'1');
            }
            bytes.extend_from_slice(&0u32.to_be_bytes());
            bytes
        };
        assert!(decode(&encoded(30_000, false)).is_ok());
        assert_eq!(
            decode(&encoded(40_000, true)),
            Err(DecodeError::Malformed("too many headers"))
        );
    }
}

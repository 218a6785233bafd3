//! Reading the deadline conventions real clients send (the table in the
//! [module docs](super)): the earliest deadline named wins, capped by the server's maximum,
//! and an attempt number in any of them says the caller retries.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use tower_retry_safety::deadline::{
    self, BadDeadline, ATTEMPT_HEADER, CONNECT_TIMEOUT_HEADER, ENVOY_ATTEMPT_HEADER,
    ENVOY_TIMEOUT_HEADER, TIMEOUT_HEADER,
};
use tower_retry_safety::wire::grpc::{GRPC_TIMEOUT, PREVIOUS_ATTEMPTS};

use super::aws::{self, AMZ_SDK_REQUEST};
use super::count::{parse_count, STAINLESS_RETRY_COUNT};
use super::note::{Note, Notes};
use super::seconds::{self, STAINLESS_READ_TIMEOUT, STAINLESS_TIMEOUT};

type ParseDeadline = fn(&HeaderValue) -> Result<Duration, BadDeadline>;
/// `Some(retries)`, or `None` for a malformed value.
type ParseAttempt = fn(&HeaderValue) -> Option<bool>;

/// The other conventions' deadline headers, read beside the server's own.
static DEADLINES: [(HeaderName, ParseDeadline); 5] = [
    (GRPC_TIMEOUT, deadline::parse_grpc_timeout),
    (CONNECT_TIMEOUT_HEADER, deadline::parse_timeout_ms),
    (ENVOY_TIMEOUT_HEADER, deadline::parse_timeout_ms),
    (STAINLESS_READ_TIMEOUT, seconds::parse_fraction),
    (STAINLESS_TIMEOUT, seconds::parse_truncated),
];

/// The other conventions' attempt headers. gRPC sends its count only on a later attempt;
/// Envoy counts from 1 when told to send it; a Stainless SDK sends its retries taken on every
/// attempt, `0` on the first, from the loop that retries (2 retries by default): the header
/// says the caller is a client that retries, whatever the count. An SDK told to make no
/// retries sends the same `0`; taking it for one that retries costs a nested call at most
/// some of its resends, while the opposite mistake multiplies attempts at every hop.
static ATTEMPTS: [(HeaderName, ParseAttempt); 4] = [
    (PREVIOUS_ATTEMPTS, |v| parse_count(v).map(|_| true)),
    (ENVOY_ATTEMPT_HEADER, |v| {
        deadline::parse_attempt(v).map(|_| true)
    }),
    (STAINLESS_RETRY_COUNT, |v| parse_count(v).map(|_| true)),
    (AMZ_SDK_REQUEST, aws::caller_retries),
];

/// Which headers a layer reads: its own two (its builder's knobs), and every other
/// convention's but one its own already names.
#[derive(Clone, Debug)]
pub(crate) struct Conventions {
    pub(crate) timeout_header: HeaderName,
    pub(crate) attempt_header: HeaderName,
    /// Bit `i`: `DEADLINES[i]` is the own timeout header, read once as the own.
    skip_deadlines: u8,
    /// Bit `i`: `ATTEMPTS[i]` is the own attempt header.
    skip_attempts: u8,
}

/// What a request's headers say.
#[derive(Debug)]
pub(crate) struct Read {
    /// The time it is given: the earliest named, capped; the maximum when none is.
    pub(crate) timeout: Duration,
    pub(crate) caller_retries: bool,
    pub(crate) notes: Notes,
}

impl Default for Conventions {
    fn default() -> Self {
        Conventions {
            timeout_header: TIMEOUT_HEADER,
            attempt_header: ATTEMPT_HEADER,
            skip_deadlines: 0,
            skip_attempts: 0,
        }
    }
}

impl Conventions {
    pub(crate) fn with_timeout_header(mut self, name: HeaderName) -> Self {
        self.skip_deadlines = mask(DEADLINES.iter().map(|(n, _)| n), &name);
        self.timeout_header = name;
        self
    }

    pub(crate) fn with_attempt_header(mut self, name: HeaderName) -> Self {
        self.skip_attempts = mask(ATTEMPTS.iter().map(|(n, _)| n), &name);
        self.attempt_header = name;
        self
    }

    /// Reads `headers`: a lookup per header, and no allocation unless a note is written.
    pub(crate) fn read(&self, headers: &HeaderMap, max: Duration) -> Read {
        let mut notes = Notes::default();
        // The earliest deadline, and which header named it (`None`: the own).
        let mut earliest: Option<(Duration, Option<&HeaderName>)> = None;
        let mut named = |timeout: Duration, by| {
            if earliest.is_none_or(|(t, _)| timeout < t) {
                earliest = Some((timeout, by));
            }
        };
        // Every line of a header counts (a repeated header is one field to HTTP, and a
        // proxy may add a line): the earliest well-formed value wins.
        for value in headers.get_all(&self.timeout_header) {
            match deadline::parse_timeout_ms(value) {
                Ok(timeout) => named(timeout, None),
                Err(bad) => notes.own(bad.into()),
            }
        }
        for (i, (name, parse)) in DEADLINES.iter().enumerate() {
            if self.skip_deadlines & (1 << i) != 0 {
                continue;
            }
            for value in headers.get_all(name) {
                match parse(value) {
                    Ok(timeout) => named(timeout, Some(name)),
                    Err(bad) => notes.on(bad.into(), name),
                }
            }
        }
        let timeout = match earliest {
            None => max,
            Some((timeout, by)) if timeout > max => {
                match by {
                    None => notes.own(Note::Capped),
                    Some(name) => notes.on(Note::Capped, name),
                }
                max
            }
            Some((timeout, _)) => timeout,
        };

        let mut caller_retries = false;
        for value in headers.get_all(&self.attempt_header) {
            match deadline::parse_attempt(value) {
                Some(_) => caller_retries = true,
                None => notes.on(Note::Malformed, &self.attempt_header),
            }
        }
        for (i, (name, parse)) in ATTEMPTS.iter().enumerate() {
            if self.skip_attempts & (1 << i) != 0 {
                continue;
            }
            for value in headers.get_all(name) {
                match parse(value) {
                    Some(retries) => caller_retries |= retries,
                    None => notes.on(Note::Malformed, name),
                }
            }
        }
        Read {
            timeout,
            caller_retries,
            notes,
        }
    }
}

fn mask<'a>(names: impl Iterator<Item = &'a HeaderName>, own: &HeaderName) -> u8 {
    names
        .enumerate()
        .filter(|(_, n)| *n == own)
        .fold(0, |mask, (i, _)| mask | 1 << i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Read {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        Conventions::default().read(&headers, Duration::from_secs(10))
    }

    #[test]
    fn the_earliest_deadline_named_wins() {
        let r = read(&[
            ("request-timeout-ms", "5000"),
            ("x-envoy-expected-rq-timeout-ms", "3000"),
            ("x-stainless-read-timeout", "2.5"),
            ("grpc-timeout", "4S"),
        ]);
        assert_eq!(r.timeout, Duration::from_millis(2500));
        assert!(!r.caller_retries);
    }

    #[test]
    fn none_named_is_the_maximum_and_allocates_nothing() {
        let r = read(&[("content-type", "application/json")]);
        assert_eq!(r.timeout, Duration::from_secs(10));
        assert_eq!(format!("{:?}", r.notes), "Notes([])");
    }

    #[test]
    fn any_attempt_header_says_the_caller_retries() {
        for pair in [
            ("request-attempt", "1"),
            ("grpc-previous-rpc-attempts", "1"),
            ("x-envoy-attempt-count", "1"),
            ("x-stainless-retry-count", "0"),
            ("amz-sdk-request", "attempt=1; max=3"),
        ] {
            assert!(read(&[pair]).caller_retries, "{pair:?}");
        }
        assert!(!read(&[("amz-sdk-request", "attempt=1; max=1")]).caller_retries);
    }

    #[test]
    fn the_own_header_named_as_another_conventions_is_read_once() {
        let layer = Conventions::default().with_timeout_header(ENVOY_TIMEOUT_HEADER);
        let mut headers = HeaderMap::new();
        headers.insert(ENVOY_TIMEOUT_HEADER, HeaderValue::from_static("x"));
        let r = layer.read(&headers, Duration::from_secs(10));
        let mut res = http::Response::new(());
        r.notes.mark(&mut res);
        let notes: Vec<_> = res
            .headers()
            .get_all(super::super::DEADLINE_NOTE)
            .iter()
            .collect();
        assert_eq!(notes, ["ignored-malformed"]);
    }
}

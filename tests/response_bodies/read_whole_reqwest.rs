//! The reqwest stack that reads bodies whole (`RetrySafetyMiddleware` and
//! `ReadWholeMiddleware`), the body sizes around its 64 KiB read limit, reading a reqwest body
//! to its end, and everything an error says.
//!
//! Shared by the two adversarial reviews of reading whole bodies (issue 23):
//! `range_resume_attacks` and `attempt_clock`.

use std::error::Error as StdError;

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tower_retry_safety::resume::ReadWholeMiddleware;
use tower_retry_safety::{RetryPolicy, RetrySafetyMiddleware};

pub(crate) const BIG: usize = 200_000; // past the 64 KiB limit
pub(crate) const HALF: usize = 100_000;

pub(crate) fn reqwest_client(policy: RetryPolicy) -> ClientWithMiddleware {
    let client = reqwest::Client::new();
    ClientBuilder::new(client.clone())
        .with(RetrySafetyMiddleware::new(policy))
        .with(ReadWholeMiddleware::new().resume_with(client))
        .build()
}

pub(crate) async fn reqwest_read_all(
    mut res: reqwest::Response,
) -> (Vec<u8>, Option<reqwest::Error>) {
    let mut bytes = Vec::new();
    loop {
        match res.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => return (bytes, None),
            Err(err) => return (bytes, Some(err)),
        }
    }
}

/// Everything an error says: Display and Debug of it and of each source.
pub(crate) fn all_said(err: &(dyn StdError + 'static)) -> String {
    let mut out = String::new();
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        out.push_str(&format!("{e}\n{e:?}\n"));
        source = e.source();
    }
    out
}

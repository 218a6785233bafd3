//! What the benches share: batches timed side by side, the median of samples, the ratio of two
//! rows measured in the same rounds; for the client's, the least a `tower::retry` policy does,
//! two-thread throughput and the cost of a budget deposit.

pub mod deposits;
pub mod threads;

use std::future::Ready;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tower::retry::Policy;

/// Runs `$body` `$n` times and pushes the mean nanoseconds per run onto `$samples`.
#[macro_export]
macro_rules! batch {
    ($samples:expr, $n:expr, $body:expr) => {{
        let start = std::time::Instant::now();
        for _ in 0..$n {
            $body;
        }
        $samples.push(start.elapsed().as_nanos() as f64 / $n as f64);
    }};
}

/// The median of the samples (sorts them).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The ratio of two rows measured in the same rounds (`num[i]` and `den[i]` timed in round
/// `i`, side by side): the median of the rounds' own ratios, so that the machine's load in a
/// round weighs on both sides alike.
pub struct Ratio {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The middle half of the rounds' ratios: on a loaded machine one preempted batch sets
    /// the min or the max, not these.
    pub quartiles: (f64, f64),
    pub rounds: usize,
}

/// `num` and `den` must come from the same rounds (equal lengths, not yet sorted).
pub fn ratio_of(num: &[f64], den: &[f64]) -> Ratio {
    assert_eq!(num.len(), den.len(), "rows measured in the same rounds");
    let mut each: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
    let median = median(&mut each);
    let n = each.len();
    Ratio {
        median,
        min: each[0],
        max: each[n - 1],
        quartiles: (each[n / 4], each[(3 * n) / 4]),
        rounds: n,
    }
}

/// Prints `ratio NAME V (min–max over N rounds) middle half Q1–Q3`, and anything `more` says
/// after it.
pub fn print_ratio(name: &str, num: &[f64], den: &[f64], more: &str) -> f64 {
    let r = ratio_of(num, den);
    println!(
        "ratio {name} {:.3} ({:.3}–{:.3} over {} rounds) middle half {:.3}–{:.3}{more}",
        r.median, r.min, r.max, r.rounds, r.quartiles.0, r.quartiles.1
    );
    r.median
}

pub type Req = Request<Full<Bytes>>;

/// The least a `tower::retry` policy does: keep a copy of the request, never retry.
#[derive(Clone)]
pub struct CloneNeverRetry;

impl<Res, E> Policy<Req, Res, E> for CloneNeverRetry {
    type Future = Ready<()>;

    fn retry(&mut self, _: &mut Req, _: &mut Result<Res, E>) -> Option<Ready<()>> {
        None
    }

    fn clone_request(&mut self, req: &Req) -> Option<Req> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

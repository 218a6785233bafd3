//! Cost of the request verdict: method only, 1, 10, 100 and 1000 route rules, and 1000 rules
//! reached only by another spelling of the path.
//! Ends with `ratio classify_1000_routes/classify_1_route V`, measured interleaved.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use http::{Method, Request};
use tower_retry_safety::{Idempotency, RetryPolicy};

fn policy(rules: usize) -> RetryPolicy {
    let mut b = RetryPolicy::builder();
    for i in 0..rules {
        b = b.route(
            Method::POST,
            &format!("/v1/service{i}/{{id}}/execute"),
            Idempotency::NonIdempotent,
        );
    }
    b.build().expect("valid rules")
}

/// A request that hits the last rule added (the worst case for a scan).
fn request(rules: usize) -> Request<()> {
    let last = rules.saturating_sub(1);
    Request::post(format!("https://api.test/v1/service{last}/42/execute?x=1"))
        .body(())
        .expect("valid request")
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("classify");
    let get = Request::get("https://api.test/v1/things/1")
        .body(())
        .unwrap();
    let p = policy(0);
    group.bench_function("method_only", |b| b.iter(|| p.classify(black_box(&get))));
    for rules in [1, 10, 100, 1000] {
        let p = policy(rules);
        let req = request(rules);
        group.bench_function(format!("routes_{rules}"), |b| {
            b.iter(|| p.classify(black_box(&req)))
        });
    }
    // The slowest spelling: missed as sent, normalised into the stack buffer, then folded.
    let p = policy(1000);
    let respelled = Request::post("https://api.test/v1/Service999//42/execute/?x=1")
        .body(())
        .unwrap();
    group.bench_function("routes_1000_respelled", |b| {
        b.iter(|| p.classify(black_box(&respelled)))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}

/// Median ns per call of `f`, over `rounds` batches, interleaved with `g` so that machine
/// noise hits both alike.
fn interleaved(rounds: usize, batch: u32, mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    let mut a = Vec::with_capacity(rounds);
    let mut b = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        a.push(t.elapsed().as_nanos() as f64 / f64::from(batch));
        let t = Instant::now();
        for _ in 0..batch {
            g();
        }
        b.push(t.elapsed().as_nanos() as f64 / f64::from(batch));
    }
    retry_safety_testing::bench::print_ratio("classify_1000_routes/classify_1_route", &a, &b, "");
    (
        retry_safety_testing::bench::median(&mut a),
        retry_safety_testing::bench::median(&mut b),
    )
}

fn ratio() {
    let (p1, r1) = (policy(1), request(1));
    let (p1000, r1000) = (policy(1000), request(1000));
    let (many, one) = interleaved(
        201,
        20_000,
        || {
            black_box(p1000.classify(black_box(&r1000)));
        },
        || {
            black_box(p1.classify(black_box(&r1)));
        },
    );
    println!("classify_1_route {one:.1} ns, classify_1000_routes {many:.1} ns");
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratio();
}

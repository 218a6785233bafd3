//! Throughput of services called from two threads at once.

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use tower::{Service, ServiceExt};

/// Requests per second made by two threads through `services`, `n` requests per thread, timed
/// by the threads themselves from the first one's start to the last one's end (so a pause of
/// the timing thread counts for nothing): `result[round][i]` for `services[i]`. Each
/// round runs every service once, starting one further along each round, so that the
/// services share the machine's moments alike. The threads call clones of the services (so
/// they share what clones share: for this crate's layer, the policy and its budget), each on a
/// current-thread runtime of its own.
pub fn two_threads<S, R>(services: &[S], rounds: usize, n: u64, request: fn() -> R) -> Vec<Vec<f64>>
where
    S: Service<R> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
    R: 'static,
{
    let count = services.len();
    let order = move |round: usize| (0..count).map(move |i| (round + i) % count);
    let (start, end) = (Arc::new(Barrier::new(3)), Arc::new(Barrier::new(3)));
    let (times, timed) = mpsc::channel();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let mut services = services.to_vec();
            let (start, end, times) = (start.clone(), end.clone(), times.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                for round in 0..rounds {
                    for i in order(round) {
                        let svc = &mut services[i];
                        start.wait();
                        let t0 = Instant::now();
                        runtime.block_on(async {
                            for _ in 0..n {
                                let res = svc.ready().await.expect("ready").call(request()).await;
                                std::hint::black_box(res.expect("ok"));
                            }
                        });
                        times.send((t0, Instant::now())).expect("timer");
                        end.wait();
                    }
                }
            })
        })
        .collect();
    let mut result = vec![vec![0.0; count]; rounds];
    for (round, row) in result.iter_mut().enumerate() {
        for i in order(round) {
            start.wait();
            end.wait();
            let (a, b) = (timed.recv().expect("time"), timed.recv().expect("time"));
            let elapsed = a.1.max(b.1) - a.0.min(b.0);
            row[i] = (2 * n) as f64 / elapsed.as_secs_f64();
        }
    }
    for t in threads {
        t.join().expect("bench thread");
    }
    result
}

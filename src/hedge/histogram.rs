//! A lock-free latency histogram, and a fixed table of them keyed by host.
//!
//! Log-linear buckets of microseconds: exact below 8 µs, then 8 buckets per power of two (a
//! bucket spans at most 1/8 of its lower bound, so a quantile is at most 12.5 % high). Up to
//! 2^26 µs (67 s); longer values count in the last bucket. Recording is two relaxed atomic
//! adds; a quantile reads every bucket once. No lock anywhere.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Sub-buckets per power of two: 2^SUB_BITS.
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
/// Largest power of two kept apart: values of 2^MAX_EXP µs and above share the last bucket.
const MAX_EXP: u32 = 26;
pub(crate) const BUCKETS: usize = ((MAX_EXP - SUB_BITS + 1) * SUB as u32) as usize;
/// Every this many samples, each bucket is halved, so the estimate follows a changing latency
/// rather than averaging the process's whole life.
const HALVE_EVERY: u64 = 1 << 14;
/// The quantile is recomputed every this many samples (at every one of the first 64).
const REFRESH_EVERY: u64 = 16;

/// The bucket of a value in microseconds.
fn bucket(us: u64) -> usize {
    let us = us.min((1 << MAX_EXP) - 1);
    if us < SUB {
        return us as usize;
    }
    let exp = 63 - us.leading_zeros();
    let sub = (us >> (exp - SUB_BITS)) & (SUB - 1);
    ((exp - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// The largest value, in microseconds, that falls in bucket `b`.
fn upper_bound(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let exp = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = b % SUB;
    let lower = (SUB + sub) << (exp - SUB_BITS);
    lower + (1 << (exp - SUB_BITS)) - 1
}

/// Latencies of one host (or of every host past the table's size).
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    /// Samples ever taken (never halved): for the minimum before the first hedge.
    recorded: AtomicU64,
    /// The last quantile computed, in microseconds (`0`: none yet).
    cached: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            recorded: AtomicU64::new(0),
            cached: AtomicU64::new(0),
        }
    }

    /// Counts one latency, and refreshes the cached `quantile` now and then.
    pub(crate) fn add_sample(&self, latency: Duration, quantile: f64) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket(us)].fetch_add(1, Relaxed);
        let n = self.recorded.fetch_add(1, Relaxed) + 1;
        if n.is_multiple_of(HALVE_EVERY) {
            // A racing add may be halved or not: either way the counts stay close.
            for b in self.buckets.iter() {
                let _ = b.fetch_update(Relaxed, Relaxed, |c| Some(c / 2));
            }
        }
        // Every sample while there are few (the first ones would otherwise set the delay for
        // the next 16), then every 16th.
        if n < 4 * REFRESH_EVERY || n.is_multiple_of(REFRESH_EVERY) {
            self.cached
                .store(self.quantile_us(quantile).max(1), Relaxed);
        }
    }

    /// Samples ever taken.
    pub(crate) fn samples(&self) -> u64 {
        self.recorded.load(Relaxed)
    }

    /// The cached quantile, if one was computed.
    pub(crate) fn cached(&self) -> Option<Duration> {
        match self.cached.load(Relaxed) {
            0 => None,
            us => Some(Duration::from_micros(us)),
        }
    }

    /// The `q` quantile (0 < q ≤ 1) of the counts, as the upper bound of its bucket, in
    /// microseconds; 0 when empty.
    pub(crate) fn quantile_us(&self, q: f64) -> u64 {
        let mut counts = [0u64; BUCKETS];
        for (c, b) in counts.iter_mut().zip(self.buckets.iter()) {
            *c = b.load(Relaxed);
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (b, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper_bound(b);
            }
        }
        upper_bound(BUCKETS - 1)
    }
}

/// Slots for hosts: past this many hosts, the rest share one overflow histogram.
pub(crate) const HOSTS: usize = 16;

/// A histogram per host, in a fixed open-addressed table claimed by compare-and-swap: the
/// first request to a host claims a free slot, later ones find it; no lock, no allocation
/// after the table is made.
pub(crate) struct HostTable {
    keys: [AtomicU64; HOSTS],
    slots: Box<[Histogram]>,
    hasher: std::collections::hash_map::RandomState,
}

impl HostTable {
    pub(crate) fn new() -> Self {
        HostTable {
            keys: std::array::from_fn(|_| AtomicU64::new(0)),
            // One more for the overflow.
            slots: (0..=HOSTS).map(|_| Histogram::new()).collect(),
            hasher: Default::default(),
        }
    }

    /// The slot for a host (`None`: a request without one, counted with the overflow).
    pub(crate) fn slot(&self, host: Option<(&str, Option<u16>)>) -> usize {
        let Some(host) = host else {
            return HOSTS;
        };
        // Never 0, which marks a free slot. Hosts are compared case-insensitively by
        // hashing the lowercase bytes.
        let key = self.hash(host) | 1;
        let start = (key >> 1) as usize % HOSTS;
        for i in 0..HOSTS {
            let at = (start + i) % HOSTS;
            match self.keys[at].compare_exchange(0, key, Relaxed, Relaxed) {
                Ok(_) => return at,
                Err(found) if found == key => return at,
                Err(_) => {}
            }
        }
        HOSTS
    }

    /// One host however it is spelled: case, a trailing dot, and the default ports (a
    /// `Host` header without a port, an absolute URI whose port comes from its scheme).
    fn hash(&self, (host, port): (&str, Option<u16>)) -> u64 {
        let mut h = self.hasher.build_hasher();
        for b in host.strip_suffix('.').unwrap_or(host).bytes() {
            b.to_ascii_lowercase().hash(&mut h);
        }
        port.filter(|p| *p != 80 && *p != 443).hash(&mut h);
        std::hash::Hasher::finish(&h)
    }

    pub(crate) fn get(&self, slot: usize) -> &Histogram {
        &self.slots[slot.min(HOSTS)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_bounds_hold_their_values() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            17,
            100,
            999,
            1000,
            1001,
            50_000,
            1 << 25,
        ] {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            assert!(upper_bound(b) >= us, "{us} above its bucket's bound");
            if b > 0 {
                assert!(upper_bound(b - 1) < us, "{us} belongs to an earlier bucket");
            }
            // At most 1/8 too high.
            assert!(upper_bound(b) as f64 <= us as f64 * 1.125 + 1.0, "{us}");
        }
        for b in 0..BUCKETS - 1 {
            assert_eq!(bucket(upper_bound(b)), b);
            assert_eq!(bucket(upper_bound(b) + 1), b + 1);
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    /// Quantiles against the exact order statistic of the same samples: never below it, at
    /// most one bucket (12.5 %) above.
    #[test]
    fn quantiles_match_the_sorted_samples_within_a_bucket() {
        let h = Histogram::new();
        let mut samples = Vec::new();
        // A heavy tail: 95 % between 500 and 1500 µs, 5 % between 40 and 60 ms.
        let mut x: u64 = 12345;
        for i in 0..10_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let us = if i % 20 == 0 {
                40_000 + (x >> 33) % 20_000
            } else {
                500 + (x >> 33) % 1000
            };
            samples.push(us);
            h.add_sample(Duration::from_micros(us), 0.95);
        }
        samples.sort_unstable();
        for q in [0.5, 0.9, 0.95, 0.96, 0.99, 0.999, 1.0] {
            let rank = ((q * samples.len() as f64).ceil() as usize).max(1);
            let exact = samples[rank - 1];
            let got = h.quantile_us(q);
            assert!(got >= exact, "q {q}: {got} below {exact}");
            assert!(
                got as f64 <= exact as f64 * 1.125 + 1.0,
                "q {q}: {got} vs {exact}"
            );
        }
        // p95 is the fast part's top, p96 the slow part's.
        assert!(h.quantile_us(0.95) < 1700);
        assert!(h.quantile_us(0.96) >= 40_000);
        assert_eq!(h.samples(), 10_000);
        assert!(h.cached().is_some());
    }

    #[test]
    fn an_empty_histogram_has_no_quantile() {
        let h = Histogram::new();
        assert_eq!(h.quantile_us(0.99), 0);
        assert_eq!(h.cached(), None);
    }

    /// Concurrent samplers lose nothing: every sample is counted once.
    #[test]
    fn concurrent_samples_are_all_counted() {
        let h = std::sync::Arc::new(Histogram::new());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000u64 {
                        h.add_sample(Duration::from_micros(t * 1000 + i % 7), 0.99);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(h.samples(), 8_000);
        let counted: u64 = h.buckets.iter().map(|b| b.load(Relaxed)).sum();
        assert_eq!(counted, 8_000);
    }

    #[test]
    fn hosts_get_their_own_slots_until_the_table_is_full() {
        let t = HostTable::new();
        let a = t.slot(Some(("a.example", Some(443))));
        let b = t.slot(Some(("b.example", Some(443))));
        assert_ne!(a, b);
        assert_eq!(t.slot(Some(("A.EXAMPLE", Some(443)))), a);
        // The default ports and a trailing dot spell the same host; another port is another.
        assert_eq!(t.slot(Some(("a.example", Some(80)))), a);
        assert_eq!(t.slot(Some(("a.example.", None))), a);
        assert_ne!(t.slot(Some(("a.example", Some(8443)))), a);
        assert_eq!(t.slot(None), HOSTS);
        let slots: std::collections::HashSet<_> = (0..40)
            .map(|i| t.slot(Some((&format!("h{i}.example"), None))))
            .collect();
        // The 13 slots left after the 3 above, and the overflow.
        assert!(slots.contains(&HOSTS));
        assert_eq!(slots.len(), HOSTS - 3 + 1);
    }
}

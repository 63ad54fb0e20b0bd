//! Keyed limiter over 10k and 1M keys, 1 and 2 threads, side by side with governor's
//! `DefaultKeyedRateLimiter` (DashMap) in the same run; each with its default clock, and each
//! with a manual clock.
//!
//! The quota is so large that every check is admitted, so both limiters write the key's state
//! on every check (no cheap denial path).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::clock::FakeRelativeClock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use sluice_core::{CoarseClock, Gcra, KeyedLimiter, ManualClock, Rate};

const KEY_SETS: [u64; 2] = [10_000, 1_000_000];

/// A fixed pseudo-random walk over `keys` keys starting at `first`, so the CPU cannot predict
/// the next key. With two threads each walks its own half of the keys, as two connections
/// serving different users would.
fn key_walk(first: u64, keys: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            first + x % keys
        })
        .collect()
}

fn sluice_rate() -> Gcra {
    Gcra::new(Rate::new(4_000_000_000, Duration::from_secs(1)).unwrap())
}

fn governor_quota() -> Quota {
    Quota::per_second(NonZeroU32::MAX)
}

/// Runs `check` for `iters` keys on each of `threads` threads; returns wall time divided by
/// the thread count, so the figure is time per check of aggregate throughput.
fn run_threads(
    threads: usize,
    iters: u64,
    walks: &[Vec<u64>],
    check: impl Fn(u64) + Sync,
) -> Duration {
    debug_assert_eq!(walks.len(), threads);
    let start = quanta::Instant::now();
    std::thread::scope(|s| {
        for walk in walks.iter().take(threads) {
            let check = &check;
            s.spawn(move || {
                let mut i = 0usize;
                for _ in 0..iters {
                    check(walk[i]);
                    i = (i + 1) & (walk.len() - 1);
                }
            });
        }
    });
    start.elapsed() / threads as u32
}

fn keyed(c: &mut Criterion) {
    let walk_len = 1 << 16;
    for keys in KEY_SETS {
        let one_thread = vec![key_walk(0, keys, walk_len, 0x9e37_79b9)];
        let two_threads: Vec<Vec<u64>> = (0..2)
            .map(|t| key_walk(t * keys / 2, keys / 2, walk_len, 0x9e37_79b9 + t))
            .collect();
        let mut group = c.benchmark_group(format!("keyed/{keys}_keys"));

        let sluice_sys = Arc::new(KeyedLimiter::<u64, _, _>::with_capacity(
            sluice_rate(),
            CoarseClock::new(),
            keys as usize,
        ));
        let manual = ManualClock::new(1_700_000_000_000_000_000);
        let sluice_manual = Arc::new(KeyedLimiter::<u64, _, _>::with_capacity(
            sluice_rate(),
            manual.clone(),
            keys as usize,
        ));
        let gov_default = Arc::new(RateLimiter::<u64, _, _>::keyed(governor_quota()));
        let fake = FakeRelativeClock::default();
        let gov_manual = Arc::new(RateLimiter::<
            u64,
            DashMapStateStore<u64>,
            FakeRelativeClock,
            NoOpMiddleware<governor::nanos::Nanos>,
        >::dashmap_with_clock(governor_quota(), fake.clone()));
        for k in 0..keys {
            sluice_sys.check(&k, 1);
            sluice_manual.check(&k, 1);
            let _ = gov_default.check_key(&k);
            let _ = gov_manual.check_key(&k);
        }

        for (threads, walks) in [(1usize, &one_thread), (2, &two_threads)] {
            let walks = walks.as_slice();
            group.bench_function(BenchmarkId::new("sluice_default_clock", threads), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, walks, |k| {
                        black_box(sluice_sys.check(&k, 1));
                    })
                })
            });
            group.bench_function(BenchmarkId::new("governor_default_clock", threads), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, walks, |k| {
                        let _ = black_box(gov_default.check_key(&k));
                    })
                })
            });
            group.bench_function(BenchmarkId::new("sluice_manual_clock", threads), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, walks, |k| {
                        black_box(sluice_manual.check(&k, 1));
                    })
                })
            });
            group.bench_function(BenchmarkId::new("governor_manual_clock", threads), |b| {
                b.iter_custom(|iters| {
                    run_threads(threads, iters, walks, |k| {
                        let _ = black_box(gov_manual.check_key(&k));
                    })
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(20);
    targets = keyed
}
criterion_main!(benches);

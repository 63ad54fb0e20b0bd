//! One check of each algorithm on one key's state, with a manual clock; plus the cost of
//! reading each clock.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::{
    Algorithm, Clock, FixedWindow, Gcra, LeakyBucket, LeakyQueue, ManualClock, Rate, SlidingLog,
    SlidingWindow, StdClock, SystemClock,
};

fn bench_one<A: Algorithm>(c: &mut Criterion, name: &str, algorithm: A)
where
    A::State: Clone,
{
    let mut state = A::State::default();
    let mut now = 1_700_000_000_000_000_000u64;
    c.bench_function(&format!("check/{name}"), |b| {
        b.iter(|| {
            now += 1_000;
            let (d, next) = algorithm.check(std::mem::take(&mut state), black_box(now), 1);
            state = next;
            black_box(d)
        })
    });
}

fn algorithms(c: &mut Criterion) {
    // 1000 per second, checked every microsecond: a mix of admissions and denials.
    let rate = Rate::new(1000, Duration::from_secs(1)).unwrap();
    bench_one(c, "gcra", Gcra::new(rate));
    bench_one(c, "leaky_bucket", LeakyBucket::new(rate, 1000));
    bench_one(
        c,
        "leaky_queue",
        LeakyQueue::new(rate, Duration::from_millis(100)),
    );
    bench_one(c, "fixed_window", FixedWindow::new(rate));
    bench_one(c, "sliding_window", SlidingWindow::new(rate));
    bench_one(c, "sliding_log", SlidingLog::new(rate));
}

fn clocks(c: &mut Criterion) {
    let system = SystemClock::new();
    let manual = ManualClock::new(1);
    let coarse = sluice_core::CoarseClock::new();
    c.bench_function("clock/coarse_published", |b| {
        b.iter(|| black_box(coarse.now()))
    });
    c.bench_function("clock/system_quanta", |b| {
        b.iter(|| black_box(system.now()))
    });
    c.bench_function("clock/std_systemtime", |b| {
        b.iter(|| black_box(StdClock.now()))
    });
    c.bench_function("clock/manual", |b| b.iter(|| black_box(manual.now())));
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = algorithms, clocks
}
criterion_main!(benches);

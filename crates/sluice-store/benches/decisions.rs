//! What a decision taken in the store costs, side by side in one run on one `redis-server`
//! started here: `exact` mode's fixed-window script and the window-counter script a synced
//! rule with a limit too small to share uses, one call at a time (the latency a request waits)
//! and with many in flight (what one instance can ask of the store).
//! Run: `cargo bench -p sluice-store --bench decisions` (`DECISIONS_CALLS=<n>`, default 20000).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, SystemClock};
use sluice_store::{
    CounterKey, CounterStore, ExactAlgorithm, ExactRequest, RedisStore, RedisStoreOptions,
};
use sluice_testkit::RedisServer;

fn request(algorithm: ExactAlgorithm, i: usize, now_us: u64) -> ExactRequest {
    // A thousand users, each under its limit for the whole run.
    ExactRequest {
        key: CounterKey::new("bench/user", &[format!("u{}", i % 1000).as_str()])
            .as_str()
            .into(),
        algorithm,
        now_us,
        cost: 1,
    }
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let calls: usize = std::env::var("DECISIONS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = RedisServer::start();
    let store: Arc<dyn CounterStore> = Arc::new(
        RedisStore::open(
            &redis.url(),
            RedisStoreOptions {
                timeout: Duration::from_secs(5),
                ..RedisStoreOptions::default()
            },
        )
        .unwrap(),
    );
    let clock = SystemClock::new();
    // A window as long as the run, so every call counts in it.
    let limit = u64::try_from(calls).unwrap() * 10;
    let window_us = 3_600_000_000;
    let cases = [
        (
            "exact fixed window",
            ExactAlgorithm::FixedWindow { limit, window_us },
        ),
        (
            "window counter (synced small limit)",
            ExactAlgorithm::WindowCounter {
                limit,
                window_us,
                sliding: false,
            },
        ),
        (
            "window counter, sliding",
            ExactAlgorithm::WindowCounter {
                limit,
                window_us,
                sliding: true,
            },
        ),
    ];
    println!("{calls} decisions per case, 1,000 keys, loopback redis-server");
    println!("| script | one at a time: median µs | p99 µs | 64 in flight: decisions/s |");
    println!("|---|---|---|---|");
    for (name, algorithm) in cases {
        let (sorted, rate) = runtime.block_on(async {
            let now_us = clock.now() / 1000;
            // Warm up: scripts loaded, keys created.
            for i in 0..1000 {
                store.exact(&request(algorithm, i, now_us)).await.unwrap();
            }
            let mut times = Vec::with_capacity(calls);
            for i in 0..calls {
                let start = clock.now();
                let d = store.exact(&request(algorithm, i, now_us)).await.unwrap();
                times.push(clock.now() - start);
                assert!(d.is_allowed(), "{d:?}");
            }
            times.sort_unstable();
            let start = clock.now();
            let mut tasks = tokio::task::JoinSet::new();
            for t in 0..64 {
                let store = store.clone();
                tasks.spawn(async move {
                    for i in (t..calls).step_by(64) {
                        store.exact(&request(algorithm, i, now_us)).await.unwrap();
                    }
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.unwrap();
            }
            let rate = calls as f64 / ((clock.now() - start) as f64 / 1e9);
            (times, rate)
        });
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} |",
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.99),
            rate
        );
    }
}

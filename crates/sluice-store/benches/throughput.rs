//! Flush throughput of the shared stores side by side, in one run: a `redis-server` and a
//! one-member `etcd` started here on free ports, the same flushes sent to each through
//! `CounterStore`. Run: `cargo bench -p sluice-store --bench throughput`
//! (`THROUGHPUT_KEYS=<n>` keys per flush, default 1000; `THROUGHPUT_ROUNDS=<n>`, default 15).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Clock, SystemClock};
use sluice_store::{
    CounterKey, CounterStore, EtcdStore, EtcdStoreOptions, EtcdTarget, FlushItem, NodeEntry,
    RedisStore, RedisStoreOptions,
};
use sluice_testkit::{EtcdCluster, RedisServer};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `keys` items of `window`; with `node`, each carries that node's entry and asks for the
/// previous window (the predictive policy's flush of a shared key).
fn items(keys: usize, window: u64, node: Option<&str>, first: bool) -> Vec<FlushItem> {
    (0..keys)
        .map(|i| FlushItem {
            key: CounterKey::new("bench/user", &[format!("u{i}").as_str()])
                .as_str()
                .into(),
            window,
            delta: 3,
            ttl: Duration::from_secs(120),
            entry: node.map(|n| NodeEntry {
                node: n.into(),
                count: 10,
                at_ms: 1_800_000_000_000,
                rate_milli: 2_000,
            }),
            want_previous: node.is_some(),
            first_write: first,
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median milliseconds of a round in which every store flushes `keys` keys at once, and the
/// round trips of one flush.
async fn measure(
    stores: &[Arc<dyn CounterStore>],
    keys: usize,
    window: u64,
    rounds: usize,
    entries: bool,
) -> (f64, usize) {
    let clock = SystemClock::new();
    let nodes: Vec<String> = (0..stores.len()).map(|i| format!("node-{i}")).collect();
    // The window's first write (keys created), not timed.
    for (store, node) in stores.iter().zip(&nodes) {
        let batch = items(keys, window, entries.then_some(node.as_str()), true);
        store.flush(&batch, None).await.expect("first flush");
    }
    let mut times = Vec::new();
    let mut round_trips = 0;
    for _ in 0..rounds {
        let start = clock.now();
        let flushes = stores.iter().zip(&nodes).map(|(store, node)| {
            let batch = items(keys, window, entries.then_some(node.as_str()), false);
            let store = store.clone();
            tokio::spawn(async move { store.flush(&batch, None).await })
        });
        for f in futures_util::future::join_all(flushes).await {
            let reply = f.unwrap().expect("flush");
            assert!(reply.results.iter().all(Result::is_ok));
            round_trips = reply.round_trips;
        }
        times.push((clock.now() - start) as f64 / 1e6);
    }
    (median(times), round_trips)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let keys = env("THROUGHPUT_KEYS", 1000);
    let rounds = env("THROUGHPUT_ROUNDS", 15);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The etcd store's channels are made in the runtime.
    let _in_runtime = runtime.enter();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let redis = RedisServer::start();
    let etcd = EtcdCluster::start();
    let etcd_target = EtcdTarget {
        endpoints: etcd.endpoints(),
        tls: false,
        auth: None,
    };
    let timeout = Duration::from_secs(10);
    let make = |kind: &str| -> Arc<dyn CounterStore> {
        match kind {
            "redis" => Arc::new(
                RedisStore::open(
                    &redis.url(),
                    RedisStoreOptions {
                        timeout,
                        ..RedisStoreOptions::default()
                    },
                )
                .unwrap(),
            ),
            _ => Arc::new(
                EtcdStore::connect(
                    &etcd_target,
                    EtcdStoreOptions {
                        timeout,
                        ..EtcdStoreOptions::default()
                    },
                    clock.clone(),
                )
                .unwrap(),
            ),
        }
    };
    println!("{keys} keys per flush, median of {rounds} rounds");
    println!(
        "| store | instances | items | ms per round | keys/s (all instances) | round trips per flush |"
    );
    println!("|---|---|---|---|---|---|");
    for (case, (instances, entries)) in [(1, false), (1, true), (3, true)].into_iter().enumerate() {
        for kind in ["redis", "etcd"] {
            // Each case writes its own window, so it starts from new keys.
            let stores: Vec<_> = (0..instances).map(|_| make(kind)).collect();
            let window = 10 + case as u64;
            let (ms, trips) = runtime.block_on(measure(&stores, keys, window, rounds, entries));
            let rate = (keys * instances) as f64 / (ms / 1e3);
            let what = if entries {
                "count + entry + previous"
            } else {
                "count"
            };
            println!("| {kind} | {instances} | {what} | {ms:.1} | {rate:.0} | {trips} |");
        }
    }
}

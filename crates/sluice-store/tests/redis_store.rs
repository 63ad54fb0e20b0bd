//! The Redis store against a real `redis-server` started by the test, and the memory store
//! beside it: same flush semantics, and exact-mode scripts that agree with `sluice-core`
//! decision for decision.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Decision, ManualClock};
use sluice_store::{
    CounterKey, CounterStore, ExactAlgorithm, ExactRequest, FlushItem, MemoryStore, NodeEntry,
    RedisStore, RedisStoreOptions, StoreError,
};
use sluice_testkit::RedisServer;

fn item(key: &CounterKey, window: u64, delta: u64, node: Option<(&str, u64)>) -> FlushItem {
    FlushItem {
        key: key.as_str().into(),
        window,
        delta,
        ttl: Duration::from_secs(120),
        entry: node.map(|(n, count)| NodeEntry {
            node: n.into(),
            count,
            at_ms: 1_700_000_000_000,
            rate_milli: 2500,
        }),
        want_previous: true,
    }
}

async fn flush_semantics(store: &dyn CounterStore) {
    let k = CounterKey::new("t/user", &["alice"]);
    let other = CounterKey::new("t/user", &["bob"]);
    let reply = store
        .flush(&[
            item(&k, 10, 5, None),
            item(&other, 10, 1, None),
            item(&k, 9, 2, None),
        ])
        .await
        .unwrap();
    // One round trip, plus two to load the script when the server did not have it yet.
    assert!(
        reply.round_trips == 1 || reply.round_trips == 3,
        "{}",
        reply.round_trips
    );
    assert!(reply.store_time.is_some());
    let totals: Vec<u64> = reply
        .results
        .iter()
        .map(|r| r.as_ref().unwrap().total)
        .collect();
    assert_eq!(totals, [5, 1, 2]);
    let reply = store
        .flush(&[
            item(&k, 10, 3, Some(("node-a", 8))),
            item(&k, 10, 0, Some(("node-b", 1))),
        ])
        .await
        .unwrap();
    assert_eq!(reply.round_trips, 1);
    let a = reply.results[0].as_ref().unwrap();
    assert_eq!((a.total, a.previous_total), (8, Some(2)));
    assert_eq!(a.entries.len(), 1);
    let b = reply.results[1].as_ref().unwrap();
    assert_eq!(b.total, 8);
    let mut nodes: Vec<_> = b
        .entries
        .iter()
        .map(|e| (e.node.to_string(), e.count, e.rate_milli))
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [
            ("node-a".to_owned(), 8, 2500),
            ("node-b".to_owned(), 1, 2500)
        ]
    );
}

#[tokio::test]
async fn memory_and_redis_flush_alike() {
    let memory = MemoryStore::new(Arc::new(ManualClock::new(1_700_000_000_000_000_000)));
    flush_semantics(&memory).await;
    let redis = RedisServer::start();
    let store = RedisStore::open(&redis.url(), RedisStoreOptions::default()).unwrap();
    flush_semantics(&store).await;
    // Window keys expire after their TTL (two windows).
    let k = CounterKey::new("t/user", &["alice"]);
    let ttl = redis.command(&format!("PTTL {}:10", k.as_str()));
    let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(ms > 100_000 && ms <= 120_000, "ttl {ms}");
}

#[tokio::test]
async fn a_key_of_the_wrong_type_fails_alone_with_a_clear_error() {
    let redis = RedisServer::start();
    let store = RedisStore::open(&redis.url(), RedisStoreOptions::default()).unwrap();
    let bad = CounterKey::new("t/user", &["mallory"]);
    let good = CounterKey::new("t/user", &["alice"]);
    // Someone else wrote a hash where our counter lives, and text where a count should be.
    redis.command(&format!("HSET {}:3 x y", bad.as_str()));
    redis.command(&format!("SET {}:2 notanumber", good.as_str()));
    let reply = store
        .flush(&[item(&bad, 3, 1, None), item(&good, 3, 1, None)])
        .await
        .unwrap();
    match &reply.results[0] {
        Err(StoreError::BadReply { key, detail }) => {
            assert_eq!(key, bad.as_str());
            assert!(detail.contains("WRONGTYPE"), "{detail}");
        }
        other => panic!("expected a bad reply, got {other:?}"),
    }
    // Text where the previous window's count should be: the count is added, the previous
    // total is reported unknown.
    match &reply.results[1] {
        Ok(outcome) => assert_eq!((outcome.total, outcome.previous_total), (1, None)),
        other => panic!("expected the count added, got {other:?}"),
    }
}

#[tokio::test]
async fn a_dead_server_fails_fast_and_recovers() {
    let mut redis = RedisServer::start();
    let options = RedisStoreOptions {
        timeout: Duration::from_millis(300),
        ..RedisStoreOptions::default()
    };
    let store = RedisStore::open(&redis.url(), options).unwrap();
    let k = CounterKey::new("t/user", &["alice"]);
    store.flush(&[item(&k, 1, 1, None)]).await.unwrap();
    redis.kill();
    let err = store.flush(&[item(&k, 1, 1, None)]).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    redis.restart();
    let mut recovered = false;
    for _ in 0..50 {
        if let Ok(reply) = store.flush(&[item(&k, 1, 1, None)]).await {
            assert_eq!(
                reply.results[0].as_ref().unwrap().total,
                1,
                "restarted server is empty"
            );
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(recovered, "store did not reconnect");
}

/// A deterministic pseudo-random sequence (xorshift), so failures replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[tokio::test]
async fn exact_scripts_agree_with_the_core_algorithms() {
    let redis = RedisServer::start();
    let store = RedisStore::open(&redis.url(), RedisStoreOptions::default()).unwrap();
    let memory = MemoryStore::new(Arc::new(ManualClock::new(1_700_000_000_000_000_000)));
    let algorithms = [
        ExactAlgorithm::FixedWindow {
            limit: 5,
            window_us: 1_000_000,
        },
        ExactAlgorithm::TokenBucket {
            limit: 5,
            window_us: 1_000_000,
            burst: 3,
        },
        ExactAlgorithm::SlidingWindow {
            limit: 7,
            window_us: 2_000_000,
        },
        ExactAlgorithm::SlidingLog {
            limit: 4,
            window_us: 1_500_000,
        },
    ];
    let mut compared = 0;
    for (i, algorithm) in algorithms.into_iter().enumerate() {
        let mut rng = Rng(0x5eed + i as u64);
        let key: Arc<str> = CounterKey::new(&format!("conf/{i}"), &["k"])
            .as_str()
            .into();
        let mut now_us = 1_700_000_000_000_000u64;
        let (mut allowed, mut denied) = (0, 0);
        for step in 0..400 {
            // Mostly forward in small steps, sometimes a jump, sometimes backwards.
            match rng.next() % 10 {
                0 => now_us = now_us.saturating_sub(rng.next() % 300_000),
                1 => now_us += rng.next() % 3_000_000,
                _ => now_us += rng.next() % 150_000,
            }
            let cost = match rng.next() % 10 {
                0 => 0,
                1 => 1 + rng.next() % 8,
                _ => 1,
            };
            let request = ExactRequest {
                key: key.clone(),
                algorithm,
                now_us,
                cost,
            };
            let expected = memory.exact(&request).await.unwrap();
            let actual = store.exact(&request).await.unwrap();
            assert_eq!(
                actual, expected,
                "{algorithm:?} step {step} at {now_us} cost {cost}"
            );
            match expected {
                Decision::Allowed(_) => allowed += 1,
                Decision::Denied(_) => denied += 1,
                _ => {}
            }
            compared += 1;
        }
        assert!(
            allowed > 20 && denied > 20,
            "{algorithm:?}: sequence too one-sided ({allowed} allowed, {denied} denied)"
        );
    }
    assert_eq!(compared, 1600);
}

//! Redis-specific behaviour against a real `redis-server` started by the test: TTLs, bad
//! replies, a dead server. The shared semantics are in the conformance suite.

use std::time::Duration;

use sluice_store::{CounterKey, CounterStore, RedisStore, RedisStoreOptions, StoreError};
use sluice_testkit::RedisServer;
use sluice_testkit::conformance::item;

#[tokio::test]
async fn window_keys_expire_after_two_windows() {
    let redis = RedisServer::start();
    let store = RedisStore::open(&redis.url(), RedisStoreOptions::default()).unwrap();
    let k = CounterKey::new("t/user", &["alice"]);
    store.flush(&[item(&k, 10, 1, None)], None).await.unwrap();
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
        .flush(&[item(&bad, 3, 1, None), item(&good, 3, 1, None)], None)
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
    store.flush(&[item(&k, 1, 1, None)], None).await.unwrap();
    redis.kill();
    let err = store
        .flush(&[item(&k, 1, 1, None)], None)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    redis.restart();
    let mut recovered = false;
    for _ in 0..50 {
        if let Ok(reply) = store.flush(&[item(&k, 1, 1, None)], None).await {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_call_waits_longer_the_more_keys_it_carries() {
    let redis = RedisServer::start();
    let options = RedisStoreOptions {
        timeout: Duration::from_millis(200),
        timeout_per_item: Duration::from_millis(1),
        max_items_per_call: 1000,
        ..RedisStoreOptions::default()
    };
    assert_eq!(options.call_timeout(1), Duration::from_millis(201));
    assert_eq!(options.call_timeout(1000), Duration::from_millis(1200));
    assert_eq!(
        options.call_timeout(1_000_000),
        Duration::from_millis(1200),
        "bounded by the largest chunk"
    );
    let store = RedisStore::open(&redis.url(), options).unwrap();
    let few = [item(&CounterKey::new("r", &["one"]), 1, 1, None)];
    let many: Vec<_> = (0..1000)
        .map(|i| item(&CounterKey::new("r", &[&format!("k{i}")]), 1, 1, None))
        .collect();
    // Connected before the stalls.
    store.flush(&few, None).await.unwrap();
    // Redis stalls for 600 ms: one key's call gives up at 201 ms, 1,000 keys' call waits.
    redis.pause();
    let resume = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        redis.resume();
    };
    let (few_result, ()) = tokio::join!(store.flush(&few, None), resume);
    assert!(
        matches!(few_result, Err(StoreError::Timeout(t)) if t == Duration::from_millis(201)),
        "{few_result:?}"
    );
    redis.pause();
    let resume = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        redis.resume();
    };
    let (many_result, ()) = tokio::join!(store.flush(&many, None), resume);
    let reply = many_result.expect("a 1,000-key call waits 1.2 s");
    assert_eq!(reply.results.len(), 1000);
}

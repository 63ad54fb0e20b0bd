//! Exact mode through the engine against a real Redis: decisions, the over-limit cache, and
//! `on_store_error`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_config::ExactCalls;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{BreakerState, Engine, EngineOptions, Outcome, Reason};
use sluice_store::{RedisStore, RedisStoreOptions};
use sluice_testkit::RedisServer;

/// The tests of decisions give a call a generous budget (a loaded test machine may take more
/// than the default 10 ms for the first call's connection); the breaker test sets its own.
fn engine(server: &RedisServer, on_store_error: &str, clock: &ManualClock) -> Engine {
    engine_with(
        server,
        on_store_error,
        clock,
        ExactCalls {
            timeout: Duration::from_secs(2),
            ..ExactCalls::default()
        },
    )
}

fn engine_with(
    server: &RedisServer,
    on_store_error: &str,
    clock: &ManualClock,
    exact_calls: ExactCalls,
) -> Engine {
    let rules = rules(&format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: 3, mode: exact, on_store_error: {on_store_error} }}\n"
    ));
    let options = RedisStoreOptions {
        timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(300),
        max_backoff: Duration::from_millis(100),
        ..RedisStoreOptions::default()
    };
    let store = Arc::new(RedisStore::open(&server.url(), options).unwrap());
    Engine::new(
        &rules,
        &Default::default(),
        store,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineOptions {
            follow_store_clock: false,
            exact_calls,
            ..EngineOptions::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_mode_counts_in_redis_and_caches_over_limit_keys() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let a = engine(&server, "deny", &clock);
    let b = engine(&server, "deny", &clock);
    let req = [[("k", "v")]];
    // Two instances share the exact count: 3 per minute in total.
    assert!(a.check("d", &req, 1).await.unwrap().allowed);
    assert!(b.check("d", &req, 1).await.unwrap().allowed);
    let third = a.check("d", &req, 1).await.unwrap();
    assert!(third.allowed);
    assert_eq!(third.statuses[0].remaining, 0);
    let denied = b.check("d", &req, 1).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.statuses[0].reason, Some(Reason::Exact));
    assert_eq!(
        denied.statuses[0].retry_after,
        Some(Duration::from_secs(60))
    );
    // Known over limit: decided locally, without the store (which is now gone).
    server.kill();
    let cached = b.check("d", &req, 1).await.unwrap();
    assert_eq!(cached.statuses[0].reason, Some(Reason::CachedOverLimit));
    // A key not in the cache with the store down: on_store_error: deny.
    let other = [[("k", "w")]];
    let v = b.check("d", &other, 1).await.unwrap();
    assert_eq!(v.statuses[0].outcome, Outcome::Denied);
    assert_eq!(v.statuses[0].reason, Some(Reason::StoreError));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_store_error_allow_and_local() {
    let mut server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let allow = engine(&server, "allow", &clock);
    let local = engine(&server, "local", &clock);
    server.kill();
    let req = [[("k", "v")]];
    for _ in 0..5 {
        assert!(allow.check("d", &req, 1).await.unwrap().allowed);
    }
    let admitted = {
        let mut n = 0;
        for _ in 0..5 {
            if local.check("d", &req, 1).await.unwrap().allowed {
                n += 1;
            }
        }
        n
    };
    assert_eq!(
        admitted, 3,
        "local fallback admits MAX / expected instances (1)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_opens_the_breaker_and_a_probe_closes_it_once_redis_answers() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let cool_off = Duration::from_secs(1);
    let engine = engine_with(
        &server,
        "local",
        &clock,
        ExactCalls {
            timeout: Duration::from_millis(50),
            breaker_failures: 3,
            breaker_cool_off: cool_off,
            ..ExactCalls::default()
        },
    );
    let req = [[("k", "v")]];
    // The connection is up and the script loaded before the stall.
    assert!(engine.check("d", &req, 0).await.unwrap().allowed);
    server.pause();
    for _ in 0..3 {
        let v = engine.check("d", &req, 0).await.unwrap();
        assert!(v.allowed, "on_store_error: local admits within MAX / 1");
    }
    assert_eq!(engine.exact_breaker(), BreakerState::Open);
    // Open: the fallback decides without a call, until the cool-off ends.
    let v = engine.check("d", &req, 1).await.unwrap();
    assert!(v.allowed);
    server.resume();
    clock.advance(cool_off);
    assert!(engine.check("d", &req, 0).await.unwrap().allowed);
    assert_eq!(engine.exact_breaker(), BreakerState::Closed);
}

/// A decision asked from a thread with a runtime of its own (a listener's worker in `sluice
/// serve`) makes the store's first connection on the engine's runtime, not on the asker's:
/// that runtime ends at shutdown, before the last flush, and a connection made there would end
/// with it.
#[test]
fn a_connection_made_for_a_worker_outlives_the_workers_runtime() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engine = Arc::new({
        let _in_home = home.enter();
        engine(&server, "deny", &clock)
    });
    let req = [[("k", "v")]];
    let on_worker = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let worker = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let first = worker.block_on(engine.check("d", &req, 1)).unwrap();
            let seen = (first.allowed, first.statuses[0].reason);
            drop(first);
            drop(worker);
            seen
        })
        .join()
        .unwrap()
    };
    assert_eq!(on_worker, (true, None), "decided by the store");
    // The worker's runtime is gone; the connection is not.
    let second = home.block_on(engine.check("d", &req, 1)).unwrap();
    assert!(second.allowed, "{second:?}");
    assert_eq!(
        second.statuses[0].remaining, 1,
        "the store counted both: {second:?}"
    );
}

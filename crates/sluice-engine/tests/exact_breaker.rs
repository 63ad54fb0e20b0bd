//! Exact mode never waits on a slow or dead store past its budget: each request waits at most
//! `exact.timeout`, and after `breaker_failures` failures in a row the store is not called at
//! all (`on_store_error` decides at once) until a probe after the cool-off succeeds.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::watched::Watched;
use common::{T0, rules};
use sluice_config::ExactCalls;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{BreakerState, Engine, EngineOptions, Reason};
use sluice_store::MemoryStore;

const BUDGET: Duration = Duration::from_millis(10);
const COOL_OFF: Duration = Duration::from_millis(500);

fn setup(on_store_error: &str) -> (Engine, Arc<Watched>, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(Watched::new(MemoryStore::new(Arc::new(clock.clone()))));
    let rules = rules(&format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: 1000, mode: exact, on_store_error: {on_store_error} }}\n"
    ));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store.clone(),
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineOptions {
            follow_store_clock: false,
            exact_calls: ExactCalls {
                timeout: BUDGET,
                breaker_failures: 3,
                breaker_cool_off: COOL_OFF,
                ..ExactCalls::default()
            },
            ..EngineOptions::default()
        },
    );
    (engine, store, clock)
}

async fn check(engine: &Engine) -> (bool, Option<Reason>) {
    let v = engine.check("d", &[[("k", "v")]], 1).await.unwrap();
    (v.allowed, v.statuses[0].reason)
}

#[tokio::test(start_paused = true)]
async fn a_stalled_store_costs_a_request_its_budget_not_the_stores_timeout() {
    let (engine, store, _clock) = setup("deny");
    store.inner.set_latency(Duration::from_secs(5));
    let started = tokio::time::Instant::now();
    let (allowed, reason) = check(&engine).await;
    assert_eq!((allowed, reason), (false, Some(Reason::StoreError)));
    assert_eq!(
        started.elapsed(),
        BUDGET,
        "the request waited its budget, then on_store_error decided"
    );
}

#[tokio::test(start_paused = true)]
async fn after_failures_in_a_row_the_store_is_not_called_until_a_probe_succeeds() {
    let (engine, store, clock) = setup("allow");
    store.inner.set_available(false);
    for _ in 0..3 {
        assert_eq!(check(&engine).await, (true, None), "on_store_error: allow");
    }
    assert_eq!(engine.exact_breaker(), BreakerState::Open);
    assert_eq!(store.exact_calls(), 3);
    // Open: decided at once, the store is not called.
    for _ in 0..100 {
        assert_eq!(check(&engine).await, (true, None));
    }
    assert_eq!(store.exact_calls(), 3);
    // After the cool-off one request probes; the store is still down, so it opens again.
    clock.advance(COOL_OFF);
    check(&engine).await;
    assert_eq!(store.exact_calls(), 4);
    assert_eq!(engine.exact_breaker(), BreakerState::Open);
    check(&engine).await;
    assert_eq!(store.exact_calls(), 4);
    // The store is back: the next probe closes the breaker and every request asks it again.
    store.inner.set_available(true);
    clock.advance(COOL_OFF);
    check(&engine).await;
    assert_eq!(engine.exact_breaker(), BreakerState::Closed);
    for _ in 0..10 {
        check(&engine).await;
    }
    assert_eq!(store.exact_calls(), 15);
}

#[tokio::test(start_paused = true)]
async fn timeouts_open_the_breaker_too_and_local_fallback_applies_at_once() {
    let (engine, store, _clock) = setup("local");
    store.inner.set_latency(Duration::from_secs(5));
    for _ in 0..3 {
        assert_eq!(check(&engine).await, (true, None));
    }
    assert_eq!(engine.exact_breaker(), BreakerState::Open);
    let started = tokio::time::Instant::now();
    assert_eq!(check(&engine).await, (true, None));
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait while open");
}

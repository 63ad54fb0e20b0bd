//! A `cooldown` is a penalty in every mode and on every store: a key that asks for more than
//! its limit is refused for the cooldown from then, across windows. Local rules, synced rules
//! on the embedded memory store (which run as local there) and exact rules, each with every
//! algorithm that can carry it, driven on manual clocks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

const MS: u64 = 1_000_000;

/// One engine with one rule (`mode`, `algorithm`, 3 per 2 s, a 6 s cooldown) on the memory
/// store; `shared_store: false` is how `sluice serve` runs the embedded store.
fn engine(mode: &str, algorithm: &str, shared_store: bool) -> (Engine, ManualClock) {
    let rules = rules(&format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ window: 2s, requests_per_unit: 3, cooldown: 6s, mode: {mode}, algorithm: {algorithm} }}\n"
    ));
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineOptions {
            shared_store,
            follow_store_clock: false,
            exact_budget_timer: false,
            ..EngineOptions::default()
        },
    );
    (engine, clock)
}

async fn allowed(engine: &Engine, user: &str) -> (bool, Option<Duration>) {
    let request = [[("user", user)]];
    let v = engine.check("d", &request, 1).await.unwrap();
    (v.allowed, v.retry_after())
}

async fn a_denial_blocks_for_the_cooldown(mode: &str, algorithm: &str, shared_store: bool) {
    let what = format!("{mode} {algorithm} (shared store: {shared_store})");
    let (engine, clock) = engine(mode, algorithm, shared_store);
    // The window starts at T0 (a whole number of minutes): 3 fit, the 4th is over at 100 ms.
    for _ in 0..3 {
        assert!(
            allowed(&engine, "mallory").await.0,
            "{what}: under the limit"
        );
    }
    clock.set(T0 + 100 * MS);
    let (ok, retry) = allowed(&engine, "mallory").await;
    assert!(!ok, "{what}: over the limit");
    let retry = retry.expect("a denial says when to retry");
    assert!(
        retry >= Duration::from_millis(5_900),
        "{what}: retry after {retry:?}, not the cooldown"
    );
    // Later windows (and a refilled bucket) have room; the key stays refused for 6 s.
    for at_ms in [2_100, 4_000, 6_050] {
        clock.set(T0 + at_ms * MS);
        assert!(
            !allowed(&engine, "mallory").await.0,
            "{what}: admitted at {at_ms} ms, inside the cooldown"
        );
        // Another user is not touched by mallory's block.
        assert!(allowed(&engine, &format!("bob-{at_ms}")).await.0, "{what}");
    }
    clock.set(T0 + 6_200 * MS);
    assert!(
        allowed(&engine, "mallory").await.0,
        "{what}: still refused after the cooldown"
    );
}

#[tokio::test]
async fn local_rules_keep_the_cooldown_with_every_algorithm() {
    for algorithm in [
        "fixed_window",
        "sliding_window",
        "sliding_window_log",
        "token_bucket",
        "leaky_bucket",
    ] {
        a_denial_blocks_for_the_cooldown("local", algorithm, true).await;
    }
}

#[tokio::test]
async fn synced_rules_on_the_embedded_store_keep_the_cooldown() {
    for algorithm in ["fixed_window", "sliding_window"] {
        a_denial_blocks_for_the_cooldown("synced", algorithm, false).await;
    }
}

#[tokio::test]
async fn exact_rules_keep_the_cooldown() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket"] {
        a_denial_blocks_for_the_cooldown("exact", algorithm, true).await;
    }
}

//! A reload keeps what it promises: an unchanged rule keeps its counters and its status
//! figures; a new limit keeps what each key used in its window; only a new window (or
//! algorithm, or mode) starts over, and the summary says which rules did.

mod common;

use std::sync::Arc;

use common::*;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions, Lineage};
use sluice_store::MemoryStore;

fn engine(yaml: &str) -> (Engine, ManualClock) {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = Engine::new(
        &rules(yaml),
        &Default::default(),
        store,
        Arc::new(clock.clone()) as Arc<dyn Clock>,
        EngineOptions {
            // `sluice serve` on the embedded store: synced rules run as local.
            shared_store: false,
            follow_store_clock: false,
            ..EngineOptions::default()
        },
    );
    (engine, clock)
}

fn rule(limit: u64, window: &str, algorithm: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ window: {window}, requests_per_unit: {limit}, algorithm: {algorithm} }}\n  - key: ip\n    rate_limit: {{ unit: minute, requests_per_unit: 100 }}\n"
    )
}

/// Sends `n` requests for user `who`; returns the last one's remaining quota.
async fn send(engine: &Engine, who: &str, n: usize) -> u64 {
    let request = [[("user", who)]];
    let mut remaining = 0;
    for _ in 0..n {
        let v = engine.check("d", &request, 1).await.unwrap();
        remaining = v.statuses[0].remaining;
    }
    remaining
}

#[tokio::test]
async fn a_new_limit_keeps_what_each_key_used() {
    for algorithm in ["fixed_window", "sliding_window", "token_bucket"] {
        let (engine, clock) = engine(&rule(5, "60s", algorithm));
        assert_eq!(send(&engine, "alice", 5).await, 0, "{algorithm}");
        clock.set(T0 + SECOND);
        let raised = engine.reload(&rules(&rule(50, "60s", algorithm)), &Default::default());
        let summary = raised.reload_summary();
        assert_eq!(summary.carried, ["d/user"], "{algorithm}: {summary}");
        assert_eq!(summary.kept, 1, "{algorithm}: {summary}");
        // Alice used 5 of her window: 45 left (a token bucket has refilled a second's worth
        // of the new rate at most), not 49.
        let left = send(&raised, "alice", 1).await;
        assert!(
            (44..=45).contains(&left),
            "{algorithm}: {left} left after the limit was raised"
        );
        // Bob never came: he gets the new limit.
        assert_eq!(send(&raised, "bob", 1).await, 49, "{algorithm}");

        // Lowered below what alice used: she is over until her window has room.
        let lowered = raised.reload(&rules(&rule(3, "60s", algorithm)), &Default::default());
        let request = [[("user", "alice")]];
        let v = lowered.check("d", &request, 1).await.unwrap();
        assert!(!v.allowed, "{algorithm}: admitted over a lowered limit");
    }
}

#[tokio::test]
async fn a_new_window_or_algorithm_starts_over_and_says_so() {
    let (engine, _clock) = engine(&rule(5, "60s", "fixed_window"));
    send(&engine, "alice", 5).await;
    let longer = engine.reload(
        &rules(&rule(5, "120s", "fixed_window")),
        &Default::default(),
    );
    let summary = longer.reload_summary();
    assert_eq!(
        summary.started_over,
        [("d/user".to_owned(), "window changed")],
        "{summary}"
    );
    assert_eq!(send(&longer, "alice", 1).await, 4);
    let bucket = longer.reload(
        &rules(&rule(5, "120s", "token_bucket")),
        &Default::default(),
    );
    assert_eq!(
        bucket.reload_summary().started_over,
        [("d/user".to_owned(), "algorithm changed")]
    );
}

#[tokio::test]
async fn an_unchanged_reload_keeps_the_counters_and_the_status_figures() {
    let (engine, _clock) = engine(&rule(5, "60s", "fixed_window"));
    // Enough requests for the heavy-hitter sample to see mallory.
    send(&engine, "mallory", 400).await;
    let before = engine.status(10);
    let same = engine.reload(&rules(&rule(5, "60s", "fixed_window")), &Default::default());
    let summary = same.reload_summary();
    assert_eq!(summary.kept, 2, "{summary}");
    assert!(summary.carried.is_empty() && summary.started_over.is_empty());
    assert_eq!(
        summary.to_string(),
        "reloaded 1 domain: 2 rules unchanged, counts kept"
    );
    let after = same.status(10);
    let user = |s: &sluice_engine::EngineStatus| {
        s.rules.iter().find(|r| r.id == "d/user").unwrap().clone()
    };
    assert_eq!(user(&after).decisions, user(&before).decisions);
    assert!(user(&before).decisions.denied >= 395);
    assert!(
        user(&after).heavy_keys.iter().any(|k| k.key == "mallory"),
        "the heavy hitter is gone after the reload: {:?}",
        user(&after).heavy_keys
    );
    // Every lineage is one of the four.
    let _ = Lineage::Kept;
}

/// A synced rule over a shared store: 20 of 60 used on one instance (flushed or not), then
/// the limit is lowered to 30: 10 more, and the store counts each request once.
#[tokio::test]
async fn a_lowered_synced_limit_keeps_what_each_key_used_flushed_or_not() {
    for flushed in [true, false] {
        let clock = ManualClock::new(T0);
        let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let synced = |limit: u64| {
            rules(&format!(
                "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ window: 5m, requests_per_unit: {limit}, mode: synced }}\n"
            ))
        };
        let engine = Engine::new(
            &synced(60),
            &Default::default(),
            store.clone(),
            Arc::new(clock.clone()) as Arc<dyn Clock>,
            EngineOptions {
                follow_store_clock: false,
                ..EngineOptions::default()
            },
        );
        assert_eq!(send(&engine, "dave", 20).await, 40);
        clock.set(T0 + 70 * SECOND);
        if flushed {
            engine.flush().await;
        }
        let lowered = engine.reload(&synced(30), &Default::default());
        assert_eq!(lowered.reload_summary().carried, ["d/user"]);
        let request = [[("user", "dave")]];
        let mut admitted = 0;
        for _ in 0..40 {
            if lowered.check("d", &request, 1).await.unwrap().allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10, "flushed before the reload: {flushed}");
        // The old rule's unsent counts and the new rule's reach the store once each.
        lowered.flush().await;
        lowered.flush().await;
        let key = sluice_store::CounterKey::new("d/user", &["dave"]);
        let total = store.total(key.as_str(), (T0 + 70 * SECOND) / (300 * SECOND));
        assert_eq!(total, 30, "flushed before the reload: {flushed}");
    }
}

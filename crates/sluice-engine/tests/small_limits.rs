//! A synced rule whose limit is too small to share among the instances (under two requests
//! per instance and span) decides each request at the store, on the window counter its
//! flushes add to; with the store unreachable its keys keep to their share, and the counts
//! they admit reach the same counter once it answers. Memory store, manual clocks.

mod common;

use std::sync::Arc;

use common::*;
use sluice_core::ManualClock;
use sluice_engine::{Engine, EngineOptions, Reason};
use sluice_store::{CounterKey, CounterStore, MemoryStore};

const WINDOW_NS: u64 = 10 * SECOND;

/// 20 per 10 s with 5 spans, over three instances: four requests per instance and window, less
/// than one per span.
fn small_rule(small_limits: &str) -> sluice_config::RuleSet {
    rules(&format!(
        "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {{ window: 10s, requests_per_unit: 20, spans: 5, small_limits: {small_limits} }}\n"
    ))
}

fn fleet(small_limits: &str) -> (Fleet, Arc<MemoryStore>, ManualClock) {
    let store_clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(store_clock.clone())));
    let fleet = Fleet::expecting(
        &small_rule(small_limits),
        store.clone(),
        &[0, 0, 0],
        true,
        3,
    );
    (fleet, store, store_clock)
}

/// One instance of a fleet of three (as configured) over `store`, with `calls` store decisions
/// a second.
fn instance(clock: &ManualClock, store: Arc<dyn CounterStore>, calls: u32) -> Engine {
    Engine::new(
        &small_rule("store"),
        &Default::default(),
        store,
        Arc::new(clock.clone()),
        EngineOptions {
            shared_store: true,
            expected_instances: 3,
            exact_calls: sluice_config::ExactCalls {
                small_limit_calls: calls,
                ..Default::default()
            },
            ..EngineOptions::default()
        },
    )
}

#[tokio::test]
async fn the_fleet_admits_exactly_a_small_limit_and_a_key_over_it_costs_no_store_call() {
    let (fleet, store, store_clock) = fleet("store");
    let mut t = T0;
    for window in 0..3 {
        // 2.5x the limit, evenly over the instances and the window.
        let step = WINDOW_NS / 50;
        let mut admitted = 0;
        let mut reasons = Vec::new();
        let mut calls_while_blocked = None;
        for n in 0..50u64 {
            store_clock.set(t);
            fleet.set_time(t);
            fleet.flush_due().await;
            let before = store.operations();
            let v = fleet.check((n % 3) as usize, "alice");
            let status = &v.statuses[0];
            if v.allowed {
                admitted += 1;
                // The remaining count is the fleet's, not this instance's share.
                assert_eq!(
                    status.remaining,
                    20 - admitted,
                    "window {window}, request {n}"
                );
            } else {
                reasons.push(status.reason);
                if reasons.len() > 3 {
                    // Each instance asked once and was told; since then, nothing is asked.
                    *calls_while_blocked.get_or_insert(0) += store.operations() - before;
                }
            }
            t += step;
        }
        assert_eq!(admitted, 20, "window {window}");
        assert_eq!(
            reasons[..3],
            [Some(Reason::Exact); 3],
            "window {window}: each instance's first refusal comes from the store"
        );
        assert!(
            reasons[3..]
                .iter()
                .all(|r| *r == Some(Reason::CachedOverLimit)),
            "window {window}: {reasons:?}"
        );
        assert_eq!(calls_while_blocked, Some(0), "window {window}");
    }
    // No key state was kept for the decisions: nothing to flush, nothing tracked, and
    // nothing to give back to (the count is the store's). The status page says how the rule
    // decides, and shows the refused key blocked.
    let engine = &fleet.instances[0].engine;
    let status = engine.status(4);
    let rule = &status.rules[0];
    assert_eq!(rule.policy, "predictive");
    assert_eq!(
        rule.note,
        Some("a limit too small to share among the fleet: decided at the store")
    );
    assert!(
        rule.heavy_keys.iter().any(|k| k.blocked),
        "{:?}",
        rule.heavy_keys
    );
    assert!(engine.key_info("d", &[("user", "alice")]).is_empty());
    assert_eq!(engine.refill("d", &[("user", "alice")], 1).unwrap(), 0);
}

#[tokio::test]
async fn a_small_limit_shared_by_configuration_never_asks_the_store() {
    let (fleet, store, store_clock) = fleet("share");
    store_clock.set(T0);
    fleet.set_time(T0);
    let before = store.operations();
    // The cold share: 20 / (3 instances x 5 spans), rounded up, in the first span.
    let admitted = (0..10).filter(|_| fleet.check(0, "alice").allowed).count();
    assert_eq!(admitted, 2);
    assert_eq!(store.operations(), before, "a check called the store");
}

#[tokio::test]
async fn with_the_store_down_a_small_limit_keeps_to_its_share_and_its_counts_reach_the_store() {
    let (fleet, store, store_clock) = fleet("store");
    let key = CounterKey::new("d/user", &["alice"]);
    let window = window_of(T0, WINDOW_NS);
    let at = |t: u64| {
        store_clock.set(t);
        fleet.set_time(t);
    };
    at(T0);
    // Two decided at the store.
    assert!(fleet.check(0, "alice").allowed);
    assert!(fleet.check(1, "alice").allowed);
    assert_eq!(store.total(key.as_str(), window), 2);
    store.set_available(false);
    // The store fails under the next request: it keeps to instance 2's cold share, 2 a span.
    let admitted = (0..5).filter(|_| fleet.check(2, "alice").allowed).count();
    assert_eq!(admitted, 2);
    fleet.flush_all_failing().await;
    // Known unreachable now: no store call is tried; each instance has its share.
    let admitted = (0..5).filter(|_| fleet.check(0, "alice").allowed).count();
    assert_eq!(admitted, 2);
    store.set_available(true);
    at(T0 + 2 * SECOND + 1);
    fleet.flush_all_ok().await;
    // What the shares admitted reached the counter, once.
    assert_eq!(store.total(key.as_str(), window), 6);
    // Decided at the store again, with what is left: 14 of 20.
    let admitted = (0..30)
        .filter(|n| fleet.check(n % 3, "alice").allowed)
        .count();
    assert_eq!(admitted, 14);
    assert_eq!(store.total(key.as_str(), window), 20);
}

#[tokio::test]
async fn a_store_decision_that_timed_out_is_not_counted_twice() {
    // The store applies the second call and its reply is lost: the key's share admits the
    // request, and the flush does not send it again.
    let clock = ManualClock::new(T0);
    let store = Arc::new(
        common::watched::Watched::new(MemoryStore::new(Arc::new(clock.clone())))
            .losing_exact_reply(1),
    );
    let engine = instance(&clock, store.clone(), 5_000);
    let user = [[("user", "alice")]];
    for _ in 0..3 {
        assert!(engine.check("d", &user, 1).await.unwrap().allowed);
    }
    assert_eq!(store.exact_calls(), 3);
    let report = engine.flush().await;
    assert_eq!(report.failed, 0, "{report:?}");
    let key = CounterKey::new("d/user", &["alice"]);
    assert_eq!(store.inner.total(key.as_str(), window_of(T0, WINDOW_NS)), 3);
}

#[tokio::test]
async fn a_key_spray_costs_the_store_at_most_the_rules_calls_a_second() {
    // 10 calls a second, 2 of them kept for keys decided at the store lately: of 100 new keys
    // in one instant, 8 are decided at the store and 92 by their share (counted here,
    // flushed); each admitted request reaches the store once.
    let clock = ManualClock::new(T0);
    let store = Arc::new(common::watched::Watched::new(MemoryStore::new(Arc::new(
        clock.clone(),
    ))));
    let engine = instance(&clock, store.clone(), 10);
    let users: Vec<String> = (0..100).map(|i| format!("sprayed-{i}")).collect();
    for user in &users {
        assert!(
            engine
                .check("d", &[[("user", user.as_str())]], 1)
                .await
                .unwrap()
                .allowed
        );
    }
    assert_eq!(store.exact_calls(), 8);
    assert_eq!(
        engine.key_info("d", &[("user", users[99].as_str())]).len(),
        1
    );
    // A second later the budget is back.
    clock.set(T0 + SECOND);
    engine.check("d", &[[("user", "later")]], 1).await.unwrap();
    assert_eq!(store.exact_calls(), 9);
    let report = engine.flush().await;
    assert_eq!(report.failed, 0, "{report:?}");
    let window = window_of(T0, WINDOW_NS);
    for user in &users {
        let key = CounterKey::new("d/user", &[user.as_str()]);
        assert_eq!(store.inner.total(key.as_str(), window), 1, "{user}");
    }
}

#[tokio::test]
async fn a_single_instance_shares_a_limit_that_is_small_only_for_a_fleet() {
    // Alone (the store counts one instance, none expected), 20 per 10 s with 5 spans is four
    // a span: not small, so the instance counts locally and asks nothing.
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = Engine::new(
        &small_rule("store"),
        &Default::default(),
        store.clone(),
        Arc::new(clock.clone()),
        EngineOptions {
            shared_store: true,
            ..EngineOptions::default()
        },
    );
    engine.announce().await;
    let before = store.operations();
    let admitted = (0..30)
        .filter(|_| {
            now_or_never(engine.check("d", &[[("user", "alice")]], 1))
                .expect("a shared limit waited")
                .unwrap()
                .allowed
        })
        .count();
    assert_eq!(admitted, 20);
    assert_eq!(store.operations(), before);
}

/// The key spray against a limit too small to share: fresh keys spent the rule's store calls
/// each second, and users the store already counted fell back to their share (with three
/// instances expected, a third of 20 per 10 s spread over 5 spans) and were refused although
/// under their limit. A quarter of the calls is kept for keys decided at the store lately: a
/// spray of new keys at 50 times the budget leaves those users every request under their
/// limit, and every key, sprayed or not, stays within its limit at the store.
#[tokio::test]
async fn a_spray_of_new_keys_leaves_store_calls_for_the_users_the_store_counts() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(common::watched::Watched::new(MemoryStore::new(Arc::new(
        clock.clone(),
    ))));
    // 40 calls a second: 30 open to any key, 10 kept for keys decided lately.
    let engine = instance(&clock, store.clone(), 40);
    let users: Vec<String> = (0..5).map(|i| format!("user-{i}")).collect();
    let mut admitted = 0;
    let mut asked = 0;
    let mut sprayed = 0;
    // One request a second per user (10 in the 10 s window, the limit is 20), each second
    // after 2,000 new keys (50 times the budget) have asked first.
    for second in 0..10u64 {
        clock.set(T0 + second * SECOND);
        if second > 0 {
            for i in 0..2_000 {
                let key = format!("spray-{second}-{i}");
                let v = engine
                    .check("d", &[[("user", key.as_str())]], 1)
                    .await
                    .unwrap();
                sprayed += usize::from(v.allowed);
            }
        }
        for user in &users {
            asked += 1;
            let v = engine
                .check("d", &[[("user", user.as_str())]], 1)
                .await
                .unwrap();
            admitted += usize::from(v.allowed);
        }
        engine.flush_due().await;
    }
    assert_eq!(
        admitted, asked,
        "users under their limit refused during the spray"
    );
    let report = engine.flush().await;
    assert_eq!(report.failed, 0, "{report:?}");
    let window = window_of(T0, WINDOW_NS);
    for user in &users {
        let key = CounterKey::new("d/user", &[user.as_str()]);
        assert_eq!(store.inner.total(key.as_str(), window), 10, "{user}");
    }
    // Each sprayed key asked once and counted once.
    let key = CounterKey::new("d/user", &["spray-9-1999"]);
    assert!(store.inner.total(key.as_str(), window) <= 1);
    eprintln!("users: {admitted} of {asked} admitted; spray: {sprayed} of 18,000 admitted");
}

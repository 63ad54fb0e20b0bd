//! A key-spraying attack cannot grow a rule's map beyond its cap, and keys beyond the cap are
//! still limited (by the fixed-size sketch).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use sluice_core::{Clock, ManualClock};
use sluice_engine::{Engine, EngineOptions};
use sluice_store::MemoryStore;

/// A rule of 5 a minute: a limit this small is decided at the store by default
/// (`tests/small_limits.rs`); here the synced rule shares it, to test its map's cap.
fn engine(mode: &str, cap: usize, clock: &ManualClock) -> Engine {
    let small = if mode == "synced" {
        ", small_limits: share"
    } else {
        ""
    };
    let rules = rules(&format!(
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {{ unit: minute, requests_per_unit: 5, mode: {mode}{small} }}\n"
    ));
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let store = Arc::new(MemoryStore::new(clock.clone()));
    Engine::new(
        &rules,
        &Default::default(),
        store,
        clock,
        EngineOptions {
            max_keys_per_rule: cap,
            shared_store: mode == "synced",
            ..EngineOptions::default()
        },
    )
}

#[tokio::test]
async fn spraying_keys_is_capped_and_still_limited() {
    for mode in ["local", "synced"] {
        let clock = ManualClock::new(T0);
        let engine = engine(mode, 1000, &clock);
        let mut fresh_denied = 0;
        for i in 0..50_000u32 {
            let ip = format!("2001:db8::{i:x}");
            let v = now_or_never(engine.check("d", &[[("ip", ip.as_str())]], 1))
                .unwrap()
                .unwrap();
            if !v.allowed {
                fresh_denied += 1;
            }
        }
        // Tracked keys are exact; keys in the sketch share cells, which over-estimates: a few
        // fresh keys may be denied under such an attack, never many.
        assert!(
            fresh_denied < 500,
            "{mode}: {fresh_denied} of 49000 sketched fresh keys denied"
        );
        // The map holds the cap; the rest went to the sketch, which still enforces the limit
        // for a key beyond the cap.
        let report = engine.flush().await;
        assert_eq!(report.failed, 0);
        let beyond = [[("ip", "198.51.100.7")]];
        let admitted = (0..20)
            .filter(|_| {
                now_or_never(engine.check("d", &beyond, 1))
                    .unwrap()
                    .unwrap()
                    .allowed
            })
            .count();
        // The sketch's documented bound: the limit plus 4.5 x sqrt(the cost it admitted / 16,384).
        let bound = 5 + sketch_excess_bound(49_000 - fresh_denied as u64) as usize;
        assert!(
            admitted <= bound,
            "{mode}: key beyond the cap admitted {admitted} > {bound}"
        );
        // Tracked keys (from the metric the flush sets) never exceed the cap.
        let tracked = match mode {
            "synced" => engine.key_info("d", &[("ip", "2001:db8::0")]).len(),
            _ => 1,
        };
        assert_eq!(tracked, 1, "{mode}: the first keys are tracked");
        assert!(
            engine.key_info("d", &[("ip", "2001:db8::c350")]).is_empty(),
            "{mode}: a key beyond the cap is tracked"
        );
    }
}

#[tokio::test]
async fn keys_beyond_the_cap_of_a_synced_rule_keep_to_this_instances_share() {
    // Sketched keys are not synced, so with 4 instances expected each admits a quarter of the
    // limit (20 per minute of 80) for them; tracked keys get the whole limit.
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 80, mode: synced }\n",
    );
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let engine = Engine::new(
        &rules,
        &Default::default(),
        Arc::new(MemoryStore::new(shared.clone())),
        shared,
        EngineOptions {
            max_keys_per_rule: 1,
            shared_store: true,
            expected_instances: 4,
            ..EngineOptions::default()
        },
    );
    let admitted = |ip: &str| {
        (0..100)
            .filter(|_| {
                now_or_never(engine.check("d", &[[("ip", ip)]], 1))
                    .unwrap()
                    .unwrap()
                    .allowed
            })
            .count()
    };
    // The tracked key: cold start keeps to MAX/(4 * 6 spans) = 3.3, rounded up to 4, in the
    // first span. The first reply shows this instance alone, but 4 are expected and instances
    // flushing at the same moment may not be in it yet: the 3 missing are taken to have done
    // what this one did (4 each), and this instance gets a quarter of the room left, 16.
    assert_eq!(admitted("192.0.2.1"), 4);
    // The replies to the flush at the window's start say nothing of who counts in the window
    // yet: the span after it is the first to tell.
    clock.advance(Duration::from_secs(10));
    engine.flush().await;
    assert_eq!(admitted("192.0.2.1"), 16);
    // A second reply to a span's flush still shows it alone, but may have come before the
    // flushes of this boundary of instances that started counting since the last one: the
    // read it asks for, once those have landed, settles it alone, and it gets the rest.
    engine.flush().await;
    assert!(engine.early_sync_wanted());
    clock.advance(sluice_engine::READ_AHEAD_MARGIN);
    engine.flush_early().await;
    assert_eq!(admitted("192.0.2.1"), 60);
    assert_eq!(admitted("192.0.2.2"), 20, "a key beyond the cap");
}

/// The cost-overflow bypass: at the key cap, a denied key sent with a huge cost was answered OK
/// and wrapped the sketch's counters so that the next normal request passed too. Every mode
/// now refuses a cost above the cap, answers a cost above the rule's limit with
/// `CostExceedsLimit`, and keeps counting the key as before.
#[tokio::test]
async fn a_huge_cost_is_never_an_admission_and_never_wraps_a_count() {
    use sluice_engine::{EngineError, Outcome};
    for mode in ["local", "synced"] {
        let clock = ManualClock::new(T0);
        let engine = engine(mode, 1, &clock);
        let tracked = [[("ip", "10.0.0.1")]];
        assert!(
            now_or_never(engine.check("d", &tracked, 1))
                .unwrap()
                .unwrap()
                .allowed
        );
        // Beyond the cap: the sketch decides. Use up the key's limit of 5.
        let beyond = [[("ip", "10.0.0.2")]];
        for _ in 0..5 {
            assert!(
                now_or_never(engine.check("d", &beyond, 1))
                    .unwrap()
                    .unwrap()
                    .allowed
            );
        }
        for cost in [u64::MAX, u64::from(u32::MAX) + 1, sluice_core::MAX_COST + 1] {
            let e = now_or_never(engine.check("d", &beyond, cost)).unwrap();
            assert!(
                matches!(e, Err(EngineError::CostTooLarge { descriptor: 0, .. })),
                "{mode}: cost {cost}: {e:?}"
            );
            let v =
                now_or_never(engine.check_each("d", &[beyond[0], tracked[0]], &[1, cost])).unwrap();
            assert!(
                v.is_err(),
                "{mode}: a second descriptor's cost is checked too"
            );
        }
        for key in [&beyond, &tracked] {
            let v = now_or_never(engine.check("d", key, sluice_core::MAX_COST))
                .unwrap()
                .unwrap();
            assert!(!v.allowed, "{mode}: a cost above the limit is a denial");
            assert_eq!(v.statuses[0].outcome, Outcome::CostExceedsLimit);
        }
        let v = now_or_never(engine.check("d", &beyond, 1))
            .unwrap()
            .unwrap();
        assert!(!v.allowed, "{mode}: the key stays at its limit");
        let admitted = (0..10)
            .filter(|_| {
                now_or_never(engine.check("d", &tracked, 1))
                    .unwrap()
                    .unwrap()
                    .allowed
            })
            .count();
        assert_eq!(admitted, 4, "{mode}: the tracked key keeps its exact count");
    }
}

/// Exact mode at its key cap: with the store down and `on_store_error: local`, a spray of new
/// keys is denied instead of growing the fallback limiter; keys it already tracks go on.
#[tokio::test]
async fn exact_mode_stops_growing_at_the_key_cap_during_an_outage() {
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 5, mode: exact, on_store_error: local }\n",
    );
    let clock = ManualClock::new(T0);
    let clock: Arc<dyn Clock> = Arc::new(clock);
    let store = Arc::new(MemoryStore::new(clock.clone()));
    let engine = Engine::new(
        &rules,
        &Default::default(),
        store.clone(),
        clock,
        EngineOptions {
            max_keys_per_rule: 10,
            ..EngineOptions::default()
        },
    );
    store.set_available(false);
    let mut allowed = 0;
    for i in 0..1000u32 {
        let ip = format!("10.0.{}.{}", i / 256, i % 256);
        if engine
            .check("d", &[[("ip", ip.as_str())]], 1)
            .await
            .unwrap()
            .allowed
        {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10, "only the first 10 keys fit under the cap");
    let known = [[("ip", "10.0.0.0")]];
    assert!(
        engine.check("d", &known, 1).await.unwrap().allowed,
        "a tracked key goes on"
    );
}

/// How far beyond its limit the overflow sketch may admit a key once it has admitted costs
/// whose squares sum to `admitted_sq` in the window (docs/RELIABILITY.md):
/// 4.5 x sqrt(admitted_sq / 16,384).
fn sketch_excess_bound(admitted_sq: u64) -> u64 {
    (4.5 * (admitted_sq as f64 / 16_384.0).sqrt()).ceil() as u64
}

/// The overflow-sketch saturation attack: one client sprays 2,000,000 keys beyond a cap of
/// 1,000 in one window. With a plain count-min estimate every cell then held about the limit
/// and new users were refused (9 of 40 admitted). The count-mean-min estimate takes each row's
/// noise floor away: new users under their limit are admitted on their first request, and a
/// heavy key is still held within the documented bound of its limit.
#[tokio::test]
async fn a_sketch_saturated_by_a_key_spray_still_admits_new_users() {
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    );
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let engine = Engine::new(
        &rules,
        &Default::default(),
        Arc::new(MemoryStore::new(shared.clone())),
        shared,
        EngineOptions {
            max_keys_per_rule: 1000,
            shared_store: false,
            ..EngineOptions::default()
        },
    );
    let check = |ip: &str| {
        now_or_never(engine.check("d", &[[("ip", ip)]], 1))
            .unwrap()
            .unwrap()
            .allowed
    };
    // 22 s of spray, 2,000,000 distinct keys.
    let mut sketched = 0u64;
    for i in 0..2_000_000u32 {
        if i % 100_000 == 0 {
            clock.advance(Duration::from_secs(1));
        }
        if check(&format!("2001:db8::{i:x}")) && i >= 1000 {
            sketched += 1;
        }
    }
    let new_users = |tag: &str| {
        (0..40)
            .filter(|n| check(&format!("198.51.100.{n}-{tag}")))
            .count()
    };
    let first = new_users("a");
    assert!(first >= 38, "{first} of 40 new users admitted");
    clock.advance(Duration::from_secs(20));
    let later = new_users("b");
    assert!(later >= 38, "{later} of 40 new users admitted 20 s later");
    // A heavy key beyond the cap is held within the bound.
    let heavy = (0..1000).filter(|_| check("203.0.113.9")).count() as u64;
    let bound = 5 + sketch_excess_bound(sketched + 80 + heavy);
    assert!(
        (1..=bound).contains(&heavy),
        "a heavy key admitted {heavy} times; the bound is {bound} (sketch admitted {sketched})"
    );
    eprintln!("new users {first}/40, {later}/40; heavy key {heavy} of limit 5 (bound {bound})");
}

/// The costly spray: 500,000 keys at cost 5 (each its whole limit) beyond a cap of 1,000 raise
/// a cell's noise deviation to 28 where 2,000,000 one-request keys raised it to 11; with the
/// smallest row's estimate one heavy key then got 51 of 60 (10 x its limit of 5). The median
/// of its rows holds it to its limit plus 4.5 deviations (126), about 40 in practice, while
/// new users are still admitted.
#[tokio::test]
async fn a_costly_spray_does_not_let_a_heavy_key_hide_in_the_noise() {
    let rules = rules(
        "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n",
    );
    let clock = ManualClock::new(T0);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let engine = Engine::new(
        &rules,
        &Default::default(),
        Arc::new(MemoryStore::new(shared.clone())),
        shared,
        EngineOptions {
            max_keys_per_rule: 1000,
            shared_store: false,
            ..EngineOptions::default()
        },
    );
    let check = |ip: &str, cost: u64| {
        now_or_never(engine.check("d", &[[("ip", ip)]], cost))
            .unwrap()
            .unwrap()
            .allowed
    };
    // 15 s of spray, 500,000 distinct keys at cost 5.
    let mut sketched = 0u64;
    for i in 0..500_000u32 {
        if i % 33_334 == 0 {
            clock.advance(Duration::from_secs(1));
        }
        if check(&format!("2001:db8::{i:x}"), 5) && i >= 1000 {
            sketched += 1;
        }
    }
    let new_users = (0..40)
        .filter(|n| check(&format!("198.51.100.{n}"), 1))
        .count();
    let heavy = (0..1000).filter(|_| check("203.0.113.9", 1)).count() as u64;
    let bound = 5 + sketch_excess_bound(sketched * 25 + 40 + heavy);
    eprintln!(
        "costly spray: new users {new_users}/40; heavy key {heavy} of limit 5 (bound {bound})"
    );
    assert!(new_users >= 38, "{new_users} of 40 new users admitted");
    assert!(
        (1..=bound).contains(&heavy),
        "a heavy key admitted {heavy} times; the bound is {bound} (sketch admitted {sketched} keys)"
    );
}

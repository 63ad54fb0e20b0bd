//! RLQS with several Sluice instances on one store (in the test's process, manual clocks):
//! each instance hands its Envoys its part of the room, by the demand the store's entries
//! carry; usage beyond the room is counted; assignments go out when they change materially
//! or near their end.

mod common;
#[path = "common/rlqs.rs"]
mod rlqs;

use rlqs::*;
use sluice_core::{Clock, ManualClock};
use sluice_engine::Engine;
use sluice_store::MemoryStore;

const T0: u64 = 60_000_000_000_000;
const SECOND: u64 = 1_000_000_000;

/// 600 a minute for `user`, synced, in spans of 5 s.
const SYNCED: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 600, spans: 12 }\n";

fn instance(node: &str, clock: &ManualClock, store: &Arc<MemoryStore>) -> SharedEngine {
    let rules = sluice_config::RuleSet::new(vec![
        sluice_config::parse_domain(std::path::Path::new("rules.yaml"), SYNCED).unwrap(),
    ])
    .unwrap();
    let options = sluice_engine::EngineOptions {
        node_id: Some(node.to_owned()),
        shared_store: true,
        ..Default::default()
    };
    let clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let engine = Engine::new(&rules, &Default::default(), store.clone(), clock, options);
    Arc::new(ArcSwap::from_pointee(engine))
}

fn alice() -> BucketId {
    bucket(&[("user", "alice")])
}

#[tokio::test]
async fn instances_hand_out_the_room_by_their_demand() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()) as Arc<dyn Clock>));
    let (a, b) = (instance("a", &clock, &store), instance("b", &clock, &store));
    for e in [&a, &b, &a] {
        e.load().announce().await;
    }
    assert_eq!(b.load().fleet_size(), 2);
    // 30 s of alice's requests admitted through each instance, 6:1 (7 a second of a limit of
    // 10), flushed as the flush loop does.
    for _ in 0..30 {
        for (engine, n) in [(&a, 6), (&b, 1)] {
            let code = engine.load().record("d", &[("user", "alice")], n).unwrap();
            assert_eq!(code, 1);
        }
        clock.set(clock.now() + SECOND);
        for engine in [&a, &b] {
            engine.load().flush_due().await;
        }
    }
    // An Envoy on each instance reports: each is its instance's only one, so it gets its
    // instance's part of the room.
    let mut per = Vec::new();
    for engine in [&a, &b] {
        let s = server_on(engine.clone(), RlqsLimits::default()).await;
        let (tx, mut inbox) = open(s.addr).await.unwrap();
        tx.send(report("d", vec![usage(alice(), 0, 0)]))
            .await
            .unwrap();
        per.push(per_interval(
            actions(&next(&mut inbox).await)[&name(&alice())].0,
        ));
    }
    // About 390 left over 30 s: the fleet's Envoys may admit a sixth of it (the pace; no
    // burst saved where instances share the room) before their next reports, which the two
    // assignments share (the parts add up to the room, up to what one instance flushed after
    // the other last read it: a second of its requests here).
    let parts: Vec<_> = [&a, &b]
        .iter()
        .map(|e| e.load().fleet_parts("d", &[("user", "alice")])[0].clone())
        .collect();
    let fleet = parts[0].room.unwrap() as f64 / 6.0;
    eprintln!("per interval: {per:?} of {fleet}; {parts:?}");
    assert!((60.0..=70.0).contains(&fleet), "{parts:?}");
    assert!(per[0] + per[1] <= 1.03 * fleet, "{per:?}");
    // By their admissions (with 30% of the room kept evenly, `FLEET_PART_FLOOR`): about 0.75
    // and 0.25 of it at 6:1, where an even split gave each instance half.
    assert!(per[0] >= 2.5 * per[1], "{per:?}");
    assert!(per[0] >= 0.7 * fleet, "{per:?}");
    assert!(per[1] >= 1.0, "{per:?}");
}

#[tokio::test]
async fn usage_beyond_the_room_is_counted() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()) as Arc<dyn Clock>));
    let engine = instance("a", &clock, &store);
    let s = server_on(engine.clone(), RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    // An Envoy on its fallback before its first assignment let 900 through: all of them
    // count, so the next window's assignments leave out what this one took beyond its limit.
    tx.send(report("d", vec![usage(alice(), 900, 0)]))
        .await
        .unwrap();
    let answer = actions(&next(&mut inbox).await);
    assert_eq!(
        answer[&name(&alice())].0,
        Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32))
    );
    let info = engine.load().key_info("d", &[("user", "alice")]);
    assert_eq!(info[0].local, 900, "{info:?}");
    // A report of more than any cost may be (a lying Envoy) counts at most that much: the
    // counts saturate, nothing overflows.
    tx.send(report("", vec![usage(alice(), u64::MAX, 0)]))
        .await
        .unwrap();
    tx.send(report("", vec![usage(bucket(&[("user", "bob")]), 1, 0)]))
        .await
        .unwrap();
    next(&mut inbox).await;
    let info = engine.load().key_info("d", &[("user", "alice")]);
    assert_eq!(info[0].local, 900 + sluice_core::MAX_COST, "{info:?}");
}

#[tokio::test]
async fn an_unchanged_assignment_is_not_sent_again_and_a_material_change_is() {
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone()) as Arc<dyn Clock>));
    let engine = instance("a", &clock, &store);
    let s = server_on(engine, RlqsLimits::default()).await;
    let (tx, mut inbox) = open(s.addr).await.unwrap();
    // Nothing used: 600 over the minute, a pace of 50 and up to 300 saved.
    tx.send(report("d", vec![usage(alice(), 0, 0)]))
        .await
        .unwrap();
    let first = actions(&next(&mut inbox).await)[&name(&alice())].0;
    assert!((340.0..=350.0).contains(&per_interval(first)), "{first:?}");
    // 5 s on, a little used: the same numbers within 2%; no answer (Envoy keeps its token
    // bucket, which holds less than a new one would, and its time to live runs on).
    clock.set(T0 + 5 * SECOND);
    tx.send(report("", vec![usage(alice(), 5, 0)]))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_millis(300), inbox.message()).await;
    assert!(
        answer.is_err(),
        "an answer to an unchanged assignment: {answer:?}"
    );
    // 10 s after it was sent: still no answer, as it lives until the window ends and a report
    // interval more, at most a window (60 s here; renewed when at most two report intervals
    // of it are left: renew.rs).
    clock.set(T0 + 10 * SECOND);
    tx.send(report("", vec![usage(alice(), 5, 0)]))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_millis(300), inbox.message()).await;
    assert!(answer.is_err(), "an answer 10 s on: {answer:?}");
    // Most of the room used at once: a material change, sent at once.
    clock.set(T0 + 11 * SECOND);
    tx.send(report("", vec![usage(alice(), 400, 0)]))
        .await
        .unwrap();
    let (changed, ttl) = actions(&next(&mut inbox).await)[&name(&alice())];
    assert!(
        per_interval(changed) < 0.5 * per_interval(first),
        "{changed:?}"
    );
    // 49 s of the window left, and a report interval.
    assert_eq!(ttl, 54);
}

//! What a front door that hands a rule's room on to its clients (RLQS) reads of the engine:
//! each instance's part of a synced key's room follows the instances' demand as the store's
//! entries carry it, the parts add up to at most the room, and usage admitted elsewhere is
//! recorded without a decision (bounded, cost-checked).

mod common;

use std::sync::Arc;

use common::*;
use sluice_core::{MAX_COST, ManualClock};
use sluice_engine::{EngineError, FLEET_PART_FLOOR, FleetPart};
use sluice_store::MemoryStore;

/// Two instances on one store, a synced rule of 300 a minute in spans of 5 s.
async fn two_instances() -> (Fleet, ManualClock) {
    let rules = synced_rule(300, "60s", 12, "predictive", "fixed_window");
    let store_clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(store_clock.clone())));
    let fleet = Fleet::new(&rules, store, &[0, 0], true);
    for i in &fleet.instances {
        i.engine.announce().await;
    }
    fleet.instances[0].engine.announce().await;
    (fleet, store_clock)
}

fn part(fleet: &Fleet, i: usize) -> FleetPart {
    let parts = fleet.instances[i]
        .engine
        .fleet_parts("d", &[("user", "alice")]);
    assert_eq!(parts.len(), 1, "{parts:?}");
    parts.into_iter().next().unwrap()
}

/// Records `per_second[i]` requests a second of alice on instance `i` for `seconds`, flushing
/// as the flush loop does.
async fn drive(
    fleet: &Fleet,
    store_clock: &ManualClock,
    t: &mut u64,
    per_second: [u64; 2],
    seconds: u64,
) {
    for _ in 0..seconds {
        store_clock.set(*t);
        fleet.set_time(*t);
        for (i, n) in per_second.iter().enumerate() {
            let recorded = fleet.instances[i]
                .engine
                .record("d", &[("user", "alice")], *n)
                .unwrap();
            assert_eq!(recorded, usize::from(*n > 0));
        }
        fleet.flush_due().await;
        // The early syncs the replies asked for, when the flush loop sends them.
        for i in &fleet.instances {
            if i.engine.early_sync_wanted() {
                let at = i
                    .engine
                    .early_sync_not_before()
                    .max(*t + sluice_engine::EARLY_SYNC_DELAY.as_nanos() as u64);
                store_clock.set(at);
                fleet.set_time(at);
                i.engine.flush_early().await;
            }
        }
        *t += SECOND;
    }
}

#[tokio::test]
async fn parts_follow_demand_and_add_up_to_at_most_the_room() {
    let (fleet, store_clock) = two_instances().await;
    assert_eq!(fleet.instances[1].engine.fleet_size(), 2);
    let mut t = T0;
    // Demand 9:1, twice the limit's pace (5 a second) in all, recorded whatever the room.
    drive(&fleet, &store_clock, &mut t, [9, 1], 50).await;
    let (a, b) = (part(&fleet, 0), part(&fleet, 1));
    eprintln!("{a:?} {b:?}");
    assert!(a.part + b.part <= 1.01, "{a:?} {b:?}");
    // The floor split evenly, the rest by demand: 0.15 + 0.7 x 0.9 and 0.15 + 0.7 x 0.1.
    assert!((0.7..=0.85).contains(&a.part), "{a:?}");
    assert!((FLEET_PART_FLOOR / 2.0..=0.3).contains(&b.part), "{b:?}");
    // The room is the fleet's by the estimate: 500 recorded against 300, none left.
    assert_eq!((a.room, b.room), (Some(0), Some(0)));
    // Demand turns: the parts follow the admissions of about the last window. While they
    // turn, each instance reads the other's count as of its last flush, and its own as of its
    // own: the parts may add up to more, a tenth here for a few seconds.
    drive(&fleet, &store_clock, &mut t, [1, 9], 30).await;
    let (a, b) = (part(&fleet, 0), part(&fleet, 1));
    eprintln!("{a:?} {b:?}");
    assert!(b.part > 0.3, "{a:?} {b:?}");
    assert!(a.part + b.part <= 1.15, "{a:?} {b:?}");
    drive(&fleet, &store_clock, &mut t, [1, 9], 40).await;
    let (a, b) = (part(&fleet, 0), part(&fleet, 1));
    eprintln!("{a:?} {b:?}");
    assert!(a.part + b.part <= 1.01, "{a:?} {b:?}");
    assert!((0.7..=0.85).contains(&b.part), "{b:?}");
}

#[tokio::test]
async fn an_instance_alone_on_a_key_has_the_whole_room_and_one_that_starts_gets_room_at_once() {
    let (fleet, store_clock) = two_instances().await;
    let mut t = T0;
    drive(&fleet, &store_clock, &mut t, [4, 0], 30).await;
    let a = part(&fleet, 0);
    assert_eq!(a.part, 1.0, "{a:?}");
    // 120 recorded of 300: the room is the rest (the estimate's extrapolation aside).
    assert!(a.room.is_some_and(|r| r <= 180), "{a:?}");
    // The other instance's clients start: its part is never nothing, and once the store has
    // told both of each other, the parts follow their admissions.
    fleet.instances[1]
        .engine
        .record("d", &[("user", "alice")], 1)
        .unwrap();
    let b = part(&fleet, 1);
    assert!(b.part >= FLEET_PART_FLOOR / 2.0, "{b:?}");
    drive(&fleet, &store_clock, &mut t, [4, 4], 25).await;
    let (a, b) = (part(&fleet, 0), part(&fleet, 1));
    eprintln!("{a:?} {b:?}");
    assert!(b.part >= 0.25 && a.part >= 0.5, "{a:?} {b:?}");
    // Still turning (the window's counts are mostly the first instance's): a little more.
    assert!(a.part + b.part <= 1.1, "{a:?} {b:?}");
}

#[tokio::test]
async fn usage_admitted_elsewhere_is_counted_and_flushed_whatever_the_room() {
    let (fleet, store_clock) = two_instances().await;
    store_clock.set(T0);
    let a = &fleet.instances[0].engine;
    // Far beyond the limit: counted in full (no decision refuses it).
    assert_eq!(a.record("d", &[("user", "alice")], 1_000).unwrap(), 1);
    let info = a.key_info("d", &[("user", "alice")]);
    assert_eq!(info[0].local, 1_000, "{info:?}");
    assert_eq!(info[0].unflushed, 1_000, "{info:?}");
    // The other instance (its first request on its share before it hears of the others)
    // learns of it from the store, and refuses.
    assert!(fleet.check(1, "alice").allowed);
    fleet.flush_all_ok().await;
    assert!(!fleet.check(1, "alice").allowed);
    // Bounded: above MAX_COST refused before any rule counts; unknown domains refused.
    assert_eq!(
        a.record("d", &[("user", "bob")], MAX_COST + 1),
        Err(EngineError::CostTooLarge {
            descriptor: 0,
            cost: MAX_COST + 1
        })
    );
    assert!(a.key_info("d", &[("user", "bob")]).is_empty());
    assert!(matches!(
        a.record("nowhere", &[("user", "bob")], 1),
        Err(EngineError::UnknownDomain(_))
    ));
    // Counts saturate: MAX_COST five times over stays a 32-bit count, no overflow.
    for _ in 0..5 {
        a.record("d", &[("user", "carol")], MAX_COST).unwrap();
    }
    let info = a.key_info("d", &[("user", "carol")]);
    assert_eq!(info[0].local, u64::from(u32::MAX), "{info:?}");
}

#[tokio::test]
async fn recording_never_tracks_a_key_beyond_the_rules_cap() {
    let rules = synced_rule(300, "60s", 6, "predictive", "fixed_window");
    let clock = ManualClock::new(T0);
    let store = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
    let engine = sluice_engine::Engine::new(
        &rules,
        &Default::default(),
        store,
        Arc::new(clock),
        sluice_engine::EngineOptions {
            max_keys_per_rule: 2,
            ..Default::default()
        },
    );
    for user in ["a", "b", "c", "d"] {
        let took = engine.record("d", &[("user", user)], 1).unwrap();
        assert_eq!(took, usize::from(user < "c"), "{user}");
    }
    assert!(engine.key_info("d", &[("user", "c")]).is_empty());
}

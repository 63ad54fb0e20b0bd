//! The budget an instance takes at its first read of a key it met in a burst, when the others
//! it reads of were last heard of before the burst.

use std::sync::Arc;

use sluice_core::Nanos;
use sluice_store::{FlushOutcome, NodeEntry};

use super::tests::{SECOND, allowed, node_entry, rule};
use crate::health::StoreView;

/// Another instance's entry: `count` in the window, flushed at `at`, a trickle of 0.1/s.
fn trickling(node: &str, count: u64, at: Nanos) -> NodeEntry {
    NodeEntry {
        rate_milli: 100,
        ..node_entry(node, count, at)
    }
}

/// Three instances, 300 a minute over 4 spans (a cold share of 25 a span). This instance meets
/// the key in a burst 5 s into a span, spends its cold share in a quarter second, and reads
/// the store early: the reply lists two others that trickled, their entries flushed at
/// `others_at`. Returns how many of 300 more requests it admits after the read.
fn admitted_after_the_cold_read(others_at: impl Fn(Nanos) -> Nanos) -> u32 {
    let window = 60 * SECOND;
    let fleet = StoreView::answering(3);
    let me: Arc<str> = Arc::from("me");
    let mut r = rule(300, window, 0);
    r.params.expected_instances = 3;
    let burst = 100 * window + window / 4 + 5 * SECOND;
    let mut asked = false;
    for i in 0..25 {
        let d = r.check("k", burst + i * 10_000_000, 1, fleet);
        assert!(allowed(&d), "the cold share's request {i}: {d:?}");
        asked |= d.2;
    }
    assert!(asked, "a spent cold share asks for an early sync");
    let now = burst + 300_000_000;
    let (mut items, mut pending) = (Vec::new(), Vec::new());
    r.prepare_early(now, &me, &mut items, &mut pending);
    assert_eq!(pending.len(), 1);
    let outcome = FlushOutcome {
        total: 27,
        previous_total: items[0].want_previous.then_some(0),
        entries: vec![
            node_entry("me", 25, now),
            trickling("a", 1, others_at(now)),
            trickling("b", 1, others_at(now)),
        ],
    };
    let outcomes = vec![outcome; items.len()];
    assert!(r.apply(&pending[0], |i| outcomes.get(i), "me", (now, fleet)));
    (0..300)
        .filter(|&i| allowed(&r.check("k", now + 1_000_000 + i * 1_000, 1, fleet)))
        .count() as u32
}

#[test]
fn a_cold_read_counts_the_others_heard_of_before_the_burst_as_bursting_too() {
    // Their entries are from the span's boundary, 5 s before the read: the trickle's rate
    // says nothing of whether they met the burst too, and each may hold a third of the room
    // set at its first request. This instance takes a third of what it read is left (273),
    // where, split by the others' trickle, it took nearly all of it.
    let stale = admitted_after_the_cold_read(|now| now - 5 * SECOND);
    assert!((80..=95).contains(&stale), "{stale}");
    // Heard of a moment before the read at a trickle's rate: they do trickle, and the room is
    // this instance's demand's.
    let fresh = admitted_after_the_cold_read(|now| now - 100_000_000);
    assert!(fresh >= 200, "{fresh}");
}

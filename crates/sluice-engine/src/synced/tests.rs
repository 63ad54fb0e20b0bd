//! `SyncedRule` over its keys: flushes, replies, windows, the shared state's lifecycle.

use std::sync::Arc;

use sluice_config::Policy;
use sluice_core::{Decision, Nanos};
use sluice_store::{FlushOutcome, NodeEntry};

use super::{KeyState, PendingFlush, SyncedParams, SyncedRule};
use crate::health::{StoreHealth, StoreView};

const ANSWERING: StoreView = StoreView::answering(1);
const UNREACHABLE: StoreView = StoreView {
    health: StoreHealth::Unreachable,
    fleet: 1,
};
use crate::verdict::Reason;

/// Applies `outcomes` (one per item of the flush) to a key's pending flush.
fn answer(r: &SyncedRule, p: &PendingFlush, outcomes: &[FlushOutcome], t: Nanos) -> bool {
    r.apply(p, |i| outcomes.get(i), "me", (t, ANSWERING))
}

pub(super) const SECOND: u64 = 1_000_000_000;

pub(super) fn rule(limit: u64, window_ns: u64, cooldown_ns: u64) -> SyncedRule {
    let params = SyncedParams {
        limit,
        window_ns,
        spans: 4,
        span_ns: window_ns / 4,
        cooldown_ns,
        policy: Policy::Predictive,
        sliding: false,
        expected_instances: 1,
    };
    SyncedRule::new(
        params,
        Arc::from("d/user"),
        (sluice_config::SmallLimits::Share, 1),
    )
}

pub(super) fn allowed(d: &(Decision, Option<Reason>, bool)) -> bool {
    matches!(d.0, Decision::Allowed(_))
}

#[test]
fn the_window_number_survives_its_low_32_bits_wrapping() {
    let core = KeyState::in_window(u32::MAX);
    let w = (1u64 << 32) + 1;
    assert_eq!(core.key_window(w), (1u64 << 32) - 1);
    let ahead = KeyState::in_window(2);
    // A clock that went back: the key's window is ahead of now's.
    assert_eq!(ahead.key_window((1u64 << 32) + 1), (1u64 << 32) + 2);
}

#[test]
fn a_cooldown_that_crosses_the_window_end_keeps_its_time() {
    let window = 60 * SECOND;
    let r = rule(10, window, 40 * SECOND);
    let t0 = 1_000 * window + 50 * SECOND;
    let mut items = Vec::new();
    let mut pending = Vec::new();
    assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
    let outcome = FlushOutcome {
        total: 11,
        previous_total: Some(0),
        entries: Vec::new(),
    };
    answer(&r, &pending[0], &[outcome], t0);
    // Blocked for 40 s from t0, i.e. 30 s into the next window.
    let (d, reason, _) = r.check("k", t0 + 39 * SECOND, 1, ANSWERING);
    assert_eq!(reason, Some(Reason::GlobalBlock));
    let Decision::Denied(denied) = d else {
        panic!("{d:?}")
    };
    let retry = denied.retry_after.as_nanos() as u64;
    assert!((SECOND..SECOND + 1_000).contains(&retry), "{retry}");
    assert!(allowed(&r.check(
        "k",
        t0 + 40 * SECOND + 1_000,
        1,
        ANSWERING
    )));
}

/// A flush of `key` at `t` answered with `total` (and `previous` for the last window).
fn flush_with(r: &SyncedRule, key_total: (u64, Option<u64>), t: Nanos) {
    let mut items = Vec::new();
    let mut pending = Vec::new();
    r.prepare_flush(t, &Arc::from("me"), &mut items, &mut pending);
    let outcome = FlushOutcome {
        total: key_total.0,
        previous_total: key_total.1,
        entries: Vec::new(),
    };
    let outcomes = vec![outcome; items.len()];
    for p in &pending {
        answer(r, p, &outcomes, t);
    }
}

#[test]
fn a_penalty_of_three_windows_outlasts_two_window_rolls() {
    let window = 10 * SECOND;
    let r = rule(10, window, 30 * SECOND);
    let t0 = 1_000 * window + 4 * SECOND;
    assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    flush_with(&r, (11, Some(0)), t0);
    for later in [SECOND, 7 * SECOND, 16 * SECOND, 29 * SECOND] {
        let (d, reason, _) = r.check("k", t0 + later, 1, ANSWERING);
        assert_eq!(reason, Some(Reason::GlobalBlock), "{later} ns after: {d:?}");
    }
    assert!(allowed(&r.check(
        "k",
        t0 + 30 * SECOND + 1_000,
        1,
        ANSWERING
    )));
}

#[test]
fn demand_beyond_the_limit_starts_a_penalty_and_demand_within_it_does_not() {
    let window = 10 * SECOND;
    let t0 = 1_000 * window + SECOND;
    // Another instance counted 3 and takes 20 a second: the estimate of its count grows
    // faster than what it had counted, so requests are refused with the total read (6)
    // still under the limit.
    let r = rule(10, window, 30 * SECOND);
    for _ in 0..3 {
        assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    }
    let mut items = Vec::new();
    let mut pending = Vec::new();
    r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
    let mut other = node_entry("other", 3, t0);
    other.rate_milli = 20_000;
    let outcome = FlushOutcome {
        total: 6,
        previous_total: Some(0),
        entries: vec![node_entry("me", 3, t0), other],
    };
    answer(&r, &pending[0], &vec![outcome; items.len()], t0);
    let mut reasons = Vec::new();
    for i in 0..12 {
        reasons.push(
            r.check("k", t0 + 300_000_000 + i * 10_000_000, 1, ANSWERING)
                .1,
        );
    }
    // Refused requests are demand beyond what was admitted: once what is known for certain
    // (admitted here, the others' count read, refused here) passes the limit, the penalty
    // starts, though the total read never reached it.
    let first_block = reasons.iter().position(|r| *r == Some(Reason::GlobalBlock));
    assert!(first_block.is_some(), "{reasons:?}");
    assert!(reasons.contains(&Some(Reason::Estimate)), "{reasons:?}");
    assert!(
        reasons[first_block.unwrap()..]
            .iter()
            .all(|r| *r == Some(Reason::GlobalBlock)),
        "{reasons:?}"
    );
    // The key is counted up to one over the limit, so every instance's next reply shows it.
    let mut items = Vec::new();
    r.prepare_flush(t0 + SECOND, &Arc::from("me"), &mut items, &mut Vec::new());
    let sent: u64 = items.iter().map(|i| i.delta).sum();
    assert_eq!(6 + sent, 11, "the store's total after the flush");

    // Demand that stays within the limit never starts one, though the estimate (the
    // others' rate) refuses some of it.
    let r = rule(10, window, 30 * SECOND);
    for _ in 0..3 {
        assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    }
    flush_with(&r, (6, Some(0)), t0);
    for i in 1..=4 {
        let (_, reason, _) = r.check("k", t0 + i * 10_000_000, 1, ANSWERING);
        assert_ne!(reason, Some(Reason::GlobalBlock), "request {i}");
    }
}

#[test]
fn an_instance_that_hears_of_a_penalty_in_the_next_window_applies_it() {
    let window = 10 * SECOND;
    let r = rule(10, window, 30 * SECOND);
    let previous_start = 1_000 * window;
    let t1 = previous_start + window + SECOND;
    // This instance never saw the key go over; its first flush in the new window learns
    // that the last window's total was over the limit.
    assert!(allowed(&r.check("k", t1, 1, ANSWERING)));
    flush_with(&r, (1, Some(14)), t1);
    let (d, reason, _) = r.check("k", t1 + SECOND, 1, ANSWERING);
    assert_eq!(reason, Some(Reason::GlobalBlock), "{d:?}");
    // Until the earliest end the penalty can have: 30 s after the last window began.
    let (_, reason, _) = r.check("k", previous_start + 29 * SECOND, 1, ANSWERING);
    assert_eq!(reason, Some(Reason::GlobalBlock));
    assert!(allowed(&r.check(
        "k",
        previous_start + 30 * SECOND + 1_000,
        1,
        ANSWERING
    )));
    // A cooldown within the window is not carried over: it ended with the window.
    let short = rule(10, window, 5 * SECOND);
    assert!(allowed(&short.check("k", t1, 1, ANSWERING)));
    flush_with(&short, (1, Some(14)), t1);
    assert!(allowed(&short.check("k", t1 + SECOND, 1, ANSWERING)));
}

#[test]
fn a_key_idle_for_years_of_spans_starts_afresh() {
    let window = SECOND;
    let r = rule(5, window, 0);
    let t0 = 1_000_000 * window;
    for _ in 0..5 {
        assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    }
    assert!(!allowed(&r.check("k", t0, 1, ANSWERING)));
    // 2^16 + 3 windows later (never swept): the span's low bits look the same as before,
    // the window's do not; nothing from the old window counts.
    let later = t0 + ((1 << 16) + 3) * window;
    for _ in 0..5 {
        assert!(allowed(&r.check("k", later, 1, ANSWERING)));
    }
    let info = r.key_info("k", later, ANSWERING).unwrap();
    assert_eq!((info.local, info.unflushed, info.blocked_until), (5, 5, 0));
}

#[test]
fn totals_beyond_32_bits_saturate_and_block() {
    let r = rule(u64::from(u32::MAX), SECOND, 0);
    let t0 = 7 * SECOND;
    assert!(allowed(&r.check("k", t0, 1, ANSWERING)));
    let mut items = Vec::new();
    let mut pending = Vec::new();
    r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
    let outcome = FlushOutcome {
        total: u64::MAX,
        previous_total: Some(u64::MAX),
        entries: Vec::new(),
    };
    assert!(answer(&r, &pending[0], &[outcome], t0));
    let (_, reason, _) = r.check("k", t0 + 1, 1, ANSWERING);
    assert_eq!(reason, Some(Reason::GlobalBlock));
    let info = r.key_info("k", t0 + 1, ANSWERING).unwrap();
    assert_eq!(info.others_read, u64::from(u32::MAX));
}

/// Another instance's entry as the store returns it: flushed at `at`, 1 hit a second.
pub(super) fn node_entry(node: &str, count: u64, at: Nanos) -> NodeEntry {
    NodeEntry {
        node: Arc::from(node),
        count,
        at_ms: at / 1_000_000,
        rate_milli: 1_000,
    }
}

#[test]
fn only_shared_keys_have_an_extension_and_only_while_shared() {
    let window = 60 * SECOND;
    let r = rule(100, window, 0);
    let me: Arc<str> = Arc::from("me");
    let t0 = 100 * window;
    let flush = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
        let (mut items, mut pending) = (Vec::new(), Vec::new());
        r.prepare_flush(t, &me, &mut items, &mut pending);
        let outcome = FlushOutcome {
            total,
            previous_total: Some(0),
            entries,
        };
        assert!(answer(&r, &pending[0], &[outcome], t));
    };
    assert!(r.check("alone", t0, 1, ANSWERING).0.is_allowed());
    assert!(r.check("shared", t0, 1, ANSWERING).0.is_allowed());
    let (mut items, mut pending) = (Vec::new(), Vec::new());
    r.prepare_flush(t0, &me, &mut items, &mut pending);
    let results: Vec<_> = items
        .iter()
        .map(|item| {
            let shared = item.key.contains("shared");
            FlushOutcome {
                total: if shared { 11 } else { 1 },
                previous_total: Some(0),
                entries: if shared {
                    vec![node_entry("me", 1, t0), node_entry("other", 10, t0)]
                } else {
                    vec![node_entry("me", 1, t0)]
                },
            }
        })
        .collect();
    for p in &pending {
        assert!(answer(&r, p, &results, t0));
    }
    assert_eq!(r.shared_len(), 1);
    assert_eq!(
        r.key_info("shared", t0, ANSWERING).unwrap().live_instances,
        2
    );
    assert_eq!(
        r.key_info("alone", t0, ANSWERING).unwrap().live_instances,
        1
    );
    // The other instance stops; three spans later its entry is stale and the extension goes.
    let t1 = t0 + 3 * (window / 4);
    // (Allowed: this instance's demand was not known at the last reply, a single hit, so it
    // was taken to be like the other's and its budget is half the room.)
    assert!(r.check("shared", t1, 1, ANSWERING).0.is_allowed());
    flush(
        t1,
        11,
        vec![node_entry("me", 1, t1), node_entry("other", 10, t0)],
    );
    assert_eq!(r.shared_len(), 0);
    assert_eq!(
        r.key_info("shared", t1, ANSWERING).unwrap().live_instances,
        1
    );
}

#[test]
fn a_shared_key_far_below_its_limit_sends_only_its_count_until_it_nears_half() {
    let window = 60 * SECOND;
    let span = window / 4;
    let r = rule(1000, window, 0);
    let me: Arc<str> = Arc::from("me");
    // The other instance: 1 hit a second.
    let other = |count: u64, at: Nanos| node_entry("other", count, at);
    // One hit, a second later a flush; returns whether it carried this instance's entry.
    let round = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
        assert!(r.check("k", t - SECOND, 1, ANSWERING).0.is_allowed());
        let (mut items, mut pending) = (Vec::new(), Vec::new());
        r.prepare_flush(t, &me, &mut items, &mut pending);
        let sent_entry = items[0].entry.is_some();
        let outcome = FlushOutcome {
            total,
            previous_total: Some(0),
            entries,
        };
        assert!(answer(&r, &pending[0], &[outcome], t));
        sent_entry
    };
    let t0 = 100 * window + SECOND;
    let mine = |count: u64, at: Nanos| node_entry("me", count, at);
    // The key's first flush in the window exchanges entries and finds the other.
    assert!(round(t0, 2, vec![mine(1, t0), other(1, t0)]));
    assert_eq!(r.key_info("k", t0, ANSWERING).unwrap().live_instances, 2);
    // Far below 1000 (an estimate of ~18, growing ~30 in two spans): only the count goes;
    // the others become one unlisted group holding what the total shows beyond ours.
    assert!(!round(t0 + span, 40, vec![]));
    let info = r.key_info("k", t0 + span, ANSWERING).unwrap();
    assert_eq!((info.others_read, info.live_instances), (38, 2));
    assert!(info.estimate >= 40.0, "{info:?}");
    // Two spans later the total is 600: past half the limit, the next flush exchanges
    // entries again.
    let t2 = t0 + 3 * span;
    assert!(!round(t2, 600, vec![]));
    // The others (597 of it) grew 559 in the two spans since the last reply: they are
    // extrapolated at that recent rate (18.6/s), not at their window average (13/s).
    let info = r.key_info("k", t2 + 5 * SECOND, ANSWERING).unwrap();
    assert!(info.estimate > 685.0, "{info:?}");
    let t3 = t2 + 2 * SECOND;
    assert!(round(t3, 601, vec![mine(4, t3), other(597, t2)]));
    // A new window: the first flush exchanges entries whatever the count.
    let t4 = t0 + window;
    assert!(round(t4, 2, vec![mine(1, t4), other(1, t4)]));
}

#[test]
fn an_instance_named_like_the_unlisted_group_is_still_an_instance() {
    // The unlisted group is told by its name's allocation, not its text: another instance
    // that happens to be called "(unlisted)" is carried into the next window like any other
    // (the group is worked out afresh from each total and would be dropped).
    let window = 60 * SECOND;
    let r = rule(1000, window, 0);
    let me: Arc<str> = Arc::from("me");
    let round = |t: Nanos, total: u64, entries: Vec<NodeEntry>| {
        assert!(r.check("k", t, 1, ANSWERING).0.is_allowed());
        let (mut items, mut pending) = (Vec::new(), Vec::new());
        r.prepare_flush(t, &me, &mut items, &mut pending);
        assert!(
            items[0].entry.is_some(),
            "a window's first flush exchanges entries"
        );
        let outcome = FlushOutcome {
            total,
            previous_total: Some(0),
            entries,
        };
        assert!(answer(&r, &pending[0], &[outcome], t));
    };
    let t0 = 100 * window + 50 * SECOND;
    round(
        t0,
        2,
        vec![
            node_entry("me", 1, t0),
            node_entry("(unlisted)", 1, t0 - SECOND),
        ],
    );
    assert_eq!(r.key_info("k", t0, ANSWERING).unwrap().live_instances, 2);
    // The next window's first flush, before the other flushed in it: still two.
    let t1 = 101 * window + SECOND;
    round(t1, 1, vec![node_entry("me", 1, t1)]);
    assert_eq!(r.key_info("k", t1, ANSWERING).unwrap().live_instances, 2);
}

#[test]
fn a_failed_flush_puts_its_counts_back_in_their_windows() {
    let window = 10 * SECOND;
    let r = rule(100, window, 0);
    let t0 = 50 * window + 9 * SECOND;
    for _ in 0..3 {
        assert!(r.check("k", t0, 1, ANSWERING).0.is_allowed());
    }
    let mut items = Vec::new();
    let mut pending = Vec::new();
    r.prepare_flush(t0, &Arc::from("me"), &mut items, &mut pending);
    assert_eq!(r.key_info("k", t0, ANSWERING).unwrap().unflushed, 0);
    // The reply fails after the window ended: the 3 go to the carry, counted once.
    let t1 = t0 + 2 * SECOND;
    assert!(r.check("k", t1, 1, UNREACHABLE).0.is_allowed());
    assert!(!r.apply(&pending[0], |_| None, "me", (t1, ANSWERING)));
    let info = r.key_info("k", t1, ANSWERING).unwrap();
    assert_eq!((info.local, info.unflushed), (1, 4));
    items.clear();
    pending.clear();
    r.prepare_flush(t1, &Arc::from("me"), &mut items, &mut pending);
    let sent: Vec<(u64, u64)> = items.iter().map(|i| (i.window, i.delta)).collect();
    assert_eq!(sent, [(50, 3), (51, 1)]);
}

#[test]
fn only_rules_that_use_it_read_the_previous_windows_total_and_the_first_write_still_ends() {
    let window = 10 * SECOND;
    let t0 = 1_000 * window + SECOND;
    let flushes = |r: &SyncedRule| {
        let mut sent = Vec::new();
        for span in 0..2 {
            let t = t0 + span * (window / 4);
            assert!(allowed(&r.check("k", t, 1, ANSWERING)));
            let mut items = Vec::new();
            let mut pending = Vec::new();
            r.prepare_flush(t + 1, &Arc::from("me"), &mut items, &mut pending);
            let outcome = FlushOutcome {
                total: span + 1,
                previous_total: items[0].want_previous.then_some(0),
                entries: vec![node_entry("me", span + 1, t)],
            };
            answer(r, &pending[0], &vec![outcome; items.len()], t + 1);
            sent.push((items[0].want_previous, items[0].first_write));
        }
        sent
    };
    // Predictive, fixed window, no penalty: never asked; the TTL is set on the first write
    // only.
    assert_eq!(
        flushes(&rule(10, window, 0)),
        [(false, true), (false, false)]
    );
    // A penalty longer than the window is heard of from the previous window's total.
    assert_eq!(
        flushes(&rule(10, window, 3 * window)),
        [(true, true), (false, false)]
    );
    // The sliding window weighs it; the reactive policy estimates instances from it.
    let mut sliding = rule(10, window, 0);
    sliding.params.sliding = true;
    assert_eq!(flushes(&sliding), [(true, true), (false, false)]);
    let mut reactive = rule(10, window, 0);
    reactive.params.policy = Policy::Reactive;
    assert_eq!(flushes(&reactive), [(true, true), (false, false)]);
}

#[test]
fn refused_keys_ask_for_a_read_once_a_span_and_the_queue_of_early_syncs_is_bounded() {
    // Three instances expected, a spray of new keys on this one: each key's cold share (1 per
    // span here) runs out at its first request, which asks for an early sync; its next
    // requests in the span ask nothing more, and the rule's queue stops at its bound.
    let mut r = rule(12, 60 * SECOND, 0);
    r.params.expected_instances = 3;
    let fleet = StoreView::answering(3);
    let t = 1_000 * 60 * SECOND;
    let keys = super::EARLY_QUEUE_MAX + 100;
    let mut queued = 0;
    for k in 0..keys {
        let key = format!("k{k}");
        for _ in 0..3 {
            queued += usize::from(r.check(&key, t, 1, fleet).2);
        }
    }
    assert_eq!(queued, super::EARLY_QUEUE_MAX);
    assert_eq!(r.early.lock().len(), super::EARLY_QUEUE_MAX);
}

#[test]
fn a_request_costing_more_than_the_cold_span_share_is_admitted_as_the_spans_first() {
    // 48 a window over 3 instances and 4 spans: a cold share of 4 a span, 16 a window. A
    // gateway route costing 5 is admitted first in each span (not refused until the store
    // answers), a second one in the span is not, and the window's share still bounds them.
    let mut r = rule(48, 60 * SECOND, 0);
    r.params.expected_instances = 3;
    let fleet = StoreView::answering(3);
    let t = 1_000 * 60 * SECOND;
    assert!(
        allowed(&r.check("gw", t, 5, fleet)),
        "the span's first request"
    );
    assert!(
        !allowed(&r.check("gw", t + 1, 5, fleet)),
        "a second in the span"
    );
    let mut admitted = 5;
    for span in 1..4 {
        if allowed(&r.check("gw", t + span * 15 * SECOND, 5, fleet)) {
            admitted += 5;
        }
    }
    // 16 a window: three of cost 5, the fourth would be 20.
    assert_eq!(admitted, 15);
}

#[test]
fn a_budget_set_after_a_quiet_span_reads_first_when_its_count_may_lack_a_boundarys_flushes() {
    // The key's last reply, at a span boundary, lists another instance that flushed in the
    // span before: it flushes at this boundary too, and the reply may have come before that
    // flush. The key is then quiet for a span; the request that sets its budget after the
    // quiet asks for an early sync. When the reply already held the other's flush of the
    // boundary, it does not.
    let window = 60 * SECOND;
    let span = window / 4;
    let me: Arc<str> = Arc::from("me");
    let t0 = 100 * window;
    // (A limit of 200: at 20 of 100, with this instance's ten requests at one moment read as
    // a burst's rate, the key could reach its limit within two spans, and the reply would ask
    // for a read 25 ms after the boundary: `tests_boundary.rs`.)
    let asks_after_quiet = |other_at: Nanos| {
        let r = rule(200, window, 0);
        for _ in 0..10 {
            assert!(r.check("k", t0 + 14 * SECOND, 1, ANSWERING).0.is_allowed());
        }
        let boundary = t0 + span + 1_000_000;
        let (mut items, mut pending) = (Vec::new(), Vec::new());
        r.prepare_flush(boundary, &me, &mut items, &mut pending);
        let outcome = FlushOutcome {
            total: 20,
            previous_total: Some(0),
            entries: vec![
                node_entry("me", 10, boundary),
                node_entry("other", 10, other_at),
            ],
        };
        assert!(answer(&r, &pending[0], &[outcome], boundary));
        // Nothing to flush at the next boundary; a request a second after it.
        let d = r.check("k", t0 + 2 * span + SECOND, 1, ANSWERING);
        assert!(allowed(&d), "{d:?}");
        d.2
    };
    // The other flushed in the span before the reply's boundary: the reply may lack its flush.
    assert!(asks_after_quiet(t0 + 14 * SECOND));
    // The other's flush of the boundary is in the reply.
    assert!(!asks_after_quiet(t0 + span + 500_000));
}

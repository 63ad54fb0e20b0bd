//! A span boundary's reply that may have come before the others' flushes of the same
//! boundary: when it reads again once they have landed.

use std::sync::Arc;

use sluice_core::Nanos;
use sluice_store::{FlushOutcome, NodeEntry};

use super::SyncedRule;
use super::tests::{SECOND, allowed, node_entry, rule};
use crate::health::StoreView;
use crate::verdict::Reason;

const WINDOW: Nanos = 60 * SECOND;
const SPAN: Nanos = WINDOW / 4;
const T0: Nanos = 100 * WINDOW;

/// The reply's boundary: the window's third.
const BOUNDARY: Nanos = T0 + 3 * SPAN;

/// How the key's usage reaches this instance.
#[derive(Clone, Copy, PartialEq)]
enum Usage {
    /// Requests it decides.
    Checked,
    /// Usage its clients admitted on their own assignments, recorded without a decision
    /// (`SyncedRule::record`, as the RLQS door records Envoys' reports).
    Recorded,
}

/// Two instances, 100 a minute over four spans of 15 s. This one admits 10 over the span
/// before [`BOUNDARY`] (one every 1.4 s) and flushes them there; the reply holds `total` and
/// lists `other`. A penalty of `cooldown` follows demand beyond the limit.
fn after_a_boundary_reply(total: u64, other: NodeEntry, cooldown: Nanos) -> SyncedRule {
    after_a_boundary_reply_of(Usage::Checked, total, other, cooldown)
}

fn after_a_boundary_reply_of(
    usage: Usage,
    total: u64,
    other: NodeEntry,
    cooldown: Nanos,
) -> SyncedRule {
    let fleet = StoreView::answering(2);
    let me: Arc<str> = Arc::from("me");
    let mut r = rule(100, WINDOW, cooldown);
    r.params.expected_instances = 2;
    for i in 0..10 {
        let at = BOUNDARY - SPAN + SECOND + i * 1_400_000_000;
        if usage == Usage::Recorded {
            r.record("k", at, 1);
            continue;
        }
        let d = r.check("k", at, 1, fleet);
        assert!(allowed(&d), "request {i}: {d:?}");
    }
    let boundary = BOUNDARY + 1_000_000;
    let (mut items, mut pending) = (Vec::new(), Vec::new());
    r.prepare_flush(boundary, &me, &mut items, &mut pending);
    let outcome = FlushOutcome {
        total,
        previous_total: items[0].want_previous.then_some(0),
        entries: vec![node_entry("me", 10, boundary), other],
    };
    let outcomes = vec![outcome; items.len()];
    assert!(r.apply(&pending[0], |i| outcomes.get(i), "me", (boundary, fleet)));
    r
}

#[test]
fn a_boundary_reply_reads_again_when_the_key_may_reach_its_limit_within_two_spans() {
    // The other flushed in the span before this boundary: it flushes at this one too, maybe
    // after this reply. At 60 of 100, growing by some 50 in two spans at the rates known,
    // the room this reply shows may already be gone: it reads again once the boundary's
    // flushes have landed. (Not for a short budget: its share of the room, about 16, outlasts
    // the span at this instance's demand, about 10.)
    let near = node_entry("other", 50, BOUNDARY - SECOND);
    let r = after_a_boundary_reply(60, near, 0);
    assert!(r.take_early_from_reply());
    // At 20 of 100 the same growth stays under the limit (about 72): no second read.
    let far = node_entry("other", 10, BOUNDARY - SECOND);
    let r = after_a_boundary_reply(20, far, 0);
    assert!(!r.take_early_from_reply());
}

#[test]
fn a_boundary_reply_of_a_key_whose_usage_is_recorded_reads_again_far_below_its_limit() {
    // The RLQS door hands this instance's part of the room to its Envoys at every report and
    // reads it from the others' counts: a boundary reply that came before the other's flush
    // of the same boundary would size them on a count a span old, whatever the key's count.
    // (Two instances, an Envoy each, one user at 3x the limit: without the read, the
    // instance whose flushes landed first summed parts of 1.06-1.14 with the other's and
    // windows went to 109 of 100 in the simulator; `sluice-sim/tests/rlqs.rs`.)
    let far = node_entry("other", 10, BOUNDARY - SECOND);
    let r = after_a_boundary_reply_of(Usage::Recorded, 20, far, 0);
    assert!(r.take_early_from_reply());
    // The other has not flushed since the last boundary: nothing to wait for.
    let quiet = node_entry("other", 10, BOUNDARY - 2 * SPAN + SECOND);
    let r = after_a_boundary_reply_of(Usage::Recorded, 20, quiet, 0);
    assert!(!r.take_early_from_reply());
}

#[test]
fn the_boundarys_read_gives_the_span_its_early_sync_back() {
    // The read a boundary reply asked for answers: the others' flushes have landed, and the
    // count is 95 of 100. Demand beyond the limit later in the span starts a penalty, which
    // publishes itself with an early sync at once, as it would had the boundary's replies
    // come in another order (not at the next boundary, 14 s on).
    let fleet = StoreView::answering(2);
    let me: Arc<str> = Arc::from("me");
    let r = after_a_boundary_reply(60, node_entry("other", 50, BOUNDARY - SECOND), 2 * WINDOW);
    assert!(r.take_early_from_reply());
    let read_at = BOUNDARY + 25_000_000;
    let (mut items, mut pending) = (Vec::new(), Vec::new());
    r.prepare_early(read_at, &me, &mut items, &mut pending);
    assert_eq!(pending.len(), 1);
    let outcome = FlushOutcome {
        total: 95,
        previous_total: items[0].want_previous.then_some(0),
        entries: Vec::new(),
    };
    let outcomes = vec![outcome; items.len()];
    assert!(r.apply(&pending[0], |i| outcomes.get(i), "me", (read_at, fleet)));
    let decisions: Vec<_> = (0..20)
        .map(|i| r.check("k", read_at + SECOND + i * 100_000_000, 1, fleet))
        .collect();
    let penalty = decisions
        .iter()
        .position(|d| d.1 == Some(Reason::GlobalBlock))
        .expect("demand beyond the limit starts a penalty");
    assert!(decisions[penalty].2, "{:?}", decisions[penalty]);
}

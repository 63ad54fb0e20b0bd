//! Limits too small to share. A synced rule splits its limit among the instances and spans:
//! each instance admits on its share until the next flush tells it the others' counts. With
//! fewer than [`SMALL_LIMIT_SHARES`] requests per instance and span, the shares are a request
//! or none: a user under its limit is refused on one instance while the others leave room
//! unused, and a user over it slips a request past on several at once (measured in
//! `docs/ACCURACY.md`: per-user limits of 20 per 10 s over 3 to 20 instances). For such a rule
//! (predictive policy, `small_limits: store`, the default) each request is decided at the store
//! instead, on the same window counter the flushes add to: one round trip per request until
//! the key is over its limit, then none until it has room again. Whether a rule's limit is
//! small follows the fleet the store counts, so instances that join or leave move it across;
//! both ways of deciding count into one counter, so instances that disagree for a moment count
//! each request once. When the store does not answer, the key falls back to the synced
//! decision (its share, as in any outage).

use std::time::Duration;

use sluice_config::SmallLimits;
use sluice_core::{Algorithm, AtomicCell, Gcra, Nanos, Rate, StateCell};
use sluice_store::ExactAlgorithm;

use super::params::SyncedParams;
use crate::exact::StoreDecisions;
use crate::health::StoreView;

/// A rule's limit is small when it is under this many requests per instance and span.
pub const SMALL_LIMIT_SHARES: u64 = 2;

/// A rule's store decisions for a small limit, and how many it may ask for.
pub(crate) struct SmallLimit {
    pub decisions: StoreDecisions,
    /// `exact.small_limit_calls` a second (a token bucket of a second's worth): a key spray
    /// costs the store at most that many calls a second per rule and instance; beyond it the
    /// keys keep to their share, counted and flushed like any synced key.
    calls: Gcra,
    spent: AtomicCell,
}

impl SmallLimit {
    /// Takes one store call from the budget at `now`; false when it is spent.
    pub(crate) fn take_call(&self, now: Nanos) -> bool {
        self.spent.transition(|tat| {
            let (d, next) = self.calls.check(tat, now, 1);
            (d.is_allowed(), next)
        })
    }
}

/// The store's decisions a rule can use for its keys when its limit is small, if any: the
/// predictive policy with `small_limits: store`, a window of whole microseconds (the store
/// numbers windows in them) and no penalty beyond the window (a key over its limit is refused
/// until it has room in the window, on every instance alike; a longer penalty needs each
/// instance's own block).
pub(crate) fn store_decisions(
    p: &SyncedParams,
    small_limits: SmallLimits,
    calls_per_second: u32,
) -> Option<SmallLimit> {
    let usable = small_limits == SmallLimits::Store
        && p.predictive()
        && p.window_ns.is_multiple_of(1000)
        && p.cooldown_ns <= p.window_ns;
    let calls = u64::from(calls_per_second.max(1));
    let rate = Rate::new(calls, Duration::from_secs(1)).ok()?;
    usable.then(|| SmallLimit {
        decisions: StoreDecisions::new(ExactAlgorithm::WindowCounter {
            limit: p.limit,
            window_us: p.window_ns / 1000,
            sliding: p.sliding,
        }),
        calls: Gcra::new(rate),
        spent: AtomicCell::default(),
    })
}

/// Whether the limit is too small to share among the fleet (at least the expected instances).
/// An instance alone shares nothing: its own count is the key's.
pub(crate) fn is_small(p: &SyncedParams, store: StoreView) -> bool {
    let parties = store.fleet.max(p.expected_instances);
    let shares = parties.saturating_mul(p.spans);
    parties > 1 && p.limit < shares.saturating_mul(SMALL_LIMIT_SHARES)
}

#[cfg(test)]
mod tests {
    use sluice_config::Policy;

    use super::*;

    fn params(limit: u64, spans: u64) -> SyncedParams {
        SyncedParams {
            limit,
            window_ns: 10_000_000_000,
            spans,
            span_ns: 10_000_000_000 / spans,
            cooldown_ns: 0,
            policy: Policy::Predictive,
            sliding: false,
            expected_instances: 1,
        }
    }

    #[test]
    fn a_limit_is_small_under_two_requests_per_instance_and_span_of_the_fleet() {
        let p = params(20, 5);
        assert!(!is_small(&p, StoreView::answering(1)));
        assert!(!is_small(&params(3, 6), StoreView::answering(1)));
        assert!(!is_small(&p, StoreView::answering(2)));
        assert!(is_small(&p, StoreView::answering(3)));
        assert!(is_small(&p, StoreView::answering(10)));
        // The configured fleet counts until the store has told its own.
        let expected = SyncedParams {
            expected_instances: 3,
            ..p.clone()
        };
        assert!(is_small(&expected, StoreView::answering(1)));
        assert!(!is_small(&params(300, 6), StoreView::answering(20)));
    }

    #[test]
    fn a_rule_asks_the_store_at_most_its_calls_a_second() {
        let small = store_decisions(&params(20, 5), SmallLimits::Store, 100).unwrap();
        let t0 = 1_000 * 1_000_000_000;
        let taken = (0..1000).filter(|_| small.take_call(t0)).count();
        assert_eq!(taken, 100, "a second's worth at once");
        assert!(!small.take_call(t0 + 5_000_000));
        // One more every 10 ms.
        assert!(small.take_call(t0 + 10_000_000));
        assert!(!small.take_call(t0 + 10_000_000));
    }

    #[test]
    fn only_the_predictive_policy_without_a_long_penalty_decides_at_the_store() {
        let p = params(20, 5);
        assert!(store_decisions(&p, SmallLimits::Store, 100).is_some());
        assert!(store_decisions(&p, SmallLimits::Share, 100).is_none());
        let reactive = SyncedParams {
            policy: Policy::Reactive,
            ..p.clone()
        };
        assert!(store_decisions(&reactive, SmallLimits::Store, 100).is_none());
        let penalty = SyncedParams {
            cooldown_ns: 2 * p.window_ns,
            ..p.clone()
        };
        assert!(store_decisions(&penalty, SmallLimits::Store, 100).is_none());
        let odd = SyncedParams {
            window_ns: p.window_ns + 1,
            ..p
        };
        assert!(store_decisions(&odd, SmallLimits::Store, 100).is_none());
    }
}

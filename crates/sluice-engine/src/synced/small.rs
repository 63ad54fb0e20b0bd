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

use std::sync::Arc;
use std::time::Duration;

use sluice_config::SmallLimits;
use sluice_core::{Algorithm, AtomicCell, Decision, Gcra, Nanos, Rate, StateCell};
use sluice_store::{CounterKey, ExactAlgorithm, StoreError};

use super::SyncedRule;
use super::params::SyncedParams;
use super::recent::RecentKeys;
use crate::descriptor_key::with_key;
use crate::exact::decisions::{Asked, StoreDecisions};
use crate::health::StoreView;
use crate::link::{StoreLink, count_store_error};
use crate::verdict::Reason;

/// A rule's limit is small when it is under this many requests per instance and span.
pub const SMALL_LIMIT_SHARES: u64 = 2;

/// The part of `exact.small_limit_calls` kept for keys the rule asked the store about lately
/// (one in this many, at least one call a second).
pub const RETURNING_KEYS_RESERVE: u32 = 4;

/// A rule's store decisions for a small limit, and how many it may ask for.
pub(crate) struct SmallLimit {
    pub decisions: StoreDecisions,
    /// `exact.small_limit_calls` a second in all (token buckets of a second's worth): a key
    /// spray costs the store at most that many calls a second per rule and instance; beyond
    /// it the keys keep to their share, counted and flushed like any synced key. Any key may
    /// take from `open`; only a key the rule asked the store about lately (`recent`) from
    /// `reserve` too, so a spray of new keys cannot take every call from the users the
    /// store already counts.
    open: CallBudget,
    reserve: CallBudget,
    /// Allocated (64 KiB) at the first store call.
    recent: std::sync::OnceLock<Box<RecentKeys>>,
}

/// A token bucket of store calls.
struct CallBudget {
    calls: Option<Gcra>,
    spent: AtomicCell,
}

impl CallBudget {
    fn new(per_second: u32) -> Self {
        let calls = Rate::new(u64::from(per_second), Duration::from_secs(1))
            .ok()
            .map(Gcra::new);
        Self {
            calls,
            spent: AtomicCell::default(),
        }
    }

    fn take(&self, now: Nanos) -> bool {
        let Some(calls) = &self.calls else {
            return false;
        };
        self.spent.transition(|tat| {
            let (d, next) = calls.check(tat, now, 1);
            (d.is_allowed(), next)
        })
    }
}

/// Which of the rule's store calls a request took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallTaken {
    /// One any key may take.
    Open,
    /// One of the reserve for keys the rule asked the store about lately.
    Reserved,
    /// None: the budget for this key is spent; its share decides.
    Spent,
}

impl SmallLimit {
    /// Takes one store call for `key` at `now`: from the open budget, or for a key the rule
    /// asked the store about lately, from the reserve when the open budget is spent.
    pub(crate) fn take_call(&self, key: &str, now: Nanos) -> CallTaken {
        let recent = self.recent.get_or_init(|| Box::new(RecentKeys::new()));
        let taken = if self.open.take(now) {
            CallTaken::Open
        } else if recent.contains(key) && self.reserve.take(now) {
            CallTaken::Reserved
        } else {
            return CallTaken::Spent;
        };
        recent.insert(key);
        taken
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
    let calls = calls_per_second.max(1);
    let reserve = (calls / RETURNING_KEYS_RESERVE).max(1).min(calls - 1);
    usable.then(|| SmallLimit {
        decisions: StoreDecisions::new(
            ExactAlgorithm::WindowCounter {
                limit: p.limit,
                window_us: p.window_ns / 1000,
                sliding: p.sliding,
            },
            p.cooldown_ns,
        ),
        open: CallBudget::new(calls - reserve),
        reserve: CallBudget::new(reserve),
        recent: std::sync::OnceLock::new(),
    })
}

/// Whether the limit is too small to share among the fleet (at least the expected instances).
/// An instance alone shares nothing: its own count is the key's.
pub(crate) fn is_small(p: &SyncedParams, store: StoreView) -> bool {
    let parties = store.fleet.max(p.expected_instances);
    let shares = parties.saturating_mul(p.spans);
    parties > 1 && p.limit < shares.saturating_mul(SMALL_LIMIT_SHARES)
}

impl SyncedRule {
    /// A request on a limit too small to share, decided at the store: the key, the decision
    /// and its reason. `None` when the limit is not small (or the rule's store calls are
    /// spent), or when the store gave no answer: the key's share decides then.
    pub(crate) async fn decide_small_limit<'v>(
        &self,
        (link, store): (&StoreLink, StoreView),
        values: impl Iterator<Item = &'v str>,
        (now, cost, max_keys): (Nanos, u64, usize),
    ) -> Option<(String, Decision, Option<Reason>)> {
        // Checked first: only a small limit pays for the owned key.
        if !self.decides_at_store(store) || !link.runs_exact() {
            return None;
        }
        let key = with_key(values, str::to_owned);
        let decisions = self.store_decides(store, &key, now)?;
        let store_key: Arc<str> = CounterKey::from_encoded(&self.rule_id, &key)
            .as_str()
            .into();
        let asked = decisions
            .ask(&link.exact_calls(), &key, store_key, now, cost, max_keys)
            .await;
        let (d, reason) = match asked {
            Asked::Decided(d, reason) => (d, reason),
            // The call may have counted at the store: the key's share decides, and the count
            // is not flushed.
            Asked::Unanswered(Some(e @ StoreError::Timeout(_))) => {
                count_store_error(&e);
                let (d, reason, early) = self.check_after_timeout(&key, now, cost, store);
                if early {
                    // The key queued an early sync: the flush loop sends it now, not with the
                    // next key that asks.
                    link.early.wake();
                }
                (d, reason)
            }
            // The synced decision takes over: the key's share, counted and flushed.
            Asked::Unanswered(error) => {
                if let Some(e) = error {
                    count_store_error(&e);
                    tracing::debug!(rule = %self.rule_id, error = %e, "store decision for a small limit failed; the key keeps to its share");
                }
                return None;
            }
        };
        Some((key, d, reason))
    }

    /// The store's decisions for `key`'s request at `now`, while the rule's limit is too small
    /// to share among the fleet and the store answers. The request takes a call from the
    /// rule's budget (`exact.small_limit_calls`), unless the key is known over its limit (no
    /// call then); with the budget spent, `None`: the key's share decides.
    fn store_decides(&self, store: StoreView, key: &str, now: Nanos) -> Option<&StoreDecisions> {
        let small = self.small.as_ref()?;
        if !store.health.answering() || !is_small(&self.params, store) {
            return None;
        }
        if small.decisions.is_blocked(key, now) || small.take_call(key, now) != CallTaken::Spent {
            return Some(&small.decisions);
        }
        metrics::counter!("sluice_small_limit_calls_spent_total", "rule" => self.rule_id.to_string())
            .increment(1);
        None
    }

    /// Whether the rule's limit is too small to share among the fleet as `store` reports it
    /// (and the rule decides such limits at the store).
    pub(crate) fn decides_at_store(&self, store: StoreView) -> bool {
        self.small.is_some() && store.health.answering() && is_small(&self.params, store)
    }
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
        let taken = |key: &str, now| small.take_call(key, now) != CallTaken::Spent;
        let new_keys = (0..1000).filter(|i| taken(&format!("new-{i}"), t0)).count();
        assert_eq!(new_keys, 75, "a second's worth at once, less the reserve");
        assert!(!taken("another", t0 + 5_000_000));
        // The reserve is for keys asked about lately: 25 of them.
        let returning = (0..1000).filter(|i| taken(&format!("new-{i}"), t0)).count();
        assert_eq!(returning, 25);
        assert!(!taken("new-1", t0 + 5_000_000), "all 100 calls taken");
        // One more every 13.3 ms for any key.
        assert_eq!(small.take_call("later", t0 + 14_000_000), CallTaken::Open);
        assert_eq!(small.take_call("new-1", t0 + 14_000_000), CallTaken::Spent);
        // One call a second is all open.
        let one = store_decisions(&params(20, 5), SmallLimits::Store, 1).unwrap();
        assert_eq!(one.take_call("k", t0), CallTaken::Open);
        assert_eq!(one.take_call("k", t0), CallTaken::Spent);
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

//! One rule of the table: its limiter (`local`, `synced` or `exact`), and how it decides one
//! descriptor's key.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use metrics::{counter, gauge};
use sluice_config::{AlgorithmKind, Mode, ResolvedLimit};
use sluice_core::{Allowed, Decision, Denied, InsufficientCapacity, Nanos};
use sluice_store::CounterKey;
use smallvec::SmallVec;

use crate::descriptor_key::with_key;
use crate::exact::decisions::ExactRule;
use crate::health::StoreView;
use crate::lineage::Lineage;
use crate::link::{StoreLink, count_store_error};
use crate::local::limiter::LocalLimiter;
use crate::local::sketch::OverflowSketch;
use crate::synced::SyncedRule;
use crate::verdict::Reason;

/// The mode a rule runs in here: `synced` needs a shared store and a window algorithm.
pub(crate) fn runs_as(r: &ResolvedLimit, options: &crate::EngineOptions) -> Mode {
    let window_algorithm = matches!(
        r.algorithm,
        AlgorithmKind::FixedWindow | AlgorithmKind::SlidingWindow
    );
    match r.mode {
        Mode::Synced if !options.shared_store || !window_algorithm => Mode::Local,
        m => m,
    }
}

/// A rule's limiter.
pub(crate) enum RuleKind {
    Unlimited,
    /// `requests_per_unit: 0`: every request with a cost is over the limit (its capacity is 0).
    Blocked,
    Local(LocalLimiter),
    Synced(SyncedRule),
    Exact(ExactRule),
}

/// A rule as the engine runs it.
pub(crate) struct RuleEngine {
    pub id: Arc<str>,
    pub name: Option<Arc<str>>,
    pub shadow: bool,
    pub limit: Option<(u64, Duration)>,
    /// The largest cost the rule admits at once; a larger one is `CostExceedsLimit`, decided
    /// before any counter is touched.
    pub capacity: u64,
    pub policy: &'static str,
    /// Shared with the engine a reload builds, when the rule did not change: its counters
    /// survive the reload.
    pub kind: Arc<RuleKind>,
    /// The rule's resolved settings (`None`: unlimited); a reload keeps `kind` only when
    /// these are equal.
    pub settings: Option<ResolvedLimit>,
    /// Allocated on first overflow (256 KiB), never for rules that stay under the cap.
    pub overflow: std::sync::OnceLock<OverflowSketch>,
    /// Last span number flushed (synced rules).
    pub flushed_span: AtomicU64,
    pub allowed: metrics::Counter,
    /// Decisions and heaviest keys, for the status page (kept across reloads).
    pub stats: Arc<crate::observe::heavy::RuleStats>,
    /// Per-value counts (`detailed_metric: true`).
    pub detailed: Option<Arc<crate::observe::detailed::DetailedStats>>,
    /// What the last reload did to the rule's counters.
    pub lineage: Lineage,
    /// `share_threshold`: entries whose value counts as their wildcard pattern.
    pub shared: Box<[(usize, Box<str>)]>,
    /// `quota_mode`.
    pub quota: bool,
    /// The descriptor's `metadata`, for Envoy's dynamic metadata.
    pub metadata: Option<Arc<serde_json::Value>>,
}

/// After a reload that changed a rule's settings (now `settings`, its new limiter `kind`):
/// takes over what each key of the rule as it was (`before`) used, where the new settings
/// allow, and says what happened.
pub(crate) fn carry(
    before: &RuleEngine,
    (kind, settings): (&RuleKind, Option<&ResolvedLimit>),
    options: &crate::EngineOptions,
    now: Nanos,
) -> Lineage {
    let (Some(new), Some(old)) = (settings, &before.settings) else {
        return Lineage::StartedOver("limited or unlimited");
    };
    if new.rate.window() != old.rate.window() {
        return Lineage::StartedOver("window changed");
    }
    if new.algorithm != old.algorithm {
        return Lineage::StartedOver("algorithm changed");
    }
    if runs_as(new, options) != runs_as(old, options) {
        return Lineage::StartedOver("mode changed");
    }
    match (kind, &*before.kind) {
        (RuleKind::Local(new), RuleKind::Local(old)) => match new.carry_from(old, now) {
            Some(_) => Lineage::Carried,
            None => Lineage::StartedOver("algorithm changed"),
        },
        // The store's counters are the rule's (named by its id) and stay; each key also
        // carries what this instance knew of its window, so none starts over until its next
        // flush reply.
        (RuleKind::Synced(new), RuleKind::Synced(old)) => {
            new.carry_from(old, now);
            Lineage::Carried
        }
        // Exact: the store decides every request on the rule's counters, which stay.
        _ => Lineage::Carried,
    }
}

impl RuleEngine {
    /// The values that name a descriptor's key under this rule: the request's, except that
    /// an entry matched by a sharing wildcard (`share_threshold`) counts as the pattern.
    pub(crate) fn key_values<'a, K: AsRef<str>, V: AsRef<str>>(
        &'a self,
        entries: &'a [(K, V)],
    ) -> impl Iterator<Item = &'a str> + Clone + 'a {
        entries.iter().enumerate().map(move |(i, (_, v))| {
            self.shared
                .iter()
                .find(|(depth, _)| *depth == i)
                .map_or(v.as_ref(), |(_, pattern)| &**pattern)
        })
    }

    /// Decides one descriptor (its `entries`) at `now` for `cost`. Local rules never wait on
    /// I/O, nor do synced ones except for a limit too small to share; exact ones, and those,
    /// ask the store through `link`.
    pub(crate) async fn check<K: AsRef<str>, V: AsRef<str>>(
        &self,
        link: &StoreLink,
        max_keys: usize,
        entries: &[(K, V)],
        now: Nanos,
        cost: u64,
    ) -> (Decision, Option<Reason>) {
        let values = || self.key_values(entries);
        match &*self.kind {
            RuleKind::Unlimited => (
                Decision::Allowed(Allowed {
                    remaining: u64::MAX,
                    reset_after: Duration::ZERO,
                    delay: Duration::ZERO,
                }),
                None,
            ),
            // A look at cost 0 is answered, as any rule answers it: nothing left.
            RuleKind::Blocked if cost == 0 => (
                Decision::Allowed(Allowed {
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    delay: Duration::ZERO,
                }),
                None,
            ),
            _ if cost > self.capacity => (
                Decision::InsufficientCapacity(InsufficientCapacity {
                    cost,
                    capacity: self.capacity,
                }),
                None,
            ),
            RuleKind::Blocked => (
                Decision::InsufficientCapacity(InsufficientCapacity { cost, capacity: 0 }),
                None,
            ),
            RuleKind::Local(local) => self.check_local(local, values(), (now, cost, max_keys)),
            RuleKind::Synced(synced) => {
                // One view of the store for the whole decision.
                let (store, at) = (link.view(), (now, cost, max_keys));
                let small = synced.decide_small_limit((link, store), values(), at);
                if let Some((key, d, reason)) = small.await {
                    self.observe(&key, !d.is_allowed(), now, cost);
                    return (d, reason);
                }
                self.check_synced(synced, (link, store), values(), at)
            }
            RuleKind::Exact(exact) => {
                self.check_exact(exact, link, values, (now, cost, max_keys))
                    .await
            }
        }
    }

    /// A local rule decides in this process alone; keys beyond its cap go to its sketch.
    fn check_local<'v>(
        &self,
        local: &LocalLimiter,
        values: impl Iterator<Item = &'v str>,
        (now, cost, max_keys): (Nanos, u64, usize),
    ) -> (Decision, Option<Reason>) {
        with_key(values, |key| {
            if local.len() >= max_keys && !local.contains(key) {
                return self.overflow(key, now, cost, 1);
            }
            let d = local.check(key, now, cost);
            let reason = matches!(d, Decision::Denied(_)).then_some(Reason::LocalBudget);
            self.observe(key, reason.is_some(), now, cost);
            (d, reason)
        })
    }

    /// A synced rule decides on its key's state, with no I/O; a key whose span's share is
    /// spent wakes the flush loop for an early sync.
    fn check_synced<'v>(
        &self,
        synced: &SyncedRule,
        (link, store): (&StoreLink, StoreView),
        values: impl Iterator<Item = &'v str>,
        (now, cost, max_keys): (Nanos, u64, usize),
    ) -> (Decision, Option<Reason>) {
        with_key(values, |key| {
            if synced.keys.len() >= max_keys && !synced.keys.pin().contains_key(key) {
                // Untracked keys are never synced: each instance keeps to its share.
                let instances = synced.params.expected_instances;
                return self.overflow(key, now, cost, instances);
            }
            let (decision, reason, early) = synced.check(key, now, cost, store);
            if early {
                link.early.wake();
            }
            self.observe(key, !decision.is_allowed(), now, cost);
            (decision, reason)
        })
    }

    /// An exact rule asks the store for every decision (within its time budget and breaker).
    async fn check_exact<'v, I: Iterator<Item = &'v str>>(
        &self,
        exact: &ExactRule,
        link: &StoreLink,
        values: impl Fn() -> I,
        (now, cost, max_keys): (Nanos, u64, usize),
    ) -> (Decision, Option<Reason>) {
        let key = with_key(values(), str::to_owned);
        let store_key: Arc<str> = {
            let values: SmallVec<[&str; 4]> = values().collect();
            CounterKey::new(&self.id, &values).as_str().into()
        };
        let calls = link.exact_calls();
        let (d, reason, error) = exact
            .check(&calls, &key, store_key, now, cost, max_keys)
            .await;
        if let Some(e) = error {
            count_store_error(&e);
            tracing::debug!(rule = %self.id, error = %e, "exact-mode store call failed");
        }
        self.observe(&key, !d.is_allowed(), now, cost);
        (d, reason)
    }

    /// Feeds the heavy-hitters sketch and the per-value counts; a rule only queried (cost 0)
    /// did not decide.
    fn observe(&self, key: &str, denied: bool, now: Nanos, cost: u64) {
        if cost == 0 {
            return;
        }
        self.stats.observe(key, denied, now);
        if let Some(detailed) = &self.detailed {
            detailed.count(key, denied, self.shadow);
        }
    }

    /// Decides a key beyond the rule's cap with the rule's fixed-size sketch, locally. For a
    /// synced rule each of the `instances` expected keeps to its share of the limit (rounded
    /// up), since these counts never reach the store.
    fn overflow(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        instances: u64,
    ) -> (Decision, Option<Reason>) {
        counter!("sluice_overflow_checks_total", "rule" => self.id.to_string()).increment(1);
        let (limit, window) = self.limit.unwrap_or((u64::MAX, Duration::from_secs(1)));
        let limit = limit.div_ceil(instances.max(1));
        let window_ns = sluice_core::duration_to_nanos(window).max(1);
        let reset = Duration::from_nanos(window_ns - now % window_ns);
        let sketch = self.overflow.get_or_init(OverflowSketch::new);
        let checked = sketch.check(key, now, window_ns, limit, cost);
        gauge!("sluice_overflow_noise_floor", "rule" => self.id.to_string())
            .set(sketch.noise_floor());
        if checked.admitted {
            let allowed = Allowed {
                remaining: checked.remaining,
                reset_after: reset,
                delay: Duration::ZERO,
            };
            (Decision::Allowed(allowed), None)
        } else {
            let denied = Denied {
                retry_after: reset,
                reset_after: reset,
            };
            (Decision::Denied(denied), Some(Reason::LocalBudget))
        }
    }
}

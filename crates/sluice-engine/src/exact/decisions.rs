//! Decisions taken in the store: `exact` mode (one store round trip per decision, with a local
//! cache of keys known to be over their limit and the rule's `on_store_error` behaviour), and
//! the same calls for a synced rule whose limit is too small to share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use papaya::HashMap;
use sluice_config::{AlgorithmKind, OnStoreError, ResolvedLimit};
use sluice_core::{Clock, Decision, FixedWindow, KeyedLimiter, Nanos, Rate};
use sluice_store::{CounterStore, ExactAlgorithm, ExactRequest, StoreError};

use crate::exact::breaker::{Admission, Breaker};
use crate::verdict::Reason;

/// What an exact-mode request calls the store with: the store, its breaker, the time budget
/// (`None`: no timer, the store's own timeout applies) and the runtime its calls run on.
pub(crate) struct StoreCalls<'a> {
    pub store: &'a Arc<dyn CounterStore>,
    pub breaker: &'a Breaker,
    pub timeout: Option<Duration>,
    /// The runtime the engine was built on, when it was built on one.
    pub home: Option<&'a tokio::runtime::Handle>,
}

impl StoreCalls<'_> {
    /// One decision taken in the store, run on the engine's own runtime. A store connection's
    /// tasks live on the runtime of the call that (re)made it (redis-rs spawns them there), and
    /// a listener's worker runtime ends at shutdown before the last flush: a connection remade
    /// by a request on a worker would die with it, and the last flush with it.
    /// Asked on that runtime, or outside any (the simulator polls in place), the call runs
    /// in place.
    async fn exact(&self, request: ExactRequest) -> Result<Decision, StoreError> {
        let here = tokio::runtime::Handle::try_current().ok();
        let Some(home) = self
            .home
            .filter(|home| here.is_some_and(|here| here.id() != home.id()))
        else {
            return self.store.exact(&request).await;
        };
        let store = self.store.clone();
        home.spawn(async move { store.exact(&request).await })
            .await
            .unwrap_or_else(|e| {
                Err(StoreError::Unavailable(format!(
                    "the engine's runtime did not run the call: {e}"
                )))
            })
    }
}

type FastHasher = foldhash::fast::RandomState;

/// What asking the store for a decision gave.
pub(crate) enum Asked {
    /// The store decided, or the key is known over its limit.
    Decided(Decision, Option<Reason>),
    /// No answer: the store failed (its error), or the breaker is open (none).
    Unanswered(Option<StoreError>),
}

/// Decisions taken in the store, one round trip each, with a cache of the keys it denied
/// until they may have room again: an `exact` rule's, and a synced rule's for a limit too
/// small to share.
pub(crate) struct StoreDecisions {
    algorithm: ExactAlgorithm,
    /// The rule's `cooldown`: a key the store denies is refused here at least this long.
    cooldown_ns: u64,
    /// Keys denied by the store, and until when (store-corrected ns).
    over_limit: HashMap<String, AtomicU64, FastHasher>,
}

impl StoreDecisions {
    pub(crate) fn new(algorithm: ExactAlgorithm, cooldown_ns: u64) -> Self {
        Self {
            algorithm,
            cooldown_ns,
            over_limit: HashMap::builder().hasher(FastHasher::default()).build(),
        }
    }

    /// Decides one request: a key known to be over its limit is denied here; otherwise the
    /// store decides, within the request's time budget and unless the breaker is open.
    pub(crate) async fn ask(
        &self,
        store: &StoreCalls<'_>,
        key: &str,
        store_key: Arc<str>,
        now: Nanos,
        cost: u64,
        max_keys: usize,
    ) -> Asked {
        {
            let guard = self.over_limit.guard();
            if let Some(until) = self.over_limit.get(key, &guard) {
                let until = until.load(Ordering::Relaxed);
                if now < until {
                    let wait = Duration::from_nanos(until - now);
                    let denied = Decision::Denied(sluice_core::Denied {
                        retry_after: wait,
                        reset_after: wait,
                    });
                    return Asked::Decided(denied, Some(Reason::CachedOverLimit));
                }
                self.over_limit.remove(key, &guard);
            }
        }
        if store.breaker.admit(now) == Admission::FailFast {
            return Asked::Unanswered(None);
        }
        let request = ExactRequest {
            key: store_key,
            algorithm: self.algorithm,
            now_us: now / 1000,
            cost,
        };
        // A call cut off by the budget may still be applied by the store: counted, not
        // admitted (the safe side).
        let call = store.exact(request);
        let result = match store.timeout {
            Some(budget) => tokio::time::timeout(budget, call)
                .await
                .unwrap_or(Err(StoreError::Timeout(budget))),
            None => call.await,
        };
        match &result {
            Ok(_) => store.breaker.succeeded(),
            Err(e) if e.is_unavailable() => store.breaker.failed(now),
            Err(_) => {}
        }
        match result {
            Ok(Decision::Denied(mut d)) => {
                // A cooldown blocks the key from this denial on, on this instance (each
                // instance starts its own block at the first denial the store gives it).
                let cooldown = Duration::from_nanos(self.cooldown_ns);
                d.retry_after = d.retry_after.max(cooldown);
                d.reset_after = d.reset_after.max(cooldown);
                let until =
                    now.saturating_add(u64::try_from(d.retry_after.as_nanos()).unwrap_or(u64::MAX));
                // The cache only saves store calls: at the key cap it stops growing.
                if self.over_limit.len() < max_keys {
                    self.over_limit
                        .pin()
                        .insert(key.to_owned(), AtomicU64::new(until));
                }
                Asked::Decided(Decision::Denied(d), Some(Reason::Exact))
            }
            Ok(d) => Asked::Decided(d, None),
            Err(e) => Asked::Unanswered(Some(e)),
        }
    }

    /// Forgets the keys whose block has passed; returns how many.
    /// Forgets the keys whose block has passed; returns how many.
    pub(crate) fn evict(&self, now: Nanos) -> usize {
        let guard = self.over_limit.guard();
        let before = self.over_limit.len();
        self.over_limit
            .retain(|_, until| until.load(Ordering::Relaxed) > now, &guard);
        before - self.over_limit.len()
    }

    /// Keys known over their limit.
    pub(crate) fn blocked(&self) -> usize {
        self.over_limit.len()
    }

    /// Whether `key` is known over its limit at `now` (no store call).
    pub(crate) fn is_blocked(&self, key: &str, now: Nanos) -> bool {
        let guard = self.over_limit.guard();
        self.over_limit
            .get(key, &guard)
            .is_some_and(|until| until.load(Ordering::Relaxed) > now)
    }
}

pub(crate) struct ExactRule {
    decisions: StoreDecisions,
    on_store_error: OnStoreError,
    /// Used when the store fails and `on_store_error: local`: MAX / instances per window.
    fallback: KeyedLimiter<String, FixedWindow, Arc<dyn Clock>>,
}

impl ExactRule {
    pub(crate) fn new(limit: &ResolvedLimit, instances: u64, clock: Arc<dyn Clock>) -> Self {
        let window_us = (limit.rate.window_ns() / 1000).max(1);
        let l = limit.rate.limit();
        let algorithm = match limit.algorithm {
            AlgorithmKind::TokenBucket | AlgorithmKind::LeakyBucket => {
                ExactAlgorithm::TokenBucket {
                    limit: l,
                    window_us,
                    burst: limit.burst,
                }
            }
            AlgorithmKind::SlidingWindow => ExactAlgorithm::SlidingWindow {
                limit: l,
                window_us,
            },
            AlgorithmKind::SlidingWindowLog => ExactAlgorithm::SlidingLog {
                limit: l,
                window_us,
            },
            _ => ExactAlgorithm::FixedWindow {
                limit: l,
                window_us,
            },
        };
        let local_limit = (l / instances.max(1)).max(1);
        let fallback_rate = Rate::new(local_limit, limit.rate.window()).unwrap_or(limit.rate);
        Self {
            decisions: StoreDecisions::new(
                algorithm,
                sluice_core::duration_to_nanos(limit.cooldown),
            ),
            on_store_error: limit.on_store_error,
            fallback: KeyedLimiter::with_clock(FixedWindow::new(fallback_rate), clock),
        }
    }

    /// Decides one request at the store ([`StoreDecisions::ask`]); when the store cannot,
    /// `on_store_error` does. Returns the store's error, if it failed.
    pub(crate) async fn check(
        &self,
        store: &StoreCalls<'_>,
        key: &str,
        store_key: Arc<str>,
        now: Nanos,
        cost: u64,
        max_keys: usize,
    ) -> (Decision, Option<Reason>, Option<StoreError>) {
        match self
            .decisions
            .ask(store, key, store_key, now, cost, max_keys)
            .await
        {
            Asked::Decided(decision, reason) => (decision, reason, None),
            Asked::Unanswered(error) => {
                let (decision, reason) = self.on_store_error(key, now, cost, max_keys);
                (decision, reason, error)
            }
        }
    }

    /// The rule's `on_store_error` decision.
    fn on_store_error(
        &self,
        key: &str,
        now: Nanos,
        cost: u64,
        max_keys: usize,
    ) -> (Decision, Option<Reason>) {
        let decision = match self.on_store_error {
            OnStoreError::Allow => Decision::Allowed(sluice_core::Allowed {
                remaining: 0,
                reset_after: Duration::ZERO,
                delay: Duration::ZERO,
            }),
            OnStoreError::Deny => Decision::Denied(sluice_core::Denied {
                retry_after: Duration::from_secs(1),
                reset_after: Duration::from_secs(1),
            }),
            // At the key cap, a key the fallback does not know is denied: a key spray
            // during an outage cannot grow memory.
            _ if self.fallback.len() >= max_keys && !self.fallback.contains(key) => {
                Decision::Denied(sluice_core::Denied {
                    retry_after: Duration::from_secs(1),
                    reset_after: Duration::from_secs(1),
                })
            }
            _ => self.fallback.check_at(key, now, cost),
        };
        let reason = (!decision.is_allowed()).then_some(match self.on_store_error {
            OnStoreError::Deny => Reason::StoreError,
            _ => Reason::Fallback,
        });
        (decision, reason)
    }

    pub(crate) fn evict(&self, now: Nanos) -> usize {
        self.decisions.evict(now) + self.fallback.evict_idle(now)
    }

    pub(crate) fn blocked(&self) -> usize {
        self.decisions.blocked()
    }

    /// Keys known over their limit, and the fallback's keys.
    pub(crate) fn len(&self) -> usize {
        self.decisions.blocked() + self.fallback.len()
    }

    /// Whether `key` is known over its limit at `now` (no store call).
    pub(crate) fn is_blocked(&self, key: &str, now: Nanos) -> bool {
        self.decisions.is_blocked(key, now)
    }
}
